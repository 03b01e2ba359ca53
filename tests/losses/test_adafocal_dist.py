"""Two-process (gloo) test: AdaFocal's update from each rank's share of the validation set equals
one process over the whole set, on every rank, bit for bit (unequal shares, one empty share);
a bad input on one rank fails both ranks (no hang) without changing their state."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import torch

from torchcal.losses import AdaFocalLoss

WORKER = textwrap.dedent(
    """
    import os, sys
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    from torchcal.losses import AdaFocalLoss

    rank = int(os.environ["RANK"])
    import datetime
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"],
                            rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    data = torch.load(sys.argv[1], weights_only=True)
    loss = AdaFocalLoss(n_bins=7, lam=3.0)
    for z, y, cut in data["steps"]:
        # rank 0 takes the first `cut` samples, rank 1 the rest (unequal, possibly empty)
        sl = slice(0, cut) if rank == 0 else slice(cut, None)
        loss.update(logits=z[sl], labels=y[sl])
    state = loss.state_dict()
    # a bad input on one rank (NaN logits on rank 1) fails every rank instead of leaving the
    # other one waiting in the gather, and no rank changes its state
    z, y, _ = data["steps"][0]
    zb = z[:10].clone()
    if rank == 1:
        zb[3, 2] = float("nan")
    try:
        loss.update(logits=zb, labels=y[:10])
        err = ""
    except ValueError as e:
        err = str(e)
    unchanged = torch.equal(loss.gammas, state["gammas"]) and len(loss.history) == 3
    torch.save({"state": state, "err": err, "unchanged": unchanged}, sys.argv[2] + f".{rank}")
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_update_equals_single_process(tmp_path):
    gen = torch.Generator().manual_seed(0)
    steps = []
    for cut in (37, 100, 0):  # unequal shares, then rank 0 empty
        z = torch.randn(100, 6, generator=gen) * 3
        y = torch.randint(0, 6, (100,), generator=gen)
        perm = torch.randperm(100, generator=gen)
        steps.append((z[perm], y[perm], cut))
    data, out, script = tmp_path / "data.pt", tmp_path / "out.pt", tmp_path / "worker.py"
    torch.save({"steps": steps}, data)
    script.write_text(WORKER)

    single = AdaFocalLoss(n_bins=7, lam=3.0)
    for z, y, _ in steps:
        single.update(logits=z, labels=y)

    port = str(_free_port())
    env = {**os.environ, "PORT": port, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(data), str(out)],
                         env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
        for r in range(2)
    ]
    try:
        logs = [p.communicate(timeout=120)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)

    saved = [torch.load(f"{out}.{r}", weights_only=True) for r in range(2)]
    assert "another rank" in saved[0]["err"] and "`logits`" in saved[1]["err"], saved
    assert saved[0]["unchanged"] and saved[1]["unchanged"]
    for r in range(2):
        state = saved[r]["state"]
        loss = AdaFocalLoss(n_bins=7, lam=3.0)
        loss.load_state_dict(state)
        assert torch.equal(loss.gammas, single.gammas)
        assert torch.equal(loss.bin_edges, single.bin_edges)
        assert len(loss.history) == 3
        for h, hs in zip(loss.history, single.history, strict=True):
            assert torch.equal(h["counts"], hs["counts"]) and torch.equal(h["gaps"], hs["gaps"])
    assert not torch.equal(single.gammas, torch.ones(7, dtype=torch.float64))
