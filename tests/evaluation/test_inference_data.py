"""ArviZ export of VI and NUTS with one schema."""

from __future__ import annotations

import logging
import shutil
import warnings

import arviz as az
import matplotlib
import numpy as np
import pyro
import pytest
import torch
import xarray as xr

import pyro_bbb as bbb
from pyro_bbb.evaluation import to_inference_data
from pyro_bbb.infer.mcmc import run_nuts

from ..problems import conjugate_problem, exact_guide, linear_bnn

matplotlib.use("Agg")


GROUPS = {
    "posterior",
    "posterior_predictive",
    "log_likelihood",
    "observed_data",
    "constant_data",
    "sample_stats",
}


def test_inference_data_has_the_same_schema_for_vi_and_nuts(nuts_result):
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    vi = to_inference_data(model, guide, x, y, num_samples=50, seed=0)
    nuts = to_inference_data(model, nuts_result, x, y)
    for data in (vi, nuts):
        assert set(data.groups()) >= GROUPS
        assert set(data.posterior.data_vars) == {"0.weight", "0.bias"}
        assert data.posterior["0.weight"].dims[2:] == ("0.out", "0.in")
        assert data.posterior["0.bias"].dims[2:] == ("0.out",)
        assert data.log_likelihood["obs"].dims[2:] == ("data",)
        assert data.posterior_predictive["obs"].shape[2:] == (30,)
        assert torch.equal(torch.as_tensor(data.observed_data["obs"].values), y)
        assert torch.equal(torch.as_tensor(data.constant_data["x"].values), x)
    assert vi.posterior["0.weight"].shape == (4, 50, 1, 3)  # four chains of a guide's draws
    assert nuts.posterior["0.weight"].shape == (2, 150, 1, 3)
    assert set(vi.sample_stats.data_vars) == {"lp", "log_q"}
    assert {"lp", "diverging", "tree_depth", "step_size"} <= set(nuts.sample_stats.data_vars)


def test_log_likelihood_is_pointwise_gaussian_density(nuts_result):
    x, y, *_ = conjugate_problem()
    data = to_inference_data(linear_bnn(x), nuts_result, x, y)
    w = nuts_result.samples["0.weight"][..., 0, :]  # (chains, draws, 3)
    b = nuts_result.samples["0.bias"]  # (chains, draws, 1)
    loc = torch.einsum("cdk,nk->cdn", w, x) + b
    expected = torch.distributions.Normal(loc, 0.5).log_prob(y)
    assert torch.allclose(torch.as_tensor(data.log_likelihood["obs"].values), expected)


def test_vi_sample_stats_are_the_log_joint_and_log_q():
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    data = to_inference_data(model, guide, x, y, num_samples=50, num_chains=2, seed=1)
    w = torch.cat(
        [
            torch.as_tensor(data.posterior["0.weight"].values).reshape(2, 50, 3),
            torch.as_tensor(data.posterior["0.bias"].values).reshape(2, 50, 1),
        ],
        dim=-1,
    )
    q = torch.distributions.MultivariateNormal(mean, covariance)
    assert torch.allclose(torch.as_tensor(data.sample_stats["log_q"].values), q.log_prob(w))
    prior = torch.distributions.Normal(0.0, 1.0).log_prob(w).sum(-1)
    loc = w[..., :3] @ x.T + w[..., 3:]
    lik = torch.distributions.Normal(loc, 0.5).log_prob(y).sum(-1)
    assert torch.allclose(torch.as_tensor(data.sample_stats["lp"].values), prior + lik)


