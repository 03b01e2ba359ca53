"""Issue 51 item 4: a post-hoc number worse than the number before the post-hoc step is marked
(†) wherever a table shows it, with a legend line; the NLL after the NLL-fitted temperature
stands beside the NLL after the grid-ECE temperature (the papers' convention)."""

from __future__ import annotations

import copy

from test_report_aggregate import fake_results  # same folder (pytest puts it on sys.path)

from torchcal.report.aggregate import group_runs, load_runs
from torchcal.report.tables import (
    WORSE_MARK,
    WORSE_NOTE,
    ensemble_table,
    extra_metrics_table,
    main_table,
    ood_tables,
)
from torchcal.results_file import write_results


def _worse_group(tmp_path, loss="ce", post_nll_grid=0.246, post_nll_fit=0.200, pre_nll=0.211,
                 predictor=None):
    """Two seeds whose grid-ECE temperature raises the NLL (0.211 -> 0.246), as the default
    demo's ensembles do, while the NLL-fitted temperature lowers it."""
    for seed in (0, 1):
        r = fake_results(loss, seed, 0.02, 0.03, 0.8)  # ECE 2% -> 3% after T: worse too
        r["test"]["post"] = {m: copy.deepcopy(v) for m, v in r["test"]["post"].items()}
        r["test"]["pre"]["nll"] = pre_nll
        r["test"]["post"]["grid_ece"]["nll"] = post_nll_grid
        r["test"]["post"]["nll"]["nll"] = post_nll_fit
        r["test"]["post"]["nll"]["ece"] = 0.01  # the NLL-fitted T lowers the ECE
        r["ood"]["noise"]["post_auroc_entropy"] = 0.40  # pre 0.52: worse after T
        if predictor:
            r["meta"].update(predictor=predictor, seed=None, members=[0, 1])
        write_results(tmp_path / f"{loss}{seed}", r)
        if predictor:
            break
    return group_runs(load_runs([tmp_path]).runs)


def test_main_table_marks_post_t_numbers_worse_than_pre_t(tmp_path):
    tab = main_table(_worse_group(tmp_path))
    col = {h: i for i, h in enumerate(tab.header)}
    (row,) = tab.rows
    assert row[col["NLL pre T"]].text == "0.211 ± 0.000"
    assert row[col["NLL post T (T)"]].text == f"0.246 ± 0.000 (0.80) {WORSE_MARK}"
    assert row[col["ECE post T (T)"]].text.endswith(WORSE_MARK)
    # the NLL-fitted temperature's NLL stands beside the grid-ECE one; it is better: no mark
    assert col["NLL post T (NLL-fitted T)"] == col["NLL post T (T)"] + 1
    assert row[col["NLL post T (NLL-fitted T)"]].text == "0.200 ± 0.000 (0.80)"
    assert WORSE_NOTE in tab.notes
    for text in (tab.to_markdown(), tab.to_html(), tab.to_text()):
        assert WORSE_MARK in text and "temperature scaling made this number worse" in text
    assert len(tab.short_header) == len(tab.header)


def test_no_worse_number_no_mark_and_no_legend(tmp_path):
    tab = main_table(_worse_group(tmp_path, post_nll_grid=0.2, pre_nll=0.211))
    col = {h: i for i, h in enumerate(tab.header)}
    assert not tab.rows[0][col["NLL post T (T)"]].text.endswith(WORSE_MARK)
    # equal as displayed (0.2111 vs 0.2109 -> 0.211): not worse
    tab2 = main_table(_worse_group(tmp_path / "b", post_nll_grid=0.2111, pre_nll=0.2109))
    assert WORSE_MARK not in tab2.rows[0][col["NLL post T (T)"]].text


def test_other_tables_mark_worse_post_hoc_numbers(tmp_path):
    groups = _worse_group(tmp_path)
    (ood,) = ood_tables(groups)
    post = ood.header.index("AUROC entropy post T")
    assert ood.rows[0][post].text.endswith(WORSE_MARK) and WORSE_NOTE in ood.notes
    assert not ood.rows[0][post - 1].text.endswith(WORSE_MARK)  # a pre-T number never is
    extra = extra_metrics_table(groups)
    assert not extra.rows[0][-1].text.endswith(WORSE_MARK)  # NLL-fitted T: ECE 2% -> 1%
    assert WORSE_NOTE not in extra.notes


def test_ensemble_rows_mark_the_fits_that_raise_the_nll(tmp_path):
    """The issue's table: the ensemble's NLL rises after the grid-ECE T (0.211 -> 0.246)."""
    groups = _worse_group(tmp_path, predictor="ensemble")
    tab = ensemble_table(groups)
    nll = tab.header.index("NLL")
    rows = {r[2].text: r for r in tab.rows}
    assert rows["ensemble, no T"][nll].text == "0.211"
    assert rows["pool then calibrate (grid-ECE T)"][nll].text == f"0.246 {WORSE_MARK}"
    assert rows["pool then calibrate (NLL T)"][nll].text == "0.200"
    assert WORSE_NOTE in tab.notes
