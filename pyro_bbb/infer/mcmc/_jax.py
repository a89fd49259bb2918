"""JAX and NumPyro, imported in one place, with the error that names the extra to install.

Only the NumPyro backend of :func:`~pyro_bbb.run_nuts` imports this module (lazily, when
``backend="numpyro"`` is asked for), so ``import pyro_bbb`` needs neither package. Nothing
here builds or runs anything.
"""

from __future__ import annotations

#: What to install for ``backend="numpyro"``.
EXTRA = 'pip install "pyro-bbb[numpyro]"'

try:
    import jax
    import jax.numpy as jnp
    import numpyro
except ImportError as error:  # pragma: no cover (the CI installs the extra)
    raise ImportError(
        f"run_nuts(backend='numpyro') needs JAX and NumPyro, which are not installed "
        f"({error}). Install them with {EXTRA}, or use backend='pyro'"
    ) from error

__all__ = ["EXTRA", "jax", "jnp", "numpyro"]