def test_arviz_functions_run_on_vi_and_nuts(nuts_result):
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    vi = to_inference_data(model, guide, x, y, num_samples=75, seed=0)
    nuts = to_inference_data(model, nuts_result, x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a high Pareto k on 30 points is data
        loo = {name: az.loo(data) for name, data in (("vi", vi), ("nuts", nuts))}
        for data in (vi, nuts):
            assert len(az.summary(data)) == 4
            assert az.waic(data).elpd_waic < 0
            az.plot_posterior(data)
        table = az.compare({"vi": vi, "nuts": nuts})
    # both sample the same posterior: their elpd agree within the standard error
    assert abs(loo["vi"].elpd_loo - loo["nuts"].elpd_loo) < loo["vi"].se
    assert set(table.index) == {"vi", "nuts"}


def test_classification_inference_data_and_labels():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    y = (x[:, 0] > 0).long()
    model = bbb.BNN(bbb.mlp([2, 3, 3], activation="tanh"), bbb.likelihoods.Categorical(), 40)
    guide = bbb.MeanFieldGuide(model)
    data = to_inference_data(model, guide, x, y, num_samples=20, seed=0)
    predictive = torch.as_tensor(data.posterior_predictive["obs"].values)
    assert predictive.shape == (4, 20, 40) and predictive.max() <= 2
    assert data.log_likelihood["obs"].shape == (4, 20, 40)
    assert bool((torch.as_tensor(data.log_likelihood["obs"].values) <= 0).all())


def test_a_sampled_noise_scale_is_a_posterior_variable_and_enters_the_likelihood():
    x, y, *_ = conjugate_problem()
    net = bbb.mlp([3, 1]).double()
    model = bbb.BNN(net, bbb.likelihoods.Gaussian().double(), num_data=len(x))
    prior = torch.distributions.LogNormal(torch.tensor(0.0, dtype=torch.float64), 1.0)
    result = run_nuts(
        model, x, y, num_samples=20, warmup_steps=20, seed=0, progress=False, noise=prior,
        init_steps=50,
    )  # fmt: skip
    data = to_inference_data(model, result, x, y)
    scale = result.samples["likelihood.scale"]  # (1, 20)
    assert torch.equal(torch.as_tensor(data.posterior["likelihood.scale"].values), scale)
    loc = torch.einsum("cdk,nk->cdn", result.samples["0.weight"][..., 0, :], x)
    loc = loc + result.samples["0.bias"]
    expected = torch.distributions.Normal(loc, scale.unsqueeze(-1)).log_prob(y)
    assert torch.allclose(torch.as_tensor(data.log_likelihood["obs"].values), expected)
    prediction = result.predict(model, x, seed=0)
    assert torch.allclose(prediction.scale_samples.reshape(20, -1)[:, 0], scale[0])


def test_inference_data_on_a_test_set_larger_than_the_training_set(nuts_result):
    x, *_ = conjugate_problem()
    x_test, y_test, *_ = conjugate_problem(num_data=100, seed=1)
    model = linear_bnn(x)
    data = to_inference_data(model, nuts_result, x_test, y_test)
    assert data.log_likelihood["obs"].shape == (2, 150, 100)
    with pytest.raises(ValueError, match=r"y must have shape \(100,\) for x, got \(100, 1\)"):
        to_inference_data(model, nuts_result, x_test, y_test.unsqueeze(-1))


def _diagnose_without_warnings(data, caplog):
    """az.summary, az.ess and az.rhat on ``data``, failing on any warning or ArviZ log line."""
    with caplog.at_level(logging.WARNING), warnings.catch_warnings():
        warnings.simplefilter("error")
        summary, ess, rhat = az.summary(data), az.ess(data), az.rhat(data)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    return summary, ess, rhat


def test_a_guides_draws_are_four_chains_that_arviz_diagnoses_without_a_warning(caplog):
    # One chain gave "Shape validation failed ... minimum_shape: (chains=2, draws=4)" and a
    # NaN R-hat. The draws are independent: every chain has the posterior's distribution, so
    # R-hat is 1 up to its noise and the ESS about the number of draws (500).
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    data = to_inference_data(model, guide, x, y, seed=0)
    assert data.posterior.sizes["chain"] == 4 and data.posterior.sizes["draw"] == 125
    summary, ess, rhat = _diagnose_without_warnings(data, caplog)
    assert summary["r_hat"].notna().all() and (summary["r_hat"] < 1.03).all()
    assert float(rhat["0.weight"].max()) < 1.03
    assert 300 < float(ess["0.bias"].min()) < 800
    two = to_inference_data(model, guide, x, y, num_samples=30, num_chains=2, seed=0)
    assert two.posterior["0.weight"].shape == (2, 30, 1, 3)


def test_an_ensembles_members_are_its_chains(caplog):
    x, y, *_ = conjugate_problem()
    model = linear_bnn(x)
    ensemble = bbb.Ensemble(model, bbb.MeanFieldGuide, k=3)
    data = to_inference_data(model, ensemble, x, y, num_samples=40, seed=0)
    assert data.posterior["0.weight"].shape == (3, 40, 1, 3)
    _diagnose_without_warnings(data, caplog)
    assert (
        to_inference_data(model, ensemble, x, y, num_samples=8, num_chains=3).posterior.sizes[
            "chain"
        ]
        == 3
    )
    with pytest.raises(
        ValueError, match=r"num_chains=4 but the chains are the ensemble's members \(3\)"
    ):
        to_inference_data(model, ensemble, x, y, num_chains=4)


def test_num_chains_must_match_a_nuts_results_chains(nuts_result):
    x, y, *_ = conjugate_problem()
    with pytest.raises(
        ValueError, match=r"num_chains=4 but the chains are the NUTS result's chains \(2\)"
    ):
        to_inference_data(linear_bnn(x), nuts_result, x, y, num_chains=4)
    with pytest.raises(ValueError, match="num_chains must be a positive int, got 0"):
        to_inference_data(linear_bnn(x), nuts_result, x, y, num_chains=0)


def _fitted(**options):
    x, y, *_ = conjugate_problem()
    model = linear_bnn(x)
    guide = bbb.MeanFieldGuide(model)
    bbb.fit(model, guide, x, y, progress=False, seed=0, **options)
    return model, guide, x, y


def _convergence_warnings(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if issubclass(w.category, bbb.ConvergenceWarning)]


def test_a_posterior_whose_fit_stopped_on_the_predictive_is_exported_with_one_warning():
    # fit's default run stops when the predictive stops improving; its sds can be far from
    # the posterior's, so the export says so, once per guide, and names the strict run
    model, guide, x, y = _fitted(max_steps=40)
    first = _convergence_warnings(lambda: to_inference_data(model, guide, x, y, num_samples=8))
    assert len(first) == 1
    assert "to_inference_data" in first[0] and 'until="converged"' in first[0]
    assert not _convergence_warnings(lambda: to_inference_data(model, guide, x, y, num_samples=8))


@pytest.mark.parametrize("options", [{"max_steps": 40, "until": "converged"}, {"epochs": 3}])
def test_a_strict_or_fixed_fit_is_exported_without_that_warning(options):
    model, guide, x, y = _fitted(**options)
    assert not _convergence_warnings(lambda: to_inference_data(model, guide, x, y, num_samples=8))


# --- a real network's size: the sites and units asked for, the groups asked for, a limit ------


def _network(seed: int = 0):
    pyro.set_rng_seed(seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(50, 6, generator=g)
    y = (x[:, 0] > 0).long()
    model = bbb.BNN(bbb.mlp([6, 8, 8, 3]), bbb.likelihoods.Categorical(), num_data=50)
    guide = bbb.MeanFieldGuide(model, init_scale=0.2)
    guide(x, y)
    return model, guide, x, y


def test_var_names_exports_a_layers_sites_as_arviz_reads_them():
    model, guide, x, y = _network()
    data = to_inference_data(model, guide, x, y, var_names="2", num_samples=10, seed=0)
    assert set(data.posterior.data_vars) == {"2.weight", "2.bias"}
    assert data.posterior["2.weight"].dtype == np.float32
    assert data.log_likelihood["obs"].dtype == np.float32
    assert data.sample_stats["lp"].dtype == np.float32
    left_out = to_inference_data(model, guide, x, y, var_names=["~0", "~2"], num_samples=10)
    assert set(left_out.posterior.data_vars) == {"4.weight", "4.bias"}
    like = to_inference_data(model, guide, x, y, var_names="bias", filter_vars="like",
                             num_samples=10)  # fmt: skip
    assert set(like.posterior.data_vars) == {"0.bias", "2.bias", "4.bias"}
    with pytest.raises(KeyError, match="'fc1' matches none of the sites"):
        to_inference_data(model, guide, x, y, var_names="fc1")


def test_coords_keep_some_units_labelled_by_their_index_and_az_summary_reads_them():
    model, guide, x, y = _network()
    data = to_inference_data(
        model, guide, x, y, var_names="2", coords={"2.out": [5, 1]}, num_samples=10, seed=0
    )
    assert data.posterior["2.weight"].shape == (4, 10, 2, 8)
    assert data.posterior["2.bias"].coords["2.out"].values.tolist() == [5, 1]
    # the same draws as the whole layer's, those units only
    whole = to_inference_data(model, guide, x, y, var_names="2", num_samples=10, seed=0)
    expected = whole.posterior["2.weight"].sel({"2.out": [5, 1]}).values
    np.testing.assert_array_equal(data.posterior["2.weight"].values, expected)
    assert len(az.summary(data, kind="stats")) == 2 * 8 + 2
    rows = to_inference_data(model, guide, x, y, var_names="4.bias",
                             coords={"data": range(10, 20)}, num_samples=10)  # fmt: skip
    assert rows.log_likelihood["obs"].shape == (4, 10, 10)
    assert rows.observed_data["obs"].coords["data"].values.tolist() == list(range(10, 20))
    np.testing.assert_array_equal(rows.constant_data["x"].values, x[10:20].numpy())


def test_the_groups_that_grow_with_the_data_can_be_left_out():
    model, guide, x, y = _network()
    both = {"log_likelihood": False, "posterior_predictive": False}
    posterior_only = to_inference_data(model, guide, x, y, num_samples=10, **both)
    assert set(posterior_only.groups()) == {"posterior"}
    no_predictive = to_inference_data(
        model, guide, x, y, num_samples=10, posterior_predictive=False, seed=0
    )
    assert set(no_predictive.groups()) == GROUPS - {"posterior_predictive"}
    no_log_likelihood = to_inference_data(
        model, guide, x, y, num_samples=10, log_likelihood=False, seed=0
    )
    assert set(no_log_likelihood.groups()) == GROUPS - {"log_likelihood"}
    # lp still sums the log-likelihood over the rows
    np.testing.assert_allclose(
        no_log_likelihood.sample_stats["lp"].values,
        no_predictive.sample_stats["lp"].values,
        rtol=1e-6,
    )


def test_an_export_above_max_bytes_is_refused_before_anything_is_drawn(nuts_result):
    # 4 x 125 draws of 6*8 + 8 + 8*8 + 8 + 8*3 + 3 = 155 float32 weights: 310,000 bytes; the
    # log-likelihood 4 x 125 x 50 x 4 = 100,000; the predictive (int64 labels) 200,000; the
    # data 400 + 1,200
    model, guide, x, y = _network()
    state = torch.get_rng_state()
    with pytest.raises(ValueError) as refused:
        to_inference_data(model, guide, x, y, max_bytes=500_000)
    message = str(refused.value)
    assert "would build 612 kB, above max_bytes=500000" in message
    assert "posterior 310 kB" in message and "log_likelihood 100 kB" in message
    assert "var_names=None: 6 sites, 155 values a draw over 500 draws" in message
    assert "'0' 112 kB" in message and "max_bytes=None" in message
    assert torch.equal(torch.get_rng_state(), state)  # nothing was drawn
    small = to_inference_data(model, guide, x, y, var_names="4", max_bytes=500_000,
                              log_likelihood=False, posterior_predictive=False)  # fmt: skip
    assert set(small.posterior.data_vars) == {"4.weight", "4.bias"}
    assert to_inference_data(model, guide, x, y, max_bytes=None, num_samples=5).posterior
    x_nuts, y_nuts, *_ = conjugate_problem()
    with pytest.raises(ValueError, match=r"var_names='0\.bias': 1 sites, 1 values a draw over 300"):
        to_inference_data(linear_bnn(x_nuts), nuts_result, x_nuts, y_nuts, var_names="0.bias",
                          max_bytes=1000)  # fmt: skip
    nuts = to_inference_data(linear_bnn(x_nuts), nuts_result, x_nuts, y_nuts, var_names="0.bias",
                             log_likelihood=False, posterior_predictive=False)  # fmt: skip
    assert set(nuts.groups()) == {"posterior", "sample_stats"}
    assert nuts.posterior["0.bias"].shape == (2, 150, 1)


def test_a_fresh_guides_first_seeded_export_is_the_one_later_calls_give():
    pyro.clear_param_store()
    model = bbb.BNN(bbb.mlp([3, 8, 2]), bbb.likelihoods.Categorical(), num_data=10)
    guide = bbb.MeanFieldGuide(model)
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    options = {"var_names": "0", "num_samples": 5, "seed": 0}
    first = to_inference_data(model, guide, x, y, **options)
    second = to_inference_data(model, guide, x, y, **options)
    np.testing.assert_array_equal(
        first.posterior["0.weight"].values, second.posterior["0.weight"].values
    )
    np.testing.assert_array_equal(
        first.log_likelihood["obs"].values, second.log_likelihood["obs"].values
    )


# --- into a file: the same export, written as it is drawn ------------------------------------


def _assert_same_export(written, built) -> None:
    assert set(written.groups()) == set(built.groups())
    for group in built.groups():
        xr.testing.assert_equal(getattr(written, group), getattr(built, group))
        for name, variable in getattr(built, group).data_vars.items():
            assert getattr(written, group)[name].dtype == variable.dtype, (group, name)


def test_an_export_into_a_file_is_the_export_in_memory(tmp_path, monkeypatch, nuts_result):
    # slices of a few draws (chain-major slices cross the chains' ends), the units and rows
    # coords= keeps, an ensemble's members, and NUTS's own draws and boolean sample_stats
    model, guide, x, y = _network()
    monkeypatch.setattr("pyro_bbb.evaluation.draws.SLICE_BYTES", 4 * 3 * 3 * 155 * 4)
    options = {"num_samples": 7, "seed": 0, "coords": {"2.out": [5, 1], "data": range(10, 30)}}
    path = tmp_path / "guide.nc"
    written = to_inference_data(model, guide, x, y, path=path, **options)
    _assert_same_export(written, to_inference_data(model, guide, x, y, **options))
    assert written.posterior["2.bias"].coords["2.out"].values.tolist() == [5, 1]
    _assert_same_export(az.from_netcdf(path), written)  # the file itself, read again
    ensemble = bbb.Ensemble(model, lambda m: bbb.MeanFieldGuide(m, init_scale=0.2), k=2)
    ensemble(x, y)
    _assert_same_export(
        to_inference_data(model, ensemble, x, y, num_samples=5, seed=1, path=tmp_path / "e.nc"),
        to_inference_data(model, ensemble, x, y, num_samples=5, seed=1),
    )
    x_nuts, y_nuts, *_ = conjugate_problem()
    nuts = to_inference_data(linear_bnn(x_nuts), nuts_result, x_nuts, y_nuts, seed=0,
                             path=tmp_path / "nuts.nc")  # fmt: skip
    _assert_same_export(
        nuts, to_inference_data(linear_bnn(x_nuts), nuts_result, x_nuts, y_nuts, seed=0)
    )
    assert nuts.sample_stats["diverging"].dtype == bool
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.nc", "guide.nc", "nuts.nc"]


def test_an_export_into_a_file_holds_in_memory_only_the_data(tmp_path):
    # refused in memory at 500 kB (612 kB), written into a file: memory holds the data's
    # 1.6 kB; where the file would not fit on the disk, refused before anything is drawn
    model, guide, x, y = _network()
    with pytest.raises(ValueError, match="path= to write it into a file as it is drawn"):
        to_inference_data(model, guide, x, y, max_bytes=500_000)
    data = to_inference_data(model, guide, x, y, max_bytes=500_000, path=tmp_path / "a.nc")
    assert data.posterior["0.weight"].shape == (4, 125, 8, 6)
    with pytest.raises(ValueError, match="would build 612 kB, above max_bytes=1000"):
        to_inference_data(model, guide, x, y, max_bytes=1000, path=tmp_path / "b.nc")
    state = torch.get_rng_state()
    with pytest.raises(FileNotFoundError, match=r"its folder '.*missing' does not exist"):
        to_inference_data(model, guide, x, y, path=tmp_path / "missing" / "c.nc")
    with pytest.raises(IsADirectoryError, match="is a folder; name the file to write"):
        to_inference_data(model, guide, x, y, path=tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("shutil.disk_usage", lambda _: shutil._ntuple_diskusage(10**6, 0, 1000))
        with pytest.raises(OSError, match="the export takes 1 MB and the disk there has 0 MB"):
            to_inference_data(model, guide, x, y, path=tmp_path / "d.nc")
    assert torch.equal(torch.get_rng_state(), state)  # nothing was drawn
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.nc"]


def test_a_file_is_replaced_only_by_a_complete_export_and_earlier_readers_keep_theirs(
    tmp_path, monkeypatch
):
    model, guide, x, y = _network()
    path = tmp_path / "export.nc"
    first = to_inference_data(model, guide, x, y, var_names="4", num_samples=5, seed=0, path=path)
    before = first.posterior["4.bias"].values.copy()
    second = to_inference_data(model, guide, x, y, var_names="4", num_samples=5, seed=1, path=path)
    np.testing.assert_array_equal(first.posterior["4.bias"].values, before)  # its own file
    assert not np.array_equal(second.posterior["4.bias"].values, before)
    calls = []

    def failing(self, start, part):
        calls.append(start)
        if len(calls) > 2:
            raise RuntimeError("interrupted")

    monkeypatch.setattr("pyro_bbb.evaluation.netcdf_export._FileSink.add", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        to_inference_data(model, guide, x, y, num_samples=5, seed=2, path=path)
    np.testing.assert_array_equal(
        az.from_netcdf(path).posterior["4.bias"].values, second.posterior["4.bias"].values
    )
    assert [p.name for p in tmp_path.iterdir()] == ["export.nc"]  # no half-written file
