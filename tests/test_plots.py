from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from pyro_bbb.plots import (  # noqa: E402
    plot_history,
    plot_posterior_summary,
    plot_regression_bands,
    plot_reliability,
    plot_scores,
    plot_weight_sigma,
)

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path):
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(_PNG_SIGNATURE)


@dataclass
class _History:
    loss: list[float] = field(default_factory=list)
    nll: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    beta: list[float] = field(default_factory=list)


def test_plot_regression_bands_returns_a_figure_and_writes_a_png(tmp_path):
    x_train = torch.cat([torch.linspace(-4, -1, 20), torch.linspace(1, 4, 20)]).unsqueeze(-1)
    y_train = torch.sin(x_train.squeeze(-1))
    x_test = torch.linspace(6, -6, 101).unsqueeze(-1)  # unsorted on purpose
    mean = torch.sin(x_test.squeeze(-1))
    epistemic = 0.1 + 0.05 * x_test.squeeze(-1).abs()
    total = (epistemic**2 + 0.1**2).sqrt()
    path = tmp_path / "bands.png"
    figure = plot_regression_bands(
        x_train,
        y_train,
        x_test,
        mean,
        epistemic,
        total,
        true_fn=torch.sin,
        shade=[(-1.0, 1.0)],
        shade_label="gap",
        title="bands",
        path=path,
    )
    assert isinstance(figure, Figure)
    _assert_png(path)
    (ax,) = figure.axes
    labels = ax.get_legend_handles_labels()[1]
    assert labels == [
        "gap",
        "±2σ total",
        "±2σ epistemic",
        "predictive mean",
        "truth",
        "training data",
    ]
    mean_line, truth_line = ax.get_lines()
    assert np.all(np.diff(mean_line.get_xdata()) > 0)  # sorted before drawing
    np.testing.assert_allclose(truth_line.get_ydata(), np.sin(truth_line.get_xdata()), atol=1e-6)


def test_plot_regression_bands_rejects_predictions_of_the_wrong_length():
    x = np.linspace(-1, 1, 5)
    with pytest.raises(ValueError, match=r"total_std must have one value per x_test point \(5\)"):
        plot_regression_bands(x, x, x, x, np.ones(5), np.ones(4))


def test_plot_regression_bands_draws_a_reference_posterior_sorted_like_the_rest():
    x = np.array([2.0, -1.0, 0.5, 1.0])
    reference = ("NUTS", 10 * x, np.full(4, 0.5))
    figure = plot_regression_bands(x, x, x, x, np.ones(4), np.ones(4), reference=reference)
    (ax,) = figure.axes
    labels = ax.get_legend_handles_labels()[1]
    assert "NUTS mean" in labels and "NUTS ±2σ epistemic" in labels
    _, ref_mean, lower, upper = ax.get_lines()
    np.testing.assert_allclose(ref_mean.get_ydata(), 10 * np.sort(x))
    np.testing.assert_allclose(upper.get_ydata() - lower.get_ydata(), 2.0)
    with pytest.raises(ValueError, match=r"reference mean must have one value per x_test"):
        plot_regression_bands(x, x, x, x, x**2, x**2, reference=("NUTS", x[:3], x))


def test_plot_history_returns_a_figure_and_writes_a_png(tmp_path):
    history = _History(
        loss=[100.0, 50.0, 20.0, -3.0],
        nll=[90.0, 40.0, 5.0, -10.0],
        kl=[torch.tensor(10.0), 10.0, 15.0, 7.0],
        beta=[0.0, 0.5, 1.0, 1.0],
    )
    path = tmp_path / "history.png"
    figure = plot_history(history, path=path)
    assert isinstance(figure, Figure)
    _assert_png(path)
    top, bottom = figure.axes
    assert top.get_yscale() == "symlog"  # negative values present
    np.testing.assert_allclose(bottom.get_lines()[0].get_ydata(), [0.0, 0.5, 1.0, 1.0])


def test_plot_history_draws_the_fraction_of_weights_at_the_prior_when_recorded():
    history = {
        "loss": [3.0, 2.0], "nll": [2.0, 1.0], "kl": [1.0, 1.0], "beta": [0.0, 1.0],
        "collapsed": [0.2, 0.9],
    }  # fmt: skip
    _, bottom = plot_history(history).axes
    np.testing.assert_allclose(bottom.get_lines()[1].get_ydata(), [0.2, 0.9])


