"""The lm-evaluation-harness and Hugging Face evaluate recipes, with stand-ins that follow
their documented interfaces (no peer is imported here)."""

from __future__ import annotations

import importlib.util
import math
import sys
import types
from pathlib import Path

import pytest
import torch

from torchcal.llm import (
    abstention_curve,
    calibration_report,
    evaluate_confidence,
    lm_eval_aurc,
    lm_eval_ece,
    lm_eval_mc_item,
    register_lm_eval,
    summarize_samples,
)

ROOT = Path(__file__).resolve().parents[2]


def _records():
    g = torch.Generator().manual_seed(0)
    recs, conf, ok = [], [], []
    for i in range(60):  # building test records, one per question
        lls = (-torch.rand(4, generator=g, dtype=torch.float64) * 4).tolist()
        gold = int(torch.randint(0, 4, (1,), generator=g))
        e = [math.exp(x) for x in lls]
        k = max(range(4), key=lls.__getitem__)
        conf.append(e[k] / sum(e))
        ok.append(k == gold)
        if i % 3 == 0:
            recs.append({"loglikelihoods": lls, "gold": gold})
        elif i % 3 == 1:  # lm_eval --log_samples: [loglikelihood, is_greedy] per option
            recs.append({"filtered_resps": [[str(x), "False"] for x in lls], "target": gold,
                         "doc_id": i})
        else:
            lp = (-torch.rand(3, generator=g, dtype=torch.float64)).tolist()
            recs.append({"token_logprobs": lp, "correct": i % 2 == 0})
            conf[-1] = math.exp(sum(lp) / 3)
            ok[-1] = i % 2 == 0
    return recs, torch.tensor(conf, dtype=torch.float64), torch.tensor(ok)


def test_summarize_samples_against_hand_confidences():
    recs, conf, ok = _records()
    out = summarize_samples(recs, n_bins=10)
    ref = evaluate_confidence(conf, ok, n_bins=10)
    for key in ("ece", "brier", "auroc", "aurc", "augrc", "accuracy"):
        assert out[key] == pytest.approx(ref[key], abs=1e-12), key
    curve = abstention_curve(conf, ok)
    assert out["abstention_curve"]["coverage"] == pytest.approx(curve.coverage.tolist())
    with pytest.raises(ValueError, match="got keys"):
        summarize_samples([{"resps": []}])


def test_lm_eval_registration_with_a_stand_in_registry():
    metrics, aggregations = {}, {}

    def register_aggregation(name):  # lm_eval.api.registry.register_aggregation's interface
        def deco(fn):
            aggregations[name] = fn
            return fn
        return deco

    def register_metric(**args):  # lm_eval.api.registry.register_metric's interface
        def deco(fn):
            metrics[args["metric"]] = (fn, args)
            return fn
        return deco

    names = register_lm_eval(register_metric, register_aggregation)
    assert names == ["torchcal_ece", "torchcal_aurc"] and set(metrics) == set(names)
    fn, args = metrics["torchcal_ece"]
    assert args["aggregation"] == "torchcal_ece" and args["higher_is_better"] is False
    # process_results side: (loglikelihood, is_greedy) per option -> lm_eval's brier items
    item = lm_eval_mc_item([(-1.0, True), (-2.0, False), (-3.0, False)], 0)
    e = [math.exp(-1), math.exp(-2), math.exp(-3)]
    assert item[0] == 0 and item[1] == pytest.approx([x / sum(e) for x in e])
    items = [fn(item), (2, [0.1, 0.3, 0.6]), (1, [0.5, 0.25, 0.25])]
    conf = torch.tensor([e[0] / sum(e), 0.6, 0.5], dtype=torch.float64)
    ok = torch.tensor([True, True, False])
    assert aggregations["torchcal_ece"](items) == pytest.approx(
        evaluate_confidence(conf, ok)["ece"])
    assert lm_eval_aurc(items) == pytest.approx(evaluate_confidence(conf, ok)["aurc"])
    # generation items: (correct, confidence)
    assert lm_eval_ece([(True, 0.9), (False, 0.2)]) == pytest.approx(
        evaluate_confidence(torch.tensor([0.9, 0.2]), torch.tensor([1, 0]))["ece"])


def test_hf_evaluate_module_with_a_stand_in(monkeypatch):
    class Metric:  # evaluate.Metric's documented interface: compute(**kw) -> _compute(**kw)
        def compute(self, **kwargs):
            self.info = self._info()
            return self._compute(**kwargs)

    ev = types.ModuleType("evaluate")
    ev.Metric = Metric
    ev.MetricInfo = lambda **kw: kw
    ds = types.ModuleType("datasets")
    ds.Features = dict
    ds.Value = str
    monkeypatch.setitem(sys.modules, "evaluate", ev)
    monkeypatch.setitem(sys.modules, "datasets", ds)
    path = ROOT / "examples" / "hf_evaluate" / "torchcal_calibration.py"
    spec = importlib.util.spec_from_file_location("torchcal_calibration_metric", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    metric = mod.TorchcalCalibration()
    out = metric.compute(predictions=["Paris", "Lyon ", "Rome"],
                         references=["Paris", "Paris", "Rome"], confidences=[0.9, 0.7, 0.6])
    assert {f["confidences"] for f in metric.info["features"]} == {"float64"}
    ref = evaluate_confidence(torch.tensor([0.9, 0.7, 0.6]), torch.tensor([1, 0, 1]))
    assert out["ece"] == pytest.approx(ref["ece"]) and out["auroc"] == ref["auroc"]
    assert out["abstention_curve"]["selective_error"] == pytest.approx([0.0, 0.5, 1 / 3])
    ints = metric.compute(predictions=[1, 2], references=[1, 0], confidences=[0.8, 0.4])
    assert ints["accuracy"] == 0.5
    with pytest.raises(ValueError, match="as many predictions"):
        calibration_report(["a"], ["a", "b"], [0.5])
