"""Issue 33 part 5: report.html as a reader sees it, in headless Chromium at 1280 and 800 px.

The claims were 7,800 px down a 10,150 px page, after 11 figures, with no table of contents,
and the 10-column table scrolled the whole page sideways at 800 px.  Now the page opens with a
table of contents and the claims (the committed run's verdicts in a box of their own), within
the first screen after the title, and nothing makes the page scroll sideways.  The screenshots
are written next to the report (and copied to ``$TORCHCAL_SCREENSHOTS`` when it is set, for a
person to look at)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from test_report_html import APPENDIX, INTRO, _chromium, _report  # same folder

from torchcal.experiments import get_benchmark
from torchcal.experiments.benchmark import committed_note
from torchcal.experiments.claims import CLAIMS
from torchcal.report.build import build_report

pytestmark = pytest.mark.skipif(
    _chromium() is None, reason="headless Chromium is not installed (Debian: apt-get install "
                                "chromium; .ci/run installs it)")

HEIGHT = 900  # the first screen

_PROBE = """<script>
window.addEventListener('load', () => {
  const top = e => e ? e.getBoundingClientRect().top + window.scrollY : null;
  const bottom = e => e ? e.getBoundingClientRect().bottom + window.scrollY : null;
  const h2 = [...document.querySelectorAll('h2')];
  const claims = h2.find(h => h.textContent.startsWith("The papers"));
  const verdict = [...document.querySelectorAll('strong')]
    .find(b => b.textContent.startsWith('Verdict'));
  const tables = [...document.querySelectorAll('table')];
  const out = document.createElement('pre');
  out.id = 'torchcal-check';
  out.textContent = JSON.stringify({
    width: document.documentElement.clientWidth, height: window.innerHeight,
    scroll_width: document.documentElement.scrollWidth,
    title_bottom: bottom(document.querySelector('h1')), claims_top: top(claims),
    verdict_bottom: bottom(verdict), figure_top: top(document.querySelector('figure')),
    toc: [...document.querySelectorAll('nav.toc a')].map(a => a.textContent),
    preface_top: top(document.querySelector('div.preface')),
    max_columns: Math.max(...tables.map(t => t.rows[0].cells.length)),
    h3: [...document.querySelectorAll('h3')].map(h => h.textContent)});
  document.body.appendChild(out);
});
</script>"""


def _chrome(tmp_path, width: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--hide-scrollbars", f"--user-data-dir={tmp_path / f'profile{width}'}",
         f"--window-size={width},{HEIGHT}", "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A demo-like report: every claim's losses on 2 seeds, figures, the 10-column table, a
    --quick label and the committed run's verdicts."""
    tmp = tmp_path_factory.mktemp("screens")
    _report(tmp)  # writes the runs under tmp/runs
    return build_report([tmp / "runs"], tmp / "demo", intro=INTRO, appendix=APPENDIX,
                        claims=CLAIMS, figures=True, title="torchcal demo: calibration on MNIST-1D",
                        verdict_label="--quick smoke test, 15 of 350 epochs: not evidence",
                        preface=committed_note(get_benchmark("mnist1d")))


@pytest.mark.parametrize("width", [1280, 800])
def test_the_claims_open_the_report_and_the_page_never_scrolls_sideways(report, tmp_path, width):
    page = report.report_html.read_text(encoding="utf-8")
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    proc = _chrome(tmp_path, width, "--dump-dom", probe.as_uri())
    m = re.search(r'<pre id="torchcal-check">(.*?)</pre>', proc.stdout)
    assert m, f"no result from Chromium: {proc.stderr[-2000:]}"
    seen = json.loads(m.group(1).replace("&quot;", '"'))
    assert seen["max_columns"] >= 10, seen
    # no horizontal page scroll (a wide table scrolls in its own box)
    assert seen["scroll_width"] <= seen["width"], seen
    # a table of contents, the claims first, within the first screen after the title
    assert seen["toc"][0].startswith("The papers' claims") and "Runs" in seen["toc"], seen
    assert seen["title_bottom"] < seen["claims_top"] < seen["preface_top"], seen
    # this run's first verdict, read unscrolled (the window's inner height: the first screen)
    assert seen["verdict_bottom"] < seen["height"] <= HEIGHT, seen
    assert seen["claims_top"] < seen["figure_top"], seen
    # each per-seed table is named by its claim: no heading repeated
    per_seed = [h for h in seen["h3"] if "per seed" in h]
    assert len(per_seed) == 6 and len(set(per_seed)) == 6, per_seed
    shot = report.out_dir / f"screen-{width}.png"
    _chrome(tmp_path, width, f"--screenshot={shot}", report.report_html.as_uri())
    assert shot.is_file() and shot.stat().st_size > 10_000
    assert int.from_bytes(shot.read_bytes()[16:20], "big") == width  # the PNG's width
    if os.environ.get("TORCHCAL_SCREENSHOTS"):
        shutil.copy(shot, os.environ["TORCHCAL_SCREENSHOTS"])