def test_plot_history_uses_a_log_scale_for_positive_curves_and_accepts_a_mapping():
    history = {"loss": [3.0, 2.0], "nll": [2.0, 1.0], "kl": [1.0, 1.0], "beta": []}
    top, _ = plot_history(history).axes
    assert top.get_yscale() == "log"


def test_plot_history_names_a_missing_series():
    with pytest.raises(ValueError, match=r"history must have a 'beta'"):
        plot_history({"loss": [], "nll": [], "kl": []})


def test_plot_reliability_returns_a_figure_with_the_ece_in_its_title(tmp_path):
    probs = torch.tensor([[0.9, 0.1]] * 10 + [[0.3, 0.7]] * 10)
    y = torch.tensor([0] * 5 + [1] * 5 + [1] * 7 + [0] * 3)  # 50% right at 0.9, 70% at 0.7
    path = tmp_path / "reliability.png"
    figure = plot_reliability(probs, y, num_bins=10, path=path)
    assert isinstance(figure, Figure)
    _assert_png(path)
    assert figure.axes[0].get_title() == "Reliability (ECE = 0.200)"
    assert math.isclose(sum(patch.get_height() for patch in figure.axes[1].patches), 20)


def test_plot_reliability_accepts_numpy_binary_probabilities(tmp_path):
    path = tmp_path / "binary.png"
    plot_reliability(np.array([0.1, 0.8, 0.6, 0.3]), np.array([0, 1, 0, 0]), path=path)
    _assert_png(path)


def test_plot_weight_sigma_draws_one_histogram_per_entry_and_the_prior_line(tmp_path):
    import pyro_bbb as bbb

    model = bbb.BNN(bbb.mlp([2, 8, 1]), bbb.likelihoods.Gaussian(), num_data=4)
    guide = bbb.MeanFieldGuide(model, init_scale=0.05)
    guide(torch.zeros(4, 2), torch.zeros(4))
    posterior = guide.posterior()  # distributions: their variance gives sigma
    scales = {"0.weight": posterior["0.weight"], "2.weight": torch.full((8,), 0.3)}
    path = tmp_path / "sigma.png"
    figure = plot_weight_sigma(scales, prior_scale=1.0, num_bins=20, path=path)
    _assert_png(path)
    ax = figure.axes[0]
    assert ax.get_xscale() == "log"
    patches = [p for p in ax.patches if p.get_label() and not p.get_label().startswith("_")]
    assert [p.get_label() for p in patches] == ["0.weight (median 0.05)", "2.weight (median 0.3)"]
    (prior_line,) = [line for line in ax.lines if line.get_label() == "prior σ"]
    assert prior_line.get_xdata()[0] == 1.0


