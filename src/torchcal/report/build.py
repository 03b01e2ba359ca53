"""``build_report``: evaluated runs -> report.md, report.html, figures, results.json/csv.

Output directory layout::

    OUT/report.md        tables (papers' layout) + figures linked from figures/
    OUT/report.html      the same, figures embedded as base64 (one self-contained file)
    OUT/results.json     every number: per group mean/std over seeds, per run, skipped files
    OUT/results.csv      one row per run, every number (fractions)
    OUT/summary.csv      one row per group, mean and std of every number
    OUT/figures/*.svg    every loss's reliability diagram (pre T) in one figure, confidence
                         histograms, OOD ROC curves, AdaFocal's γ per bin over epochs (SVG
                         written by :mod:`torchcal.report.svg`, no matplotlib; PNG with
                         ``figure_format="png"``); with ``figures="all"`` also each loss's
                         reliability diagrams pre/post T as PNG (test logits pooled over seeds)

A run whose ``results.json`` is missing or malformed is listed (with the file and the reason)
in the report and in ``results.json["errors"]``; the other runs are still reported.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import html
import math
import os
import re
import shutil
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from markdown_it import MarkdownIt

from .._io import (
    atomic_write_files,
    check_own_path,
    json_text,
    make_temp_dir,
    read_json,
    remove_stale_temp_dirs,
    remove_stale_temp_files,
    staged_temp_dir,
)
from .._validation import with_settings
from ..errors import ResultsFileError, TorchcalError
from ..logits_file import load_logits
from ..metrics import ece_noise_floor, entropy
from ..plot import MIN_COUNT
from ..results_file import DEFAULT_PREDICTOR
from ..run_dir import LOSS_STATE_KEY, REPORT_RESULTS_FILE, RunDir, logits_filename
from . import figures as F
from . import svg as S
from . import tables as T
from .aggregate import (
    Group,
    IdentityOf,
    LoadReport,
    TestLogits,
    check_checkpoints,
    group_runs,
    identity_notes,
    load_runs,
    read_test_logits,
)
from .claims import (
    Claim,
    add_confidence_gaps,
    check_claims,
    claims_section,
    claims_verdicts,
    section_markdown,
)

__all__ = ["ReportOutput", "ReportOptions", "build_report", "gamma_history", "prepare_report_dir",
           "write_report_pages", "remove_stale_report_temp_files", "markdown_page",
           "FIGURE_SETS", "FIGURE_FORMATS", "figure_set", "REPORT_PAGES"]

REPORT_SCHEMA = "torchcal.report/1"
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")


@dataclass
class Figure:
    title: str
    path: Path  # absolute
    caption: str = ""


@dataclass
class ReportOutput:
    """What :func:`build_report` wrote and the text of its main tables."""

    out_dir: Path
    report_md: Path
    report_html: Path
    results_json: Path
    results_csv: Path
    summary_csv: Path
    figures: list[Path]
    groups: list[Group]
    errors: list[tuple[str, str]]
    text: str  # the main table(s) as plain text, for printing
    markdown_tables: str = ""
    notes: list[str] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)  # one line per claim, for printing
    verdict_label: str = ""  # what the verdicts are (a shortened run's: not evidence)


def _slug(*parts: str) -> str:
    s = "_".join(p for p in parts if p)
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", s).strip("_")[:120]


def _group_slug(g: Group) -> str:
    """A group's file-name stem; a non-seed predictor (an ensemble) gets its own, so that its
    figure never replaces its seeds' (they shared one file)."""
    kw = "_".join(f"{k}={v}" for k, v in sorted(g.loss_kwargs.items()))
    predictor = "" if g.predictor == DEFAULT_PREDICTOR else g.predictor
    return _slug(g.dataset, g.model, g.loss, kw, predictor, g.variant)


# --------------------------------------------------------------------------------------------
# AdaFocal history
# --------------------------------------------------------------------------------------------
def gamma_history(run_dir: str | os.PathLike) -> np.ndarray | None:
    """AdaFocal's per-bin γ over epochs, shape (E, B), from a run's ``log.jsonl`` (or None).

    Read from the one documented place: the ``gammas`` of each log line's
    :data:`~torchcal.run_dir.LOSS_STATE_KEY` object (``"loss_state": {"gammas": [...], ...}``, as the
    trainer writes it).  None when no line has per-bin γ (a loss without them, a run with no log)
    or when the lines disagree on the number of bins.
    """
    rows = []
    for rec in RunDir(run_dir).read_log():
        state = rec.get(LOSS_STATE_KEY)
        g = state.get("gammas") if isinstance(state, dict) else None
        if g is None:
            continue
        try:
            rows.append(np.asarray(g, dtype=np.float64).ravel())
        except (TypeError, ValueError):
            return None
    if not rows or any(r.shape != rows[0].shape or r.size < 2 for r in rows):
        return None
    return np.stack(rows)


# --------------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------------
_SPARSE_NOTE = (f"Below each diagram: samples per bin (log scale; blue line: accuracy, red "
                f"dashed: mean confidence); bins with fewer than {MIN_COUNT} samples (dotted "
                "line) are faded, with their count on the bar: their accuracy is uncertain by "
                "more than ±0.1.")



