"""compare(): the VI-versus-NUTS table."""

from __future__ import annotations

import warnings

import pyro
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.evaluation import (
    Comparison,
    compare,
    label_set_coverage,
)
from pyro_bbb.infer.mcmc import run_nuts

from ..problems import conjugate_problem, exact_guide, linear_bnn
from ..support import REPO


@pytest.fixture(scope="module")
def nuts_result():
    x, y, *_ = conjugate_problem()
    return run_nuts(
        linear_bnn(x), x, y, num_samples=200, warmup_steps=100, seed=0, progress=False,
        init_steps=50,
    )  # fmt: skip


def test_a_result_compared_with_itself_has_distance_zero_and_agreement_one(nuts_result):
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    for posterior in (nuts_result, guide):
        report = compare(model, posterior, posterior, x, y, num_samples=300)
        assert report.columns["w2_mean"] == [0.0, 0.0]
        assert torch.equal(report.pointwise["w2"], torch.zeros(30, dtype=torch.float64))


def test_classification_result_compared_with_itself_agrees():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    y = (x[:, 0] > 0).long()
    model = bbb.BNN(bbb.mlp([2, 3, 3], activation="tanh"), bbb.likelihoods.Categorical(), 40)
    guide = bbb.MeanFieldGuide(model)
    report = compare(model, guide, guide, x, y, num_samples=50)
    assert report.task == "classification"
    assert report.columns["tv_mean"] == [0.0, 0.0]
    assert report.columns["top1_agreement"] == [1.0, 1.0]
    assert 0 <= report.columns["accuracy"][0] <= 1
    # two guides of one class are told apart in the table (both read "MeanFieldGuide" before)
    assert report.names == ("MeanFieldGuide (a)", "MeanFieldGuide (b)")
    assert compare(model, guide, guide, x, y, names=["p", "q"], num_samples=5).names == ("p", "q")


def test_exact_vi_and_nuts_agree_and_the_table_has_every_column(nuts_result):
    x, y, mean, covariance, _ = conjugate_problem()
    x_test, y_test, *_ = conjugate_problem(num_data=200, seed=1)
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    narrow = exact_guide(model, x, y, mean, covariance, shrink=0.1)
    history = bbb.History(num_data=30, seconds=[1.5, 2.5])
    report = compare(
        model, (guide, history), nuts_result, x_test, y_test, x_train=x, y_train=y,
        num_samples=1000,
    )  # fmt: skip
    table = report.to_dict()
    assert table["method"] == ["exact_1.0", "NUTS"]
    assert table["kind"] == ["VI", "NUTS"]
    assert table["wall_time_s"] == [4.0, nuts_result.wall_time]
    assert table["ess_per_s"][0] is None and table["ess_per_s"][1] > 0
    assert table["psis_khat"][0] < 0.5 and table["psis_khat"][1] is None
    # the same posterior: the same log-likelihood and RMSE up to Monte Carlo error (NUTS's
    # mean function has an error of about 0.15 / sqrt(ESS ≈ 150) ≈ 0.01 per point), and
    # 95 % intervals that cover about 95 % of 200 test points
    assert abs(table["test_log_likelihood"][0] - table["test_log_likelihood"][1]) < 0.03
    assert abs(table["rmse"][0] - table["rmse"][1]) < 0.03
    assert all(0.9 < c < 0.99 for c in table["coverage_95"])
    # the predictive std is ≈ 0.5 (noise); the W2 between 1000 and 200 draws of one such
    # distribution is about 0.07 from sampling alone
    assert table["w2_mean"][0] < 0.1
    # far from the data the weights' uncertainty dominates: a 10x too narrow guide is far off
    x_far = 5 * x_test
    y_far = x_far @ torch.tensor([1.0, -2.0, 0.5], dtype=x.dtype) + 0.3
    exact_far = compare(model, guide, nuts_result, x_far, y_far)
    worse = compare(model, narrow, nuts_result, x_far, y_far, x_train=x, y_train=y)
    assert worse.columns["psis_khat"][0] > 0.7
    assert worse.columns["w2_mean"][0] > 2 * exact_far.columns["w2_mean"][0]
    assert worse.columns["coverage_95"][0] < exact_far.columns["coverage_95"][0]
    text = str(report)
    for label in ("test log-likelihood", "RMSE", "95% interval coverage", "PSIS k-hat", "W2"):
        assert label in text
    assert report._repr_markdown_().startswith("| | exact_1.0 | NUTS |")


