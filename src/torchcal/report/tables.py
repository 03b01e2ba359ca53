"""Tables in the papers' layout, rendered as Markdown, HTML, plain text and CSV.

The main table (one per data set and model, one row per loss) follows Mukhoti et al. 2020 and
Ghosh et al. 2022: ECE, AdaECE, Classwise-ECE and NLL before temperature scaling ("pre T") and
after it ("post T (T)"), then the test error.  Calibration errors and the error are in percent,
NLL in nats.  Post-T columns use the grid-ECE temperature, except AdaECE which uses the
grid-AdaECE temperature (AdaFocal's tables).  Each cell is ``mean ± std`` over seeds (sample
std; a single run shows the mean only).  The best value of a column (the lowest, or the highest
for AUROC/AUPR) is marked (bold in Markdown/HTML, ``*`` in plain text) only when the difference
is beyond the seeds' spread: its mean ± std interval does not overlap the mean ± std interval of
any other row.  A column with a single run in a row (no spread) or a best within another row's
spread has no mark (:func:`beyond_noise`).

A post-hoc number worse than the same row's number before the post-hoc step (higher; lower for
AUROC), as displayed, carries :data:`WORSE_MARK`, and the table's notes then hold
:data:`WORSE_NOTE` (:func:`worse_than`).  The NLL after the grid-ECE temperature (the papers'
convention) stands beside the NLL after the NLL-fitted temperature.
"""

from __future__ import annotations

import csv
import html
import io
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..results_file import DEFAULT_PREDICTOR, PREDICTORS
from .aggregate import Group, loss_label, mean_std

__all__ = [
    "Cell",
    "Table",
    "fmt_mean_std",
    "main_table",
    "temperature_table",
    "ood_tables",
    "extra_metrics_table",
    "ensemble_table",
    "tables_for",
    "beyond_noise",
    "groups_csv",
    "runs_csv",
    "worse_than",
    "WORSE_MARK",
    "WORSE_NOTE",
]

#: Appended to a post-hoc number worse than the number before the post-hoc step.
WORSE_MARK = "†"
#: The legend line of :data:`WORSE_MARK`, in the notes of a table that shows it.
WORSE_NOTE = (f"{WORSE_MARK}: worse after the post-hoc step than before it (higher; lower for "
              "AUROC and AUPR) in the same row, as displayed: temperature scaling made this "
              "number worse.")


@dataclass
class Cell:
    text: str
    value: float = math.nan  # rounded value used for best marking (NaN: not comparable)
    best: bool = False
    spread: float = math.nan  # std over seeds, in the displayed unit (NaN: a single run)


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[Cell]]
    notes: list[str] = field(default_factory=list)
    short_header: list[str] | None = None  # for the plain-text (terminal) rendering

    def to_markdown(self) -> str:
        def esc(s: str) -> str:
            return s.replace("|", "\\|")

        lines = [f"### {self.title}", "", "| " + " | ".join(esc(h) for h in self.header) + " |",
                 "|" + "|".join(["---"] + ["---:"] * (len(self.header) - 1)) + "|"]
        for row in self.rows:
            cells = [f"**{esc(c.text)}**" if c.best else esc(c.text) for c in row]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += [f"{n}" for n in self.notes]
        return "\n".join(lines).rstrip() + "\n"

    def to_html(self) -> str:
        # the wrapper scrolls a wide table in its own box, never the page
        out = [f"<h3>{html.escape(self.title)}</h3>", "<div class=\"wide\"><table>",
               "<thead><tr>"]
        out += [f"<th>{html.escape(h)}</th>" for h in self.header]
        out.append("</tr></thead><tbody>")
        for row in self.rows:
            out.append("<tr>" + "".join(
                f"<td class=\"{'best' if c.best else ''}\">"
                + (f"<b>{html.escape(c.text)}</b>" if c.best else html.escape(c.text)) + "</td>"
                for c in row) + "</tr>")
        out.append("</tbody></table></div>")
        out += [f"<p class=\"note\">{html.escape(n)}</p>" for n in self.notes]
        return "\n".join(out) + "\n"

    def to_text(self) -> str:
        cells = [self.short_header or self.header] + [[(c.text + " *") if c.best else c.text for c in r] for r in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.header))]
        lines = [self.title]
        for j, r in enumerate(cells):
            lines.append("  ".join(s.ljust(w) if i == 0 else s.rjust(w)
                                   for i, (s, w) in enumerate(zip(r, widths, strict=True))))
            if j == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines += [n for n in self.notes if n == WORSE_NOTE]  # the terminal shows the mark's legend
        return "\n".join(lines) + "\n"