class _RunTest(NamedTuple):
    """One run's saved test logits, labels, grid-ECE temperature and logits folder."""

    z: np.ndarray
    y: np.ndarray
    t: float
    logits_dir: Path


RunLogits = list[_RunTest]

#: The figure sets of :func:`build_report` (``--figures``): ``none``; ``default``: the figures
#: that show every loss at once (the reliability overview, the confidence histograms, the OOD
#: ROC curves, AdaFocal's γ), as SVG about 0.1 s of CPU (PNG: 2.1-2.4 s); ``all``: also each loss's
#: reliability diagrams before and after temperature scaling (one PNG per loss by matplotlib,
#: most of the cost).
FIGURE_SETS = ("none", "default", "all")

#: The formats of the default figures (:func:`build_report`'s ``figure_format``): ``svg``
#: (:mod:`torchcal.report.svg`, written by hand: a few percent of matplotlib's CPU, issue 43)
#: or ``png`` (matplotlib, :mod:`torchcal.report.figures`).  ``figures="all"``'s pairs are PNG.
FIGURE_FORMATS = ("svg", "png")


def _save(fmt: str, path: Path, kind: str, *args: Any, **kwargs: Any) -> Path:
    """Draw the figure ``kind`` (a function of :mod:`torchcal.report.svg` and
    :mod:`torchcal.report.figures` alike) as ``fmt`` and write it to ``path`` plus the
    format's suffix."""
    if fmt == "svg":
        return S.save_svg(getattr(S, kind)(*args, **kwargs), path.with_name(path.name + ".svg"))
    return F.save_figure(getattr(F, kind)(*args, **kwargs), path.with_name(path.name + ".png"))


def figure_set(figures: bool | str) -> str:
    """The figure set a ``figures`` argument names (``True``: ``"default"``, ``False``:
    ``"none"``).

    >>> figure_set(True), figure_set(False), figure_set("all")
    ('default', 'none', 'all')
    """
    if figures is True or figures is False:
        return "default" if figures else "none"
    if figures not in FIGURE_SETS:
        raise ValueError(f"Expected `figures` to be a bool or one of {FIGURE_SETS}, got "
                         f"{figures!r}")
    return str(figures)


def _run_test_logits(g: Group, test_logits: TestLogits) -> RunLogits:
    """``(test logits, labels, grid-ECE temperature, logits folder)`` of every run of ``g``
    whose test logits were read (``test_logits``)."""
    out: RunLogits = []
    for r in g.runs:
        zy = test_logits.get(r.logits_dir / logits_filename("test"))
        if zy is None:
            continue
        t = r.results.get("temperatures", {}).get("grid_ece", 1.0) or 1.0
        out.append(_RunTest(zy[0], zy[1], float(t), r.logits_dir))
    return out


def _pooled_test_logits(runs: RunLogits) -> tuple[np.ndarray, np.ndarray, np.ndarray, float] | None:
    """The runs' test logits concatenated, also divided by each run's grid-ECE T."""
    if not runs:
        return None
    return (np.concatenate([r.z for r in runs]),
            np.concatenate([r.z / r.t for r in runs]),
            np.concatenate([r.y for r in runs]), float(np.mean([r.t for r in runs])))


def _top1_confidence(z: np.ndarray) -> np.ndarray:
    p = np.exp(z - z.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)).max(1)


def _noise_floors(groups: Sequence[Group], logits: dict[str, RunLogits], n_bins: int,
                  ) -> dict[str, float]:
    """Per group label: the mean over its runs of the ECE noise floor at the run's test-set
    size, from the run's post-T confidences (:func:`~torchcal.metrics.ece_noise_floor`)."""
    out = {}
    for g in groups:
        runs = logits.get(g.label) or []
        if runs:
            out[g.label] = float(np.mean([
                ece_noise_floor(_top1_confidence(np.asarray(r.z, np.float64) / r.t), n_bins=n_bins)
                for r in runs]))
    return out


def _entropy(z: np.ndarray) -> np.ndarray:
    """Predictive entropy (float64) of saved logits, by :func:`torchcal.metrics.entropy`."""
    return entropy(logits=torch.as_tensor(np.asarray(z, dtype=np.float64)),
                   validate_args=False).numpy()


def _make_figures(groups: Sequence[Group], fig_dir: Path, n_bins: int, notes: list[str],
                  logits: dict[str, RunLogits], every: bool = False, fmt: str = "svg"
                  ) -> dict[tuple[str, str], list[Figure]]:
    """The report's figures per (data set, model); ``every``: also each loss' reliability pair
    (figure set ``all``, PNG); ``fmt``: the other figures' format (:data:`FIGURE_FORMATS`)."""
    out: dict[tuple[str, str], list[Figure]] = {}
    by_dm: dict[tuple[str, str], list[Group]] = {}
    for g in groups:
        by_dm.setdefault((g.dataset, g.model), []).append(g)
    for (ds, model), gs in by_dm.items():
        figs: list[Figure] = []
        try:
            _figures_for(ds, model, gs, figs, fig_dir, n_bins, notes, logits, every, fmt)
        except (ValueError, TypeError, OSError) as exc:  # e.g. seeds with different class counts
            notes.append(f"{ds}/{model}: figures stopped early: {type(exc).__name__}: {exc}")
        out[(ds, model)] = figs
    return out


