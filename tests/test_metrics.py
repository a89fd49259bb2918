from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pyro_bbb.metrics import (
    accuracy,
    auroc,
    brier,
    ece,
    expected_calibration_error,
    gaussian_log_likelihood,
    interval_coverage,
    log_likelihood,
    nll,
    reliability_curve,
    rmse,
)


def _normal_log_pdf(y: float, loc: float, scale: float) -> float:
    return -0.5 * math.log(2 * math.pi) - math.log(scale) - (y - loc) ** 2 / (2 * scale**2)


def _binary_predictions(confidence: float, num_correct: int, num: int):
    """`num` two-class predictions of class 0 with the given confidence, `num_correct` right."""
    probs = torch.tensor([[confidence, 1 - confidence]]).repeat(num, 1)
    y = torch.ones(num, dtype=torch.long)
    y[:num_correct] = 0
    return probs, y


# --- regression -------------------------------------------------------------------------------


def test_rmse_matches_hand_computed_value():
    mean = torch.tensor([1.0, 2.0, 3.0, 4.0])
    y = torch.tensor([1.0, 0.0, 3.0, 8.0])
    # squared errors 0, 4, 0, 16 -> mean 5
    assert rmse(mean, y) == pytest.approx(math.sqrt(5.0))


def test_rmse_averages_over_points_and_dimensions():
    mean = torch.zeros(2, 2)
    y = torch.tensor([[1.0, 1.0], [1.0, 3.0]])
    assert rmse(mean, y) == pytest.approx(math.sqrt((1 + 1 + 1 + 9) / 4))


def test_rmse_rejects_shapes_that_would_broadcast():
    with pytest.raises(ValueError, match=r"mean and y must have the same shape"):
        rmse(torch.zeros(5, 1), torch.zeros(5))


def test_gaussian_log_likelihood_with_one_sample_is_the_gaussian_log_pdf():
    loc = torch.tensor([[0.0, 1.0, -2.0]])
    scale = torch.tensor([[1.0, 0.5, 2.0]])
    y = torch.tensor([0.3, 2.0, 1.0])
    expected = np.mean(
        [
            _normal_log_pdf(0.3, 0.0, 1.0),
            _normal_log_pdf(2.0, 1.0, 0.5),
            _normal_log_pdf(1.0, -2, 2),
        ]
    )
    assert gaussian_log_likelihood(loc, scale, y) == pytest.approx(expected, rel=1e-6)


def test_gaussian_log_likelihood_is_log_of_the_mixture_density_not_of_a_fitted_gaussian():
    loc = torch.tensor([[0.0], [2.0]])
    scale = torch.tensor([[1.0], [0.5]])
    y = torch.tensor([1.0])
    density = 0.5 * math.exp(_normal_log_pdf(1.0, 0.0, 1.0)) + 0.5 * math.exp(
        _normal_log_pdf(1.0, 2.0, 0.5)
    )
    # moment-matched Gaussian: mean 1, variance E[sigma^2] + Var[mu] = 0.625 + 1
    moment_matched = _normal_log_pdf(1.0, 1.0, math.sqrt(1.625))
    result = gaussian_log_likelihood(loc, scale, y)
    assert result == pytest.approx(math.log(density), rel=1e-6)
    assert result != pytest.approx(moment_matched, rel=1e-3)


def test_gaussian_log_likelihood_accepts_a_scalar_noise_scale():
    loc = torch.tensor([[0.0, 1.0], [0.5, 1.5]])
    y = torch.tensor([0.2, 1.1])
    assert gaussian_log_likelihood(loc, 0.7, y) == pytest.approx(
        gaussian_log_likelihood(loc, torch.full_like(loc, 0.7), y)
    )


def test_gaussian_log_likelihood_sums_over_output_dimensions():
    loc = torch.tensor([[[0.0, 1.0]]])  # (1 sample, 1 point, 2 dims)
    scale = torch.tensor([[[1.0, 2.0]]])
    y = torch.tensor([[0.5, -1.0]])
    expected = _normal_log_pdf(0.5, 0.0, 1.0) + _normal_log_pdf(-1.0, 1.0, 2.0)
    assert gaussian_log_likelihood(loc, scale, y) == pytest.approx(expected, rel=1e-6)


def test_gaussian_log_likelihood_rejects_non_positive_scale():
    with pytest.raises(ValueError, match=r"scale must be positive"):
        gaussian_log_likelihood(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3))


