"""The built documentation site as a reader sees it, offline, in headless Chromium (issue 26,
item 7): formulas rendered by the vendored KaTeX (no CDN), no page, code block or signature
wider than the window, nothing loaded from the network.  Skipped, saying why, where MkDocs (the
``docs`` extra) or Chromium is absent; .ci/run runs it after installing both."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                         "google-chrome")) if p), None)
pytest.importorskip("mkdocs", reason="the docs extra (MkDocs) is not installed")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install "
                             "chromium; .ci/run installs it)")

# the home page, a guide with formulas and an API page with long signatures
PAGES = ["index.html", "guide/metrics/index.html", "api/metrics/index.html"]

_PROBE = """<script>
window.addEventListener('load', () => setTimeout(() => {
  const wide = el => el.scrollWidth > el.clientWidth + 1;
  const raw = [...document.querySelectorAll('.arithmatex')]
    .filter(e => !e.querySelector('.katex')).length;
  const out = document.createElement('pre');
  out.id = 'torchcal-check';
  out.textContent = JSON.stringify({
    katex: document.querySelectorAll('.katex').length,
    errors: document.querySelectorAll('.katex-error').length, raw,
    page_wide: document.documentElement.scrollWidth > window.innerWidth,
    wide_code: [...document.querySelectorAll('pre > code')].filter(wide)
      .map(e => e.textContent.slice(0, 60)),
    wide_signatures: [...document.querySelectorAll('.doc-signature')].filter(wide).length,
    signatures: document.querySelectorAll('.doc-signature').length,
  });
  document.body.appendChild(out);
}, 1500));
</script>"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--no-first-run", "--window-size=1280,900", *args],
                          capture_output=True, text=True, timeout=180)


def test_nothing_is_loaded_from_the_network(site):
    remote = re.compile(r"<(?:script|link|img)\b[^>]*(?:src|href)=\"(?:https?:)?//[^\"]*\"[^>]*>")
    bad = {}
    for page in site.rglob("*.html"):
        tags = [t for t in remote.findall(page.read_text(encoding="utf-8"))
                if t.startswith("<script") or "stylesheet" in t or t.startswith("<img")]
        if tags:
            bad[str(page.relative_to(site))] = tags[:3]
    assert not bad, bad
    assert (site / "vendor" / "katex" / "katex.min.js").is_file()


@pytest.mark.parametrize("page", PAGES)
def test_page_as_a_reader_sees_it(site, page, tmp_path):
    path = site / page
    probe = path.with_name("probe.html")  # beside the page, so its relative assets resolve
    probe.write_text(path.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"),
                     encoding="utf-8")
    proc = _chromium(f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
                     "--dump-dom", probe.as_uri())
    m = re.search(r'<pre id="torchcal-check">(.*?)</pre>', proc.stdout)
    assert m, f"no result from Chromium: {proc.stderr[-2000:]}"
    seen = json.loads(m.group(1).replace("&quot;", '"'))
    assert seen["errors"] == 0 and seen["raw"] == 0, seen  # every formula rendered
    if page.startswith("guide/"):
        assert seen["katex"] > 20, seen  # the metrics guide's formulas, typeset
    assert not seen["page_wide"], seen
    if not page.startswith("api/"):
        assert seen["wide_code"] == [], seen  # the home page's diagram, the guide's examples
    assert seen["wide_signatures"] == 0, seen
    if page.startswith("api/"):
        assert seen["signatures"] > 10, seen
    shot = tmp_path / "page.png"  # and a screenshot renders (kept by the test's tmp_path)
    _chromium(f"--user-data-dir={tmp_path / 'profile2'}", "--virtual-time-budget=10000",
              f"--screenshot={shot}", path.as_uri())
    assert shot.is_file() and shot.stat().st_size > 10_000
