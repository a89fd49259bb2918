"""Property tests of what fit and predict accept: any input ends in our error or a result.

Hypothesis draws the data's shapes, dtypes, devices, NaN/inf positions and label ranges. For
every draw, ``fit`` and ``predict`` must either succeed with results of the right shape, or
raise ``ValueError``/``TypeError`` from this package's own checks (the raising frame lies in
``pyro_bbb``), never an exception from deep inside torch or Pyro.
"""

from __future__ import annotations

import math
import traceback
import warnings
from pathlib import Path

import pyro
import pytest
import torch

import pyro_bbb as bbb

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PACKAGE = str(Path(bbb.__file__).parent)
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FEATURES, CLASSES = 3, 4

# Each draw corrupts some inputs in one way or another; the valid choice is drawn most often,
# so that single corruptions, the likeliest to slip through a check, are each tried alone.
DTYPES = [torch.float32] * 4 + [torch.float64, torch.float16, torch.int64, torch.bool]
DEVICES = ["cpu"] * 4 + ["meta"]  # "meta": a device the model is not on, on every machine
if torch.cuda.is_available():
    DEVICES.append("cuda")  # fit moves data to the model's device; predict refuses it


def _raised_here(error: BaseException) -> bool:
    """Whether the innermost frame of the traceback lies in this package."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(PACKAGE)


@st.composite
def arrays(draw, rows, width):
    """A tensor with a drawn shape near ``(rows, width)``, dtype, device and bad values."""
    valid = [(rows, width)] * 4
    shape = draw(
        st.sampled_from([*valid, (rows,), (rows, width, 1), (rows + 1, width), (rows, width + 1)])
    )
    dtype = draw(st.sampled_from(DTYPES))
    values = torch.randn(shape) * 3
    if draw(st.integers(0, 3)) == 0 and values.numel():
        flat = values.reshape(-1)
        position = draw(st.integers(0, flat.numel() - 1))
        flat[position] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    if dtype == torch.bool:
        tensor = values > 0
    elif dtype.is_floating_point:
        tensor = values.to(dtype)
    else:
        tensor = torch.nan_to_num(values, posinf=5, neginf=-5).round().to(dtype)
    return tensor.to(draw(st.sampled_from(DEVICES)))


@st.composite
def labels(draw, rows):
    shape = draw(st.sampled_from([(rows,)] * 3 + [(rows, 1), (rows + 1,)]))
    ranges = [(0, CLASSES - 1)] * 3 + [(-1, CLASSES - 1), (0, CLASSES)]
    low, high = draw(st.sampled_from(ranges))
    dtype = draw(st.sampled_from([torch.int64] * 3 + [torch.int32, torch.uint8, torch.float32]))
    if dtype == torch.uint8:
        low = max(low, 0)
    values = torch.randint(low, high + 1, shape)
    return values.to(dtype).to(draw(st.sampled_from(DEVICES)))


def _check(run, *inputs):
    """Run; a failure must be our ValueError/TypeError raised from pyro_bbb."""
    pyro.clear_param_store()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return run(*inputs)
    except (ValueError, TypeError) as error:
        assert _raised_here(error), "".join(traceback.format_exception(error))
        return None
    # anything else propagates: it is a failure of the property


def _valid_regression(x, y, rows):
    return (
        x.device.type == y.device.type == "cpu"
        and x.shape == (rows, FEATURES)
        and x.dtype == torch.float32
        and y.shape == (rows,)
        and y.dtype == torch.float32
        and bool(torch.isfinite(x).all() and torch.isfinite(y).all())
    )


@SETTINGS
@given(data=st.data(), rows=st.integers(2, 12))
def test_fit_and_predict_on_any_regression_input_give_a_result_or_our_error(data, rows):
    x = data.draw(arrays(rows, FEATURES))
    y = data.draw(arrays(rows, 1))
    if data.draw(st.integers(0, 3)) > 0 and y.device.type == "cpu":
        y = y.reshape(-1)[:rows]  # most often the (rows,) targets a one-output net takes

    def run(x, y):
        model = bbb.BNN(bbb.mlp([FEATURES, 4, 1]), bbb.likelihoods.Gaussian(), num_data=rows)
        guide = bbb.MeanFieldGuide(model)
        history = bbb.fit(model, guide, x, y, epochs=1, progress=False)
        pred = bbb.predict(model, guide, x, num_samples=2)
        return history, pred

    result = _check(run, x, y)
    if _valid_regression(x, y, rows):
        assert result is not None, "valid data were refused"
    if result is not None:
        history, pred = result
        assert math.isfinite(history.loss[0])
        assert pred.mean.shape == (rows,) and torch.isfinite(pred.std).all()


@SETTINGS
@given(data=st.data(), rows=st.integers(2, 12))
def test_fit_and_predict_on_any_classification_input_give_a_result_or_our_error(data, rows):
    x = data.draw(arrays(rows, FEATURES))
    y = data.draw(labels(rows))

    def run(x, y):
        net = bbb.mlp([FEATURES, 4, CLASSES])
        model = bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=rows)
        guide = bbb.MeanFieldGuide(model)
        history = bbb.fit(model, guide, x, y, epochs=1, progress=False)
        pred = bbb.predict(model, guide, x, num_samples=2)
        return history, pred, y

    result = _check(run, x, y)
    valid = (
        x.device.type == y.device.type == "cpu"
        and x.shape == (rows, FEATURES)
        and x.dtype == torch.float32
        and bool(torch.isfinite(x).all())
        and y.shape == (rows,)
        and not y.dtype.is_floating_point
        and int(y.min()) >= 0
        and int(y.max()) < CLASSES
    )
    if valid:
        assert result is not None, "valid data were refused"
    if result is not None:
        history, pred, y = result
        assert math.isfinite(history.loss[0])
        assert pred.probs.shape == (rows, CLASSES)
        assert math.isfinite(pred.log_likelihood(y))


@SETTINGS
@given(data=st.data(), rows=st.integers(1, 12))
def test_predict_on_any_input_gives_a_result_or_our_error(data, rows):
    x = data.draw(arrays(rows, FEATURES))
    num_samples = data.draw(st.sampled_from([1, 3, 0, -2]))
    batch_size = data.draw(st.sampled_from([None, 1, 5, 0]))

    def run(x):
        model = bbb.BNN(bbb.mlp([FEATURES, 4, 1]), bbb.likelihoods.Gaussian(), num_data=20)
        guide = bbb.MeanFieldGuide(model)
        return bbb.predict(model, guide, x, num_samples=num_samples, batch_size=batch_size)

    pred = _check(run, x)
    valid = (
        x.device.type == "cpu"
        and x.shape == (rows, FEATURES)
        and x.dtype == torch.float32
        and bool(torch.isfinite(x).all())
        and num_samples > 0
        and batch_size != 0
    )
    if valid:
        assert pred is not None, "valid inputs were refused"
    if pred is not None:
        assert pred.samples.shape == (num_samples, x.shape[0])
        assert torch.isfinite(pred.mean).all() and torch.isfinite(pred.std).all()
