"""fastcheck: fast, batched gradient checks for TensorFlow.

The public names are imported lazily, so that the ``fastcheck`` command can
configure TensorFlow's logging before TensorFlow loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "GradientCheckError": "fastcheck.report.results",
    "GradientChecker": "fastcheck._api",
    "GradientReport": "fastcheck.report.results",
    "assert_gradients_close": "fastcheck._api",
    "autodiff_jacobian": "fastcheck._api",
    "check_gradients": "fastcheck._api",
    "check_model": "fastcheck._api",
    "compute_gradient": "fastcheck.integrations.compat",
    "max_error": "fastcheck.integrations.compat",
    "verify_gradients": "fastcheck._api",
    "numerical_jacobian": "fastcheck._api",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from fastcheck._api import GradientChecker as GradientChecker
    from fastcheck._api import assert_gradients_close as assert_gradients_close
    from fastcheck._api import autodiff_jacobian as autodiff_jacobian
    from fastcheck._api import check_gradients as check_gradients
    from fastcheck._api import check_model as check_model
    from fastcheck._api import numerical_jacobian as numerical_jacobian
    from fastcheck._api import verify_gradients as verify_gradients
    from fastcheck.integrations.compat import compute_gradient as compute_gradient
    from fastcheck.integrations.compat import max_error as max_error
    from fastcheck.report.results import GradientCheckError as GradientCheckError
    from fastcheck.report.results import GradientReport as GradientReport


def __getattr__(name: str):
    if name == "tfp":  # the TensorFlow Probability helpers: a submodule, imported on first use
        return importlib.import_module("fastcheck.tfp")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fastcheck' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