def _figures_for(ds: str, model: str, gs: Sequence[Group], figs: list[Figure], fig_dir: Path,
                 n_bins: int, notes: list[str], logits: dict[str, RunLogits],
                 every: bool = False, fmt: str = "svg") -> None:
    pooled, conf, acc = _reliability_figures(ds, model, gs, figs, fig_dir, n_bins, notes,
                                             logits, every)
    if pooled:
        path = _save(fmt, fig_dir / f"reliability_overview_{_slug(ds, model)}",
                     "reliability_overview", {k: (v[0], v[2]) for k, v in pooled.items()},
                     n_bins=n_bins,
                     title=f"Reliability before temperature scaling, {ds}/{model} test")
        figs.insert(0, Figure("Reliability overview (pre T)", path,
                              "Reliability diagrams of every loss before temperature scaling "
                              "(test logits pooled over seeds; the ECE in each panel is that of "
                              "the pooled logits, not the mean over seeds of the tables). "
                              + _SPARSE_NOTE))
    if conf:
        path = _save(fmt, fig_dir / f"confidence_{_slug(ds, model)}", "confidence_histograms",
                     conf, n_bins=n_bins, accuracies=acc,
                     title=f"Top-1 confidence, {ds}/{model} test (pre T)")
        figs.append(Figure("Confidence histograms", path,
                           "Histogram of the top-1 confidence on the test set before temperature scaling; "
                           "dashed: mean confidence, solid: accuracy."))
    _ood_roc_figures(ds, model, gs, figs, fig_dir, pooled, logits, fmt)
    _gamma_figures(ds, model, gs, figs, fig_dir, notes, fmt)


def _reliability_figures(ds: str, model: str, gs: Sequence[Group], figs: list[Figure],
                         fig_dir: Path, n_bins: int, notes: list[str],
                         logits: dict[str, RunLogits], every: bool = False):
    """Each group's pooled logits, confidences and accuracy; ``every``: also draw its pre/post-T
    reliability pair."""
    conf: dict[str, np.ndarray] = {}
    acc: dict[str, float] = {}
    pooled: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, float]] = {}
    for g in gs:
        pt = _pooled_test_logits(logits.get(g.label) or [])
        if pt is None:
            notes.append(f"{g.label} ({ds}/{model}): no saved test logits, no reliability diagram.")
            continue
        pooled[g.label] = pt
        pre, post, y, t = pt
        conf[g.label] = _top1_confidence(pre)
        acc[g.label] = float((pre.argmax(1) == y).mean())
        if not every:
            continue
        seeds = f"{len(g.runs)} seed(s) pooled" if len(g.runs) > 1 else "1 run"
        members = g.runs[0].meta.get("members") if len(g.runs) == 1 else None
        if g.predictor != DEFAULT_PREDICTOR and members:
            seeds = f"{g.predictor} of seeds {', '.join(map(str, members))}"
        fig = F.reliability_pair(pre, post, y, n_bins=n_bins, temperature=t,
                                 title=f"{g.label} - {ds}/{model} test ({seeds})")
        path = F.save_figure(fig, fig_dir / f"reliability_{_group_slug(g)}.png")
        figs.append(Figure(f"Reliability: {g.label}", path,
                           f"Reliability diagram of {g.label} on the {ds} test set ({seeds}), "
                           f"before and after temperature scaling (each run's grid-ECE T, mean {t:.2f}); "
                           "the ECE in the panels is that of the pooled logits. " + _SPARSE_NOTE))
    return pooled, conf, acc


def _ood_roc_figures(ds: str, model: str, gs: Sequence[Group], figs: list[Figure],
                     fig_dir: Path, pooled: dict[str, Any], logits: dict[str, RunLogits],
                     fmt: str = "svg") -> None:
    """Draw one entropy ROC figure per OOD set of the runs (groups with pooled logits)."""
    ood_names: list[str] = []
    for g in gs:
        for r in g.runs:
            for n in (r.results.get("ood") or {}):
                if n not in ood_names:
                    ood_names.append(n)
    for name in ood_names:
        curves = {}
        for g in gs:
            if g.label not in pooled:
                continue
            curve = _ood_roc_curve(g, name, logits.get(g.label) or [])
            if curve is not None:
                curves[g.label] = curve
        if curves:
            path = _save(fmt, fig_dir / f"roc_{_slug(ds, model, name)}", "roc_figure", curves,
                         title=f"OOD ROC (entropy), {ds}/{model} test vs {name}")
            figs.append(Figure(f"OOD ROC: {name}", path,
                               f"ROC curves of OOD detection by softmax entropy ({ds} test as "
                               f"negatives, {name} as positives), seeds pooled: one panel per "
                               "loss (blue) over the other losses (grey) and the first loss "
                               "(dashed); titles: AUROC in %, mean ± std over seeds."))


