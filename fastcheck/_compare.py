"""Element-wise verdicts.

The rule, element by element, for analytical ``a`` and numerical ``n``::

    |a - n| <= atol + rtol * |n| + noise

where ``noise`` is the numerical side's own error estimate: its rounding error
``NOISE_FACTOR * eps_eval * |f(x)| / span`` plus, for columns that were refined
with a smaller step, the Richardson truncation estimate.  Both sides must be
finite; a NaN/Inf on either side fails, with its own status.
"""

from __future__ import annotations

import numpy as np

OK, MISMATCH, ANALYTICAL_NONFINITE, NUMERICAL_NONFINITE = 0, 1, 2, 3
STATUS_NAMES = {
    OK: "ok",
    MISMATCH: "mismatch",
    ANALYTICAL_NONFINITE: "analytical not finite",
    NUMERICAL_NONFINITE: "numerical not finite",
}
# Rounding error of one evaluation of f, in units of eps * |f|.
NOISE_FACTOR = 4.0


def rounding_noise(y0: np.ndarray, spans: np.ndarray, eps_eval: float) -> np.ndarray:
    """[m, n] rounding error estimate of (f(x+) - f(x-)) / span."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return NOISE_FACTOR * eps_eval * np.abs(y0)[:, None] / np.abs(spans)[None, :]


def verdicts(analytical: np.ndarray, numerical: np.ndarray, noise: np.ndarray, atol: float, rtol: float):
    """Status per element and the band each element had to meet."""
    band = atol + rtol * np.abs(numerical) + np.nan_to_num(noise, nan=0.0, posinf=0.0)
    status = np.full(analytical.shape, OK, dtype=np.int8)
    with np.errstate(invalid="ignore"):
        status[np.abs(analytical - numerical) > band] = MISMATCH
    status[~np.isfinite(numerical)] = NUMERICAL_NONFINITE
    status[~np.isfinite(analytical) & np.isfinite(numerical)] = ANALYTICAL_NONFINITE
    return status, band


def richardson(coarse: np.ndarray, fine: np.ndarray, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """Extrapolate two central differences (steps h and h/ratio) and estimate the error left."""
    factor = ratio**2
    extrapolated = (factor * fine - coarse) / (factor - 1)
    return extrapolated, np.abs(fine - coarse) / (factor - 1)


def relative_norm_error(numerical: np.ndarray, analytical: np.ndarray) -> float:
    """||n - a|| / (||n|| + ||a|| + 1e-8), over finite entries."""
    finite = np.isfinite(numerical) & np.isfinite(analytical)
    n, a = numerical[finite], analytical[finite]
    return float(np.linalg.norm(n - a) / (np.linalg.norm(n) + np.linalg.norm(a) + 1e-8))


def diagnose(analytical: np.ndarray, numerical: np.ndarray, status: np.ndarray) -> str | None:
    """A one-line guess at the kind of defect, from the pattern of failing elements."""
    bad = status == MISMATCH
    if np.any(status == ANALYTICAL_NONFINITE):
        return ("the analytical gradient is NaN/Inf where f is smooth: a classic cause is tf.where(cond, g(x), 0) "
                "with g non-finite on the discarded branch; make the input to g safe too (the double-where trick).")
    if np.any(status == NUMERICAL_NONFINITE) and not bad.any():
        return ("f is not finite at or next to the point, so the derivative there cannot be checked numerically; "
                "move the point inside f's domain.")
    if not bad.any():
        return None
    a, n = analytical[bad], numerical[bad]
    total = int(bad.sum())
    if np.all(np.abs(a) <= 1e-12 * np.maximum(np.abs(n), 1e-300)) or np.all(a == 0):
        return ("the analytical gradient is zero where the numerical one is not: a missing chain-rule term, a "
                "misplaced tf.stop_gradient, or a variable that does not reach the gradient.")
    # Least-squares factor between the failing entries: a = c * n explains a sign
    # flip (c = -1) or a lost constant (c != 1) even when a few entries are noisy.
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = float(np.dot(a, n) / np.dot(n, n)) if np.dot(n, n) > 0 else np.nan
        residual = float(np.linalg.norm(a - factor * n) / np.linalg.norm(a)) if np.isfinite(factor) else np.inf
    if residual < 0.02 and abs(factor + 1) < 0.02:
        return "the analytical gradient has the wrong sign."
    if residual < 0.02 and abs(factor - 1) > 1e-3:
        return f"the analytical gradient is off by a constant factor of {factor:.4g} (a missing or extra constant in the derivative)."
    if analytical.shape[0] == analytical.shape[1] and analytical.shape[0] > 1 and np.allclose(analytical, numerical.T, rtol=1e-4, atol=1e-8):
        return "the analytical Jacobian equals the transpose of the numerical one (a transposed matmul in the gradient?)."
    if total <= max(1, status.size // 100):
        return f"only {total} of {status.size} elements differ: look at indexing or a special case near the worst element."
    return None
