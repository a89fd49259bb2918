"""A posterior's draws replayed through the model, in slices of draws and rows."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.evaluation.draws import DrawLayout, model_sites, posterior_draws


def _classifier(seed: int = 0):
    pyro.set_rng_seed(seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(30, 2, generator=g)
    y = (x[:, 0] > 0).long()
    model = bbb.BNN(bbb.mlp([2, 4, 3], activation="tanh"), bbb.likelihoods.Categorical(), 30)
    return model, x, y


def _log_likelihood(model, values, x, y, c, s):
    weights = {name: value[c, s] for name, value in values.items()}
    logits = model.network_at(weights, x)
    return dist.Categorical(logits=logits).log_prob(y)


def test_draws_sliced_by_memory_are_the_guides_with_their_densities(monkeypatch):
    # a budget of two draws a slice (a quarter of it, 3 x their 108 bytes) and 7 rows a
    # pass: 3 chains of 5 draws come in 8 slices, each replayed in 5 passes; every draw's
    # log q, log p(w) and log-likelihood are those of its own weights, in closed form
    model, x, y = _classifier()
    guide = bbb.MeanFieldGuide(model, init_scale=0.3)
    guide(x, y)
    monkeypatch.setattr("pyro_bbb.evaluation.draws.SLICE_BYTES", 4 * 3 * 2 * 27 * 4)
    draws = posterior_draws(model, guide, x, y, num_samples=5, num_chains=3, batch_size=7)
    assert draws.values["0.weight"].shape == (3, 5, 4, 2)
    assert draws.log_likelihood.shape == (3, 5, 30)
    flat = torch.cat([v.reshape(15, -1) for v in draws.values.values()], -1)
    assert len(torch.unique(flat, dim=0)) == 15  # fifteen distinct draws
    marginals = guide.marginals()
    log_q = sum(
        dist.Normal(*marginals[name]).log_prob(value).flatten(2).sum(-1)
        for name, value in draws.values.items()
    )
    torch.testing.assert_close(draws.log_q, log_q)
    log_prior = sum(
        dist.Normal(0.0, 1.0).log_prob(value).flatten(2).sum(-1) for value in draws.values.values()
    )
    torch.testing.assert_close(draws.log_prior, log_prior)
    for c, s in [(0, 0), (1, 3), (2, 4)]:
        expected = _log_likelihood(model, draws.values, x, y, c, s)
        torch.testing.assert_close(draws.log_likelihood[c, s], expected)
    torch.testing.assert_close(draws.total_log_likelihood, draws.log_likelihood.sum(-1))
    torch.testing.assert_close(draws.log_joint, draws.log_prior + draws.total_log_likelihood)


def test_an_ensembles_members_stay_its_chains_across_slices(monkeypatch):
    # members far apart and narrow: each chain's draws sit at its own member's mean
    model, x, y = _classifier()
    ensemble = bbb.Ensemble(model, lambda m: bbb.MeanFieldGuide(m, init_scale=1e-3), k=3)
    ensemble(x, y)
    monkeypatch.setattr("pyro_bbb.evaluation.draws.SLICE_BYTES", 4 * 3 * 3 * 27 * 4)
    draws = posterior_draws(model, ensemble, x, y, num_samples=4, predictive=True)
    loc = ensemble.marginals()["0.weight"][0]  # (3, 4, 2)
    assert draws.values["0.weight"].shape == (3, 4, 4, 2)
    torch.testing.assert_close(
        draws.values["0.weight"], loc.unsqueeze(1).expand(3, 4, 4, 2), atol=0.01, rtol=0
    )
    assert draws.predictive.shape == draws.log_likelihood.shape == (3, 4, 30)
    assert draws.log_q.shape == (3, 4)


def test_without_the_data_a_mean_field_guide_draws_the_sites_asked_and_no_other():
    # the draws of "2.bias" are the first random numbers drawn: no other site was drawn
    model, x, y = _classifier()
    guide = bbb.MeanFieldGuide(model, init_scale=0.3)
    guide(x, y)
    pyro.set_rng_seed(7)
    draws = posterior_draws(model, guide, x, num_samples=5, sites=["2.bias"])
    assert set(draws.values) == {"2.bias"}
    assert draws.log_q is draws.log_prior is draws.log_likelihood is None
    pyro.set_rng_seed(7)
    loc, scale = guide.marginals()["2.bias"]
    expected = dist.Normal(loc, scale).rsample((20, 1)).reshape(4, 5, 3)
    torch.testing.assert_close(draws.values["2.bias"], expected)


def test_the_model_sites_come_from_one_trace_that_changes_nothing():
    model, x, _ = _classifier()
    state = torch.get_rng_state()
    sites = model_sites(model, x)
    assert torch.equal(torch.get_rng_state(), state)
    assert {name: tuple(shape) for name, (shape, _) in sites.items()} == {
        "0.weight": (4, 2), "0.bias": (4,), "2.weight": (3, 4), "2.bias": (3,),
    }  # fmt: skip
    assert {dtype for _, dtype in sites.values()} == {torch.float32}


def test_sites_that_are_not_the_models_are_refused():
    model, x, y = _classifier()
    guide = bbb.MeanFieldGuide(model)
    with pytest.raises(ValueError, match=r"sites \['3.weight'\] are not the model's"):
        posterior_draws(model, guide, x, y, sites=["3.weight"])


class _Slices:
    """A sink that keeps every slice it is given, with where it starts."""

    def __init__(self, layout) -> None:
        self.layout, self.slices = layout, []

    def add(self, start, part) -> None:
        self.slices.append((start, part.clone()))

    def assembled(self) -> torch.Tensor:
        shape = self.layout.shape_of(self.slices[0][1])
        whole, filled = self.slices[0][1].new_zeros(shape), torch.zeros(shape, dtype=torch.int)
        for start, part in self.slices:
            for chain, draws, values in self.layout.pieces(start, part):
                whole[chain, draws] = values
                filled[chain, draws] += 1
        assert (filled == 1).all()  # every place once
        return whole


@pytest.mark.parametrize("ensemble", [False, True])
def test_a_sink_takes_the_slices_it_asks_for_and_memory_keeps_the_rest(monkeypatch, ensemble):
    # slices of two draws: with 3 chains of 5 draws, chain-major slices cross the chains'
    # ends (draws 4-5 are chain 0's last and chain 1's first); the slices put together in
    # their places are the draws kept in memory, bit for bit
    model, x, y = _classifier()
    if ensemble:
        guide = bbb.Ensemble(model, lambda m: bbb.MeanFieldGuide(m, init_scale=0.3), k=3)
    else:
        guide = bbb.MeanFieldGuide(model, init_scale=0.3)
    guide(x, y)
    members = 3 if ensemble else 1
    monkeypatch.setattr("pyro_bbb.evaluation.draws.SLICE_BYTES", 4 * 3 * 2 * 27 * 4 * members)
    sinks = {}

    def sink(key, layout):
        if key in ("0.weight", "log_likelihood", "predictive"):
            return sinks.setdefault(key, _Slices(layout))
        return None

    options = {"num_samples": 5, "num_chains": 3, "predictive": True, "batch_size": 7}
    pyro.set_rng_seed(3)
    sent = posterior_draws(model, guide, x, y, sink=sink, **options)
    pyro.set_rng_seed(3)
    kept = posterior_draws(model, guide, x, y, **options)
    assert set(sent.values) == {"0.bias", "2.weight", "2.bias"}
    assert sent.log_likelihood is None and sent.predictive is None
    assert len(sinks["0.weight"].slices) == (3 if ensemble else 8)
    assert torch.equal(sinks["0.weight"].assembled(), kept.values["0.weight"])
    assert torch.equal(sinks["log_likelihood"].assembled(), kept.log_likelihood)
    assert torch.equal(sinks["predictive"].assembled(), kept.predictive)
    torch.testing.assert_close(sent.log_q, kept.log_q)
    torch.testing.assert_close(sent.total_log_likelihood, kept.total_log_likelihood)


def test_a_layouts_pieces_put_a_plates_draws_in_their_chains():
    chain_major = DrawLayout(chains=3, draws=4, ensemble=False)
    flat = torch.arange(12.0).unsqueeze(-1)  # plate draw p holds p
    whole = torch.full((3, 4, 1), float("nan"))
    for start, size in [(0, 5), (5, 2), (7, 5)]:
        for chain, draws, values in chain_major.pieces(start, flat[start : start + size]):
            whole[chain, draws] = values
    assert torch.equal(whole, flat.reshape(3, 4, 1))
    assert [(c, d) for c, d, _ in chain_major.pieces(3, flat[3:9])] == [
        (0, slice(3, 4)), (1, slice(0, 4)), (2, slice(0, 1)),
    ]  # fmt: skip
    draw_major = DrawLayout(chains=2, draws=3, ensemble=True)  # a slice: (n, members, ...)
    part = torch.arange(6.0).reshape(3, 2)
    [(chain, draws, values)] = draw_major.pieces(0, part)
    assert chain == slice(None) and draws == slice(0, 3)
    assert torch.equal(values, part.T) and draw_major.shape_of(part) == (2, 3)
