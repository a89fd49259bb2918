"""NUTS on the full-batch model, both backends: posterior recovery, the noise choice, what
each returns, scripts and notebooks, bad input."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pyro.distributions as dist
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.evaluation import effective_sample_size
from pyro_bbb.infer.mcmc import NUTSResult, run_nuts
from pyro_bbb.infer.mcmc.chains import guide_start
from pyro_bbb.infer.mcmc.potential import flat_layout

from ...problems import conjugate_problem, exact_guide, linear_bnn
from ...support import REPO, requires_cuda, requires_numpyro, scaled

BACKENDS = ["pyro", pytest.param("numpyro", marks=requires_numpyro)]


def flat_draws(result: NUTSResult) -> torch.Tensor:
    """Pooled draws of [w_1..w_d, b], ``(num_draws, d + 1)``."""
    flat = result.flat_samples()
    return torch.cat([flat["0.weight"].flatten(1), flat["0.bias"]], dim=1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_nuts_recovers_the_exact_posterior_of_linear_regression(backend):
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    # NumPyro's draws cost microseconds: more of them, in two vectorised chains
    draws = {"pyro": scaled(400, 2000), "numpyro": scaled(2000, 10000)}[backend]
    result = run_nuts(
        model, x, y, num_samples=draws, warmup_steps=scaled(200, 500), seed=0,
        progress=False, init_steps=100, backend=backend, num_chains=1 + (backend == "numpyro"),
    )  # fmt: skip
    draws = flat_draws(result)
    ess = torch.cat([v.reshape(-1) for v in effective_sample_size(result).values()])
    assert result.num_divergences == 0
    # mean: within 4 Monte Carlo standard errors sd / sqrt(ESS)
    sd = covariance.diagonal().sqrt()
    assert torch.all((draws.mean(0) - mean).abs() < 4 * sd / ess.sqrt()), (draws.mean(0), mean)
    # covariance: Var[hat Σ_ij] ≈ (Σ_ii Σ_jj + Σ_ij²) / ESS for Gaussian draws
    estimate = torch.cov(draws.T)
    se = ((covariance.diagonal().outer(covariance.diagonal()) + covariance**2) / ess.min()).sqrt()
    assert torch.all((estimate - covariance).abs() < 4 * se), (estimate, covariance)


def test_result_holds_samples_stats_mcmc_and_time_by_chain():
    x, y, *_ = conjugate_problem()
    result = run_nuts(
        linear_bnn(x), x, y, num_samples=30, warmup_steps=20, num_chains=2, num_workers=1,
        seed=1, progress=False, init_steps=10,
    )  # fmt: skip
    assert result.samples["0.weight"].shape == (2, 30, 1, 3)
    assert result.samples["0.bias"].shape == (2, 30, 1)
    for name in ("lp", "diverging", "tree_depth", "n_steps", "step_size", "acceptance_rate"):
        assert result.sample_stats[name].shape == (2, 30), name
    assert len(result.mcmc) == 2 and result.wall_time > 0
    n_steps = result.sample_stats["n_steps"]
    # a tree of depth k has at most 2^k - 1 leapfrog steps
    assert torch.all(n_steps <= 2 ** result.sample_stats["tree_depth"] - 1)
    assert torch.all(n_steps >= 1)
    rate = result.sample_stats["acceptance_rate"]
    assert torch.all((rate >= 0) & (rate <= 1))
    # chains are seeded apart
    assert not torch.equal(result.samples["0.bias"][0], result.samples["0.bias"][1])


def test_same_seed_gives_the_same_draws():
    x, y, *_ = conjugate_problem()
    kwargs = dict(num_samples=10, warmup_steps=10, seed=3, progress=False, init_steps=5)
    a = run_nuts(linear_bnn(x), x, y, **kwargs)
    b = run_nuts(linear_bnn(x), x, y, **kwargs)
    assert torch.equal(a.samples["0.weight"], b.samples["0.weight"])


def test_jit_and_eager_potentials_agree():
    x, y, *_ = conjugate_problem()
    kwargs = dict(num_samples=5, warmup_steps=5, seed=2, progress=False, init="prior")
    a = run_nuts(linear_bnn(x), x, y, jit_compile=True, **kwargs)
    b = run_nuts(linear_bnn(x), x, y, jit_compile=False, **kwargs)
    assert torch.allclose(a.samples["0.weight"], b.samples["0.weight"], atol=1e-6)


@pytest.mark.slow
def test_learned_noise_needs_a_choice_and_a_prior_samples_it():
    x, y, *_ = conjugate_problem()
    net = bbb.mlp([3, 1]).double()
    model = bbb.BNN(net, bbb.likelihoods.Gaussian().double(), num_data=len(x))
    with pytest.raises(ValueError, match="noise='fixed'"):
        run_nuts(model, x, y, num_samples=5, warmup_steps=5)
    prior = dist.LogNormal(torch.tensor(0.0, dtype=torch.float64), 1.0)
    result = run_nuts(
        model, x, y, num_samples=scaled(300, 1000), warmup_steps=200, seed=0, progress=False,
        noise=prior, init_steps=100,
    )  # fmt: skip
    scale = result.samples["likelihood.scale"]
    assert scale.shape == (1, result.num_samples) and bool((scale > 0).all())
    # the data's noise is 0.5; 30 points pin it to about ±0.07
    assert abs(float(scale.mean()) - 0.5) < 0.15
    fixed = run_nuts(
        model, x, y, num_samples=5, warmup_steps=5, noise="fixed", progress=False, init_steps=5
    )
    assert fixed.noise == "fixed" and fixed.noise_value == pytest.approx(1.0)
    assert "likelihood.scale" not in fixed.samples


def test_noise_is_refused_for_a_fixed_scale():
    x, y, *_ = conjugate_problem()
    with pytest.raises(ValueError, match="only for a Gaussian likelihood with a learned scale"):
        run_nuts(linear_bnn(x), x, y, num_samples=5, warmup_steps=5, noise="fixed")


@pytest.mark.parametrize("backend", BACKENDS)
def test_minibatched_model_is_refused(backend):
    x, y, *_ = conjugate_problem()
    model = linear_bnn(x)
    with pytest.raises(ValueError, match="x has 20 rows but the model has num_data=30"):
        run_nuts(model, x[:20], y[:20], num_samples=5, warmup_steps=5, backend=backend)


def test_mismatched_x_and_y_are_refused():
    x, y, *_ = conjugate_problem()
    with pytest.raises(ValueError, match=r"same number of rows, got x \(30, 3\) and y \(29,\)"):
        run_nuts(linear_bnn(x), x, y[:-1], num_samples=5, warmup_steps=5)
    with pytest.raises(TypeError, match=r"y must be a torch\.Tensor"):
        run_nuts(linear_bnn(x), x, y.numpy(), num_samples=5, warmup_steps=5)


@pytest.mark.parametrize(
    ("option", "value"), [("num_samples", 0), ("warmup_steps", -1), ("num_chains", 1.5)]
)
def test_bad_counts_are_refused(option, value):
    x, y, *_ = conjugate_problem()
    kwargs = {"num_samples": 5, "warmup_steps": 5, option: value}
    with pytest.raises(ValueError, match=option):
        run_nuts(linear_bnn(x), x, y, **kwargs)


def test_classification_net_runs_in_spawned_workers():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = bbb.BNN(bbb.mlp([2, 3, 2], activation="tanh"), bbb.likelihoods.Categorical(), 40)
    result = run_nuts(
        model, x, y, num_samples=10, warmup_steps=10, num_chains=2, num_workers=2, seed=0,
        progress=False, init_steps=20, max_tree_depth=4,
    )  # fmt: skip
    assert result.samples["0.weight"].shape == (2, 10, 3, 2)
    assert result.mcmc == (None, None)  # MCMC objects stay in the workers
    assert torch.all(result.sample_stats["tree_depth"] <= 4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_guide_gives_the_starts_and_the_initial_inverse_mass_matrix(backend):
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    sites, *_ = flat_layout(model, x, y, None)
    starts, inverse_mass = guide_start(model, guide, x, y, sites, num_chains=3, num_draws=4000)
    assert starts.shape == (3, 4) and not torch.equal(starts[0], starts[1])
    # the variances of 4000 draws: within 4 standard errors sqrt(2 / 4000) (relative)
    assert torch.allclose(inverse_mass, covariance.diagonal(), rtol=4 * (2 / 4000) ** 0.5)
    result = run_nuts(
        model, x, y, num_samples=20, warmup_steps=20, num_chains=2, seed=0, progress=False,
        init=guide, backend=backend,
    )  # fmt: skip
    assert result.samples["0.weight"].shape == (2, 20, 1, 3)


def test_a_noise_prior_is_judged_by_its_support_not_by_a_draw():
    x, y, *_ = conjugate_problem()
    model = bbb.BNN(bbb.mlp([3, 1]).double(), bbb.likelihoods.Gaussian().double(), len(x))
    # a Normal(1, 0.3) draw is positive 99.96 % of the time, its support is the real line
    normal = dist.Normal(torch.tensor(1.0, dtype=torch.float64), 0.3)
    with pytest.raises(ValueError, match=r"support \(0, inf\).*support Real"):
        run_nuts(model, x, y, num_samples=5, warmup_steps=5, noise=normal)
    for prior in (dist.HalfNormal(1.0), dist.Uniform(0.01, 2.0), dist.Gamma(2.0, 2.0)):
        sites, *_ = flat_layout(model, x, y, prior)
        assert sites[-1].name == "likelihood.scale"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_network_in_training_mode_is_refused_and_sampled_in_evaluation_mode(backend):
    x, y, *_ = conjugate_problem()
    net = bbb.mlp([3, 4, 1], activation="tanh", dropout=0.3).double()
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(0.5).double(), num_data=len(x))
    kwargs = dict(num_samples=5, warmup_steps=5, seed=0, progress=False, init_steps=5)
    with pytest.raises(ValueError, match=r"evaluation mode.*'net.2' \(Dropout\).*model.eval\(\)"):
        run_nuts(model, x, y, backend=backend, **kwargs)
    model.eval()
    result = run_nuts(model, x, y, backend=backend, **kwargs)
    assert result.samples["0.weight"].shape == (1, 5, 4, 3)


def test_an_unknown_backend_is_refused_with_the_list():
    x, y, *_ = conjugate_problem()
    with pytest.raises(ValueError, match="backend must be 'pyro' or 'numpyro', got 'stan'"):
        run_nuts(linear_bnn(x), x, y, num_samples=5, warmup_steps=5, backend="stan")


@pytest.mark.parametrize(
    ("backend", "option"),
    [("pyro", {"chain_method": "vectorized"}), ("pyro", {"precision": "float32"}),
     pytest.param("numpyro", {"num_workers": 2}, marks=requires_numpyro)],
)  # fmt: skip
def test_an_option_of_the_other_backend_is_refused(backend, option):
    x, y, *_ = conjugate_problem()
    with pytest.raises(ValueError, match=f"{next(iter(option))} is an option of backend="):
        run_nuts(linear_bnn(x), x, y, num_samples=5, warmup_steps=5, backend=backend, **option)


# --- the NumPyro backend -----------------------------------------------------------------------


@requires_numpyro
def test_both_backends_return_the_same_sites_shapes_and_statistics():
    x, y, *_ = conjugate_problem()
    model = bbb.BNN(bbb.mlp([3, 2, 1], activation="tanh"), bbb.likelihoods.Gaussian(0.5), 30)
    kwargs = dict(num_samples=20, warmup_steps=20, num_chains=2, seed=0, progress=False)
    x32, y32 = x.float(), y.float()
    pyro_run = run_nuts(model, x32, y32, init_steps=20, **kwargs)
    numpyro_run = run_nuts(model, x32, y32, backend="numpyro", init_steps=20, **kwargs)
    for name, value in pyro_run.samples.items():
        other = numpyro_run.samples[name]
        assert (
            (other.shape, other.dtype) == (value.shape, value.dtype) == (other.shape, torch.float32)
        )
    assert set(numpyro_run.sample_stats) == set(pyro_run.sample_stats) | {"energy"}
    for name, value in numpyro_run.sample_stats.items():
        assert value.shape == (2, 20), name
    assert numpyro_run.backend == "numpyro" and numpyro_run.mcmc == (None, None)
    n_steps, depth = numpyro_run.sample_stats["n_steps"], numpyro_run.sample_stats["tree_depth"]
    assert torch.all((n_steps <= 2**depth - 1) & (n_steps >= 2 ** (depth - 1)))
    assert numpyro_run.warmup_stats["step_size"].shape == (2,)
    assert torch.equal(
        numpyro_run.warmup_stats["step_size"], numpyro_run.sample_stats["step_size"][:, -1]
    )
    # both replay through the model alike
    assert numpyro_run.predict(model, x32[:4]).loc_samples.shape == (40, 4)


@requires_cuda
@requires_numpyro
def test_a_cuda_model_is_exported_on_the_cpu_and_its_draws_come_back_on_its_device():
    x, y, *_ = conjugate_problem()
    model = linear_bnn(x).cuda()
    result = run_nuts(
        model, x.cuda(), y.cuda(), num_samples=20, warmup_steps=20, seed=0, progress=False,
        backend="numpyro",
    )  # fmt: skip
    assert result.samples["0.weight"].device.type == "cuda"
    assert result.predict(model, x.cuda()[:3]).loc_samples.device.type == "cuda"


@requires_numpyro
def test_numpyro_same_seed_gives_the_same_draws_and_chains_differ():
    x, y, *_ = conjugate_problem()
    kwargs = dict(num_samples=10, warmup_steps=10, num_chains=2, progress=False, seed=3)
    a = run_nuts(linear_bnn(x), x, y, backend="numpyro", **kwargs)
    b = run_nuts(linear_bnn(x), x, y, backend="numpyro", **kwargs)
    assert torch.equal(a.samples["0.weight"], b.samples["0.weight"])
    assert not torch.equal(a.samples["0.weight"][0], a.samples["0.weight"][1])


@requires_numpyro
@pytest.mark.slow
def test_numpyro_samples_a_noise_scale_under_its_prior():
    x, y, *_ = conjugate_problem()
    model = bbb.BNN(bbb.mlp([3, 1]).double(), bbb.likelihoods.Gaussian().double(), len(x))
    prior = dist.LogNormal(torch.tensor(0.0, dtype=torch.float64), 1.0)
    result = run_nuts(
        model, x, y, num_samples=scaled(1000, 4000), warmup_steps=500, num_chains=2, seed=0,
        progress=False, noise=prior, backend="numpyro",
    )  # fmt: skip
    scale = result.samples["likelihood.scale"]
    # the data's noise is 0.5; 30 points pin it to about ±0.07
    assert scale.shape == (2, result.num_samples) and abs(float(scale.mean()) - 0.5) < 0.15


@requires_numpyro
def test_a_model_the_export_does_not_know_is_refused_before_any_sampling(monkeypatch):
    from pyro_bbb.infer.mcmc import chains, numpyro_chains

    def sampled(*args, **kwargs):
        raise AssertionError("sampling started")

    monkeypatch.setattr(numpyro_chains.NumPyroChains, "run", sampled)
    monkeypatch.setattr(numpyro_chains.NumPyroChains, "find_modes", sampled)
    monkeypatch.setattr(chains, "initial_theta", sampled)
    x, y, *_ = conjugate_problem()
    net = bbb.mlp([3, 4, 1], activation=torch.nn.Hardswish).double()
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(0.5).double(), num_data=len(x))
    with pytest.raises(NotImplementedError, match=r"module '1' \(Hardswish\).*backend='pyro'"):
        run_nuts(model, x, y, num_samples=5, warmup_steps=5, backend="numpyro")


def test_without_the_extra_numpyro_raises_an_import_error_naming_it():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["jax"] = None  # as if the extra were not installed
        import pyro_bbb
        from tests.problems import conjugate_problem, linear_bnn
        x, y, *_ = conjugate_problem()
        try:
            pyro_bbb.run_nuts(linear_bnn(x), x, y, num_samples=5, warmup_steps=5,
                              backend="numpyro")
        except ImportError as error:
            print(error)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert 'pip install "pyro-bbb[numpyro]"' in run.stdout, run.stdout


# --- scripts and notebooks ---------------------------------------------------------------------

SCRIPT = """
import torch
import pyro_bbb as bbb

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
x = torch.randn(30, 2, generator=g)
y = torch.tanh(x[:, 0]) + 0.1 * torch.randn(30, generator=g)


