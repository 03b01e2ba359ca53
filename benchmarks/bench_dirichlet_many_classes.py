"""Dirichlet calibration with default settings at many classes (issue 24, 3): fit time,
Newton steps / Hessian-vector products, and held-out NLL against an independent SciPy L-BFGS-B
fit of dirichletcal's objective and, with ``--dirichletcal``, against dirichletcal itself.

dirichletcal does not install with pip (its sdist's ``install_requires`` lacks commas, so its
metadata does not build); it needs ``jax`` (in the ``bench`` extra). To compare with it,
unpack its sdist and pass the directory::

    pip install -e ".[bench]"
    curl -sL $(curl -s https://pypi.org/pypi/dirichletcal/json | python -c "import json, sys; \
        print(json.load(sys.stdin)['urls'][0]['url'])") | tar xz -C /tmp
    python benchmarks/bench_dirichlet_many_classes.py --dirichletcal /tmp/dirichletcal-0.5.3

dirichletcal's ``FullDirichletCalibrator(reg_lambda=lam, reg_mu=mu, reg_norm=True,
ref_row=False)`` is the same objective (its Newton's method up to 36 classes, SciPy's L-BFGS-B
above); it builds an (N, C + 1, C + 1) array, so it cannot fit C = 1,000.

Data: ``draw`` of the post-hoc tests (logits ~ 3·N(0, 1), labels from softmax(z / 2 + bias)),
N fit samples and N held-out samples per C.

Usage::

    python benchmarks/bench_dirichlet_many_classes.py [--cases 21x2000,50x2000,100x5000]
        [--reference-max-classes 100] [--lam 0.01] [--threads 0] [--dirichletcal DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "posthoc"))
from posthoc_reference import draw  # noqa: E402
from scipy.special import log_softmax  # noqa: E402
from test_posthoc_linear import _reference_fit  # noqa: E402

from torchcal.posthoc import DirichletCalibration, WorseThanIdentityWarning, linear  # noqa: E402


def scipy_fit(z, y, lam, mu):
    """dirichletcal's objective (reg_norm=True, no reference row) by L-BFGS-B (the tests'
    reference fit, gtol 1e-12)."""
    theta, _, f = _reference_fit(z, y, lam, mu, log_probs=True)
    return theta, f


def nll_of(theta, z, y):
    xt = np.hstack([log_softmax(z.numpy(), axis=1), np.ones((len(y), 1))])
    ls = log_softmax(xt @ theta.T, axis=1)
    return float(-ls[np.arange(len(y)), y.numpy()].mean())


def _dirichletcal(path: str):
    """dirichletcal's FullDirichletCalibrator from an unpacked sdist at ``path``, with jax in
    float64 as it sets itself."""
    root = Path(path)
    if not (root / "dirichletcal" / "calib" / "fulldirichlet.py").is_file():
        raise SystemExit(f"--dirichletcal: expected an unpacked dirichletcal sdist (a directory "
                         f"holding dirichletcal/calib/fulldirichlet.py), got {path!r}")
    sys.path.insert(0, str(root))
    try:
        from dirichletcal.calib.fulldirichlet import FullDirichletCalibrator
    except ImportError as e:
        raise SystemExit(f"--dirichletcal: cannot import dirichletcal ({e}); it needs jax: "
                         "pip install -e '.[bench]'") from e
    return FullDirichletCalibrator


def objective(w, b, z, y, lam, mu):
    """The fitted map's value of the shared objective on the fit data (mean NLL + the ODIR
    penalty, dirichletcal's reg_norm=True): the lower, the closer to the optimum."""
    w, b = np.asarray(w, dtype=np.float64), np.asarray(b, dtype=np.float64)
    k = w.shape[0]
    ls = log_softmax(log_softmax(z.numpy(), axis=1) @ w.T + b, axis=1)
    off = w - np.diag(np.diag(w))
    return float(-ls[np.arange(len(y)), y.numpy()].mean() + lam / (k * (k - 1)) * (off ** 2).sum()
                 + mu / k * (b ** 2).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="21x2000,50x2000,100x5000")
    ap.add_argument("--reference-max-classes", type=int, default=100)
    ap.add_argument("--lam", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dirichletcal", metavar="DIR",
                    help="an unpacked dirichletcal sdist (needs jax): compare with its fit")
    a = ap.parse_args()
    full_dirichlet = _dirichletcal(a.dirichletcal) if a.dirichletcal else None
    if a.threads:
        torch.set_num_threads(a.threads)
    hvps = [0]
    orig = linear._pcg

    def counting_pcg(hvp, g, pre, tol, max_steps):
        def h(v):
            hvps[0] += 1
            return hvp(v)
        return orig(h, g, pre, tol, max_steps)

    linear._pcg = counting_pcg
    print(f"threads {torch.get_num_threads()}, lam = mu = {a.lam}")
    for case in a.cases.split(","):
        c, n = (int(v) for v in case.split("x"))
        z, y = draw(2 * n, c, seed=c)
        zf, yf, zt, yt = z[:n], y[:n], z[n:], y[n:]
        hvps[0] = 0
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorseThanIdentityWarning)
            dc = DirichletCalibration(lam=a.lam, mu=a.lam).fit(zf, yf)
        el = time.perf_counter() - t
        ours = float(F.cross_entropy(dc.transform(zt), yt))
        f_ours = objective(dc.weight_, dc.bias_, zf, yf, a.lam, a.lam)
        line = (f"C={c} N={n}: fit {el:.1f} s ({hvps[0]} Hessian-vector products), objective "
                f"{f_ours:.9f}, held-out NLL {ours:.6f} (uncalibrated "
                f"{float(F.cross_entropy(zt, yt)):.4f})")
        if c <= a.reference_max_classes:
            t = time.perf_counter()
            theta, _ = scipy_fit(zf, yf, a.lam, a.lam)
            ref_el = time.perf_counter() - t
            ref = nll_of(theta, zt, yt)
            f_ref = objective(theta[:, :c], theta[:, c], zf, yf, a.lam, a.lam)
            line += (f"; SciPy reference: objective {f_ref:.9f}, held-out {ref:.6f} in "
                     f"{ref_el:.1f} s (diff {ours - ref:+.2e})")
        if full_dirichlet is not None and c <= a.reference_max_classes:
            t = time.perf_counter()
            dcal = full_dirichlet(reg_lambda=a.lam, reg_mu=a.lam, reg_norm=True, ref_row=False)
            dcal.fit(torch.softmax(zf, 1).numpy(), yf.numpy())
            ref_el = time.perf_counter() - t
            q = np.asarray(dcal.predict_proba(torch.softmax(zt, 1).numpy()), dtype=np.float64)
            ref = float(-np.log(q[np.arange(len(yt)), yt.numpy()]).mean())
            wd = np.asarray(dcal.weights, dtype=np.float64)
            f_ref = objective(wd[:, :c], wd[:, c], zf, yf, a.lam, a.lam)
            line += (f"; dirichletcal: objective {f_ref:.9f}, held-out {ref:.6f} in "
                     f"{ref_el:.1f} s (diff {ours - ref:+.2e})")
        print(line, flush=True)


if __name__ == "__main__":
    main()
