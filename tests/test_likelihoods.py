"""Tests of pyro_bbb.likelihoods: observation models, their parameters and target checks."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pyro_bbb import likelihoods


def _normal_log_pdf(y, loc, scale):
    return -0.5 * math.log(2 * math.pi) - torch.log(scale) - 0.5 * ((y - loc) / scale) ** 2


def _param_sites(fn, *args) -> dict[str, torch.Tensor]:
    trace = pyro.poutine.trace(fn).get_trace(*args)
    return {name: site["value"] for name, site in trace.nodes.items() if site["type"] == "param"}


# --- Gaussian: how the scale is set ----------------------------------------------------------


def test_gaussian_default_learns_its_scale_as_a_positive_pyro_param():
    likelihood = likelihoods.Gaussian(init_scale=0.7)
    assert likelihood.learned
    params = _param_sites(likelihood, torch.zeros(3, 1))
    assert set(params) == {"scale"}
    assert params["scale"].item() == pytest.approx(0.7)
    # the unconstrained value is the trainable tensor; the scale stays positive whatever it is
    (raw,) = likelihood.parameters()
    assert raw.requires_grad
    with torch.no_grad():
        raw.fill_(-30.0)
    assert likelihood.scale.item() > 0
    assert likelihood(torch.zeros(3, 1)).scale.min().item() > 0


def test_gaussian_learned_scale_receives_gradients_from_the_log_likelihood():
    likelihood = likelihoods.Gaussian()
    y = torch.tensor([3.0, -3.0])
    likelihood(torch.zeros(2, 1)).log_prob(y).sum().backward()
    (raw,) = likelihood.parameters()
    # at scale 1 the residuals of 3 are too large: the log-likelihood grows with the scale
    assert raw.grad.item() > 0


def test_gaussian_with_fixed_scale_holds_it_as_a_buffer_not_a_parameter():
    likelihood = likelihoods.Gaussian(scale=0.3)
    assert not likelihood.learned
    assert list(likelihood.parameters()) == []
    buffers = dict(likelihood.named_buffers())
    assert set(buffers) == {"scale"}
    assert buffers["scale"].item() == pytest.approx(0.3)
    assert _param_sites(likelihood, torch.zeros(4, 1)) == {}
    d = likelihood(torch.zeros(4, 1))
    torch.testing.assert_close(d.scale, torch.full((4,), 0.3))


def test_noise_scale_reads_the_param_store_as_loaded_and_the_fixed_scale_as_given(tmp_path):
    likelihood = likelihoods.Gaussian(init_scale=0.7)
    likelihood(torch.zeros(3, 1))  # run once: its parameter is in the store
    pyro.get_param_store().save(tmp_path / "params.pt")
    with torch.no_grad():
        likelihood.scale.unconstrained().fill_(math.log(2.0))  # positive's bijection: exp
    assert likelihood.noise_scale().item() == pytest.approx(2.0)
    pyro.get_param_store().load(tmp_path / "params.pt")  # other tensors in the store
    # outside a run, the module's own tensor is stale until the next run: noise_scale is not
    assert likelihood.noise_scale().item() == pytest.approx(0.7)
    assert likelihoods.Gaussian(scale=0.3).noise_scale().item() == pytest.approx(0.3)
    with pytest.raises(ValueError, match="heteroscedastic"):
        likelihoods.Gaussian(heteroscedastic=True).noise_scale()


def test_gaussian_fixed_scale_follows_the_module_dtype():
    likelihood = likelihoods.Gaussian(scale=0.3).to(torch.float64)
    assert likelihood.scale.dtype == torch.float64


def test_heteroscedastic_gaussian_takes_mean_and_softplus_scale_from_the_outputs():
    min_scale = 1e-3
    likelihood = likelihoods.Gaussian(heteroscedastic=True, min_scale=min_scale)
    assert list(likelihood.parameters()) == []
    output = torch.tensor([[0.5, -2.0], [1.5, 0.0], [-1.0, 3.0]])
    d = likelihood(output)
    assert d.batch_shape == (3,)
    assert d.event_shape == ()
    torch.testing.assert_close(d.loc, output[:, 0])
    expected_scale = torch.log1p(torch.exp(output[:, 1])) + min_scale
    torch.testing.assert_close(d.scale, expected_scale)
    y = torch.tensor([0.0, 1.0, 2.0])
    torch.testing.assert_close(d.log_prob(y), _normal_log_pdf(y, output[:, 0], expected_scale))


def test_heteroscedastic_gaussian_splits_2d_outputs_into_d_means_and_d_scales():
    likelihood = likelihoods.Gaussian(heteroscedastic=True)
    output = torch.randn(7, 5, 6)  # (sample, batch, 2 * 3)
    d = likelihood(output)
    assert d.batch_shape == (7, 5)
    assert d.event_shape == (3,)
    torch.testing.assert_close(d.base_dist.loc, output[..., :3])
    torch.testing.assert_close(d.base_dist.scale, F.softplus(output[..., 3:]) + 1e-4)


def test_heteroscedastic_gaussian_rejects_an_odd_number_of_outputs():
    likelihood = likelihoods.Gaussian(heteroscedastic=True)
    with pytest.raises(ValueError, match=r"even number of network outputs.*got 3"):
        likelihood(torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"even number of network outputs.*got 1"):
        likelihood.check_target(torch.randn(4), num_outputs=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale": 0.0}, r"scale must be a positive finite number, got 0.0"),
        ({"scale": -1.0}, r"scale must be a positive finite number, got -1.0"),
        ({"scale": math.inf}, r"scale must be a positive finite number"),
        ({"init_scale": 0.0}, r"init_scale must be a positive finite number"),
        ({"scale": 1.0, "heteroscedastic": True}, r"scale must be None when heteroscedastic"),
    ],
)
def test_gaussian_rejects_bad_scale_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        likelihoods.Gaussian(**kwargs)


# --- Gaussian: shapes ----------------------------------------------------------------------


def test_gaussian_with_one_output_has_scalar_events_over_sample_and_batch():
    likelihood = likelihoods.Gaussian(scale=0.5)
    output = torch.randn(4, 6, 1)
    d = likelihood(output)
    assert d.batch_shape == (4, 6)
    assert d.event_shape == ()
    y = torch.randn(6)
    torch.testing.assert_close(
        d.log_prob(y), _normal_log_pdf(y, output.squeeze(-1), torch.tensor(0.5))
    )


def test_gaussian_with_d_outputs_treats_the_dims_as_one_event():
    likelihood = likelihoods.Gaussian(scale=0.5)
    output = torch.randn(4, 6, 3)
    d = likelihood(output)
    assert d.batch_shape == (4, 6)
    assert d.event_shape == (3,)
    y = torch.randn(6, 3)
    expected = _normal_log_pdf(y, output, torch.tensor(0.5)).sum(-1)
    torch.testing.assert_close(d.log_prob(y), expected)


def test_learned_gaussian_with_d_outputs_shares_one_scale():
    likelihood = likelihoods.Gaussian(init_scale=2.0)
    d = likelihood(torch.zeros(5, 3))
    assert d.event_shape == (3,)
    torch.testing.assert_close(d.base_dist.scale, torch.full((5, 3), 2.0))


# --- Gaussian: what a learned noise is fitted to ---------------------------------------------


def _evidence_noise(x: torch.Tensor, y: torch.Tensor) -> float:
    """The noise std that maximises the evidence of Bayesian linear regression, y = [x, 1] w +
    noise with w ~ N(0, I): a golden-section search of log N(y; 0, [x, 1][x, 1]^T + s^2 I)."""
    design = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    gram, eye = design @ design.T, torch.eye(len(y), dtype=x.dtype)

    def log_evidence(s: float) -> float:
        covariance = gram + s**2 * eye
        zero = torch.zeros(len(y), dtype=x.dtype)
        return float(torch.distributions.MultivariateNormal(zero, covariance).log_prob(y))

    low, high, ratio = 0.01, 5.0, (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        low, high = (low, b) if log_evidence(a) > log_evidence(b) else (a, high)
    return (low + high) / 2


@pytest.mark.parametrize("seed", [0, 3])
def test_a_learned_noise_under_the_exact_posterior_is_the_evidence_maximiser(seed):
    # The ELBO's noise optimum sigma^2 = E_q (y - f)^2 = r^2 + Var_q f is MacKay's
    # sigma^2 = |r|^2 / (N - gamma) when q is the exact posterior: the spread it adds to the
    # residuals of the predictive mean is what they lack, not a double count. A full-rank
    # Gaussian guide holds the exact posterior of Bayesian linear regression.
    from pyro_bbb import BNN, LowRankGuide, fit, mlp, predict

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(20, 4, generator=g, dtype=torch.float64)
    y = x @ torch.randn(4, generator=g, dtype=torch.float64)
    y = y + 0.5 * torch.randn(20, generator=g, dtype=torch.float64)
    evidence = _evidence_noise(x, y)
    pyro.clear_param_store()
    model = BNN(mlp([4, 1]), likelihoods.Gaussian(), num_data=20)
    guide = LowRankGuide(model, rank=5, blocks="network")
    fit(model, guide, x.float(), y.float(), epochs=2000, beta=1.0, seed=0, progress=False)
    learned = float(model.likelihood.scale)
    residual = predict(model, guide, x.float(), num_samples=2000, seed=1).mean - y.float()
    # measured over data seeds 0-4 and fit seeds 0-1: 1.001-1.012 and 0.867-0.871
    assert learned / evidence == pytest.approx(1.0, abs=0.03)
    assert float(residual.pow(2).mean().sqrt()) / evidence < 0.92


# --- classification likelihoods ------------------------------------------------------------


def test_categorical_uses_the_outputs_as_logits():
    likelihood = likelihoods.Categorical()
    assert likelihood.task == "classification"
    output = torch.randn(2, 5, 4)
    d = likelihood(output)
    assert d.batch_shape == (2, 5)
    torch.testing.assert_close(d.probs, torch.softmax(output, -1))
    y = torch.tensor([0, 3, 1, 2, 3])
    expected = torch.log_softmax(output, -1).gather(-1, y.expand(2, 5).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(d.log_prob(y), expected)


@pytest.mark.parametrize("sample", [(), (3,), (2, 1)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_categorical_log_prob_is_the_distributions_log_prob_without_building_it(sample, dtype):
    torch.manual_seed(0)
    output = torch.randn(*sample, 7, 5, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 5, (7,)).to(dtype)
    lik = likelihoods.Categorical()
    expected = torch.distributions.Categorical(logits=output).log_prob(y.long())
    got = lik.log_prob(output, y)
    assert got.shape == (*sample, 7)
    torch.testing.assert_close(got, expected)
    (grad,) = torch.autograd.grad(got.sum(), output)
    (expected_grad,) = torch.autograd.grad(expected.sum(), output)
    torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("sample", [(), (3,)])
@pytest.mark.parametrize(
    "make, width",
    [
        (lambda: likelihoods.Gaussian(scale=0.1), 1),
        (lambda: likelihoods.Gaussian(scale=0.3), 2),
        (likelihoods.Gaussian, 1),  # a learned scale: its gradient too
        (likelihoods.Gaussian, 3),
        (lambda: likelihoods.Gaussian(heteroscedastic=True), 2),
        (lambda: likelihoods.Gaussian(heteroscedastic=True), 6),
    ],
)
def test_gaussian_log_prob_is_the_distributions_log_prob_bit_for_bit(make, width, sample):
    # computed without building the Normal, op for op as it would: equal, not merely close
    pyro.clear_param_store()
    torch.manual_seed(0)
    lik = make().double()
    output = torch.randn(*sample, 7, width, dtype=torch.float64, requires_grad=True)
    target = lik._target_width(width)
    y = torch.randn(7, target, dtype=torch.float64) if target > 1 else torch.randn(7).double()
    wrt = [output, *lik.parameters()]
    with lik._pyro_context:  # as in a model's run: a learned scale is the param store's
        expected = lik(output).log_prob(y)
        expected_grads = torch.autograd.grad(expected.sum(), wrt)
        got = lik.log_prob(output, y)
        grads = torch.autograd.grad(got.sum(), wrt)
    assert got.shape == expected.shape == (*sample, 7)
    assert torch.equal(got, expected)
    assert all(torch.equal(g, e) for g, e in zip(grads, expected_grads, strict=True))


@pytest.mark.parametrize(
    "lik, y",
    [
        (likelihoods.Gaussian(scale=0.3), torch.randn(6)),
        (likelihoods.Bernoulli(), torch.randint(0, 2, (6,))),
    ],
)
def test_likelihood_log_prob_defaults_to_the_distribution_of_the_observation(lik, y):
    output = torch.randn(6, 1)
    expected = lik(output).log_prob(lik.as_observation(y, output))
    torch.testing.assert_close(lik.log_prob(output, y), expected)


def test_bernoulli_with_one_output_gives_scalar_events():
    likelihood = likelihoods.Bernoulli()
    output = torch.randn(3, 5, 1)
    d = likelihood(output)
    assert d.batch_shape == (3, 5)
    assert d.event_shape == ()
    torch.testing.assert_close(d.probs, torch.sigmoid(output.squeeze(-1)))


def test_bernoulli_with_d_outputs_is_one_multilabel_event():
    likelihood = likelihoods.Bernoulli()
    output = torch.randn(5, 3)
    d = likelihood(output)
    assert d.batch_shape == (5,)
    assert d.event_shape == (3,)
    y = torch.randint(0, 2, (5, 3)).float()
    expected = -F.binary_cross_entropy_with_logits(output, y, reduction="none").sum(-1)
    torch.testing.assert_close(d.log_prob(y), expected)


def test_bernoulli_observes_integer_labels_cast_to_the_output_dtype():
    likelihood = likelihoods.Bernoulli()
    y = torch.tensor([0, 1, 1])
    obs = likelihood.as_observation(y, torch.zeros(3, 1, dtype=torch.float64))
    assert obs.dtype == torch.float64
    assert obs.tolist() == [0.0, 1.0, 1.0]


def test_likelihoods_declare_their_task():
    assert likelihoods.Gaussian().task == "regression"
    assert likelihoods.Categorical().task == "classification"
    assert likelihoods.Bernoulli().task == "classification"
    assert isinstance(likelihoods.Gaussian(), nn.Module)


# --- target checks -------------------------------------------------------------------------


def test_gaussian_accepts_matching_targets():
    likelihoods.Gaussian().check_target(torch.randn(5), num_outputs=1)
    likelihoods.Gaussian().check_target(torch.randn(5, 3), num_outputs=3)
    likelihoods.Gaussian(heteroscedastic=True).check_target(torch.randn(5), num_outputs=2)
    likelihoods.Gaussian(heteroscedastic=True).check_target(torch.randn(5, 2), num_outputs=4)


def test_gaussian_target_of_shape_b_1_for_one_output_suggests_squeeze():
    with pytest.raises(ValueError, match=r"shape \(batch,\).*got \(5, 1\); use y.squeeze\(-1\)"):
        likelihoods.Gaussian().check_target(torch.randn(5, 1), num_outputs=1)


def test_gaussian_target_without_the_output_dims_is_rejected():
    with pytest.raises(ValueError, match=r"shape \(batch, 3\) for a network with 3 output"):
        likelihoods.Gaussian().check_target(torch.randn(5), num_outputs=3)
    with pytest.raises(ValueError, match=r"shape \(batch, 2\)"):
        likelihoods.Gaussian(heteroscedastic=True).check_target(torch.randn(5, 4), num_outputs=4)


def test_gaussian_target_must_be_floating_point():
    with pytest.raises(ValueError, match=r"floating-point.*torch.int64"):
        likelihoods.Gaussian().check_target(torch.arange(5), num_outputs=1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_gaussian_target_with_nan_or_inf_is_rejected_with_its_index(bad):
    y = torch.zeros(5)
    y[3] = bad
    with pytest.raises(ValueError, match=r"y contains NaN or inf \(first at index \[3\]\)"):
        likelihoods.Gaussian().check_target(y, num_outputs=1)


def test_gaussian_target_values_are_not_read_when_values_is_false():
    y = torch.full((5,), math.nan)
    likelihoods.Gaussian().check_target(y, num_outputs=1, values=False)


def test_categorical_accepts_integer_labels_in_range():
    likelihoods.Categorical().check_target(torch.tensor([0, 2, 1, 2]), num_outputs=3)
    likelihoods.Categorical().check_target(torch.tensor([0, 1], dtype=torch.uint8), num_outputs=2)


def test_categorical_rejects_float_labels():
    with pytest.raises(
        ValueError, match=r"integer class labels \(e.g. y.long\(\)\), got dtype torch.float32"
    ):
        likelihoods.Categorical().check_target(torch.tensor([0.0, 1.0]), num_outputs=3)


@pytest.mark.parametrize(
    ("labels", "low", "high"), [([0, 3, 1], 0, 3), ([-1, 0, 2], -1, 2), ([5], 5, 5)]
)
def test_categorical_rejects_labels_outside_the_classes(labels, low, high):
    with pytest.raises(ValueError, match=rf"labels in \[{low}, {high}\], outside \[0, 3\)"):
        likelihoods.Categorical().check_target(torch.tensor(labels), num_outputs=3)


def test_categorical_rejects_column_labels():
    with pytest.raises(ValueError, match=r"shape \(batch,\), got \(4, 1\)"):
        likelihoods.Categorical().check_target(torch.zeros(4, 1, dtype=torch.long), num_outputs=3)


def test_bernoulli_rejects_labels_other_than_zero_and_one():
    with pytest.raises(ValueError, match=r"0/1 labels"):
        likelihoods.Bernoulli().check_target(torch.tensor([0.0, 0.5, 1.0]), num_outputs=1)
    with pytest.raises(ValueError, match=r"0/1 labels"):
        likelihoods.Bernoulli().check_target(torch.tensor([0, 2]), num_outputs=1)
    with pytest.raises(ValueError, match=r"0/1 labels"):
        likelihoods.Bernoulli().check_target(torch.tensor([0.0, math.nan]), num_outputs=1)


def test_bernoulli_rejects_targets_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"shape \(batch,\), got \(4, 1\)"):
        likelihoods.Bernoulli().check_target(torch.zeros(4, 1), num_outputs=1)
    with pytest.raises(ValueError, match=r"shape \(batch, 3\), got \(4, 2\)"):
        likelihoods.Bernoulli().check_target(torch.zeros(4, 2), num_outputs=3)
    likelihoods.Bernoulli().check_target(torch.ones(4, 3), num_outputs=3)