def fmt_mean_std(mean: float, std: float, digits: int) -> str:
    """``'21.03 ± 1.20'``; a NaN std (single run) shows the mean only; NaN mean shows ``'-'``.

    >>> fmt_mean_std(21.034, 1.2, 2), fmt_mean_std(0.5, float("nan"), 3), fmt_mean_std(float("nan"), 0.0, 1)
    ('21.03 ± 1.20', '0.500', '-')
    """
    if math.isnan(mean):
        return "-"
    if math.isnan(std):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def worse_than(post: float, pre: float, digits: int, higher_better: bool = False) -> bool:
    """Whether a post-hoc number is worse than the pre-hoc one as both are displayed
    (rounded to ``digits``); NaN on either side is never worse.

    >>> worse_than(0.2461, 0.2109, 3), worse_than(0.2111, 0.2109, 3), worse_than(90.0, 91.0, 2, True)
    (True, False, True)
    """
    if math.isnan(post) or math.isnan(pre):
        return False
    a, b = round(post, digits), round(pre, digits)
    return a < b if higher_better else a > b


def _cell(g: Group, key: str, scale: float, digits: int, temp_key: str | None = None,
          pre_key: str | None = None, higher_better: bool = False) -> Cell:
    """``mean ± std`` of ``key``, `` (T)`` with ``temp_key``, and :data:`WORSE_MARK` when
    ``pre_key``'s mean (the number before the post-hoc step) is better."""
    m = g.mean.get(key, math.nan) * scale
    s = g.std.get(key, math.nan) * scale
    text = fmt_mean_std(m, s, digits)
    if temp_key is not None and not math.isnan(m):
        t = g.mean.get(temp_key, math.nan)
        if not math.isnan(t):
            text += f" ({t:.2f})"
    if pre_key is not None and worse_than(m, g.mean.get(pre_key, math.nan) * scale, digits,
                                          higher_better):
        text += f" {WORSE_MARK}"
    return Cell(text=text, value=round(m, digits) if not math.isnan(m) else math.nan,
                spread=s)


def _worse_notes(rows: Sequence[Sequence[Cell]]) -> list[str]:
    """``[WORSE_NOTE]`` when a cell of ``rows`` carries :data:`WORSE_MARK`, else ``[]``."""
    return [WORSE_NOTE] if any(c.text.endswith(WORSE_MARK) for r in rows for c in r) else []


def beyond_noise(values: Sequence[float], spreads: Sequence[float], *,
                 higher_better: bool = False) -> int | None:
    """Index of the best value when it is beyond the noise of every other one, else None.

    The best (lowest, or highest with ``higher_better``) is beyond noise when its interval
    ``value ± spread`` does not overlap any other entry's ``value ± spread``.  A NaN spread (a
    single run: its noise is unknown) or a tie makes it not beyond noise.  NaN values are left
    out.

    >>> beyond_noise([6.0, 20.0], [1.0, 10.0]), beyond_noise([3.0, 4.0], [1.0, 1.0])
    (0, None)
    >>> beyond_noise([3.0, 9.0], [0.5, float("nan")]), beyond_noise([90.0, 80.0], [1.0, 2.0], higher_better=True)
    (None, 0)
    """
    items = [(v, sp, i) for i, (v, sp) in enumerate(zip(values, spreads, strict=True))
             if not math.isnan(v)]
    if len(items) < 2:
        return None
    sign = -1.0 if higher_better else 1.0
    items.sort(key=lambda t: sign * t[0])
    (bv, bs, bi), rest = items[0], items[1:]
    if math.isnan(bs) or any(math.isnan(sp) for _v, sp, _i in rest):
        return None
    if all(sign * (v - bv) > bs + sp for v, sp, _i in rest):
        return bi
    return None


