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

OK, MISMATCH, ANALYTICAL_NONFINITE, NUMERICAL_NONFINITE, NONDIFFERENTIABLE, UNRESOLVED = 0, 1, 2, 3, 4, 5
STATUS_NAMES = {
    OK: "ok",
    MISMATCH: "mismatch",
    ANALYTICAL_NONFINITE: "analytical not finite",
    NUMERICAL_NONFINITE: "numerical not finite",
    NONDIFFERENTIABLE: "not differentiable here",
    UNRESOLVED: "numerical derivative unresolved",
}
# Statuses that make a check fail.  A kink whose analytical value is one of the
# one-sided derivatives (or between them) is reported but is not a wrong gradient.
FAILING = (MISMATCH, ANALYTICAL_NONFINITE, NUMERICAL_NONFINITE, UNRESOLVED)
# Statuses that say "the numerics cannot decide here", as opposed to "the gradient is wrong".
UNDECIDED = (NUMERICAL_NONFINITE, UNRESOLVED)
# Elements per block of the element-wise rule (a few arrays of it stay in cache).
VERDICT_BLOCK = 1 << 14
# Rounding error of one evaluation of f, in units of eps * |f|.
NOISE_FACTOR = 4.0


def rounding_noise(y0: np.ndarray, spans: np.ndarray, eps_eval: float) -> np.ndarray:
    """[m, n] rounding error estimate of (f(x+) - f(x-)) / span (0 where it is not finite)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rows = NOISE_FACTOR * eps_eval * np.abs(y0)
        columns = 1.0 / np.abs(spans)
        rows[~np.isfinite(rows)] = 0.0
        columns[~np.isfinite(columns)] = 0.0
        return np.multiply.outer(rows, columns)


def verdicts(analytical: np.ndarray, numerical: np.ndarray, noise: np.ndarray, atol: float, rtol: float):
    """Status per element (OK / MISMATCH / ...NONFINITE) and the band each element had to meet.

    Jacobians of 10^7 entries are common, so the rule runs over blocks of rows
    that fit in cache: one trip through memory instead of one per operation.
    """
    status = np.empty(numerical.shape, np.int8)
    band = np.empty(numerical.shape, np.float64)
    columns = numerical.shape[1] if numerical.ndim == 2 else 1
    rows = max(1, VERDICT_BLOCK // max(1, columns))
    for start in range(0, numerical.shape[0], rows):
        part = slice(start, start + rows)
        status[part], band[part] = _block_verdicts(analytical[part], numerical[part], noise[part], atol, rtol)
    return status, band


def _block_verdicts(analytical, numerical, noise, atol, rtol):
    with np.errstate(invalid="ignore", over="ignore"):
        band = np.abs(numerical)
        band *= rtol
        band += atol
        band += np.where(np.isfinite(noise), noise, 0.0)
        difference = np.abs(analytical - numerical)
        status = (difference > band).astype(np.int8)  # MISMATCH == 1
    numerical_bad = ~np.isfinite(numerical)
    if numerical_bad.any():
        status[numerical_bad] = NUMERICAL_NONFINITE
    analytical_bad = ~np.isfinite(analytical)
    if analytical_bad.any():
        status[analytical_bad & ~numerical_bad] = ANALYTICAL_NONFINITE
    return status, band


def richardson(coarse: np.ndarray, fine: np.ndarray, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """Extrapolate two central differences (steps h and h/ratio) and estimate the error left."""
    factor = ratio**2
    extrapolated = (factor * fine - coarse) / (factor - 1)
    return extrapolated, np.abs(fine - coarse) / (factor - 1)


def refine(levels: list, y0: np.ndarray, ratio: float):
    """Best estimate from central differences at shrinking steps, and a kink test.

    ``levels`` holds, for steps h, h/ratio, h/ratio^2, ..., tuples
    ``(derivative [m, k], noise [m, k], plus [m, k] or None, minus, span [k])``.
    Each consecutive pair (D_k, D_k+1) is Richardson-extrapolated.  Its error
    estimate is |D_k - D_k+1| / (ratio^2 - 1) when the next pair confirms the
    h^2 regime (|D_k+1 - D_k+2| <= |D_k - D_k+1| / 4, up to noise), and the
    whole |D_k - D_k+1| otherwise -- so steps that straddle a kink or a domain
    edge never look precise.  Per element, the pair with the smallest error
    (truncation + rounding) wins.

    Returns (estimate, error estimate, settled mask, kink mask, right-sided,
    left-sided): ``settled`` says the estimate came from a pair in the h^2
    regime; an element is a kink when its one-sided derivatives at the two
    finest steps differ by about the same amount (a smooth function's gap
    shrinks with h).
    """
    best = np.full(levels[0][0].shape, np.nan)
    error = np.full(best.shape, np.inf)
    settled_best = np.zeros(best.shape, bool)
    factor = ratio**2
    with np.errstate(invalid="ignore", over="ignore"):
        gaps = [np.abs(a[0] - b[0]) for a, b in zip(levels, levels[1:])]
        for k in range(len(levels) - 1):
            (coarse, coarse_noise, *_), (fine, fine_noise, *_) = levels[k], levels[k + 1]
            estimate, truncation = richardson(coarse, fine, ratio)
            rounding = fine_noise * (factor + 1) / (factor - 1) + coarse_noise / (factor - 1)
            if k + 1 < len(gaps):
                settled = gaps[k + 1] <= gaps[k] / 4 + 2 * (fine_noise + levels[k + 2][1])
            else:
                settled = np.zeros(best.shape, bool)
            total = np.where(settled, truncation, gaps[k]) + rounding
            better = np.isfinite(estimate) & np.isfinite(total) & (total < error)
            best[better], error[better], settled_best[better] = estimate[better], total[better], settled[better]
    # Where no pair is finite, fall back to the finest finite single estimate.
    for derivative, noise, *_ in reversed(levels):
        missing = ~np.isfinite(best) & np.isfinite(derivative)
        best[missing], error[missing] = derivative[missing], noise[missing]

    def one_sided(level):
        _, noise, plus, minus, span = level
        half = span[None, :] / 2
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return (plus - y0[:, None]) / half, (y0[:, None] - minus) / half, noise

    right_fine, left_fine, noise_fine = one_sided(levels[-1])
    right_coarse, left_coarse, _ = one_sided(levels[-2])
    with np.errstate(invalid="ignore"):
        gap_fine, gap_coarse = np.abs(right_fine - left_fine), np.abs(right_coarse - left_coarse)
        kink = (gap_fine > 0.5 * gap_coarse) & (gap_fine > 20 * noise_fine) & np.isfinite(gap_fine)
    return best, error, settled_best, kink, right_fine, left_fine


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
    if np.any(status == UNRESOLVED) and not bad.any():
        return ("the central differences did not converge even at steps 4**12 times smaller: f varies on a scale "
                "far below the step (or is noisy); pass a smaller eps, or check at a point where f is smoother.")
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