def test_bad_arguments_are_refused(nuts_result):
    x, y, *_ = conjugate_problem()
    model = linear_bnn(x)
    with pytest.raises(TypeError, match="a must be a guide, a NUTSResult"):
        compare(model, 3, nuts_result, x, y)
    with pytest.raises(ValueError, match="both x_train and y_train"):
        compare(model, nuts_result, nuts_result, x, y, x_train=x)
    assert isinstance(compare(model, nuts_result, nuts_result, x, y), Comparison)


def test_the_vi_vs_nuts_example_runs_end_to_end(tmp_path):
    import subprocess
    import sys

    pytest.importorskip("numpyro", reason="the example samples with the numpyro extra")
    script = REPO / "examples" / "vi_vs_nuts.py"
    out = tmp_path / "bands.png"
    args = ["--num-data", "20", "--hidden", "3", "--epochs", "50", "--chains", "1"]
    args += ["--samples", "10", "--warmup", "10", "--out", str(out)]
    run = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    for text in ("mean-field", "low-rank", "NUTS", "W2 to NUTS", "epistemic std, gap"):
        assert text in run.stdout
    assert "(the same 50 epochs for every posterior" in run.stdout  # said, not warned of
    assert "ConvergenceWarning" not in run.stderr
    assert out.stat().st_size > 10_000


def test_the_report_warns_once_of_a_guide_whose_fit_stopped_on_the_predictive():
    x, y, *_ = conjugate_problem()
    model = linear_bnn(x)
    guides = {}
    for until in ("predictive", "converged"):
        guides[until] = bbb.MeanFieldGuide(model, name=until)
        bbb.fit(model, guides[until], x, y, progress=False, seed=0, max_steps=40, until=until)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compare(model, guides["predictive"], guides["converged"], x, y, num_samples=20)
        compare(model, guides["converged"], guides["predictive"], x, y, num_samples=20)
    messages = [str(w.message) for w in caught if issubclass(w.category, bbb.ConvergenceWarning)]
    assert len(messages) == 1
    assert messages[0].startswith("compare reads") and 'until="converged"' in messages[0]


def test_a_bernoulli_classifiers_two_columns_are_compared_as_its_classes():
    # its probs are [p(y=0), p(y=1)]: the total variation between two is |p1 - q1|, and
    # the label set and the accuracy read the same two columns
    pyro.set_rng_seed(0)
    x = torch.randn(40, 2)
    y = (x[:, 0] > 0).long()
    model = bbb.BNN(bbb.mlp([2, 4, 1]), bbb.likelihoods.Bernoulli(), num_data=40)
    a = bbb.MeanFieldGuide(model, init_scale=0.3, name="a")
    b = bbb.MeanFieldGuide(model, init_scale=0.3, name="b")
    a(x, y), b(x, y)
    report = compare(model, a, b, x, y, num_samples=50)
    pa, pb = (bbb.predict(model, g, x, num_samples=50, seed=0).probs for g in (a, b))
    torch.testing.assert_close(report.pointwise["tv"], (pa[:, 1] - pb[:, 1]).abs())
    assert report.columns["accuracy"][0] == pytest.approx(
        float(((pa[:, 1] > 0.5).long() == y).double().mean())
    )
    expected = label_set_coverage(pa[:, 1], y, 0.95, binary=True)
    assert report.columns["coverage_95"][0] == pytest.approx(expected)
