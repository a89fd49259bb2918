"""The stream protocol's baselines, streaming VCL and batch fit, on a conjugate stream."""

from __future__ import annotations

import warnings

import pyro
import torch

import pyro_bbb as bbb
from pyro_bbb.bench.online import batch_fit, minibatches, streaming_vcl

from ..problems import conjugate_problem, linear_bnn


def _exact_predictive(x, mean, covariance):
    """The exact posterior's predictive mean and epistemic sd at ``x``."""
    design = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], -1)
    return design @ mean, (design @ covariance * design).sum(-1).sqrt()


def test_the_stream_is_its_rows_in_order_in_minibatches_the_last_one_smaller():
    x, y = torch.arange(23.0).unsqueeze(-1), torch.arange(23.0)
    batches = list(minibatches(x, y, 10))
    assert [len(xb) for xb, _ in batches] == [10, 10, 3]
    torch.testing.assert_close(torch.cat([yb for _, yb in batches]), y)


def test_streaming_vcl_fits_each_minibatch_once_and_moves_towards_the_posterior():
    # A linear regression with known noise, 60 points in minibatches of 10, each fit seeing
    # only its minibatch under the previous posterior. 100 epochs a minibatch move little
    # (docs/online.md: streaming VCL underfits): on three problems its predictive mean ended
    # 0.26-0.59 of the prior's distance from the exact posterior's, in posterior sds. Its
    # short fits do not warn that they have not converged.
    pyro.clear_param_store()
    x, y, mean, covariance = conjugate_problem(num_data=60)[:4]
    with warnings.catch_warnings():
        warnings.simplefilter("error", bbb.ConvergenceWarning)
        vcl, seconds = streaming_vcl(linear_bnn(x), x, y, batch_size=10, seed=0)
    assert vcl.num_tasks == 6 and [len(h) for h in vcl.histories] == [100] * 6 and seconds > 0
    exact, sd = _exact_predictive(x, mean, covariance)
    predicted = vcl.predict(x, num_samples=500, seed=0).mean
    assert ((predicted - exact) / sd).abs().max() < 0.7 * (exact / sd).abs().max()


def test_batch_fit_at_fits_defaults_ends_at_the_posterior_mean():
    # fit's default trains until converged: on four such problems its predictive mean was
    # within 0.07 posterior sds of the exact one everywhere (1,000 fixed epochs: up to 1.27)
    pyro.clear_param_store()
    x, y, mean, covariance = conjugate_problem(num_data=60)[:4]
    model = linear_bnn(x)
    guide, seconds = batch_fit(model, x, y, seed=0)
    exact, sd = _exact_predictive(x, mean, covariance)
    predicted = bbb.predict(model, guide, x, num_samples=500, seed=0).mean
    assert seconds > 0 and ((predicted - exact) / sd).abs().max() < 0.25