def _mark_best(rows: list[list[Cell]], higher_better: Sequence[bool | None]) -> None:
    """Mark per column (from column 1) the best value when it is beyond the seeds' spread
    (:func:`beyond_noise`); None in ``higher_better`` skips the column."""
    for j, hb in enumerate(higher_better, start=1):
        if hb is None:
            continue
        i = beyond_noise([r[j].value for r in rows], [r[j].spread for r in rows],
                         higher_better=bool(hb))
        if i is not None:
            rows[i][j].best = True


_BEST_NOTE = ("Bold: the best of the column, marked only when its mean ± std does not overlap "
              "any other row's mean ± std (a difference beyond the seeds' spread); no bold: the "
              "best is within noise, or a row has a single run.")


#: (column name, metric key, scale, digits, post-T method or None)
MAIN_COLUMNS = (
    ("ECE", "ece", 100.0, 2, "grid_ece"),
    ("AdaECE", "adaptive_ece", 100.0, 2, "grid_adaece"),
    ("Classwise-ECE", "classwise_ece", 100.0, 2, "grid_ece"),
    ("NLL", "nll", 1.0, 3, "grid_ece"),
)


def _title(groups: Sequence[Group], what: str) -> str:
    g = groups[0]
    return f"{what}: {g.dataset} / {g.model}"


def _seeds_note(groups: Sequence[Group]) -> str:
    """How many seeds each row averages (rows of a pooled predictor, an ensemble, named apart).

    >>> from torchcal.report.aggregate import RunRecord
    >>> r = RunRecord(None, None, {}, {}, {})
    >>> _seeds_note([Group("d", "m", "ce", {}, [r, r, r]), Group("d", "m", "ce", {}, [r], predictor="ensemble")])
    'mean ± std over 3 seed(s) (sample std); ensemble rows pool runs and are never averaged with the seeds.'
    """
    ns = sorted({len(g.runs) for g in groups if g.predictor == DEFAULT_PREDICTOR})
    n = "/".join(str(x) for x in ns)
    note = f"mean ± std over {n} seed(s) (sample std)" if ns else ""
    pooled = sorted({PREDICTORS.get(g.predictor, g.predictor) for g in groups
                     if g.predictor != DEFAULT_PREDICTOR})
    if pooled:
        note += ("; " if note else "") + (f"{', '.join(pooled)} rows pool runs and are never "
                                          "averaged with the seeds")
    return note + "."


def _noise_floor_note(groups: Sequence[Group], noise_floor: Mapping[str, float]) -> str:
    vals = [100.0 * noise_floor[g.label] for g in groups if g.label in noise_floor]
    if not vals:
        return ""
    n = sorted({int(g.mean.get("n.test", math.nan)) for g in groups
                if not math.isnan(g.mean.get("n.test", math.nan))})
    size = f"{'/'.join(str(x) for x in n)} test samples" if n else "this test-set size"
    lo, hi = min(vals), max(vals)
    value = f"{lo:.2f}%" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}% (by loss)"
    return (f"Noise floor: a perfectly calibrated model with these post-T confidences would "
            f"still show an ECE of about {value} on {size} (labels drawn from the confidences "
            "themselves, mean over 200 draws); ECE differences of that size are noise, not "
            "calibration.")