def _ood_roc_curve(g: Group, name: str, runs: RunLogits):
    """``(fpr, tpr, auroc mean, auroc std)`` of a group against OOD set ``name`` (its runs'
    test logits ``runs`` against their saved ``ood_<name>`` logits), or None."""
    s_id, s_ood = [], []
    for run in runs:
        po = run.logits_dir / logits_filename(f"ood_{name}")
        if not po.is_file():
            continue
        try:
            zo = load_logits(po)[0]
        except ResultsFileError:
            continue
        s_id.append(_entropy(run.z))
        s_ood.append(_entropy(zo))
    if not s_id:
        return None
    scores = np.concatenate(s_id + s_ood)
    pos = np.r_[np.zeros(sum(map(len, s_id))), np.ones(sum(map(len, s_ood)))]
    fpr, tpr = F.roc_curve(scores, pos)
    auc = g.mean.get(f"ood.{name}.auroc_entropy", math.nan)
    return (fpr, tpr, auc, g.std.get(f"ood.{name}.auroc_entropy", math.nan))


def _gamma_figures(ds: str, model: str, gs: Sequence[Group], figs: list[Figure],
                   fig_dir: Path, notes: list[str], fmt: str = "svg") -> None:
    """Draw AdaFocal's γ per bin over epochs for every group with a γ history."""
    for g in gs:
        hist = {f"seed {r.seed}": h for r in g.runs if (h := gamma_history(r.run_dir)) is not None}
        if not hist:
            if g.loss == "adafocal":
                notes.append(f"{g.label}: no γ history found in its runs' epoch logs, no γ plot.")
            continue
        gmax = g.loss_kwargs.get("gamma_max", 20.0) if g.loss == "adafocal" else None
        path = _save(fmt, fig_dir / f"gamma_{_group_slug(g)}", "gamma_history_figure", hist,
                     title=f"{g.label}: γ per bin over epochs ({ds}/{model})", gamma_max=gmax)
        figs.append(Figure(f"γ per bin: {g.label}", path,
                           "AdaFocal's γ of each of the equal-mass validation bins after each "
                           "epoch's update (dark: low-confidence bins, light: high), on the same "
                           "y-scale in every panel; dashed: γ_max (or a note when it lies above "
                           "the scale)."))


