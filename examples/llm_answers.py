"""LLM answers you can trust: sequence confidence, its calibration and abstention with a
guarantee, on a small decoder-only transformer trained here (nothing is downloaded).

The task is three-digit addition as text: the prompt ``"007+450="`` (operands zero-padded),
the answer ``"457;"`` (1 to 4 digits, ``";"`` ends it).  A fifth of the training sequences
are verification questions, ``"007+450=457;?Y"`` or ``"007+450=467;?N"``, so the same model can be
asked whether its own answer is right (P(True)).  The model (torch alone: a causal
transformer of two layers) is trained on a fixed set of problems for a limited number of
steps, so it is right on some unseen problems and wrong on others.  Then, on held-out
problems:

1. greedy answers, decoded step by step with the step's scores kept, as
   ``generate(..., output_scores=True)`` returns them, and
   :func:`torchcal.llm.from_generate` turns into token log-probabilities and the mask;
2. every confidence score (length-normalised probability, sequence probability, minimum
   token probability, negative mean entropy, P(True), and the multiple-choice option
   probability of four candidate sums) and its AUROC for correctness;
3. ECE before and after each calibrator (Platt, isotonic, beta, histogram), fitted on one
   half of the answers and measured on the other;
4. the abstention curve and the threshold certified by Learn-then-Test
   (:func:`torchcal.llm.abstention_threshold`), with its realised error over 200 random
   calibration/test splits;
5. conformal answer sets over the four options.

Run:  python examples/llm_answers.py            (the full run)
      python examples/llm_answers.py --quick    (the test suite's mode, under a minute)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import torchcal.llm as L

CHARS = "0123456789+=;?YN"
PAD = len(CHARS)
VOCAB = len(CHARS) + 1
EOS, QMARK, YES, NO = (CHARS.index(c) for c in ";?YN")
TOP = 1000  # operands in [0, TOP)
PROMPT = 8  # "007+450="
MAX_ANSWER = 5  # "1998;"
MAX_LEN = PROMPT + MAX_ANSWER + 2  # + "?Y"
IGNORE = -100


def encode(text: str) -> list[int]:
    return [CHARS.index(ch) for ch in text]


def prompt_text(a: int, b: int) -> str:
    return f"{a:03d}+{b:03d}="


def make_training(n: int, g: torch.Generator, verify: float = 0.2
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` training sequences (inputs, next-token labels), the loss on the answer and on the
    verification verdict only (-100 elsewhere)."""
    ids = torch.full((n, MAX_LEN), PAD, dtype=torch.long)
    labels = torch.full((n, MAX_LEN), IGNORE, dtype=torch.long)
    ab = torch.randint(0, TOP, (n, 2), generator=g)
    is_verify = torch.rand(n, generator=g) < verify
    wrong = torch.rand(n, generator=g) < 0.5
    shift = torch.randint(1, 12, (n,), generator=g)
    for i in range(n):  # data generation, not a training step
        a, b = int(ab[i, 0]), int(ab[i, 1])
        c = a + b
        if is_verify[i] and wrong[i]:
            c = max(0, c + int(shift[i]) * (1 if i % 2 else -1))
        text = prompt_text(a, b) + f"{c};"
        if is_verify[i]:
            text += "?" + ("N" if c != a + b else "Y")
        t = torch.tensor(encode(text))
        ids[i, : len(t)] = t
        if is_verify[i]:
            labels[i, len(t) - 2] = t[-1]  # the verdict follows "?"
        else:
            labels[i, PROMPT - 1: len(t) - 1] = t[PROMPT:]  # the answer follows "="
    return ids, labels


