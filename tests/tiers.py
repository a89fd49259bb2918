"""The test tiers: what the README's test command runs, and what CI adds to it.

``python -m pytest -q`` runs the **quick** tier: every module's behaviour, every public
function's contract, the fused-versus-traced equalities on small networks, each example's
short form and the fresh-clone checks. The **extended** tier holds the tests that cost seconds
to a minute each and guard at size what quick tests guard in small: statistical checks at
size, NUTS chains, runs of several processes (torchrun, spawned workers) and the examples
that sample with NUTS. CI runs both (``.ci/run``); ``--tier=extended`` runs the second alone,
``--tier=all`` both, and a ``-m`` expression without ``--tier`` picks from both.

A test is quick unless :data:`EXTENDED` names it, so a new test lands in the quick tier.
:data:`EXTENDED` is keyed by file, then by test: a test's name covers all its parameters
(``test_z``), a name with its parameter id one of them (``test_z[numpyro]``), and ``"*"`` the
whole file. Costs are measured with ``python -m pytest -q --durations=50``: a test that
costs more than a few seconds and guards at size what a quick test guards in small belongs
here, with its reason; a test weakened to fit the quick tier does not.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The repository's root, where pytest runs.
ROOT = Path(__file__).resolve().parent.parent

QUICK, EXTENDED_TIER = "quick", "extended"
TIERS = (QUICK, EXTENDED_TIER)
WHOLE_FILE = "*"

NUTS = "NUTS chains: JAX compiles each, or spawned workers sample"
STATISTICAL = "a statistical check at size: fits to fit's default length, or many fits"
PROCESSES = "several processes: torchrun (gloo) or spawned workers"

#: The extended tier: file -> test -> why it is not quick. Loaded 2-core seconds where the
#: cost alone is the reason.
EXTENDED: dict[str, dict[str, str]] = {
    # the quick tier keeps NUTS's contract: both backends' sites, shapes and statistics, the
    # refusals, seeds, the guide's starts on Pyro's backend, the missing extra named
    "tests/infer/mcmc/test_nuts.py": {
        "test_nuts_recovers_the_exact_posterior_of_linear_regression": NUTS,
        "test_learned_noise_needs_a_choice_and_a_prior_samples_it": NUTS,
        "test_classification_net_runs_in_spawned_workers": NUTS,
        "test_a_guide_gives_the_starts_and_the_initial_inverse_mass_matrix[numpyro]": NUTS,
        "test_a_network_in_training_mode_is_refused_and_sampled_in_evaluation_mode[numpyro]": NUTS,
        "test_numpyro_same_seed_gives_the_same_draws_and_chains_differ": NUTS,
        "test_numpyro_samples_a_noise_scale_under_its_prior": NUTS,
        "test_run_nuts_works_from_an_unguarded_script_and_a_notebook_as_here": NUTS,
        "test_worker_processes_from_an_unguarded_script_fail_with_a_clear_error": NUTS,
    },
    "tests/infer/mcmc/test_numpyro_chains.py": {
        "test_the_chains_record_the_energy_that_arviz_bfmi_reads": NUTS,
        "test_sequential_chains_in_float32_return_the_model_s_dtype": NUTS,
    },
    "tests/test_howto.py": {
        "test_compare_with_nuts_runs_as_written": f"{NUTS} (the page's chains; 36 s)",
    },
    "tests/evaluation/test_comparison.py": {
        "test_the_vi_vs_nuts_example_runs_end_to_end": f"{NUTS} (its short form samples; 24 s)",
    },
    "tests/test_end_to_end.py": {
        "test_command_line_demo_with_nuts_draws_its_band_and_reports_convergence": (
            f"{NUTS} (the demo's --nuts; 29 s; the plain demo's short form is quick)"
        ),
        "test_demo_gap_uncertainty_is_at_least_twice_that_near_the_data": STATISTICAL,
    },
    # the quick tier runs the same code on small problems and short budgets
    "tests/training/test_default_length.py": {
        "test_the_default_fit_of_a_small_network_is_as_good_as_the_best_fixed_length": (
            STATISTICAL
        ),
    },
    "tests/training/test_auto_epochs.py": {
        "test_the_strict_fit_meets_the_conjugate_posterior_within_5_percent": STATISTICAL,
    },
    "tests/training/test_stopping.py": {
        "test_the_strict_fit_meets_conjugate_posteriors_of_every_size_within_5_percent": (
            STATISTICAL
        ),
    },
    "tests/training/test_lr_schedules.py": {
        "test_at_fits_defaults_the_conjugate_posteriors_scales_are_within_5_percent": STATISTICAL,
    },
    "tests/training/test_continual.py": {
        "test_vcl_remembers_split_digits_far_better_than_naive_fine_tuning": STATISTICAL,
    },
    "tests/bench/test_online.py": {
        "test_batch_fit_at_fits_defaults_ends_at_the_posterior_mean": STATISTICAL,
    },
    "tests/bench/test_uci.py": {
        "test_bench_uci_command_smoke_run_on_two_splits_of_two_sets": (
            f"{STATISTICAL} (the whole protocol on two splits of two sets; 26 s)"
        ),
        "test_parallel_splits_run_from_a_script_without_a_main_guard": PROCESSES,
        "test_run_uci_in_worker_processes_gives_the_serial_numbers": PROCESSES,
    },
    # the quick tier keeps the world of one and the scripts' teardown
    "tests/training/test_distributed.py": {
        "test_map_on_two_processes_ends_where_one_process_with_twice_the_batch_does": PROCESSES,
        "test_a_loader_with_a_distributed_sampler_takes_the_steps_of_one_process": PROCESSES,
        "test_every_process_ends_with_the_same_parameters_and_history": PROCESSES,
        "test_every_process_starts_from_rank_zeros_initialisation": PROCESSES,
        "test_monte_carlo_noise_differs_between_processes": PROCESSES,
        "test_rank_averaged_gradient_is_the_single_process_gradient_in_expectation": PROCESSES,
        "test_averaging_over_two_processes_halves_the_gradient_variance": PROCESSES,
        "test_resume_under_torchrun_equals_the_uninterrupted_fit_on_every_process": PROCESSES,
        "test_the_ddp_example_runs_under_torchrun": PROCESSES,
    },
}


def extended_entry(nodeid: str) -> tuple[str, str] | None:
    """The ``(file, test)`` of :data:`EXTENDED` that names the test ``nodeid``, if one does.

    Args:
        nodeid: pytest's id of the test, relative to the repository's root
            (``tests/x/test_y.py::test_z[param]``; a test in a class, ``...::Class::test_z``).
    """
    path, _, name = nodeid.partition("::")
    tests = EXTENDED.get(path, {})
    function = name.rsplit("::", 1)[-1]
    for key in (WHOLE_FILE, function, function.split("[", 1)[0]):
        if key in tests:
            return path, key
    return None


def tier_of(nodeid: str) -> str:
    """``"extended"`` for a test :data:`EXTENDED` names, else ``"quick"``."""
    return QUICK if extended_entry(nodeid) is None else EXTENDED_TIER


@dataclass(frozen=True)
class Collection:
    """The whole suite as pytest collects it, before any selection.

    Attributes:
        quick: How many tests the quick tier holds: what the README's test command collects.
        extended: The ids of the extended tier's tests.
    """

    quick: int
    extended: frozenset[str]


#: The suite's :class:`Collection`, kept by ``conftest.py`` when a run collected every file.
COLLECTION = pytest.StashKey[Collection]()


def collection(config: pytest.Config) -> Collection:
    """The whole suite's :class:`Collection`: this run's if it collected every test file,
    else from ``pytest --collect-only`` in a subprocess (about 10 s)."""
    if COLLECTION in config.stash:
        return config.stash[COLLECTION]
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=", "--tier=all",
         "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
    ).stdout  # fmt: skip
    ids = [line for line in listed.splitlines() if line.startswith("tests/") and "::" in line]
    extended = frozenset(nodeid for nodeid in ids if tier_of(nodeid) == EXTENDED_TIER)
    return Collection(quick=len(ids) - len(extended), extended=extended)
