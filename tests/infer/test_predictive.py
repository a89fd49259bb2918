"""Tests of pyro_bbb.infer.predictive: summaries against closed forms, and predict()."""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pyro
import pytest
import torch

from pyro_bbb import (
    BNN,
    ClassificationPrediction,
    Ensemble,
    MeanFieldGuide,
    RegressionPrediction,
    fit,
    likelihoods,
    metrics,
    mlp,
    predict,
)
from tests.support import scaled

Z_975 = 1.959963984540054  # the 97.5% quantile of the standard normal


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))


def _regression(num_samples: int = 5, batch: int = 4) -> RegressionPrediction:
    generator = torch.Generator().manual_seed(2)
    loc = torch.randn(num_samples, batch, generator=generator, dtype=torch.float64)
    scale = 0.2 + torch.rand(num_samples, batch, generator=generator, dtype=torch.float64)
    samples = loc + scale * torch.randn(
        num_samples, batch, generator=generator, dtype=torch.float64
    )
    return RegressionPrediction(samples=samples, loc_samples=loc, scale_samples=scale)


def _entropy(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return terms.sum(-1)


# --- regression summaries ------------------------------------------------------------------


def test_regression_mean_and_std_split_follow_the_law_of_total_variance():
    prediction = _regression()
    loc = prediction.loc_samples.numpy()
    scale = prediction.scale_samples.numpy()
    np.testing.assert_allclose(prediction.mean.numpy(), loc.mean(0))
    np.testing.assert_allclose(prediction.epistemic_std.numpy(), loc.std(0, ddof=0))
    np.testing.assert_allclose(prediction.aleatoric_std.numpy(), np.sqrt((scale**2).mean(0)))
    # the variance of the equal-weight Gaussian mixture, from its first two moments
    second_moment = (loc**2 + scale**2).mean(0)
    mixture_variance = second_moment - loc.mean(0) ** 2
    np.testing.assert_allclose(prediction.std.numpy() ** 2, mixture_variance)


def test_regression_std_of_a_single_weight_sample_is_its_noise_scale():
    loc = torch.tensor([[0.0, 1.0, -2.0]])
    scale = torch.tensor([[1.0, 0.5, 3.0]])
    prediction = RegressionPrediction(samples=loc, loc_samples=loc, scale_samples=scale)
    assert prediction.epistemic_std.tolist() == [0.0, 0.0, 0.0]
    torch.testing.assert_close(prediction.std, scale[0])


def test_regression_aleatoric_std_accepts_a_scale_shared_by_all_points():
    loc = torch.randn(6, 4)
    scale = torch.tensor([[0.5], [1.0], [0.5], [1.0], [0.5], [1.0]])  # (S, 1)
    prediction = RegressionPrediction(samples=loc, loc_samples=loc, scale_samples=scale)
    expected = math.sqrt((3 * 0.25 + 3 * 1.0) / 6)
    torch.testing.assert_close(prediction.aleatoric_std, torch.full((4,), expected))


def test_interval_of_a_single_gaussian_is_loc_plus_minus_1_96_scale():
    loc = torch.tensor([[0.0, 2.0, -1.0]], dtype=torch.float64)
    scale = torch.tensor([[1.0, 0.5, 3.0]], dtype=torch.float64)
    prediction = RegressionPrediction(samples=loc, loc_samples=loc, scale_samples=scale)
    lower, upper = prediction.interval(0.95)
    torch.testing.assert_close(lower, loc[0] - Z_975 * scale[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(upper, loc[0] + Z_975 * scale[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("level", [0.5, 0.9, 0.95, 0.99])
def test_mixture_interval_holds_the_requested_mass_of_the_mixture(level):
    loc = torch.tensor([[-3.0, 0.0], [0.0, 0.1], [4.0, -0.1]], dtype=torch.float64)
    scale = torch.tensor([[0.5, 1.0], [1.0, 0.2], [2.0, 3.0]], dtype=torch.float64)
    prediction = RegressionPrediction(samples=loc, loc_samples=loc, scale_samples=scale)
    lower, upper = prediction.interval(level)
    loc_np, scale_np = loc.numpy(), scale.numpy()
    below_lower = _normal_cdf((lower.numpy() - loc_np) / scale_np).mean(0)
    below_upper = _normal_cdf((upper.numpy() - loc_np) / scale_np).mean(0)
    alpha = (1 - level) / 2
    np.testing.assert_allclose(below_lower, alpha, atol=1e-6)
    np.testing.assert_allclose(below_upper, 1 - alpha, atol=1e-6)


def test_mixture_interval_is_not_a_gaussian_fit():
    # two far-apart narrow components: a Gaussian fit's 50% interval would straddle the gap
    loc = torch.tensor([[-5.0], [5.0]], dtype=torch.float64)
    scale = torch.full((2, 1), 0.1, dtype=torch.float64)
    prediction = RegressionPrediction(samples=loc, loc_samples=loc, scale_samples=scale)
    median = prediction.quantile(0.5)
    # any point between the components splits the mass in half; the true 25% quantile is
    # inside the left component
    q25 = prediction.quantile(0.25).item()
    assert abs(q25 - (-5.0)) < 0.1
    assert -5.0 < median.item() < 5.0


@pytest.mark.parametrize("level", [0.0, 1.0, 1.5, -0.2])
def test_interval_rejects_levels_outside_the_unit_interval(level):
    with pytest.raises(ValueError, match=r"level must be in \(0, 1\)"):
        _regression().interval(level)


def test_quantile_rejects_q_outside_the_unit_interval():
    with pytest.raises(ValueError, match=r"q must be in \(0, 1\)"):
        _regression().quantile(1.0)


def test_regression_log_likelihood_is_the_mean_log_mixture_density():
    prediction = _regression(num_samples=3, batch=4)
    y = torch.tensor([0.1, -0.5, 2.0, 0.0], dtype=torch.float64)
    loc, scale = prediction.loc_samples.numpy(), prediction.scale_samples.numpy()
    densities = np.exp(-0.5 * ((y.numpy() - loc) / scale) ** 2) / (scale * math.sqrt(2 * math.pi))
    expected = np.log(densities.mean(0)).mean()
    assert prediction.log_likelihood(y) == pytest.approx(expected, rel=1e-6)


def test_unstandardize_maps_every_summary_to_original_units():
    prediction = _regression()
    mean, std = 10.0, 3.0
    original = prediction.unstandardize(mean, std)
    torch.testing.assert_close(original.samples, prediction.samples * std + mean)
    torch.testing.assert_close(original.loc_samples, prediction.loc_samples * std + mean)
    torch.testing.assert_close(original.scale_samples, prediction.scale_samples * std)
    torch.testing.assert_close(original.mean, prediction.mean * std + mean)
    torch.testing.assert_close(original.std, prediction.std * std)
    torch.testing.assert_close(original.epistemic_std, prediction.epistemic_std * std)
    lower, upper = prediction.interval(0.9)
    original_lower, original_upper = original.interval(0.9)
    torch.testing.assert_close(original_lower, lower * std + mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(original_upper, upper * std + mean, rtol=1e-5, atol=1e-5)
    # a new prediction: the original is unchanged
    assert original is not prediction


def test_unstandardize_applies_per_dimension_mean_and_std():
    loc = torch.randn(4, 3, 2)
    scale = torch.rand(4, 3, 2) + 0.1
    prediction = RegressionPrediction(samples=loc, loc_samples=loc, scale_samples=scale)
    mean, std = torch.tensor([1.0, -2.0]), torch.tensor([2.0, 0.5])
    original = prediction.unstandardize(mean, std)
    torch.testing.assert_close(original.mean, prediction.mean * std + mean)
    torch.testing.assert_close(original.aleatoric_std, prediction.aleatoric_std * std)


@pytest.mark.parametrize("std", [0.0, -1.0])
def test_unstandardize_rejects_a_non_positive_std(std):
    with pytest.raises(ValueError, match=r"std must be positive"):
        _regression().unstandardize(0.0, std)


# --- classification summaries --------------------------------------------------------------


def test_classification_entropy_split_matches_hand_computed_values():
    probs = torch.tensor(
        [
            [[0.7, 0.2, 0.1], [0.3, 0.3, 0.4]],
            [[0.5, 0.4, 0.1], [0.1, 0.8, 0.1]],
        ],
        dtype=torch.float64,
    )  # (S=2, B=2, C=3)
    prediction = ClassificationPrediction.from_probs(probs.argmax(-1), probs)
    p = probs.numpy()
    mean = p.mean(0)
    np.testing.assert_allclose(prediction.probs.numpy(), mean)
    np.testing.assert_allclose(prediction.entropy.numpy(), _entropy(mean))
    np.testing.assert_allclose(prediction.expected_entropy.numpy(), _entropy(p).mean(0))
    np.testing.assert_allclose(
        prediction.mutual_information.numpy(), _entropy(mean) - _entropy(p).mean(0)
    )
    assert prediction.predicted.tolist() == [0, 1]
    assert (prediction.mutual_information >= 0).all()


def test_mutual_information_is_zero_when_all_samples_agree():
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]).expand(5, 2, 3)
    prediction = ClassificationPrediction.from_probs(torch.zeros(5, 2), probs)
    torch.testing.assert_close(prediction.mutual_information, torch.zeros(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(prediction.entropy, prediction.expected_entropy)


def test_mutual_information_is_log_2_for_two_confident_disagreeing_samples():
    probs = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # (S=2, B=1, C=2)
    prediction = ClassificationPrediction.from_probs(torch.tensor([[0], [1]]), probs)
    assert prediction.entropy.item() == pytest.approx(math.log(2))
    assert prediction.expected_entropy.item() == pytest.approx(0.0)
    assert prediction.mutual_information.item() == pytest.approx(math.log(2))


def test_binary_predictions_use_the_bernoulli_entropy():
    probs = torch.tensor([[1.0, 0.9, 0.5], [0.0, 0.9, 0.5]])  # (S=2, B=3) of p(y=1)
    prediction = ClassificationPrediction.from_probs((probs > 0.5).long(), probs, binary=True)
    two_class = torch.stack((1 - probs, probs), dim=-1).double().numpy()
    mean = two_class.mean(0)
    np.testing.assert_allclose(prediction.entropy.numpy(), _entropy(mean), rtol=1e-6)
    np.testing.assert_allclose(
        prediction.expected_entropy.numpy(), _entropy(two_class).mean(0), rtol=1e-6, atol=1e-7
    )
    assert prediction.mutual_information[0].item() == pytest.approx(math.log(2))
    assert prediction.mutual_information[1:].tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    assert prediction.predicted.tolist() == [0, 1, 0]


def test_classification_log_likelihood_is_the_mean_log_probability_of_the_labels():
    probs = torch.tensor([[[0.7, 0.3], [0.4, 0.6]], [[0.5, 0.5], [0.2, 0.8]]])
    prediction = ClassificationPrediction.from_probs(torch.zeros(2, 2), probs)
    y = torch.tensor([0, 1])
    expected = (math.log(0.6) + math.log(0.7)) / 2
    assert prediction.log_likelihood(y) == pytest.approx(expected, rel=1e-5)


def test_classification_log_likelihood_counts_a_confident_error_in_full():
    # Every sample puts the true class 0 at e^-200 below class 1: 0 as a float32 probability,
    # and 27.6 nats if probabilities had been clamped at 1e-12 before the log.
    logits = torch.tensor([[[0.0, 200.0]], [[0.0, 201.0]]])  # (S=2, B=1, C=2)
    prediction = ClassificationPrediction(samples=torch.ones(2, 1), logits_samples=logits)
    y = torch.tensor([0])
    expected = math.log((math.exp(-200.0) + math.exp(-201.0)) / 2)
    assert prediction.log_likelihood(y) == pytest.approx(expected, rel=1e-6)
    assert metrics.nll(prediction.log_probs, y) == pytest.approx(-expected, rel=1e-6)
    binary = ClassificationPrediction(
        samples=torch.ones(2, 1), logits_samples=torch.tensor([[200.0], [201.0]]), binary=True
    )
    assert binary.log_likelihood(y) == pytest.approx(expected, rel=1e-6)
    assert metrics.nll(binary.log_probs, y) == pytest.approx(-expected, rel=1e-6)


def test_log_probs_is_the_log_of_the_mean_probabilities():
    logits = torch.randn(7, 5, 3, dtype=torch.float64)
    prediction = ClassificationPrediction(samples=torch.zeros(7, 5), logits_samples=logits)
    torch.testing.assert_close(prediction.log_probs, prediction.probs.log())
    binary = ClassificationPrediction(
        samples=torch.zeros(7, 5), logits_samples=logits[..., 0], binary=True
    )
    torch.testing.assert_close(binary.log_probs, binary.probs.log())
    p = torch.sigmoid(logits[..., 0]).mean(0)
    torch.testing.assert_close(binary.probs, torch.stack([1 - p, p], -1))


# --- predict() on a trained network ------------------------------------------------------------


def _data(n: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.linspace(-2, 2, n).unsqueeze(-1)
    return x, torch.sin(2 * x.squeeze(-1))


@pytest.fixture
def trained():
    x, y = _data()
    model = BNN(mlp([1, 8, 1]), likelihoods.Gaussian(), num_data=len(x))
    guide = MeanFieldGuide(model, init_scale=0.05)
    fit(model, guide, x, y, epochs=15, lr=0.02, progress=False)
    return model, guide, x


def test_predict_returns_sample_by_batch_regression_summaries(trained):
    model, guide, x = trained
    prediction = predict(model, guide, x, num_samples=12)
    assert isinstance(prediction, RegressionPrediction)
    assert prediction.num_samples == 12
    assert prediction.samples.shape == (12, 20)
    assert prediction.loc_samples.shape == (12, 20)
    assert prediction.scale_samples.shape == (12, 20)
    assert prediction.mean.shape == prediction.std.shape == (20,)
    # each weight sample gives its own function; the noise scale is the learned one
    assert prediction.epistemic_std.min() > 0
    learned = pyro.param("likelihood.scale").item()
    torch.testing.assert_close(prediction.scale_samples, torch.full((12, 20), learned))


def test_predict_loc_samples_are_the_network_at_guide_draws():
    x, y = _data()
    model = BNN(mlp([1, 8, 1]), likelihoods.Gaussian(scale=0.1), num_data=len(x))
    # a nearly deterministic guide: every draw is (almost) its mean
    guide = MeanFieldGuide(model, init_scale=2e-6, min_scale=1e-6)
    guide(x, y)
    prediction = predict(model, guide, x, num_samples=4)
    at_mean = pyro.poutine.condition(model.net, data=guide.median())(x).squeeze(-1)
    for s in range(4):
        torch.testing.assert_close(prediction.loc_samples[s], at_mean, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(prediction.scale_samples, torch.full((4, 20), 0.1))


def test_predict_with_the_same_seed_is_reproducible(trained):
    model, guide, x = trained
    first = predict(model, guide, x, num_samples=6, seed=3)
    second = predict(model, guide, x, num_samples=6, seed=3)
    assert torch.equal(first.samples, second.samples)
    assert torch.equal(first.loc_samples, second.loc_samples)
    other = predict(model, guide, x, num_samples=6, seed=4)
    assert not torch.equal(first.loc_samples, other.loc_samples)


def test_a_seeded_prediction_leaves_the_callers_random_stream_where_it_was(trained):
    # a callback that scores with predict(seed=0) every epoch once reset the training loop's
    # draws (minibatch order, weight noise) to the same numbers each epoch
    model, guide, x = trained
    pyro.set_rng_seed(11)
    expected = (torch.rand(3), np.random.rand(3))
    pyro.set_rng_seed(11)
    predict(model, guide, x, num_samples=6, seed=0)
    torch.testing.assert_close(torch.rand(3), expected[0], rtol=0, atol=0)
    np.testing.assert_array_equal(np.random.rand(3), expected[1])
    before = torch.get_rng_state()
    predict(model, guide, x, num_samples=6)  # unseeded: draws from the stream, advancing it
    assert not torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("ensemble", [False, True])
def test_a_fresh_guides_first_seeded_prediction_is_the_one_later_calls_give(ensemble):
    # its first call builds its parameters, running the model once (draws from the priors):
    # inside the seeded block those draws shifted the prediction's, the first call's alone
    pyro.clear_param_store()
    model = BNN(mlp([3, 8, 1]), likelihoods.Gaussian(), num_data=20)
    guide = Ensemble(model, MeanFieldGuide, k=2) if ensemble else MeanFieldGuide(model)
    x = torch.randn(5, 3)
    first = predict(model, guide, x, num_samples=4, seed=0)
    second = predict(model, guide, x, num_samples=4, seed=0)
    torch.testing.assert_close(first.loc_samples, second.loc_samples, rtol=0, atol=0)


def test_predict_in_chunks_uses_the_same_weight_samples_as_unchunked(trained):
    model, guide, x = trained
    whole = predict(model, guide, x, num_samples=6, seed=3)
    chunked = predict(model, guide, x, num_samples=6, seed=3, batch_size=7)
    # the same weights give the same outputs, up to the rounding of a smaller matmul
    assert chunked.samples.shape == whole.samples.shape
    torch.testing.assert_close(chunked.loc_samples, whole.loc_samples)
    torch.testing.assert_close(chunked.scale_samples, whole.scale_samples)
    torch.testing.assert_close(chunked.std, whole.std)


def test_predict_summarises_multi_output_and_heteroscedastic_regression():
    x, _ = _data()
    y = torch.randn(20, 2)
    model = BNN(mlp([1, 8, 4]), likelihoods.Gaussian(heteroscedastic=True), num_data=20)
    guide = MeanFieldGuide(model)
    guide(x, y)
    prediction = predict(model, guide, x, num_samples=5, batch_size=6)
    assert prediction.samples.shape == (5, 20, 2)
    assert prediction.loc_samples.shape == (5, 20, 2)
    assert prediction.scale_samples.shape == (5, 20, 2)
    # the noise scale varies from point to point
    assert prediction.scale_samples.std(1).min() > 0


def test_predict_summarises_a_categorical_model_in_chunks():
    x, _ = _data()
    y = torch.randint(0, 3, (20,))
    model = BNN(mlp([1, 8, 3]), likelihoods.Categorical(), num_data=20)
    guide = MeanFieldGuide(model)
    guide(x, y)
    whole = predict(model, guide, x, num_samples=5, seed=1)
    chunked = predict(model, guide, x, num_samples=5, seed=1, batch_size=6)
    assert isinstance(whole, ClassificationPrediction)
    assert not whole.binary
    assert whole.samples.shape == (5, 20)
    assert whole.probs_samples.shape == (5, 20, 3)
    torch.testing.assert_close(whole.probs_samples.sum(-1), torch.ones(5, 20))
    torch.testing.assert_close(chunked.probs_samples, whole.probs_samples)
    assert whole.entropy.shape == whole.mutual_information.shape == (20,)


def test_predict_summarises_a_bernoulli_model():
    x, _ = _data()
    y = torch.randint(0, 2, (20,))
    model = BNN(mlp([1, 8, 1]), likelihoods.Bernoulli(), num_data=20)
    guide = MeanFieldGuide(model)
    guide(x, y)
    prediction = predict(model, guide, x, num_samples=5)
    assert isinstance(prediction, ClassificationPrediction)
    assert prediction.binary
    assert prediction.samples.shape == prediction.logits_samples.shape == (5, 20)
    assert prediction.probs_samples.shape == (5, 20, 2)
    assert ((prediction.probs_samples > 0) & (prediction.probs_samples < 1)).all()
    assert set(prediction.samples.unique().tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("num_samples", [0, -1, 2.0, True])
def test_predict_rejects_num_samples_that_is_not_a_positive_int(trained, num_samples):
    model, guide, x = trained
    with pytest.raises(ValueError, match=r"num_samples must be a positive int"):
        predict(model, guide, x, num_samples=num_samples)


@pytest.mark.parametrize("batch_size", [0, 2.5])
def test_predict_rejects_batch_size_that_is_not_a_positive_int(trained, batch_size):
    model, guide, x = trained
    with pytest.raises(ValueError, match=r"batch_size must be a positive int"):
        predict(model, guide, x, batch_size=batch_size)


def test_multi_label_log_likelihood_treats_the_labels_of_a_point_jointly_per_sample():
    # two samples that agree with each other label-wise on average but never jointly
    probs = torch.tensor([[[1 - 1e-9, 1e-9]], [[1e-9, 1 - 1e-9]]], dtype=torch.float64)
    pred = ClassificationPrediction.from_probs(torch.zeros(2, 1, 2), probs, binary=True)
    # labels (1, 1): each sample gives it probability ~0, so the mixture does too
    assert pred.log_likelihood(torch.tensor([[1.0, 1.0]])) < -15
    # averaging the probabilities first would have claimed 0.5 * 0.5
    assert pred.probs[..., 1].prod().item() == pytest.approx(0.25)
    # labels (1, 0): the first sample gives probability ~1, the mixture 1/2
    assert pred.log_likelihood(torch.tensor([[1.0, 0.0]])) == pytest.approx(math.log(0.5))


# --- predict() in slices of rows ----------------------------------------------------------------


def _models_of_every_likelihood():
    x = torch.linspace(-2, 2, 40).unsqueeze(-1)
    cases = [  # likelihood, network outputs, targets
        (likelihoods.Gaussian(), 1, torch.sin(x).squeeze(-1)),
        (likelihoods.Gaussian(heteroscedastic=True), 4, torch.randn(40, 2)),
        (likelihoods.Categorical(), 3, torch.randint(0, 3, (40,))),
        (likelihoods.Bernoulli(), 1, torch.randint(0, 2, (40,))),
    ]
    for i, (likelihood, outputs, y) in enumerate(cases):
        model = BNN(mlp([1, 8, outputs]), likelihood, num_data=40)
        guide = MeanFieldGuide(model, name=f"guide_{i}")
        guide(x, y)
        yield model, guide, x


@pytest.mark.parametrize("reparam", [None, "local"])
def test_predict_draws_the_same_numbers_in_slices_as_in_one_pass(reparam):
    # the slices share the guide's draws and the targets are drawn once, from every row's
    # distribution: the numbers of one pass, whatever the slices, to the rounding of a
    # matrix product over fewer rows (labels exactly); the local estimator's noise is drawn
    # slice by slice, so only the shapes agree there
    pyro.set_rng_seed(0)
    for model, guide, x in _models_of_every_likelihood():
        whole = predict(model, guide, x, num_samples=9, seed=5, batch_size=len(x), reparam=reparam)
        sliced = predict(model, guide, x, num_samples=9, seed=5, batch_size=7, reparam=reparam)
        assert sliced.samples.shape == whole.samples.shape
        if reparam is not None:
            continue
        torch.testing.assert_close(sliced.samples, whole.samples, rtol=1e-6, atol=1e-6)
        for name in ("loc_samples", "scale_samples", "logits_samples"):
            if hasattr(whole, name):
                torch.testing.assert_close(getattr(sliced, name), getattr(whole, name))


def test_predict_goes_through_the_rows_in_slices_sized_by_their_activations(monkeypatch):
    # mlp([1, 8, 1]) at 9 draws: Linear (8), ReLU (8), Linear (1) per row and draw, float32,
    # and the undrawn observation's 4 bytes over the probe's two rows; a budget of 50 rows
    pyro.set_rng_seed(0)
    x = torch.linspace(-2, 2, 230).unsqueeze(-1)
    model = BNN(mlp([1, 8, 1]), likelihoods.Gaussian(0.1), num_data=len(x))
    guide = MeanFieldGuide(model)
    guide(x)
    per_row = 9 * (8 + 8 + 1) * 4 + 4 / 2
    monkeypatch.setattr("pyro_bbb.infer.slices.SLICE_BYTES", 50 * per_row)
    rows = []
    handle = model.net.register_forward_hook(lambda module, args, out: rows.append(len(args[0])))
    try:
        sliced = predict(model, guide, x, num_samples=9, seed=1)
    finally:
        handle.remove()
    assert rows == [2, 50, 50, 50, 50, 30]  # the probe, then the slices
    whole = predict(model, guide, x, num_samples=9, seed=1, batch_size=len(x))
    torch.testing.assert_close(sliced.samples, whole.samples, rtol=1e-6, atol=1e-6)


def test_an_autoguides_prediction_goes_in_slices_too():
    # an autoguide's trace holds its plates over the rows it was set up on (20): a slice of
    # 7 rows replays its draws only (its plates would give the slice 20 rows)
    from pyro.infer.autoguide import AutoNormal

    pyro.set_rng_seed(0)
    x, y = _data()
    model = BNN(mlp([1, 8, 1]), likelihoods.Gaussian(0.1), num_data=20)
    guide = AutoNormal(model)
    guide(x, y)
    whole = predict(model, guide, x, num_samples=6, seed=2, batch_size=len(x))
    sliced = predict(model, guide, x, num_samples=6, seed=2, batch_size=7)
    torch.testing.assert_close(sliced.samples, whole.samples, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("predictive", ["sample", "linearised", "online"])
def test_a_bernoulli_prediction_has_probs_and_log_probs_of_one_shape(predictive):
    # both end with the two classes [y = 0, y = 1], as a Categorical's end with its classes
    from pyro_bbb.online import LowRankPrecisionGuide

    pyro.set_rng_seed(0)
    x = torch.randn(12, 2)
    y = torch.randint(0, 2, (12,))
    model = BNN(mlp([2, 4, 1]), likelihoods.Bernoulli(), num_data=12)
    if predictive == "online":
        guide = LowRankPrecisionGuide(model, rank=2)  # linearised unless told otherwise
        guide(x)
        options = {}
    else:
        guide = MeanFieldGuide(model, init_scale=0.3)
        guide(x, y)
        options = {"predictive": predictive}
    pred = predict(model, guide, x, num_samples=20, seed=0, **options)
    assert pred.binary
    assert pred.probs.shape == pred.log_probs.shape == (12, 2)
    assert pred.probs_samples.shape == pred.log_probs_samples.shape == (20, 12, 2)
    torch.testing.assert_close(pred.probs, pred.log_probs.exp())
    torch.testing.assert_close(pred.probs.sum(-1), torch.ones(12))
    torch.testing.assert_close(pred.probs[:, 1], torch.sigmoid(pred.logits_samples).mean(0))
    assert torch.equal(pred.predicted, pred.probs.argmax(-1))
    # the metrics take both as they are
    assert metrics.nll(pred.log_probs, y) == pytest.approx(-pred.log_likelihood(y), rel=1e-5)
    assert metrics.accuracy(pred.probs, y) == pytest.approx(
        float((pred.predicted == y).double().mean())
    )


_LENET_MEMORY = """
import resource, sys, torch, pyro
from torch import nn
import pyro_bbb as bbb
import pyro_bbb.infer.slices
torch.set_num_threads(1)
pyro_bbb.infer.slices.SLICE_BYTES = int(sys.argv[3])
pyro.set_rng_seed(0)
net = nn.Sequential(
    nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
    nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
model = bbb.BNN(bbb.bayesianize(net, bbb.priors.Gaussian(1.0)), bbb.likelihoods.Categorical(),
                num_data=60000)
guide = bbb.MeanFieldGuide(model)
x = torch.rand(int(sys.argv[1]), 1, 28, 28)
guide(x[:2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
bbb.predict(model, guide, x, num_samples=int(sys.argv[2]), seed=0)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


@pytest.mark.slow
def test_predicts_memory_does_not_grow_with_the_number_of_images():
    # a LeNet-5 BNN at 50 draws held about 2.5 MB per 28x28 image in one pass (+2.5 GB at
    # 1,000 images); in slices of 256 MiB of activations its peak is about 280 MB above the
    # model's whatever the images (measured 282, 307, 283 and 337 MB at 500, 1,000, 2,000
    # and 10,000). The short form: 10 draws in slices of 16 MiB (about 28 images), 250
    # images against 1,000 (in one pass: +120 and +500 MB)
    import subprocess
    import sys

    draws, budget, images = (50, 2**28, (500, 2000)) if scaled(0, 1) else (10, 2**24, (250, 1000))
    added = []
    for n in images:
        result = subprocess.run(
            [sys.executable, "-c", _LENET_MEMORY, str(n), str(draws), str(budget)],
            capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        added.append(float(result.stdout.split()[-1]))
    assert added[1] < added[0] + 50, added  # MB
    assert max(added) < 1000, added


def test_draws_larger_than_the_budget_are_taken_in_passes_from_one_stream(trained, monkeypatch):
    # 100 draws of a ResNet-18's weights hold 4.5 GB: over DRAW_BYTES, predict draws them in
    # passes, each over every row; the first pass is the draws a smaller prediction takes
    from pyro_bbb.infer import predictive as module

    model, guide, x = trained
    per_draw = 4 * sum(value.numel() for value in guide.median().values())  # float32
    monkeypatch.setattr(module, "DRAW_BYTES", 4 * per_draw)
    assert module.draw_passes(guide, 10) == [4, 4, 2]
    assert module.draw_passes(guide, 4) == [4]
    passes = predict(model, guide, x, num_samples=10, seed=5, batch_size=7)
    first = predict(model, guide, x, num_samples=4, seed=5)
    assert passes.loc_samples.shape == passes.samples.shape == (10, 20)
    torch.testing.assert_close(passes.loc_samples[:4], first.loc_samples, rtol=0, atol=0)
    assert not torch.equal(passes.loc_samples[4:8], passes.loc_samples[:4])  # new draws
    # the same predictive as one pass, to Monte Carlo error
    monkeypatch.setattr(module, "DRAW_BYTES", 2**30)
    many = 4000
    one = predict(model, guide, x, num_samples=many, seed=0)
    monkeypatch.setattr(module, "DRAW_BYTES", 700 * per_draw)
    several = predict(model, guide, x, num_samples=many, seed=1)
    error = one.loc_samples.std(0) / math.sqrt(many)
    assert ((several.mean - one.mean).abs() < 5 * math.sqrt(2) * error).all()


def test_an_ensembles_draws_in_passes_keep_each_members_share(monkeypatch):
    from pyro_bbb.infer import predictive as module

    x, y = _data()
    model = BNN(mlp([1, 8, 1]), likelihoods.Gaussian(scale=0.1), num_data=len(x))
    ensemble = Ensemble(model, MeanFieldGuide, k=3)
    ensemble(x, y)
    per_draw = 4 * sum(value.numel() for value in ensemble.members.median().values()) // 3
    monkeypatch.setattr(module, "DRAW_BYTES", 3 * 2 * per_draw)  # two draws of 3 members
    assert module.draw_passes(ensemble, 5) == [2, 2, 1]
    passes = predict(model, ensemble, x, num_samples=5, seed=2)
    first = predict(model, ensemble, x, num_samples=2, seed=2)
    assert passes.loc_samples.shape == (15, 20)
    torch.testing.assert_close(passes.loc_samples[:6], first.loc_samples, rtol=0, atol=0)


def test_predicting_with_batch_norm_in_training_mode_warns_and_eval_does_not():
    # in training mode each slice is normalised by its own statistics, so the prediction
    # depends on batch_size, and the running statistics move
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(2, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    from pyro_bbb import bayesianize
    from pyro_bbb.infer.predictive import TrainingModeWarning

    model = BNN(bayesianize(net), likelihoods.Gaussian(scale=0.1), num_data=40)
    guide = MeanFieldGuide(model)
    x = torch.randn(40, 2)
    guide(x, torch.randn(40))
    with pytest.warns(
        TrainingModeWarning, match=r"BatchNorm1d\) is in training mode.*model\.eval\(\)"
    ):
        whole = predict(model, guide, x, num_samples=3, seed=0)
    with pytest.warns(TrainingModeWarning, match="training mode"):
        sliced = predict(model, guide, x, num_samples=3, seed=0, batch_size=7)
    assert not torch.allclose(whole.mean, sliced.mean)  # what the warning says
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        whole = predict(model, guide, x, num_samples=3, seed=0)
        sliced = predict(model, guide, x, num_samples=3, seed=0, batch_size=7)
    torch.testing.assert_close(whole.mean, sliced.mean)