def test_gaussian_log_likelihood_rejects_targets_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"y must have shape \(3,\)"):
        gaussian_log_likelihood(torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(4))


def test_log_likelihood_is_the_mean_over_points_of_logmeanexp_over_samples():
    probs = torch.tensor([[0.2, 0.9], [0.6, 0.1]])  # p(y_i | w_s), rows are samples
    expected = (math.log((0.2 + 0.6) / 2) + math.log((0.9 + 0.1) / 2)) / 2
    assert log_likelihood(probs.log()) == pytest.approx(expected, rel=1e-6)


def test_log_likelihood_is_stable_for_very_small_likelihoods():
    log_probs = torch.full((4, 3), -1000.0)
    assert log_likelihood(log_probs) == pytest.approx(-1000.0)


def test_log_likelihood_rejects_a_missing_sample_dimension():
    with pytest.raises(ValueError, match=r"log_probs must have shape \(num_samples, batch\)"):
        log_likelihood(torch.zeros(5))


def test_interval_coverage_counts_closed_intervals():
    lower = torch.tensor([0.0, 0.0, 0.0, 0.0])
    upper = torch.tensor([1.0, 1.0, 1.0, 1.0])
    y = torch.tensor([0.0, 1.0, 1.5, -0.1])  # both endpoints count as inside
    assert interval_coverage(lower, upper, y) == pytest.approx(0.5)


def test_interval_coverage_rejects_inverted_intervals():
    with pytest.raises(ValueError, match=r"lower must be <= upper"):
        interval_coverage(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.5]))


# --- classification ---------------------------------------------------------------------------


def test_accuracy_takes_the_most_probable_class():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.2, 0.5, 0.3], [0.4, 0.35, 0.25]])
    y = torch.tensor([0, 2, 0, 1])
    assert accuracy(probs, y) == pytest.approx(0.5)


def test_accuracy_of_binary_probabilities_thresholds_at_one_half():
    probs = torch.tensor([0.9, 0.6, 0.4, 0.1, 0.5])
    y = torch.tensor([1, 0, 0, 0, 0])  # predictions 1, 1, 0, 0, 0 (a tie is class 0)
    assert accuracy(probs, y) == pytest.approx(4 / 5)


def test_nll_is_the_mean_negative_log_probability_of_the_true_label():
    log_probs = torch.tensor([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25]]).log()
    y = torch.tensor([0, 2])
    assert nll(log_probs, y) == pytest.approx((math.log(2) + math.log(4)) / 2, rel=1e-6)


def test_nll_of_binary_log_probabilities_reads_the_column_of_the_label():
    log_probs = torch.tensor([[0.2, 0.8], [0.2, 0.8]]).log()  # [log(1 - p), log p]
    y = torch.tensor([1, 0])
    assert nll(log_probs, y) == pytest.approx(-(math.log(0.8) + math.log(0.2)) / 2, rel=1e-6)
    with pytest.raises(ValueError, match=r"binary: the two columns"):
        nll(torch.tensor([0.8, 0.8]).log(), y)


def test_nll_is_exact_for_a_confident_error_far_beyond_what_probabilities_can_hold():
    # softmax([0, 200]) gives the true class 0 probability e^-200: 0 in float32, and
    # log(probs) clamped at 1e-12 would have reported 27.6 nats.
    logits = torch.tensor([[0.0, 200.0]])
    assert torch.softmax(logits, -1)[0, 0] == 0
    value = nll(torch.log_softmax(logits, -1), torch.tensor([0]))
    assert value == pytest.approx(200.0, rel=1e-6)
    logit = torch.tensor([200.0])
    two_columns = torch.nn.functional.logsigmoid(torch.stack([-logit, logit], -1))
    assert nll(two_columns, torch.tensor([0])) == pytest.approx(200.0, rel=1e-6)


def test_nll_is_infinite_when_the_true_label_has_probability_zero():
    assert nll(torch.tensor([[0.0, -math.inf]]), torch.tensor([1])) == math.inf


