"""Multi-task learning with learned uncertainty weighting on scikit-learn's digits.

One shared MLP trunk, two heads:
  * classification: which digit (cross-entropy, ``c = 1``),
  * regression: the image's mean ink intensity, standardised (mean squared error, ``c = 1/2``),
combined with :class:`torchcal.losses.multitask.UncertaintyWeighting` (Kendall et al. 2018):
``sum_t c_t exp(-s_t) L_t + s_t / 2``, with ``s_t`` learned beside the network (no weight decay).

Run:  python examples/multitask_digits.py      (a few seconds on a CPU; the data ship with
scikit-learn, nothing is downloaded)
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

from torchcal.losses.multitask import UncertaintyWeighting


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--form", choices=("kendall", "uniform"), default="kendall")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0  # (1797, 64) in [0, 1]
    y_cls = digits.target.astype(np.int64)
    ink = x.mean(axis=1)
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(len(x))
    n_train = int(0.7 * len(x))
    tr, te = perm[:n_train], perm[n_train:]
    mu, sd = ink[tr].mean(), ink[tr].std()
    y_reg = ((ink - mu) / sd).astype(np.float32)
    # the trunk sees noisy pixels (fresh noise every step; one fixed noisy copy for testing) so
    # neither task is solved exactly and both keep a non-zero loss for s_t to settle on
    noise = 0.3
    X, Yc, Yr = torch.from_numpy(x), torch.from_numpy(y_cls), torch.from_numpy(y_reg)
    X_test_noisy = X + noise * torch.randn(X.shape)
    trunk = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
    cls_head, reg_head = nn.Linear(128, 10), nn.Linear(128, 1)
    weighting = UncertaintyWeighting(kinds=("classification", "regression"), form=args.form)
    net_params = [*trunk.parameters(), *cls_head.parameters(), *reg_head.parameters()]
    opt = torch.optim.AdamW(
        [{"params": net_params, "weight_decay": 1e-4},
         {"params": weighting.parameters(), "weight_decay": 0.0}],
        lr=3e-3,
    )
    batch = 64
    tr_t = torch.from_numpy(tr)
    for epoch in range(args.epochs):
        order = tr_t[torch.randperm(len(tr_t))]
        for i in range(0, len(order), batch):
            idx = order[i:i + batch]
            h = trunk(X[idx] + noise * torch.randn(len(idx), 64))
            l_cls = nn.functional.cross_entropy(cls_head(h), Yc[idx])
            l_reg = nn.functional.mse_loss(reg_head(h).squeeze(1), Yr[idx])
            loss = weighting([l_cls, l_reg])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if epoch % 10 == 0 or epoch == args.epochs - 1:
            w = weighting.weights().tolist()
            print(f"epoch {epoch:3d}  L_cls {l_cls.item():.4f}  L_reg {l_reg.item():.4f}  "
                  f"weights cls {w[0]:.3f} reg {w[1]:.3f}")

    with torch.no_grad():
        te_t = torch.from_numpy(te)
        h = trunk(X_test_noisy[te_t])
        acc = (cls_head(h).argmax(1) == Yc[te_t]).float().mean().item()
        rmse = ((reg_head(h).squeeze(1) - Yr[te_t]) ** 2).mean().sqrt().item() * sd
    w = weighting.weights().tolist()
    s = weighting.log_vars.detach().tolist()
    print(f"learned log-variances s: classification {s[0]:+.3f}, regression {s[1]:+.3f}")
    print(f"learned weights c*exp(-s): classification {w[0]:.3f}, regression {w[1]:.3f}")
    print(f"test accuracy {acc:.3f}, test ink-intensity RMSE {rmse:.4f} (target std {sd:.4f})")
    return {"weights": w, "log_vars": s, "accuracy": acc, "rmse": rmse}


if __name__ == "__main__":
    main()