def main_table(groups: Sequence[Group], noise_floor: Mapping[str, float] | None = None) -> Table:
    """The papers' table for groups of one (dataset, model): pre T | post T (T) per metric.

    ``noise_floor`` maps a group label to its ECE noise floor (:func:`~torchcal.metrics.
    ece_noise_floor`, a fraction); given, the notes state it.
    """
    header = ["Loss"]
    for name, _key, _s, _d, _m in MAIN_COLUMNS:
        header += [f"{name} pre T", f"{name} post T (T)"]
    header += ["NLL post T (NLL-fitted T)", "Error"]
    rows = []
    for g in groups:
        row = [Cell(g.label)]
        for _name, key, scale, digits, method in MAIN_COLUMNS:
            row.append(_cell(g, f"test.pre.{key}", scale, digits))
            row.append(_cell(g, f"test.post.{method}.{key}", scale, digits, f"temperature.{method}",
                             pre_key=f"test.pre.{key}"))
        row.append(_cell(g, "test.post.nll.nll", 1.0, 3, "temperature.nll", pre_key="test.pre.nll"))
        row.append(_cell(g, "test.pre.error", 100.0, 2))
        rows.append(row)
    _mark_best(rows, [False] * (len(header) - 1))
    notes = [
        "ECE, AdaECE (equal-mass ECE), Classwise-ECE and error in %, NLL in nats; "
        f"{groups[0].runs[0].results.get('n_bins', 15)} bins; test set. " + _seeds_note(groups),
        "post T: after temperature scaling with T chosen on the validation set by grid search "
        "(0.1..10, step 0.1) on ECE (on AdaECE for the AdaECE column), the papers' convention "
        "for every metric; (T) is the mean temperature. NLL post T (NLL-fitted T): after the "
        "temperature that minimises the validation NLL (Guo et al. 2017).",
        _BEST_NOTE, *_worse_notes(rows),
    ]
    floor_note = _noise_floor_note(groups, noise_floor or {})
    if floor_note:
        notes.append(floor_note)
    short = ["Loss"]
    for name, *_ in MAIN_COLUMNS:
        name = name.replace("Classwise-", "CW-")
        short += [name, "post T (T)"]
    return Table(_title(groups, "Calibration"), header, rows, notes,
                 short_header=short + ["post NLL T", "Error"])


def temperature_table(groups: Sequence[Group]) -> Table:
    methods = []
    for g in groups:
        for k in g.mean:
            if k.startswith("temperature.") and k[12:] not in methods:
                methods.append(k[12:])
    order = ["grid_ece", "grid_adaece", "grid_nll", "nll"]
    methods.sort(key=lambda m: (order.index(m) if m in order else len(order), m))
    header = ["Loss"] + [f"T {m}" for m in methods]
    rows = [[Cell(g.label)] + [_cell(g, f"temperature.{m}", 1.0, 2) for m in methods] for g in groups]
    notes = ["Optimal temperatures fitted on the validation set: grid_ece / grid_adaece / grid_nll "
             "choose T in 0.1..10 by the lowest validation ECE / AdaECE / NLL; nll minimises the "
             "NLL continuously (Guo et al. 2017). T > 1: over-confident, T < 1: under-confident."]
    if "calibrate_then_pool" in methods:
        notes.append("calibrate_then_pool (ensembles): the mean of the members' own grid-ECE "
                     "temperatures, each fitted on the member's validation logits before "
                     "pooling; calibrate_then_pool_nll: the same with NLL-fitted temperatures.")
    return Table(_title(groups, "Temperatures"), header, rows, notes)


#: (column, key suffix, scale, digits, higher is better)
OOD_COLUMNS = (
    ("AUROC entropy pre T", "auroc_entropy", 100.0, 2, True),
    ("AUROC entropy post T", "post_auroc_entropy", 100.0, 2, True),
    ("AUROC max-prob", "auroc_max_prob", 100.0, 2, True),
    ("FPR@95 entropy (FPR on OOD at 95% TPR of ID)", "fpr95_entropy", 100.0, 2, False),
    ("AUPR entropy", "aupr_entropy", 100.0, 2, True),
)


