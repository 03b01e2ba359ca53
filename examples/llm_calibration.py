"""Calibrating a (tiny) language model: token-level ECE with ``ignore_index``, temperature
scaling on (N, T, V) logits, and the confidence of a multiple-choice answer.

Everything is built here, nothing is downloaded: a character-level language of sums modulo 10
(``"3+4=7;8+5=3;"``, the answer replaced by a random digit in 20 % of the training facts), a
causal transformer of two layers, trained on a small fixed set of sequences until it is
over-confident (2,000 steps, about a minute on an idle CPU core; ``--quick``: 150 steps, a few
seconds).  Then:

1. **Token-level ECE.**  The logits of held-out sequences are (N, T, V); padded positions have
   the label -100 (``ignore_index``, as ``transformers`` pads), so the metric sees only real
   tokens: ``torchcal.metrics.ece(logits=z.movedim(-1, 1), labels=y)``.
2. **Temperature scaling on (N, T, V) logits.**  ``TemperatureScaling().fit(z_val, y_val)``
   takes the token layout as it is (the labels' shape (N, T) names the class axis: the last)
   and ``predict_proba`` returns (N, T, V).
3. **Multiple-choice confidence.**  For a question ``"a+b="`` with four options, each option's
   continuation (``"c;"``) gets its log-probability under the model (the sum over its tokens);
   normalised over the options (a softmax of those sums) they give the confidence of each
   choice.  Its ECE, a temperature fitted on validation questions, and a reliability diagram
   (``mc_reliability.png``).

Run:  python examples/llm_calibration.py            (2,000 steps: about a minute of training)
      python examples/llm_calibration.py --quick    (a few seconds: the test suite's mode)
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import torchcal.metrics as M
from torchcal.plot import reliability_diagram
from torchcal.posthoc import TemperatureScaling

CHARS = "0123456789+=;"
PAD = len(CHARS)  # the padding token (its labels are -100)
VOCAB = len(CHARS) + 1
FACT = 6  # "a+b=c;"
IGNORE = -100


def encode(text: str) -> list[int]:
    return [CHARS.index(ch) for ch in text]


def fact(a: int, b: int, c: int) -> str:
    return f"{a}+{b}={c};"


def make_sequences(n: int, g: torch.Generator, *, max_facts: int = 4, noise: float = 0.0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of 1 to ``max_facts`` facts, padded: inputs (n, T) and next-token labels
    (n, T) with -100 where the next token is padding."""
    length = FACT * max_facts
    ids = torch.full((n, length), PAD, dtype=torch.long)
    for i in range(n):  # data generation, not a training step
        k = int(torch.randint(1, max_facts + 1, (1,), generator=g))
        text = ""
        for _ in range(k):
            a, b = (int(v) for v in torch.randint(0, 10, (2,), generator=g))
            c = (a + b) % 10
            if noise and float(torch.rand(1, generator=g)) < noise:
                c = int(torch.randint(0, 10, (1,), generator=g))
            text += fact(a, b, c)
        ids[i, : len(text)] = torch.tensor(encode(text))
    inputs, labels = ids[:, :-1], ids[:, 1:].clone()
    labels[labels == PAD] = IGNORE
    return inputs, labels