class TinyDecoder(nn.Module):
    """Token and position embeddings, a causal transformer, a linear head: (N, T) -> (N, T, V)."""

    def __init__(self, d: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(MAX_LEN, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        h = self.tok(ids) + self.pos(torch.arange(t))
        return self.head(self.blocks(h, mask=mask, is_causal=True))


def train(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, steps: int,
          seed: int, batch: int = 64) -> None:
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, ids.shape[0], (batch,), generator=g)
        z = model(ids[idx])
        loss = F.cross_entropy(z.movedim(-1, 1), labels[idx], ignore_index=IGNORE)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()


@torch.no_grad()
def generate(model: nn.Module, prompts: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """Greedy decoding of MAX_ANSWER tokens, as ``generate(..., output_scores=True)``:
    ``sequences`` (N, PROMPT + T) and ``scores`` (T tensors (N, V)); finished rows get PAD."""
    seq, scores = prompts, []
    done = torch.zeros(prompts.shape[0], dtype=torch.bool)
    for _ in range(MAX_ANSWER):
        z = model(seq)[:, -1]
        nxt = torch.where(done, torch.full_like(done, PAD, dtype=torch.long), z.argmax(1))
        scores.append(z)
        seq = torch.cat([seq, nxt.unsqueeze(1)], dim=1)
        done |= nxt == EOS
    return seq, tuple(scores)


def decode(tokens: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return ["".join(CHARS[t] for t, m in zip(row.tolist(), mrow.tolist(), strict=True)
                    if m and t < PAD and t != EOS) for row, mrow in zip(tokens, mask, strict=True)]


@torch.no_grad()
def p_true_scores(model: nn.Module, sequences: torch.Tensor, mask: torch.Tensor
                  ) -> torch.Tensor:
    """P(True) of the model's own answers: ``prompt + answer + "?"``, the next token's
    logits, ``Y`` against ``N``."""
    n = sequences.shape[0]
    lengths = PROMPT + mask.sum(1)  # the answer includes its ";"
    ids = torch.full((n, MAX_LEN), PAD, dtype=torch.long)
    ids[:, : sequences.shape[1]] = torch.where(
        torch.arange(sequences.shape[1]) < lengths.unsqueeze(1), sequences, PAD)
    ids[torch.arange(n), lengths] = QMARK
    z = model(ids)[torch.arange(n), lengths]  # the logits after "?"
    return L.p_true(z, yes_ids=YES, no_ids=NO)


@torch.no_grad()
def option_loglik(model: nn.Module, ab: torch.Tensor, options: torch.Tensor) -> torch.Tensor:
    """(Q, K) summed log-likelihood of each option's continuation ``"c;"`` after the prompt."""
    q, k = options.shape
    rows, conts = [], []
    for i in range(q):  # building token sequences (text), one per question and option
        for j in range(k):
            cont = encode(f"{int(options[i, j])};")
            rows.append(encode(prompt_text(int(ab[i, 0]), int(ab[i, 1]))) + cont
                        + [PAD] * (MAX_ANSWER - len(cont)))
            conts.append(len(cont))
    ids = torch.tensor(rows)
    logp = torch.log_softmax(model(ids[:, :-1]).double(), dim=-1)
    tok = logp.gather(2, ids[:, 1:].unsqueeze(2)).squeeze(2)[:, PROMPT - 1:]
    mask = torch.arange(MAX_ANSWER).unsqueeze(0) < torch.tensor(conts).unsqueeze(1)
    return L.sequence_log_prob(tok, mask).view(q, k)


def make_options(ab: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Four candidate sums per question (the right one and three near misses), shuffled."""
    right = ab.sum(1)
    near = torch.tensor([1, -1, 10, -10, 2, -2, 11, 9])
    pick = torch.rand(ab.shape[0], near.numel(), generator=g).argsort(1)[:, :3]
    wrong = (right.unsqueeze(1) + near[pick]).abs()
    wrong = torch.where(wrong == right.unsqueeze(1), right.unsqueeze(1) + 3, wrong)
    opts = torch.cat([right.unsqueeze(1), wrong], 1)
    perm = torch.rand(ab.shape[0], 4, generator=g).argsort(1)
    return opts.gather(1, perm), (perm == 0).long().argmax(1)


def answer_scores(model: nn.Module, ab: torch.Tensor, g: torch.Generator
                  ) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor]]:
    """Every confidence score of the model's answers to ``ab`` and their correctness, and
    the multiple-choice scores (option log-likelihoods, right option)."""
    prompts = torch.tensor([encode(prompt_text(int(a), int(b))) for a, b in ab.tolist()])
    sequences, scores = generate(model, prompts)
    out = L.from_generate(sequences, scores, eos_token_id=EOS, pad_token_id=PAD)
    answers = decode(out.tokens, out.mask)
    correct = L.exact_match(answers, [str(int(s)) for s in ab.sum(1)])
    conf = L.confidence_scores(out.log_probs, out.mask, logits=out.logits)
    conf["p_true"] = p_true_scores(model, sequences, out.mask)
    opts, right = make_options(ab, g)
    ll = option_loglik(model, ab, opts)
    conf["option_prob"] = L.option_probs(ll).amax(1)
    mc = {"loglik": ll, "answer": right,
          "correct": L.option_probs(ll).argmax(1) == right}
    return conf, correct, mc


PROBABILITIES = ("length_normalized_prob", "sequence_prob", "min_token_prob", "p_true")


def calibration_table(conf: dict[str, torch.Tensor], correct: torch.Tensor, mc: dict,
                      cal: torch.Tensor, test: torch.Tensor) -> dict[str, dict[str, float]]:
    """Per score: AUROC on all answers, ECE on the test half before and after each
    calibrator fitted on the calibration half (logit-scale scores: after only)."""
    table: dict[str, dict[str, float]] = {}
    for name, s in conf.items():  # one row per score (a handful)
        ok = mc["correct"] if name == "option_prob" else correct
        row = {"auroc": L.evaluate_confidence(torch.sigmoid(s), ok)["auroc"]}
        prob = name in PROBABILITIES or name == "option_prob"
        if prob:
            row["before"] = L.evaluate_confidence(s[test], ok[test])["ece"]
        for method in L.CALIBRATORS:
            cal_s = L.calibrate_scores(s[cal], ok[cal], method,
                                       scale="probability" if prob else "logit")
            row[method] = L.evaluate_confidence(cal_s.predict(s[test]), ok[test])["ece"]
        table[name] = row
    ts = L.calibrate_options(mc["loglik"][cal], mc["answer"][cal])
    q = torch.as_tensor(ts.predict_proba(mc["loglik"][test])).amax(1)
    table["option_prob"]["temperature"] = L.evaluate_confidence(
        q.double(), mc["correct"][test])["ece"]
    return table


def abstention_summary(conf: torch.Tensor, correct: torch.Tensor, eps: float, delta: float,
                       n_cal: int) -> dict[str, float]:
    sel = L.abstention_threshold(conf[:n_cal], correct[:n_cal], eps, delta)
    chk = L.abstention_split_check(conf, correct, eps, delta, n_cal=n_cal, n_splits=200)
    return {"threshold": sel.threshold_, "answered_cal": sel.answered_fraction_,
            "mean_test_error": float(chk.test_error.mean()),
            "violations": float(chk.violation.double().mean()),
            "mean_coverage": float(chk.coverage.mean()),
            "certified_splits": float(torch.isfinite(chk.threshold).double().mean())}


def report(out: dict, table: dict, curve: L.AbstentionCurve) -> None:
    print(f"tiny decoder: {out['parameters']:,} parameters, {out['steps']} steps on "
          f"{out['n_train']} sequences ({out['train_s']:.0f} s); accuracy on "
          f"{out['n_eval']} unseen problems {out['accuracy']:.3f} (multiple choice "
          f"{out['mc_accuracy']:.3f})")
    cols = ("before",) + L.CALIBRATORS + ("temperature",)
    print(f"{'score':24s} {'AUROC':>6s} " + " ".join(f"{c:>11s}" for c in cols) + "   (ECE)")
    for name, row in table.items():
        cells = " ".join(f"{row[c]:11.4f}" if c in row else f"{'':11s}" for c in cols)
        print(f"{name:24s} {row['auroc']:6.3f} {cells}".rstrip())
    print("abstention curve (length-normalised probability): coverage -> error among answered")
    for cov in (0.2, 0.4, 0.6, 0.8, 1.0):
        k = int(torch.searchsorted(curve.coverage, torch.tensor(cov, dtype=torch.float64)))
        k = min(k, curve.coverage.numel() - 1)
        print(f"  {float(curve.coverage[k]):.2f} -> {float(curve.selective_error[k]):.3f}")
    a = out["abstention"]
    print(f"certified threshold (eps {out['eps']}, delta {out['delta']}, {out['n_cal']} "
          f"calibration answers): {a['threshold']:.2f}, answers {a['answered_cal']:.3f}; over "
          f"200 splits: mean test error among answered {a['mean_test_error']:.3f}, violations "
          f"{a['violations']:.3f}, coverage {a['mean_coverage']:.3f}")
    print(f"conformal answer sets (alpha 0.1, LAC): coverage {out['sets_coverage']:.3f}, "
          f"mean size {out['sets_size']:.2f}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the test suite's mode (< 60 s)")
    ap.add_argument("--steps", type=int, default=None, help="training steps")
    ap.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    steps = args.steps or (QUICK_STEPS if args.quick else FULL_STEPS)
    n_train, n_eval = (4000, 1500) if args.quick else (4000, 4000)
    ids, labels = make_training(n_train, g)
    model = TinyDecoder()
    start = time.perf_counter()
    train(model, ids, labels, steps, args.seed)
    train_s = time.perf_counter() - start
    ab = torch.randint(0, TOP, (n_eval, 2), generator=g)
    conf, correct, mc = answer_scores(model, ab, g)
    half = n_eval // 2
    cal, test = torch.arange(half), torch.arange(half, n_eval)
    table = calibration_table(conf, correct, mc, cal, test)
    eps, delta = 0.1, 0.1
    cp = L.conformal_answer_sets(mc["loglik"][cal], mc["answer"][cal], alpha=0.1)
    sets = cp.predict_sets(mc["loglik"][test])
    out = {"parameters": sum(p.numel() for p in model.parameters()), "steps": steps,
           "n_train": n_train, "n_eval": n_eval, "train_s": train_s,
           "accuracy": float(correct.double().mean()),
           "mc_accuracy": float(mc["correct"].double().mean()), "eps": eps, "delta": delta,
           "n_cal": half, "table": table,
           "abstention": abstention_summary(conf["length_normalized_prob"], correct, eps,
                                            delta, half),
           "sets_coverage": float(sets[torch.arange(test.numel()),
                                       mc["answer"][test]].double().mean()),
           "sets_size": float(sets.sum(1).double().mean())}
    curve = L.abstention_curve(conf["length_normalized_prob"][test], correct[test])
    report(out, table, curve)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return out


QUICK_STEPS, FULL_STEPS = 900, 1000

if __name__ == "__main__":
    main()
