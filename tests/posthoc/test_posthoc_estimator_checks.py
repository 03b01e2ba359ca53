"""scikit-learn's estimator checks for every calibrator and the conformal predictor (issue 24,
7): every check passes except those listed here, each with the reason (they feed inputs that
are not (N, C) logits with C >= 2 and integer labels in [0, C), or expect scikit-learn's
argument names and conventions that torchcal's design departs from on purpose)."""

from __future__ import annotations

import warnings

import pytest
from test_posthoc_contract import ALL, BINARY

from torchcal.posthoc import ConformalClassifier

LOGITS = ("the inputs are (N, C) floating-point logits with C >= 2 columns and integer labels "
          "in [0, C); this check feeds {what}, which torchcal rejects with its own message")
NAMES = ("torchcal's estimators take `fit(logits, labels)` (the project's vocabulary: "
         "logits=/labels= everywhere), not scikit-learn's `X, y`")
REASONS = {
    "check_do_not_raise_errors_in_init_or_set_params": (
        "torchcal checks settings in the constructor and in set_params (DESIGN.md's estimator "
        "contract; issue 24: set_params(method='x') must not pass)"),
    "check_fit_score_takes_y": NAMES,
    "check_transformer_general": NAMES + " (fit_transform(X, y=...) is called by keyword)",
    "check_requires_y_none": NAMES + "; labels are required and None is rejected",
    "check_n_features_in": "the fitted width is `n_classes_` (C, the logits' columns)",
    "check_n_features_in_after_fitting": "the fitted width is `n_classes_` (C)",
    "check_transformer_n_iter": "the iterative fits raise on non-convergence instead of "
                                "reporting `n_iter_`",
    "check_estimators_overwrite_params": LOGITS.format(what="labels up to 2 for 2 columns"),
    "check_estimators_fit_returns_self": LOGITS.format(what="labels up to 2 for 2 columns"),
    "check_readonly_memmap_input": LOGITS.format(what="labels up to 2 for 2 columns"),
    "check_estimators_dtypes": LOGITS.format(what="integer logits"),
    "check_complex_data": LOGITS.format(what="complex logits"),
    "check_dtype_object": LOGITS.format(what="object arrays"),
    "check_estimators_empty_data_messages": LOGITS.format(what="0 columns (other wording)"),
    "check_estimators_nan_inf": LOGITS.format(what="float labels"),
    "check_estimator_sparse_tag": LOGITS.format(what="sparse matrices"),
    "check_estimator_sparse_array": LOGITS.format(what="sparse arrays"),
    "check_estimator_sparse_matrix": LOGITS.format(what="sparse matrices"),
    "check_transformer_data_not_an_array": LOGITS.format(what="array-likes that are neither "
                                                         "tensors nor NumPy arrays"),
    "check_fit2d_1sample": LOGITS.format(what="1 sample (other wording)"),
    "check_fit2d_1feature": LOGITS.format(what="1 column (other wording)"),
    "check_fit2d_predict1d": LOGITS.format(what="1-D input (other wording)"),
    # sample_weight (issue 39): tested in test_posthoc_dense_weights.py on logits and labels
    "check_sample_weights_pandas_series": LOGITS.format(what="pandas objects"),
    "check_sample_weights_not_an_array": LOGITS.format(what="array-likes that are neither "
                                                       "tensors nor NumPy arrays"),
    "check_sample_weights_shape": LOGITS.format(what="integer logits"),
    "check_sample_weights_not_overwritten": LOGITS.format(what="labels up to 2 for 2 columns"),
    "check_sample_weight_equivalence_on_dense_data": NAMES + " (fit(X, y=...) is called by "
                                                     "keyword)",
}
BINARY_REASONS = {name: LOGITS.format(what="3 columns to a binary (2-column) calibrator")
          for name in ("check_dont_overwrite_parameters", "check_positive_only_tag_during_fit",
                       "check_pipeline_consistency", "check_estimators_pickle",
                       "check_f_contiguous_array_estimator",
                       "check_transformer_preserve_dtypes",
                       "check_methods_sample_order_invariance",
                       "check_methods_subset_invariance", "check_dict_unchanged",
                       "check_sample_weights_list")}


@pytest.mark.parametrize("cls", ALL + [ConformalClassifier])
def test_sklearn_estimator_checks(cls):
    from sklearn.utils.estimator_checks import check_estimator
    expected = dict(REASONS)
    if cls in BINARY:
        expected.update(BINARY_REASONS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(cls(), expected_failed_checks=expected, on_fail=None,
                                  on_skip=None)
    failed = [r["check_name"] for r in results if r["status"] == "failed"]
    assert failed == [], failed
    passed = [r["check_name"] for r in results if r["status"] == "passed"]
    assert len(passed) >= 10  # the contract checks that do apply (clone, get/set_params, ...)