def ood_tables(groups: Sequence[Group]) -> list[Table]:
    names: list[str] = []
    for g in groups:
        for k in g.mean:
            if k.startswith("ood."):
                n = k.split(".")[1]
                if n not in names:
                    names.append(n)
    tables = []
    for name in names:
        header = ["Loss"] + [c[0] for c in OOD_COLUMNS]
        rows = [[Cell(g.label)] + [
            _cell(g, f"ood.{name}.{key}", sc, d, higher_better=hb,
                  pre_key=f"ood.{name}.{key[5:]}" if key.startswith("post_") else None)
            for _c, key, sc, d, hb in OOD_COLUMNS]
            for g in groups if any(k.startswith(f"ood.{name}.") for k in g.mean)]
        _mark_best(rows, [c[4] for c in OOD_COLUMNS])
        notes = [f"Out-of-distribution detection, in-distribution (ID) test set vs {name!r}, in "
                 f"%: AUROC and AUPR with {name!r} as the positive class; FPR@95 in the "
                 "literature's convention (Hendrycks & Gimpel 2017, Liu et al. 2020): the share "
                 f"of {name!r} accepted at the threshold that keeps 95% of the ID samples (ID the "
                 "positive class). Scores: softmax entropy, or minus the maximum probability; "
                 "post T uses the grid-ECE temperature. " + _seeds_note(groups), _BEST_NOTE,
                 *_worse_notes(rows)]
        tables.append(Table(_title(groups, f"OOD detection ({name})"), header, rows, notes))
    return tables


EXTRA_COLUMNS = (
    ("MCE", "mce", 100.0, 2), ("RMSCE", "rmsce", 100.0, 2), ("Brier", "brier", 1.0, 4),
    ("Top-5 error", "topk_error", 100.0, 2), ("S99 share", "s99_share", 100.0, 2),
    ("S99 accuracy", "s99_accuracy", 100.0, 2),
)


def extra_metrics_table(groups: Sequence[Group]) -> Table:
    header = ["Loss"] + [c[0] for c in EXTRA_COLUMNS] + ["ECE post T (NLL-fitted T)"]
    rows = []
    for g in groups:
        row = [Cell(g.label)] + [_cell(g, f"test.pre.{k}", sc, d) for _c, k, sc, d in EXTRA_COLUMNS]
        row.append(_cell(g, "test.post.nll.ece", 100.0, 2, "temperature.nll",
                         pre_key="test.pre.ece"))
        rows.append(row)
    _mark_best(rows, [False, False, False, False, None, True, False])
    notes = ["Pre-temperature test metrics in % (Brier: mean squared error summed over classes, "
             "not divided by C). S99: share of samples with confidence >= 0.99 and the accuracy on "
             "them ('-' when there are none).", _BEST_NOTE, *_worse_notes(rows)]
    return Table(_title(groups, "Further metrics"), header, rows, notes)


#: (column, metric key, scale, digits) of :func:`ensemble_table`.
ENSEMBLE_COLUMNS = (("ECE %", "ece", 100.0, 2), ("AdaECE %", "adaptive_ece", 100.0, 2),
                    ("NLL", "nll", 1.0, 3), ("Error %", "error", 100.0, 2))
#: (row, results section of its metrics, temperature key or None) of :func:`ensemble_table`.
_ENSEMBLE_ROWS = (("ensemble, no T", "test.pre", None),
                  ("pool then calibrate (NLL T)", "test.post.nll", "temperature.nll"),
                  ("calibrate then pool (NLL T)", "test.post.calibrate_then_pool_nll",
                   "temperature.calibrate_then_pool_nll"),
                  ("pool then calibrate (grid-ECE T)", "test.post.grid_ece", "temperature.grid_ece"),
                  ("calibrate then pool (grid-ECE T)", "test.post.calibrate_then_pool",
                   "temperature.calibrate_then_pool"))