class Net(torch.nn.Module):  # defined in __main__, as in a notebook or a script
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(2, 3)
        self.fc2 = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


model = bbb.BNN(bbb.bayesianize(Net()), bbb.likelihoods.Gaussian(0.1), num_data=30)
result = bbb.run_nuts(model, x, y, num_samples=8, warmup_steps=8, num_chains=2, seed=0,
                      progress=False, init_steps=10, max_tree_depth=4{options})
torch.save(result.samples, {out!r})
print("done")
"""


def _run_script(tmp_path, source: str, as_file: bool):
    if as_file:  # a top-level script without a main guard
        path = tmp_path / "script.py"
        path.write_text(source)
        command, stdin = [sys.executable, str(path)], None
    else:  # code with no file behind it, as a notebook's cells
        command, stdin = [sys.executable, "-"], source
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )


@pytest.mark.parametrize("as_file", [True, False], ids=["unguarded_script", "notebook_like"])
def test_run_nuts_works_from_an_unguarded_script_and_a_notebook_as_here(tmp_path, as_file):
    out = tmp_path / "samples.pt"
    run = _run_script(tmp_path, SCRIPT.format(options="", out=str(out)), as_file)
    assert run.returncode == 0 and "done" in run.stdout, run.stderr[-3000:]
    # the same seed in this process, chains one after another: the same draws
    namespace = {}
    exec(SCRIPT.format(options="", out=str(tmp_path / "here.pt")), namespace)
    here = torch.load(tmp_path / "here.pt")
    for name, value in torch.load(out).items():
        assert torch.equal(value, here[name]), name


def test_worker_processes_from_an_unguarded_script_fail_with_a_clear_error(tmp_path):
    source = SCRIPT.format(options=", num_workers=2", out=str(tmp_path / "s.pt"))
    run = _run_script(tmp_path, source, as_file=True)
    assert run.returncode != 0
    assert "num_workers=1 (the default: chains run here)" in run.stderr, run.stderr[-3000:]


def test_run_nuts_samples_a_model_function_of_ones_own():
    # before: "'function' object has no attribute 'named_modules'" (the evaluation-mode check)
    import pyro
    from torch import nn

    pyro.clear_param_store()
    net = bbb.bayesianize(nn.Sequential(nn.Linear(1, 3), nn.Tanh(), nn.Linear(3, 1)))
    x = torch.linspace(-1, 1, 20).unsqueeze(-1)
    y = torch.sin(x[:, 0])

    def model(x, y=None):
        loc = net(x).squeeze(-1)
        with pyro.plate("data", 20):
            return pyro.sample("obs", dist.Normal(loc, 0.1), obs=y)

    result = run_nuts(model, x, y, num_samples=10, warmup_steps=10, num_chains=1, seed=0,
                      progress=False, init_steps=0)  # fmt: skip
    assert result.samples["0.weight"].shape == (1, 10, 3, 1)
