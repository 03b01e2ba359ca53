"""The README's performance table equals the committed benchmark output it quotes
(`benchmarks/results/losses.md`, the output of `python benchmarks/bench_losses.py --clock cpu`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = re.compile(r"^\(N, C\) = \((\d+), (\d+)\); ms per fwd\+bwd call")


def _bench_ratios(text: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(loss, "NxC") -> (eager ratio, compiled ratio) against the plain formula, as printed."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    shape = None
    for line in text.splitlines():
        m = SHAPE.match(line)
        if m:
            shape = f"{m.group(1)}x{m.group(2)}"
            continue
        if line.startswith("Per-call overhead"):
            shape = None
        cells = line.replace("*", " ").split()
        if shape and len(cells) >= 7 and cells[0] not in ("loss",):
            try:
                float(cells[3]), float(cells[6])
            except ValueError:
                continue
            out[(cells[0], shape)] = (cells[3], cells[6])
    return out


def test_readme_performance_table_equals_the_committed_benchmark_output():
    bench = _bench_ratios((ROOT / "benchmarks" / "results" / "losses.md").read_text(encoding="utf-8"))
    assert len(bench) >= 2 * 14, "the committed output lacks the per-loss rows"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Performance", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    assert len(rows) >= 14
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        loss = cells[0].strip("`")
        got = [c.replace("**", "") for c in cells[1:5]]
        want = [*bench[(loss, "4096x100")], *bench[(loss, "4096x1000")]]
        assert got == want, (loss, got, want)


TIMING = ROOT / "benchmarks" / "results" / "demo_timing.md"


def _timed_walls(text: str) -> dict[str, list[int]]:
    """label ("before"/"after") -> the WALL seconds of its runs, rounded, in the log's order."""
    out: dict[str, list[int]] = {}
    label = None
    for line in text.splitlines():
        m = re.match(r"^== (before|after)-\d+ ", line)
        if m:
            label = m.group(1)
        m = re.match(r"^WALL ([\d.]+) s", line)
        if m and label:
            out.setdefault(label, []).append(round(float(m.group(1))))
            label = None
    return out


def _series(xs: list[int]) -> str:
    return ", ".join(str(x) for x in xs[:-1]) + f" and {xs[-1]} s"


def test_readme_command_one_quotes_the_committed_timing_log():
    """README command 1's comment gives the three alternating /usr/bin/time figures of the
    committed log (benchmarks/time_readme_demo.sh's output), for main and the main before."""
    walls = _timed_walls(TIMING.read_text(encoding="utf-8"))
    assert sorted(walls) == ["after", "before"] and all(len(v) == 3 for v in walls.values()), walls
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("# 1. install and run", 1)[1].split("pip install -e . && torchcal demo", 1)[0]
    comment = " ".join(line.lstrip("# ").strip() for line in block.splitlines())
    for label in ("after", "before"):
        assert _series(walls[label]) in comment, (label, _series(walls[label]), comment)


def test_timing_log_parser_reads_labels_in_order():
    log = "== before-1 abc\nWALL 216.75 s user 1\n== after-1 def\nWALL 210.4 s user 1\n"
    assert _timed_walls(log) == {"before": [217], "after": [210]}
    assert _series([217, 207, 209]) == "217, 207 and 209 s"
