"""The published UCI figures: complete, in the right units and sign, and as printed."""

from __future__ import annotations

import pytest

from pyro_bbb.bench import PUBLISHED, PUBLISHED_SOURCES, SplitResult, UCIConfig, UCIResults

STANDARD_SETS = (
    "boston",
    "concrete",
    "energy",
    "kin8nm",
    "naval",
    "power",
    "protein",
    "wine",
    "yacht",
)
COLUMNS = ("VI", "PBP", "MC dropout", "Deep ensembles")


def test_every_standard_set_has_every_column_for_both_metrics():
    assert set(PUBLISHED) == {"rmse", "log_likelihood"}
    assert tuple(PUBLISHED_SOURCES) == COLUMNS
    for metric, by_set in PUBLISHED.items():
        assert set(by_set) == set(STANDARD_SETS), metric
        for name, by_column in by_set.items():
            assert tuple(by_column) == COLUMNS, (metric, name)


def test_every_column_names_its_paper_and_table():
    for column, source in PUBLISHED_SOURCES.items():
        assert "Table 1" in source, column
    assert "Hernández-Lobato & Adams (2015" in PUBLISHED_SOURCES["PBP"]
    assert "Gal & Ghahramani (2016" in PUBLISHED_SOURCES["MC dropout"]
    assert "Lakshminarayanan et al. (2017" in PUBLISHED_SOURCES["Deep ensembles"]
    assert "standard deviation" in PUBLISHED_SOURCES["Deep ensembles"]


def test_figures_are_nonnegative_spreads_and_rmse_in_each_sets_units():
    # RMSE in original units: naval's target (a decay coefficient near 1) has an RMSE of
    # about 0.005, kin8nm's about 0.1, protein's (an RMSD in ångström) about 4.5.
    scale = {"naval": 0.02, "kin8nm": 0.2, "wine": 1.0, "yacht": 7.0, "energy": 3.0}
    for metric, by_set in PUBLISHED.items():
        for name, by_column in by_set.items():
            for column, (mean, spread) in by_column.items():
                assert spread >= 0, (metric, name, column)
                if metric == "rmse":
                    assert 0 <= mean <= scale.get(name, 10.0), (name, column, mean)


@pytest.mark.parametrize(
    ("metric", "name", "column", "expected"),
    [
        # Hernández-Lobato & Adams 2015, Table 1 (via Gal & Ghahramani 2016, Table 1).
        ("rmse", "power", "VI", (4.33, 0.04)),
        ("rmse", "protein", "PBP", (4.73, 0.01)),
        ("log_likelihood", "naval", "VI", (3.73, 0.12)),
        ("log_likelihood", "kin8nm", "PBP", (0.90, 0.01)),
        # Gal & Ghahramani 2016, Table 1, standard errors (the first version printed
        # standard deviations: 0.38 for yacht's RMSE, 0.05 for naval's log-likelihood).
        ("rmse", "yacht", "MC dropout", (1.11, 0.09)),
        ("rmse", "power", "MC dropout", (4.02, 0.04)),
        ("log_likelihood", "naval", "MC dropout", (3.80, 0.01)),
        ("log_likelihood", "protein", "MC dropout", (-2.89, 0.00)),
        # Lakshminarayanan et al. 2017, Table 1: NLL -1.20, -5.63 and 2.79, sign flipped.
        ("rmse", "protein", "Deep ensembles", (4.71, 0.06)),
        ("log_likelihood", "kin8nm", "Deep ensembles", (1.20, 0.02)),
        ("log_likelihood", "naval", "Deep ensembles", (5.63, 0.05)),
        ("log_likelihood", "power", "Deep ensembles", (-2.79, 0.04)),
    ],
)
def test_figures_match_the_papers(metric, name, column, expected):
    assert PUBLISHED[metric][name][column] == pytest.approx(expected, abs=1e-9)


def test_log_likelihoods_are_higher_is_better():
    # Within each paper's table the better method has the higher log-likelihood: deep
    # ensembles beat PBP on kin8nm and naval (lower NLL), MC dropout beats VI everywhere.
    ll = PUBLISHED["log_likelihood"]
    for name in ("kin8nm", "naval"):
        assert ll[name]["Deep ensembles"][0] > ll[name]["PBP"][0]
    for name in STANDARD_SETS:
        assert ll[name]["MC dropout"][0] > ll[name]["VI"][0], name


def _row(markdown: str, name: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith(f"| {name} |"))


def test_markdown_fills_every_published_column_and_keeps_small_rmses_readable():
    result = SplitResult("naval", 0, "bnn", 0.0012, 5.9, 0.001, 1.0)
    markdown = UCIResults(config=UCIConfig(), results=[result]).to_markdown()
    rmse_row = _row(markdown, "naval")
    assert "–" not in rmse_row
    assert rmse_row.startswith("| naval | 1 | 0.0012 ± 0.0000 |")
    assert rmse_row.endswith("| 0.01 ± 0.00 | 0.01 ± 0.00 | 0.01 ± 0.00 | 0.00 ± 0.00 |")
    ll_row = _row(markdown.split("log-likelihood", 1)[1], "naval")
    assert ll_row.endswith("| 3.73 ± 0.12 | 3.73 ± 0.01 | 3.80 ± 0.01 | 5.63 ± 0.05 |")


def _results():
    rows = [
        SplitResult("boston", k, method, rmse=3.0 + k, log_likelihood=-2.5 - 0.1 * k,
                    noise_std=3.0, seconds=1.0, cpu_seconds=0.9)
        for k in range(3) for method in ("bnn", "mc_dropout")
    ]  # fmt: skip
    return UCIResults(config=UCIConfig(epochs=7), results=rows, seconds=12.0, jobs=2)


def test_a_saved_run_reads_back_equal(tmp_path):
    results = _results()
    _, js = results.save(tmp_path)
    again = UCIResults.from_json(js)
    assert again == results
    assert again.to_markdown() == results.to_markdown()


def test_from_json_names_a_file_that_holds_no_run(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"summary": {}}')
    with pytest.raises(ValueError, match="no UCI run"):
        UCIResults.from_json(path)


def test_scores_set_each_method_beside_the_published_figures_of_its_data_set():
    ours, published = _results().scores("log_likelihood")
    assert ours == {"boston": {"BNN (ours)": pytest.approx((-2.6, 0.1 / 3**0.5)),
                               "MC dropout": pytest.approx((-2.6, 0.1 / 3**0.5))}}  # fmt: skip
    assert published == {"boston": PUBLISHED["log_likelihood"]["boston"]}
    rmse, _ = _results().scores("rmse")
    assert rmse["boston"]["BNN (ours)"] == pytest.approx((4.0, 1 / 3**0.5))
    with pytest.raises(ValueError, match="metric"):
        _results().scores("accuracy")


def test_the_report_of_an_automatic_run_says_it_stops_on_the_predictive():
    result = SplitResult("naval", 0, "bnn", 0.0012, 5.9, 0.001, 1.0)
    markdown = UCIResults(config=UCIConfig(epochs=None), results=[result]).to_markdown()
    assert "until converged" not in markdown
    assert "(epochs=None: until more training stops improving the predictive)" in markdown