def _members_row(label: str, seeds: str, members: Sequence) -> list[Cell]:
    """The members' mean ± std (over the seeds pooled) of each column, and their mean T."""
    def cell(key: str, scale: float, digits: int) -> Cell:
        m, sd, _n = mean_std([r.flat.get(key, math.nan) * scale for r in members])
        return Cell(fmt_mean_std(m, sd, digits))
    return ([Cell(label), Cell(seeds), Cell("members (mean ± std)")]
            + [cell(f"test.pre.{k}", sc, d) for _c, k, sc, d in ENSEMBLE_COLUMNS]
            + [cell("temperature.grid_ece", 1.0, 2)])


def _ensemble_rows(label: str, seed_text: str, flat: Mapping[str, float]) -> list[list[Cell]]:
    """An ensemble's rows of :func:`ensemble_table`: before T, then each fit in its results;
    a post-T number worse than the number before T carries :data:`WORSE_MARK` (the error
    column too: a temperature never changes the argmax, so it never does)."""
    rows = []
    for name, section, tkey in _ENSEMBLE_ROWS:
        if tkey and tkey not in flat:
            continue  # results written before this fit was measured
        t = flat.get(tkey, math.nan) if tkey else math.nan
        cells = []
        for _c, k, sc, d in ENSEMBLE_COLUMNS:
            v = flat.get(f"{section}.{k}", math.nan) * sc
            worse = tkey is not None and worse_than(v, flat.get(f"test.pre.{k}", math.nan) * sc, d)
            cells.append(Cell(fmt_mean_std(v, math.nan, d) + (f" {WORSE_MARK}" if worse else "")))
        rows.append([Cell(label), Cell(seed_text), Cell(name)] + cells
                    + [Cell(fmt_mean_std(t, math.nan, 2) if tkey else "–")])
    return rows


def ensemble_table(groups: Sequence[Group]) -> Table | None:
    """Per loss's ensemble (groups of predictor ``"ensemble"``, one seed set per record): its
    members' mean, the ensemble before temperature scaling, "pool then calibrate" and
    "calibrate then pool" (:func:`torchcal.ensemble.evaluate_ensemble`); None without one."""
    runs = {(g.loss, g.runs[0].key[3]): g for g in groups if g.predictor == DEFAULT_PREDICTOR}
    header = (["Loss", "Seeds pooled", "Predictor"] + [c[0] for c in ENSEMBLE_COLUMNS] + ["T"])
    rows = []
    for g in groups:
        if g.predictor != "ensemble":
            continue
        run_group = runs.get((g.loss, g.runs[0].key[3]))
        for r in g.runs:
            seeds = [int(x) for x in r.meta.get("members") or ()]
            label, seed_text = loss_label(g.loss, g.loss_kwargs), ", ".join(map(str, seeds)) or "?"
            members = [x for x in (run_group.runs if run_group else []) if x.seed in seeds]
            if members:
                rows.append(_members_row(label, seed_text, members))
            rows += _ensemble_rows(label, seed_text, r.flat)
    if not rows:
        return None
    notes = ["Each loss's ensemble: the mean of the probabilities of the seeds pooled (Seeds "
             "pooled). Temperatures are fitted on the validation split, every number is on the "
             "test split. Pool then calibrate: one T for the ensemble's validation "
             "log-probabilities, fitted by NLL (the ensemble papers' fit, and the claims') or "
             "chosen by grid-search ECE (noisy on a small validation split). Calibrate then "
             "pool: each member divided by its own T of the same fit (on its validation "
             "logits), then pooled; T is the members' mean. A row whose fit the results lack "
             "(written before it was measured) is left out. Members: mean ± std over the "
             "seeds pooled, T their grid-ECE temperature.", *_worse_notes(rows)]
    return Table(_title(groups, "Ensembles"), header, rows, notes)


def _by_dataset_model(groups: Sequence[Group]) -> list[list[Group]]:
    out: dict[tuple[str, str], list[Group]] = {}
    for g in groups:
        out.setdefault((g.dataset, g.model), []).append(g)
    return list(out.values())


