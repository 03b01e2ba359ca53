"""The torchcal.llm recipes run against the real lm-evaluation-harness and Hugging Face
evaluate (issue 48, item 4): lm_eval's registry takes torchcal_ece / torchcal_aurc, and
evaluate.load() loads examples/hf_evaluate/torchcal_calibration.py and computes it.  The
suite tests the same code with stand-ins (tests/llm/test_llm_integrations.py).

Run:  PYTHONPATH=src /work/peers-venv/bin/python benchmarks/bench_llm_integrations_peers.py
Writes benchmarks/results/llm_integrations.md.
"""

from __future__ import annotations

import platform
from pathlib import Path

import evaluate
import lm_eval
import torch
from lm_eval.api import registry

from torchcal.llm import evaluate_confidence, lm_eval_mc_item, register_lm_eval

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    names = register_lm_eval()
    items = [lm_eval_mc_item([(-1.0, True), (-2.0, False)], 0), (1, [0.7, 0.3]),
             (0, [0.2, 0.8])]
    agg = registry.get_aggregation("torchcal_ece")(items)
    ref = evaluate_confidence(torch.tensor([1 / (1 + 2.718281828459045 ** -1), 0.7, 0.8],
                                           dtype=torch.float64),
                              torch.tensor([1, 0, 0]))["ece"]
    metric = evaluate.load(str(ROOT / "examples" / "hf_evaluate" / "torchcal_calibration.py"))
    out = metric.compute(predictions=["Paris", "Lyon", "Rome"],
                         references=["Paris", "Paris", "Rome"], confidences=[0.9, 0.7, 0.6])
    lines = [
        "# torchcal.llm recipes against lm-evaluation-harness and evaluate",
        "",
        "Command: `PYTHONPATH=src /work/peers-venv/bin/python "
        "benchmarks/bench_llm_integrations_peers.py`",
        "",
        f"lm-eval {lm_eval.__version__}, evaluate {evaluate.__version__}, torch "
        f"{torch.__version__}, Python {platform.python_version()}, {platform.machine()}.",
        "Both installed beside torch 2.13.0 with "
        "`pip install -c torch-pin.txt lm-eval evaluate` without error.",
        "",
        f"- lm_eval registry: registered {names}; `get_metric('torchcal_ece')` found: "
        f"{registry.get_metric('torchcal_ece') is not None}; aggregation of 3 items "
        f"{agg:.6f} (torchcal directly: {ref:.6f}).",
        f"- evaluate.load(torchcal_calibration.py).compute: ece {out['ece']:.6f}, "
        f"auroc {out['auroc']:.4f}, aurc {out['aurc']:.6f}, coverage "
        f"{[round(c, 4) for c in out['abstention_curve']['coverage']]}.",
        "",
    ]
    path = ROOT / "benchmarks" / "results" / "llm_integrations.md"
    path.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
