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