# --------------------------------------------------------------------------------------------
# documents
# --------------------------------------------------------------------------------------------
_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
td.best{background:#e8f4e8} p.note{font-size:12px;color:#555;margin:.2em 0}
figure{display:inline-block;margin:.6em;vertical-align:top;max-width:100%}
figure img{max-width:100%} figcaption{font-size:12px;color:#555;max-width:800px}
pre{background:#f6f6f6;padding:.6em;overflow:auto} .err{color:#a00}
.md td,.md th{white-space:normal;text-align:left;vertical-align:top}
th{white-space:normal;vertical-align:bottom} div.wide{max-width:100%;overflow-x:auto}
nav.toc{font-size:14px;margin:.4em 0 1em} nav.toc ol{margin:.2em 0;padding-left:1.6em}
nav.toc li{display:inline-block;margin-right:1.4em}
div.preface{border-left:4px solid #888;background:#f4f4f4;padding:.1em 1em;margin:.8em 0}
@media (max-width:900px){th,td{padding:2px 4px;font-size:12px}}
"""


def _markdown_html(md: str) -> str:
    """Markdown (CommonMark and tables) as HTML, by markdown-it-py; HTML in the text is escaped,
    not passed through (the report's text holds run metadata)."""
    return f'<div class="md">{_MARKDOWN.render(md)}</div>'


def _data_uri(path: Path) -> str:
    """The file at ``path`` (a PNG or an SVG figure) as a base64 ``data:`` URI."""
    mime = "image/svg+xml" if path.suffix == ".svg" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def markdown_page(title: str, markdown: str, base: str | os.PathLike) -> str:
    """A Markdown report as a self-contained HTML page in the reports' style: the images it
    links (``![name](file.png)`` or ``.svg``, relative to ``base``) embedded as base64.

    >>> "<h1>r</h1>" in markdown_page("t", "# r", ".")
    True
    """
    def embed(m: re.Match) -> str:
        path = Path(base) / html.unescape(m.group(1))
        if not path.is_file():
            return m.group(0)
        return f'src="{_data_uri(path)}"'

    body = re.sub(r'src="([^":]+\.(?:png|svg))"', embed, _markdown_html(markdown))
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
            f"{body}\n</body></html>\n")


#: A report's pages (:func:`write_report_pages`); :func:`build_report` writes its data files
#: (``results.json``, ``results.csv``, ``summary.csv``) with them.
REPORT_PAGES = ("report.md", "report.html")
_DATA_FILES = (REPORT_RESULTS_FILE, "results.csv", "summary.csv")


#: The figures' files in ``OUT/figures`` (replaced together with the pages).
_FIGURE_FILES = ("*.svg", "*.png")


def write_report_pages(out: str | os.PathLike, title: str, markdown: str,
                       html_text: str | None = None, *,
                       others: dict[str, str] | None = None,
                       figures: Path | None = None) -> tuple[Path, Path]:
    """Write a report's two pages into ``out``: ``report.md`` (``markdown``) and
    ``report.html`` (``html_text``; None: :func:`markdown_page` of the Markdown, its figures
    embedded), and the files ``others`` (``{name: text}``, e.g. ``results.json``), all
    together (:func:`torchcal._io.atomic_write_files`): each is written to a temporary file
    first and only when all are written are they moved into place, so a failure (a full disk)
    leaves every old page, never a new ``report.md`` beside an old ``report.html``.  Every
    report of the demo is written by this function (:func:`build_report`'s, the uncertainty
    suite's).  ``figures``: a folder of figures drawn for these pages
    (:func:`figure_stage`); in the same commit they replace the figures of ``out/figures``
    (the earlier report's), and the folder is removed.  A kill or a full disk at any point
    leaves the old pages and figures or the new ones, never a mix.  Returns the two pages'
    paths."""
    out = Path(out)
    if html_text is None:
        html_text = markdown_page(title, markdown, out)
    texts = {**dict(zip(REPORT_PAGES, (markdown, html_text), strict=True)), **(others or {})}
    remove_stale_temp_files(out, texts)  # a killed writer's, before this one writes
    swap = None if figures is None else _FigureSwap(out / "figures", figures)
    try:
        md, page = atomic_write_files({out / name: text for name, text in texts.items()},
                                      before_commit=swap)[:2]
    finally:
        if swap is not None:
            swap.clean()
    return md, page


class _FigureSwap:
    """The figures' part of a report's commit (called in it): the earlier figures of
    ``fig_dir`` move to a folder of their own, the staged ones into ``fig_dir``; renames only.
    :meth:`clean` removes both folders afterwards (or the staged one when the commit failed
    before this ran)."""

    def __init__(self, fig_dir: Path, staged: Path) -> None:
        self.fig_dir, self.staged, self.old = fig_dir, staged, None

    def __call__(self) -> None:
        new = sorted(self.staged.iterdir())
        if not new and not self.fig_dir.exists():
            return  # no figures before, none now: no empty folder
        self.fig_dir.mkdir(exist_ok=True)
        check_own_path(self.fig_dir, "Figures directory", directory=True)
        self.old = make_temp_dir(self.staged.parent, ".figures-old.tmp-")
        for pattern in _FIGURE_FILES:
            for f in sorted(self.fig_dir.glob(pattern)):
                os.replace(f, self.old / f.name)
        for f in new:
            os.replace(f, self.fig_dir / f.name)

    def clean(self) -> None:
        for d in (self.staged, self.old):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)


#: The prefix of the hidden folder a report draws its figures into.
_FIGURE_STAGE = ".figures.tmp-"


def figure_stage(out: str | os.PathLike) -> Path:
    """A new hidden folder in ``out`` to draw a report's figures into; the report's commit
    (:func:`write_report_pages` with ``figures=``) moves them into ``out/figures``."""
    return make_temp_dir(out, _FIGURE_STAGE)


def remove_stale_report_temp_files(out: str | os.PathLike) -> list[Path]:
    """Remove the temporary files that a killed report writer left in ``out``: those of its
    pages, data files and figures (``.report.md.PID-RANDOM.tmp``,
    ``figures/.NAME.svg.PID-RANDOM.tmp``, ``.png``), of torchcal's naming only and only when their
    writer is gone (:func:`torchcal._io.remove_stale_temp_files`; no link is followed).
    Returns the removed paths."""
    out = Path(out)
    return (remove_stale_temp_files(out, (*REPORT_PAGES, *_DATA_FILES))
            + remove_stale_temp_files(out / "figures", _FIGURE_FILES)
            + remove_stale_temp_dirs(out, ("figures", "figures-old")))


@dataclass(frozen=True)
class ReportOptions:
    """What :func:`build_report` reads and shows (each field also a keyword of
    :func:`build_report`, which wins over ``options``).

    Attributes:
        title: report title.
        intro: Markdown paragraphs placed under the title (the demo describes its setup here).
        appendix: Markdown placed after the runs table (the demo's setting in full).
        verdict_label: with ``claims``, what every verdict line says beside "Verdict" (the
            demo: that a shortened or ``--quick`` run's verdicts are not the papers' setting).
        preface: Markdown shown in a box of its own at the head of the claims section (the
            demo: the committed full run's verdicts, labelled as such).
        n_bins: bins of the reliability diagrams and histograms.
        figures: the figures to draw (they need the runs' saved logits): a set of
            :data:`FIGURE_SETS`: ``"default"`` (or ``True``) the figures of every loss at once,
            ``"all"`` also each loss's reliability diagrams before and after temperature
            scaling, ``"none"`` (or ``False``) none.
        figure_format: the format of the default figures (:data:`FIGURE_FORMATS`): ``"svg"``
            (written by :mod:`torchcal.report.svg`, no matplotlib) or ``"png"`` (matplotlib);
            the pairs of ``figures="all"`` are PNG either way.
        claims: the claims to test (a sequence of :class:`~torchcal.report.claims.Claim`: a
            benchmark's own, e.g. the seed papers' :data:`torchcal.experiments.claims.CLAIMS`;
            empty or ``False``: none): add the section "The papers' claims on this benchmark"
            (:func:`torchcal.report.claims.claims_markdown`) and each run's mean confidence
            minus accuracy (``test.pre.conf_minus_acc``, from its saved test logits).
        checkpoint: with ``paths``, read the evaluations of this checkpoint (``"last"``:
            ``results.json``; ``"best"``: ``results-best.json``).
        mix_checkpoints: allow one table to hold runs evaluated from different checkpoints
            (refused otherwise; the Runs table states each group's checkpoint either way).
        identity_of: with ``paths``, how a run whose results record no identity (written
            before ``meta.identity``) gets it from its ``config.json``
            (:data:`~torchcal.report.aggregate.IdentityOf`; ``torchcal report`` and the demo
            give :func:`torchcal.train.config.config_identity`); None: such a run has none.
    """

    title: str = "torchcal report"
    intro: str = ""
    appendix: str = ""
    verdict_label: str = ""
    preface: str = ""
    n_bins: int = 15
    figures: bool | str = True
    figure_format: str = "svg"
    claims: Sequence[Claim] | bool = ()
    checkpoint: str = "last"
    mix_checkpoints: bool = False
    identity_of: IdentityOf | None = None


def build_report(
    paths: Iterable[str | os.PathLike] | None = None,
    out_dir: str | os.PathLike = "torchcal-report",
    *,
    runs: LoadReport | None = None,
    options: ReportOptions | None = None,
    **settings: Any,
) -> ReportOutput:
    """Aggregate the evaluated runs found under ``paths`` into ``out_dir``.

    Args:
        paths: run directories (searched recursively for ``results.json``) or results files.
        out_dir: output directory (created).
        runs: an already loaded :class:`LoadReport` instead of ``paths``.
        options: what the report reads and shows (:class:`ReportOptions`; default: its
            defaults).
        **settings: fields of :class:`ReportOptions` (``title="..."``, ``n_bins=10``, ...),
            replacing those of ``options``.

    Raises:
        ResultsFileError: when no run could be read at all (the message lists every bad file).
        TypeError: a keyword that is no field of :class:`ReportOptions`.
    """
    o = with_settings(options, ReportOptions(), settings, "build_report")
    figure_set(o.figures)  # checked before anything is read
    if o.figure_format not in FIGURE_FORMATS:
        raise ValueError(f"Expected `figure_format` to be one of {FIGURE_FORMATS}, got "
                         f"{o.figure_format!r}")
    if o.claims is True:
        raise TypeError("Expected `claims` to be the claims to test (a sequence of Claim, e.g. "
                        "torchcal.experiments.claims.CLAIMS) or False, got True")
    runs, errors = _readable_runs(paths, runs, o.checkpoint, o.mix_checkpoints, o.identity_of)
    test_logits = read_test_logits(runs.runs)  # read once: claims, noise floors and figures
    if o.claims:
        add_confidence_gaps(runs.runs, test_logits)
    groups = group_runs(runs.runs)
    for g in groups:  # runs of one loss that are no seeds of one configuration: said
        if g.apart_from is not None:
            warnings.warn(_identity_note(g, Path(out_dir)), UserWarning,
                          stacklevel=2)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_report_temp_files(out)  # a killed writer's, before this one writes
    with _staged_figures(out) as fig_dir:  # drawn aside, moved into out/figures with the pages
        return _build(out, runs, groups, errors, fig_dir, o, test_logits)


@contextlib.contextmanager
def _staged_figures(out: Path) -> Iterator[Path]:
    """:func:`figure_stage` for the block, removed when the block ends without committing it
    (an error, Ctrl-C): the earlier report's figures stay as they are."""
    with staged_temp_dir(out, _FIGURE_STAGE) as stage:
        yield stage


def _build(out: Path, runs: LoadReport, groups: list[Group], errors: list, fig_dir: Path,
           o: ReportOptions, test_logits: TestLogits) -> ReportOutput:
    """:func:`build_report` once its runs are read: figures (into ``fig_dir``), tables, pages."""
    title, n_bins, claims = o.title, o.n_bins, o.claims
    intro, appendix, verdict_label, preface = o.intro, o.appendix, o.verdict_label, o.preface
    drawn, figure_format = figure_set(o.figures), o.figure_format
    notes: list[str] = identity_notes(groups, lambda p: T.relative_run_dir(p, out))
    logits = {g.label: _run_test_logits(g, test_logits) for g in groups}
    floors = _noise_floors(groups, logits, n_bins)
    figs = (_make_figures(groups, fig_dir, n_bins, notes, logits, every=drawn == "all",
                          fmt=figure_format) if drawn != "none" else {})
    table_sets = T.tables_for(groups, floors)
    runs_table = _runs_table(groups, out)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    tested = check_claims(groups, claims) if claims else []  # computed once per report
    claims_blocks = (claims_section(groups, claims, verdict_label=verdict_label, results=tested)
                     if claims else [])
    claims_md = section_markdown(claims_blocks)
    verdicts = claims_verdicts(groups, claims, results=tested) if claims_blocks else []
    page = _Page(title, (intro, appendix, preface), stamp, len(runs.runs), groups, table_sets,
                 figs, runs_table, notes, errors)
    md_text = _report_markdown(page, out, claims_md)
    html_text = _report_html(page, claims_blocks)
    doc = _results_doc(stamp, groups, floors, errors, out)
    data = dict(zip(_DATA_FILES, (json_text(doc, indent=1), T.runs_csv(groups, out),
                                  T.groups_csv(groups)), strict=True))
    report_md, report_html = write_report_pages(out, title, md_text, html_text, others=data,
                                                figures=fig_dir)
    paths_out = dict(report_md=report_md, report_html=report_html,
                     **{key: out / name for key, name in zip(
                         ("results_json", "results_csv", "summary_csv"), _DATA_FILES,
                         strict=True)})
    all_figs = [out / "figures" / f.path.name for fs in figs.values() for f in fs]
    text_parts = [tabs[0].to_text() for _key, tabs in table_sets]
    md_tables = [tabs[0].to_markdown() for _key, tabs in table_sets]
    return ReportOutput(out_dir=out, figures=all_figs, groups=groups, errors=errors,
                        text="\n".join(text_parts), markdown_tables="\n".join(md_tables),
                        notes=notes, verdicts=verdicts, verdict_label=verdict_label,
                        **paths_out)


def _identity_note(g: Group, out: Path) -> str:
    """:func:`identity_notes`' line of one group kept apart."""
    return identity_notes([g], lambda p: T.relative_run_dir(p, out))[0]


def _readable_runs(paths: Iterable[str | os.PathLike] | None, runs: LoadReport | None,
                   checkpoint: str, mix_checkpoints: bool, identity_of: IdentityOf | None = None,
                   ) -> tuple[LoadReport, list]:
    """The loaded runs and their load errors; raise when no run could be read."""
    if runs is None:
        if paths is None:
            raise ValueError("Expected `paths` or `runs`, got neither")
        runs = load_runs(paths, checkpoint, identity_of=identity_of)
    errors = list(runs.errors)
    if not runs.runs:
        detail = "; ".join(msg for _p, msg in errors) or "nothing given"
        raise ResultsFileError(f"No evaluated run could be read: {detail}")
    check_checkpoints(runs.runs, mix_checkpoints)
    return runs, errors


def _runs_table(groups: Sequence[Group], out: Path) -> T.Table:
    """The "Run directories" table: seeds, checkpoint and run directories of each group."""
    return T.Table("Run directories", ["Group", "Seeds", "Checkpoint", "Run directories"], [
        [T.Cell(f"{g.label} ({g.dataset}/{g.model})"), T.Cell(", ".join(map(str, g.seeds))),
         T.Cell(", ".join(sorted({r.checkpoint for r in g.runs}))),
         T.Cell(", ".join(T.relative_run_dir(r.run_dir, out) for r in g.runs))]
        for g in groups],
        ["Run directories relative to this report. Checkpoint: the evaluated checkpoint "
         "(last: the last epoch's, as the papers report; best: by the validation metric)."])


_SETTING = "This run"  # the heading of the intro, which follows the claims


class _Page(NamedTuple):
    """What report.md and report.html both show; ``prose``: the intro, the appendix and the
    preface (Markdown)."""

    title: str
    prose: tuple[str, str, str]
    stamp: str
    n_runs: int
    groups: Sequence[Group]
    table_sets: Any
    figs: dict[tuple[str, str], list[Figure]]
    runs_table: T.Table
    notes: list[str]
    errors: list


def _report_markdown(page: _Page, out: Path, claims_md: str) -> str:
    """The text of report.md, in the order of report.html (the claims first, the figures
    after)."""
    title, prose, stamp, n_runs, groups, table_sets, figs, runs_table, notes, errors = page
    intro, appendix, preface = prose
    md = [f"# {title}", "", f"Generated {stamp} from {n_runs} evaluated run(s) in "
          f"{len(groups)} group(s).", ""]
    head, _sep, rest = claims_md.partition("\n\n")
    if claims_md:
        md += [head, ""]
    if preface:
        md += ["\n".join(f"> {ln}" if ln else ">" for ln in preface.strip().splitlines()), ""]
    if rest:
        md += [rest.strip(), ""]
    if intro:
        md += [f"## {_SETTING}", "", intro.strip(), ""]
    for key, tabs in table_sets:
        md += [f"## {key[0]} / {key[1]}", ""]
        for tab in tabs:
            md += [tab.to_markdown(), ""]
        for f in figs.get(key, []):
            rel = f"figures/{f.path.name}"  # where the commit moves it
            md += [f"#### {f.title}", "", f"![{f.title}]({rel})", "", f"_{f.caption}_", ""]
    md += ["## Runs", "", runs_table.to_markdown(), ""]
    if appendix:
        md += [appendix.strip(), ""]
    if notes:
        md += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    if errors:
        md += ["## Skipped files", ""] + [f"- `{p}`: {m}" for p, m in errors] + [""]
    return "\n".join(md).rstrip() + "\n"


def _with_contents(body: list[str]) -> list[str]:
    """``body`` with an anchor before every ``<h2>`` and a table of contents of them in front."""
    text, entries = "\n".join(body), []

    def number(m: re.Match) -> str:
        entries.append(m.group(1))
        return f'<a id="s{len(entries)}"></a><h2>{m.group(1)}</h2>'

    text = re.sub(r"<h2>(.*?)</h2>", number, text)
    items = "".join(f'<li><a href="#s{i}">{e}</a></li>' for i, e in enumerate(entries, 1))
    return [f'<nav class="toc"><b>Contents</b><ol>{items}</ol></nav>', text] if entries else [text]


def _report_html(page: _Page, claims_blocks: list) -> str:
    """The text of report.html (figures embedded as base64 SVG or PNG): a table of contents, the
    claims (with the preface in its box), the intro, then the tables and figures;
    ``claims_blocks``: :func:`claims_section`'s blocks."""
    title, prose, stamp, n_runs, groups, table_sets, figs, runs_table, notes, errors = page
    intro, appendix, preface = prose
    head = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\">",
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            f"<p>Generated {stamp} from {n_runs} evaluated run(s) in {len(groups)} group(s).</p>"]
    h: list[str] = []
    box = f'<div class="preface">{_markdown_html(preface)}</div>' if preface else ""
    for i, block in enumerate(claims_blocks):
        h.append(block.to_html() if isinstance(block, T.Table) else _markdown_html(block))
        if i == 0 and box:  # under the section's heading
            h.append(box)
    if box and not claims_blocks:
        h.append(box)
    if intro:
        h += [f"<h2>{_SETTING}</h2>", _markdown_html(intro)]
    for key, tabs in table_sets:
        h.append(f"<h2>{html.escape(key[0])} / {html.escape(key[1])}</h2>")
        h += [t.to_html() for t in tabs]
        for f in figs.get(key, []):
            h.append(f"<figure><img alt=\"{html.escape(f.title)}\" src=\"{_data_uri(f.path)}\">"
                     f"<figcaption>{html.escape(f.caption)}</figcaption></figure>")
    h += ["<h2>Runs</h2>", runs_table.to_html()]
    if appendix:
        h.append(_markdown_html(appendix))
    if notes:
        h.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    if errors:
        h.append("<h2>Skipped files</h2><ul>" + "".join(
            f"<li class=\"err\"><code>{html.escape(p)}</code>: {html.escape(m)}</li>" for p, m in errors)
            + "</ul>")
    return "\n".join(head + _with_contents(h) + ["</body></html>"]) + "\n"


def _results_doc(stamp: str, groups: Sequence[Group], floors: dict, errors: list,
                 out: Path) -> dict:
    """The content of results.json: groups, runs (directories relative to ``out``, the report's
    directory) and skipped files."""
    return {
        "schema": REPORT_SCHEMA,
        "generated": stamp,
        "groups": [{
            "dataset": g.dataset, "model": g.model, "loss": g.loss, "loss_kwargs": g.loss_kwargs,
            "predictor": g.predictor, "label": g.label, "identity": g.identity,
            "n_runs": len(g.runs), "seeds": g.seeds,
            "runs": [T.relative_run_dir(r.run_dir, out) for r in g.runs],
            "mean": g.mean, "std": g.std, "count": g.count,
            "ece_noise_floor": floors.get(g.label),
        } for g in groups],
        "runs": [{"run_dir": T.relative_run_dir(r.run_dir, out), "meta": r.meta,
                  "results": r.results}
                 for g in groups for r in g.runs],
        "errors": [{"path": p, "error": m} for p, m in errors],
    }


def _is_report_results(path: Path) -> bool:
    try:
        doc = read_json(path, what="Results file")
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str(doc.get("schema", "")).startswith(REPORT_SCHEMA.split("/")[0] + "/")


def prepare_report_dir(out: Path, option: str = "--out") -> list[Path]:
    """Make ``out`` ready for a report: refuse a run directory.  An earlier report's figures
    (``figures/*.svg``, ``*.png``) stay until the new report's commit replaces them together
    with its pages (:func:`write_report_pages`).  Returns the removed files: none (kept for
    callers of earlier versions).

    Raises:
        TorchcalError: ``out`` is a file, or holds a training run.
        UnsafePathError: ``out/figures`` is a symbolic link (its target is not the report's).
    """
    out = Path(out)
    if not out.exists():
        return []
    if not out.is_dir():
        raise TorchcalError(f"Expected `{option}` to be a directory, got the file {str(out)!r}")
    rdir = RunDir(out)
    held = [p.name for p in (rdir.config, rdir.log, rdir.checkpoint_dir) if p.exists()]
    if rdir.results().is_file() and not _is_report_results(rdir.results()):
        held.append(rdir.results().name)
    if held:
        raise TorchcalError(
            f"Expected `{option}` to be a new directory or an earlier report's, but "
            f"{str(out)!r} holds a training run ({', '.join(held)}), which the report's files "
            "would replace: choose another directory")
    check_own_path(out / "figures", "Figures directory", directory=True)  # never followed
    return []  # the earlier figures are replaced in the report's commit, with its pages