def test_nll_refuses_probabilities_passed_for_log_probabilities():
    with pytest.raises(ValueError, match=r"log_probs must be <= 0.*log_softmax"):
        nll(torch.tensor([[0.7, 0.3]]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"log_probs must be normalised.*log_softmax"):
        nll(torch.tensor([[-3.0, -3.0]]), torch.tensor([0]))


def test_brier_is_zero_for_perfect_one_hot_predictions():
    y = torch.tensor([0, 3, 1, 2])
    probs = torch.nn.functional.one_hot(y, 4).float()
    assert brier(probs, y) == pytest.approx(0.0)


@pytest.mark.parametrize("num_classes", [2, 3, 10])
def test_brier_of_the_uniform_prediction_is_c_minus_one_over_c(num_classes):
    y = torch.arange(num_classes)
    probs = torch.full((num_classes, num_classes), 1 / num_classes)
    assert brier(probs, y) == pytest.approx((num_classes - 1) / num_classes, rel=1e-6)


def test_brier_of_binary_probabilities_is_the_mean_squared_error_to_the_label():
    probs = torch.tensor([0.9, 0.3])
    y = torch.tensor([1, 1])
    assert brier(probs, y) == pytest.approx((0.1**2 + 0.7**2) / 2, rel=1e-6)


# --- calibration ------------------------------------------------------------------------------


def test_ece_is_zero_for_perfectly_calibrated_predictions():
    p80, y80 = _binary_predictions(0.8, num_correct=8, num=10)  # 80% confident, 80% right
    p60, y60 = _binary_predictions(0.6, num_correct=3, num=5)  # 60% confident, 60% right
    probs, y = torch.cat([p80, p60]), torch.cat([y80, y60])
    assert expected_calibration_error(probs, y) == pytest.approx(0.0, abs=1e-6)


def test_ece_of_an_over_confident_predictor_matches_hand_value():
    p90, y90 = _binary_predictions(0.9, num_correct=5, num=10)  # gap |0.5 - 0.9| = 0.4
    p70, y70 = _binary_predictions(0.7, num_correct=5, num=10)  # gap |0.5 - 0.7| = 0.2
    probs, y = torch.cat([p90, p70]), torch.cat([y90, y70])
    assert expected_calibration_error(probs, y, num_bins=10) == pytest.approx(0.3, abs=1e-6)


def test_ece_with_one_bin_is_the_gap_between_accuracy_and_mean_confidence():
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(200, 5, generator=generator), dim=-1)
    y = torch.randint(0, 5, (200,), generator=generator)
    gap = abs(accuracy(probs, y) - float(probs.max(-1).values.double().mean()))
    assert ece(probs, y, num_bins=1) == pytest.approx(gap, rel=1e-6)


def test_ece_of_binary_probabilities_uses_the_confidence_of_the_predicted_class():
    # p(y=1) = 0.2 predicts class 0 with confidence 0.8; all correct -> gap 0.2
    probs = torch.tensor([0.2, 0.2, 0.8, 0.8])
    y = torch.tensor([0, 0, 1, 1])
    assert ece(probs, y) == pytest.approx(0.2, abs=1e-6)


def test_reliability_curve_bins_by_confidence_and_leaves_empty_bins_nan():
    probs = torch.tensor([[0.95, 0.05], [0.95, 0.05], [0.55, 0.45], [0.25, 0.75]])
    y = torch.tensor([0, 1, 0, 1])
    curve = reliability_curve(probs, y, num_bins=4)
    np.testing.assert_allclose(curve.bin_centers, [0.125, 0.375, 0.625, 0.875])
    np.testing.assert_array_equal(curve.counts, [0, 0, 2, 2])
    np.testing.assert_allclose(curve.accuracy[2:], [1.0, 0.5])
    np.testing.assert_allclose(curve.confidence[2:], [0.65, 0.95], rtol=1e-6)
    assert np.isnan(curve.accuracy[:2]).all() and np.isnan(curve.confidence[:2]).all()


def test_ece_is_the_alias_of_expected_calibration_error():
    assert ece is expected_calibration_error


# --- validation -------------------------------------------------------------------------------


def test_classification_metrics_reject_mismatched_batch_sizes():
    with pytest.raises(ValueError, match=r"y must have one label per prediction \(3\), got 2"):
        accuracy(torch.full((3, 2), 0.5), torch.tensor([0, 1]))


@pytest.mark.parametrize("metric", [accuracy, nll, brier, expected_calibration_error])
def test_classification_metrics_reject_labels_out_of_range(metric):
    inputs = torch.full((2, 3), 1 / 3)
    inputs = inputs.log() if metric is nll else inputs
    with pytest.raises(ValueError, match=r"y must hold labels in \[0, 3\).*got labels in \[0, 3\]"):
        metric(inputs, torch.tensor([0, 3]))