class TinyCausalLM(nn.Module):
    """Token and position embeddings, a causal transformer encoder, a linear head."""

    def __init__(self, d: int = 64, layers: int = 2, heads: int = 4, max_len: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        h = self.tok(ids) + self.pos(torch.arange(t))
        return self.head(self.blocks(h, mask=mask, is_causal=True))  # (N, T, V)


def train(model: TinyCausalLM, inputs: torch.Tensor, labels: torch.Tensor, *,
          max_steps: int, batch: int = 64, seed: int = 0) -> int:
    """``max_steps`` steps of AdamW on a fixed training set; returns the steps."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    step = 0
    model.train()
    while step < max_steps:
        idx = torch.randint(0, inputs.shape[0], (batch,), generator=g)
        logits = model(inputs[idx])
        # F.cross_entropy takes (N, C, T): the vocabulary on axis 1; -100 ignored
        loss = F.cross_entropy(logits.movedim(-1, 1), labels[idx], ignore_index=IGNORE)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
    model.eval()
    return step


@torch.no_grad()
def option_scores(model: TinyCausalLM, questions: torch.Tensor, options: torch.Tensor
                  ) -> torch.Tensor:
    """(Q, K) log-probability of each option's continuation ``"c;"`` after ``"a+b="``: the sum
    of its tokens' log-probabilities (one batched forward pass over the Q K sequences)."""
    q, k = options.shape
    prompt = torch.stack([questions[:, 0], torch.full_like(questions[:, 0], CHARS.index("+")),
                          questions[:, 1], torch.full_like(questions[:, 0], CHARS.index("="))],
                         dim=1)  # (Q, 4)
    cont = torch.stack([options, torch.full_like(options, CHARS.index(";"))], dim=2)  # (Q,K,2)
    seq = torch.cat([prompt.unsqueeze(1).expand(q, k, 4), cont], dim=2).reshape(q * k, 6)
    logp = torch.log_softmax(model(seq[:, :-1]).double(), dim=-1)  # (QK, 5, V)
    # the continuation's tokens are seq[:, 4:6], predicted at positions 3 and 4
    tok = logp[:, 3:5].gather(2, seq[:, 4:6].unsqueeze(2)).squeeze(2)
    return tok.sum(dim=1).view(q, k)


def make_questions(n: int, g: torch.Generator, k: int = 4
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` questions (a, b), ``k`` distinct options each (one of them the sum modulo 10) and
    the index of the right one."""
    ab = torch.randint(0, 10, (n, 2), generator=g)
    right = (ab[:, 0] + ab[:, 1]) % 10
    # k - 1 distractors: other digits, drawn without replacement per question
    shift = torch.argsort(torch.rand(n, 9, generator=g), dim=1)[:, : k - 1] + 1
    opts = torch.cat([right.unsqueeze(1), (right.unsqueeze(1) + shift) % 10], dim=1)
    perm = torch.argsort(torch.rand(n, k, generator=g), dim=1)
    opts = opts.gather(1, perm)
    answer = (perm == 0).long().argmax(dim=1)
    return ab, opts, answer


def worse(after: float, before: float) -> str:
    """`` (worse than without T)`` when temperature scaling made a number (lower is better)
    worse, as printed (4 decimals); else ``""``."""
    return " (worse than without T)" if round(after, 4) > round(before, 4) else ""


def after_t_lines(out: dict[str, float]) -> list[str]:
    """The numbers after temperature scaling, each followed by a flag when T made it worse
    (the temperature is fitted on validation data: on the test data it can go either way)."""
    return [f"  temperature scaling on (N, T, V) logits: T = {out['temperature']:.3f}, "
            f"ECE {out['token_ece_ts']:.4f}{worse(out['token_ece_ts'], out['token_ece'])}, "
            f"NLL {out['token_nll_ts']:.4f}{worse(out['token_nll_ts'], out['token_nll'])}",
            f"multiple choice (4 options, 400 questions): accuracy {out['mc_accuracy']:.3f}, "
            f"ECE {out['mc_ece']:.4f}; with T = {out['mc_temperature']:.3f}: "
            f"ECE {out['mc_ece_ts']:.4f}{worse(out['mc_ece_ts'], out['mc_ece'])}"]


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="a few seconds of training (the test suite's mode)")
    ap.add_argument("--steps", type=int, default=2000,
                    help="training steps without --quick (default: 2000, about a minute on "
                         "one idle CPU core)")
    ap.add_argument("--out", type=Path, default=Path("llm_calibration_out"),
                    help="folder of the reliability diagram")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    n_train, max_steps = (256, 150) if args.quick else (512, args.steps)
    x_tr, y_tr = make_sequences(n_train, g, noise=0.2)
    x_val, y_val = make_sequences(300, g, noise=0.2)
    x_te, y_te = make_sequences(300, g, noise=0.2)
    model = TinyCausalLM()
    steps = train(model, x_tr, y_tr, max_steps=max_steps, seed=args.seed)
    with torch.no_grad():
        z_val, z_te = model(x_val), model(x_te)  # (N, T, V)

    # 1. token-level ECE: the metrics take the vocabulary on axis 1 and skip -100 labels
    out: dict[str, float] = {"steps": float(steps)}
    out["token_ece"] = float(M.ece(logits=z_te.movedim(-1, 1), labels=y_te))
    out["token_nll"] = float(M.nll(logits=z_te.movedim(-1, 1), labels=y_te))
    # 2. temperature scaling on the (N, T, V) logits as they are
    ts = TemperatureScaling().fit(z_val, y_val)
    q_te = ts.predict_proba(z_te)  # (N, T, V)
    out["temperature"] = ts.temperature_
    out["token_ece_ts"] = float(M.ece(probs=q_te.movedim(-1, 1), labels=y_te))
    out["token_nll_ts"] = float(M.nll(logits=(z_te / ts.temperature_).movedim(-1, 1),
                                      labels=y_te))
    # 3. multiple choice: the options' continuation log-probabilities, normalised over options
    qv, ov, av = make_questions(400, g)
    qt, ot, at = make_questions(400, g)
    s_val, s_te = option_scores(model, qv, ov), option_scores(model, qt, ot)
    out["mc_accuracy"] = float((s_te.argmax(dim=1) == at).double().mean())
    out["mc_ece"] = float(M.ece(logits=s_te, labels=at))  # softmax over the options
    mc_ts = TemperatureScaling().fit(s_val, av)
    out["mc_temperature"] = mc_ts.temperature_
    out["mc_ece_ts"] = float(M.ece(probs=mc_ts.predict_proba(s_te), labels=at))
    args.out.mkdir(parents=True, exist_ok=True)
    reliability_diagram(logits=s_te, labels=at, n_bins=10,
                        title="Multiple-choice confidence (tiny LM)",
                        path=args.out / "mc_reliability.png")

    print(f"tiny causal LM: {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{steps} training steps on {n_train} sequences")
    print(f"token level ({int((y_te != IGNORE).sum())} tokens, padding ignored): "
          f"ECE {out['token_ece']:.4f}, NLL {out['token_nll']:.4f}")
    print("\n".join(after_t_lines(out)))
    print(f"reliability diagram: {args.out / 'mc_reliability.png'}")
    assert all(math.isfinite(v) for v in out.values())
    return out


if __name__ == "__main__":
    main()