def tables_for(groups: Sequence[Group], noise_floor: Mapping[str, float] | None = None,
               ) -> list[tuple[tuple[str, str], list[Table]]]:
    """Per (dataset, model): ``((dataset, model), [main, ensembles (when the groups hold an
    ensemble), temperatures, OOD..., further metrics])``."""
    out = []
    for gs in _by_dataset_model(groups):
        ens = ensemble_table(gs)
        out.append(((gs[0].dataset, gs[0].model),
                    [main_table(gs, noise_floor), *([ens] if ens else []), temperature_table(gs),
                     *ood_tables(gs), extra_metrics_table(gs)]))
    return out


def _csv(header: list[str], rows: list[list[object]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        w.writerow(["" if isinstance(v, float) and math.isnan(v) else
                    (repr(v) if isinstance(v, float) else v) for v in r])
    return buf.getvalue()


def _all_keys(dicts: Sequence[dict[str, float]]) -> list[str]:
    keys: dict[str, None] = {}
    for d in dicts:
        keys.update(dict.fromkeys(d))
    return sorted(keys)


def relative_run_dir(run_dir: str | os.PathLike, base: str | os.PathLike | None) -> str:
    """A run directory as a results file names it: relative to ``base`` (the directory of the
    report that holds the file) with ``/`` separators, so the files name no machine's paths;
    as given when ``base`` is None or on another drive.

    >>> relative_run_dir("/data/demo/runs/ce/seed0", "/data/demo")
    'runs/ce/seed0'
    """
    if base is None:
        return Path(run_dir).as_posix()
    try:
        return Path(os.path.relpath(Path(run_dir).absolute(), Path(base).absolute())).as_posix()
    except ValueError:  # different drives on Windows
        return Path(run_dir).as_posix()


def runs_csv(groups: Sequence[Group], base: str | os.PathLike | None = None) -> str:
    """One row per run with every number (fractions; empty cell = NaN/missing); ``run_dir``
    relative to ``base`` (the report's directory, see :func:`relative_run_dir`); ``members``:
    the seeds a pooled record (an ensemble) pooled, space-separated (empty for a seed's run);
    ``identity``: the record's identity hash (``meta.identity``; empty when it records none).
    An ensemble group's seed-subset ensembles (:attr:`Group.subsets`) follow its own rows, so
    that the file holds every record the claims were tested on."""
    runs = [r for g in groups for r in (*g.runs, *g.subsets)]
    keys = _all_keys([r.flat for r in runs])
    header = ["dataset", "model", "loss", "loss_kwargs", "predictor", "seed", "run_dir",
              "members", "identity"] + keys
    rows = []
    for g in groups:
        for r in (*g.runs, *g.subsets):
            members = r.meta.get("members")
            rows.append([g.dataset, g.model, g.loss, r.key[3], g.predictor, r.seed,
                         relative_run_dir(r.run_dir, base),
                         " ".join(map(str, members)) if members else "", r.identity or ""]
                        + [r.flat.get(k, math.nan) for k in keys])
    return _csv(header, rows)


def groups_csv(groups: Sequence[Group]) -> str:
    """One row per group: every number's mean and std over seeds (fractions)."""
    keys = _all_keys([g.mean for g in groups])
    header = ["dataset", "model", "loss", "loss_kwargs", "predictor", "identity", "n_runs",
              "seeds"]
    for k in keys:
        header += [f"{k}.mean", f"{k}.std"]
    rows = []
    for g in groups:
        row: list[object] = [g.dataset, g.model, g.loss, g.runs[0].key[3], g.predictor,
                             g.identity or "", len(g.runs), " ".join(str(s) for s in g.seeds)]
        for k in keys:
            row += [g.mean.get(k, math.nan), g.std.get(k, math.nan)]
        rows.append(row)
    return _csv(header, rows)
