"""A NUTS run of the conjugate problem, shared by the evaluation tests (it takes seconds)."""

from __future__ import annotations

import pytest

from pyro_bbb import run_nuts

from ..problems import conjugate_problem, linear_bnn


@pytest.fixture(scope="package")
def nuts_result():
    """Two chains of NUTS on the conjugate linear-regression problem."""
    x, y, *_ = conjugate_problem()
    return run_nuts(
        linear_bnn(x), x, y, num_samples=150, warmup_steps=100, num_chains=2, num_workers=1,
        seed=0, progress=False, init_steps=50,
    )  # fmt: skip