def test_binary_metrics_reject_labels_other_than_zero_and_one():
    with pytest.raises(ValueError, match=r"y must hold labels in \[0, 2\)"):
        brier(torch.tensor([0.3, 0.7]), torch.tensor([0, 2]))


def test_classification_metrics_reject_float_labels():
    with pytest.raises(ValueError, match=r"y must hold integer class labels.*torch.float32"):
        accuracy(torch.full((2, 2), 0.5), torch.tensor([0.0, 1.0]))


def test_classification_metrics_reject_non_finite_probabilities():
    with pytest.raises(ValueError, match=r"probs must be finite"):
        brier(torch.tensor([[float("nan"), 0.5]]), torch.tensor([0]))


def test_classification_metrics_reject_probabilities_outside_the_unit_interval():
    with pytest.raises(ValueError, match=r"probs must lie in \[0, 1\]"):
        brier(torch.tensor([[1.5, -0.5]]), torch.tensor([0]))


@pytest.mark.parametrize("num_bins", [0, -3, 2.5])
def test_calibration_rejects_a_bad_number_of_bins(num_bins):
    with pytest.raises(ValueError, match=r"num_bins must be a positive int"):
        expected_calibration_error(torch.full((2, 2), 0.5), torch.tensor([0, 1]), num_bins=num_bins)


def test_ece_with_fifteen_bins_matches_a_hand_computed_three_bin_case():
    # Confidences 0.95 (bin 15), 0.62 (bin 10, (9/15, 10/15]) and 0.40 (bin 6, (5/15, 6/15]).
    rows = [[0.95, 0.05, 0.0]] * 4 + [[0.62, 0.38, 0.0]] * 5 + [[0.30, 0.30, 0.40]]
    probs = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor([0, 0, 0, 1, 0, 0, 0, 0, 1, 2])
    # 0.95: accuracy 3/4, gap 0.20; 0.62: accuracy 4/5, gap 0.18; 0.40: accuracy 1, gap 0.60
    expected = (4 * 0.20 + 5 * 0.18 + 1 * 0.60) / 10
    assert expected_calibration_error(probs, y, num_bins=15) == pytest.approx(expected, abs=1e-12)
    curve = reliability_curve(probs, y, num_bins=15)
    assert curve.counts.tolist() == [0] * 5 + [1] + [0] * 3 + [5] + [0] * 4 + [4]


# --- AUROC ------------------------------------------------------------------------------------


def test_auroc_matches_a_hand_computed_case_with_a_tie():
    # positives 0.35, 0.8, 0.4; negatives 0.1, 0.4: pairs won 1+0, 1+1, 1+0.5 of 6
    scores = torch.tensor([0.1, 0.4, 0.35, 0.8, 0.4])
    labels = torch.tensor([0, 0, 1, 1, 1])
    assert auroc(scores, labels) == pytest.approx(4.5 / 6)


def test_auroc_is_one_for_separated_scores_and_zero_when_reversed():
    scores = torch.tensor([0.1, 0.2, 0.3, 0.9, 1.0])
    labels = torch.tensor([0, 0, 0, 1, 1])
    assert auroc(scores, labels) == 1.0
    assert auroc(-scores, labels) == 0.0
    assert auroc(scores, labels.bool()) == 1.0


def test_auroc_equals_the_pairwise_mann_whitney_count_with_many_ties():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 6, (300,), generator=generator).double()
    labels = torch.randint(0, 2, (300,), generator=generator)
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = (pos[:, None] > neg[None, :]).double() + 0.5 * (pos[:, None] == neg[None, :]).double()
    assert auroc(scores, labels) == pytest.approx(float(wins.mean()), abs=1e-12)


def test_auroc_of_scores_independent_of_the_labels_is_near_one_half():
    generator = torch.Generator().manual_seed(1)
    scores = torch.rand(4000, generator=generator)
    labels = torch.randint(0, 2, (4000,), generator=generator)
    assert auroc(scores, labels) == pytest.approx(0.5, abs=0.03)


def test_auroc_needs_both_groups_and_zero_one_labels():
    with pytest.raises(ValueError, match=r"both labels present, got 0 positive\(s\) and 3"):
        auroc(torch.rand(3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"only 0 and 1"):
        auroc(torch.rand(3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"integer or bool"):
        auroc(torch.rand(3), torch.tensor([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match=r"shape of scores \(3,\), got \(2,\)"):
        auroc(torch.rand(3), torch.tensor([0, 1]))