def test_plot_weight_sigma_and_plot_reliability_take_a_guide_and_a_prediction_as_they_are():
    # what a user passes first; they failed with "no attribute 'items'" and "Could not infer
    # dtype of ClassificationPrediction"
    import pyro_bbb as bbb

    model = bbb.BNN(bbb.mlp([2, 8, 3]), bbb.likelihoods.Categorical(), num_data=6)
    guide = bbb.MeanFieldGuide(model, init_scale=0.05)
    x, y = torch.randn(6, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    guide(x, y)
    labels = [p.get_label() for p in plot_weight_sigma(guide).axes[0].patches]
    assert labels == [
        f"{name} (median 0.05)" for name in ("0.weight", "0.bias", "2.weight", "2.bias")
    ]
    with pytest.raises(TypeError, match=r"e\.g\. guide\.posterior\(\), got list"):
        plot_weight_sigma([0.1, 0.2])
    prediction = bbb.predict(model, guide, x, num_samples=4, seed=0)
    given = plot_reliability(prediction, y).axes[0].get_title()
    assert given == plot_reliability(prediction.probs, y).axes[0].get_title()
    regression = bbb.BNN(bbb.mlp([2, 4, 1]), bbb.likelihoods.Gaussian(), num_data=6)
    regression_guide = bbb.MeanFieldGuide(regression, name="regression")
    regression_guide(x, y.float())
    # a regression's prediction failed on "Could not infer dtype of RegressionPrediction"
    with pytest.raises(TypeError, match=r"a classifier's calibration.*interval_coverage"):
        plot_reliability(bbb.predict(regression, regression_guide, x, num_samples=4), y)


def test_plot_weight_sigma_counts_every_weight_in_its_histogram():
    values = np.array([0.01] * 5 + [0.1] * 3)
    figure = plot_weight_sigma({"w": values}, num_bins=4)
    (patch,) = figure.axes[0].patches
    heights = patch.get_xy()[:, 1]
    assert heights.max() == 5 and sorted(set(heights.tolist()))[-2:] == [3.0, 5.0]


def test_plot_weight_sigma_rejects_non_positive_scales_and_priors():
    with pytest.raises(ValueError, match=r"scales\['w'\] must hold positive finite"):
        plot_weight_sigma({"w": torch.tensor([0.1, 0.0])})
    with pytest.raises(ValueError, match=r"prior_scale must hold positive numbers"):
        plot_weight_sigma({"w": torch.tensor([0.1])}, prior_scale=[1.0, -2.0])
    with pytest.raises(ValueError, match=r"at least one entry"):
        plot_weight_sigma({})


def test_plot_scores_draws_one_panel_per_data_set_with_ours_filled_above_the_published(tmp_path):
    ours = {"a": {"BNN": (-2.5, 0.1), "MC dropout": (-2.7, 0.2)}, "b": {"BNN": (1.0, 0.05)}}
    published = {"a": {"VI": (-2.9, 0.07)}, "b": {}, "not run": {"VI": (0.0, 0.1)}}
    path = tmp_path / "scores.png"
    figure = plot_scores(ours, published, columns=3, path=path)
    _assert_png(path)
    visible = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["a", "b"]  # two columns of three: one hidden
    panel = visible[0]
    labels = [tick.get_text() for tick in panel.get_yticklabels()]
    assert labels == ["VI (published)", "MC dropout", "BNN"]  # bottom to top
    centres = sorted((line.get_ydata()[0], line.get_xdata()[0]) for line in panel.lines[::3])
    assert centres == [(0, -2.9), (1, -2.7), (2, -2.5)]
    # ours filled, the published figure hollow
    faces = {line.get_xdata()[0]: line.get_markerfacecolor() for line in panel.lines[::3]}
    assert faces[-2.9] == "white" and faces[-2.5] != "white"


def test_plot_scores_rejects_empty_input():
    with pytest.raises(ValueError, match="at least one data set"):
        plot_scores({})
    with pytest.raises(ValueError, match=r"no scores for data set\(s\) \['b'\]"):
        plot_scores({"a": {"BNN": (0.0, 1.0)}, "b": {}})
    with pytest.raises(ValueError, match="columns"):
        plot_scores({"a": {"BNN": (0.0, 1.0)}}, columns=0)


def test_plot_posterior_summary_draws_a_row_per_site_and_writes_a_png(tmp_path):
    import pyro

    import pyro_bbb as bbb

    pyro.set_rng_seed(0)
    x = torch.randn(8, 2)
    model = bbb.BNN(bbb.mlp([2, 3, 1]), bbb.likelihoods.Gaussian(0.1), num_data=8)
    ensemble = bbb.Ensemble(model, bbb.MeanFieldGuide, k=2)
    ensemble(x)
    table = bbb.posterior_summary(model, ensemble, x, by="layer")
    path = tmp_path / "posterior.png"
    figure = plot_posterior_summary(table, title="posterior", path=path)
    assert isinstance(figure, Figure)
    _assert_png(path)
    spread, ratio, share = figure.axes
    assert ratio.get_xlabel() == "signal-to-noise |μ| / σ"
    labels = [label.get_text() for label in spread.get_yticklabels()]
    assert labels == ["0 / 0", "0 / 2", "1 / 0", "1 / 2"]
    assert spread.get_xscale() == "log"
    assert [text.get_text()[:3] for text in share.texts] == ["KL "] * 4
    with pytest.raises(ValueError, match="must be a posterior_summary table"):
        plot_posterior_summary(table.drop(columns="kl"))
