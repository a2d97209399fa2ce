"""Noise-limited directions at wide steps: one stage of full mode (columns) and coloured mode (nonzeros).

At the default step the measured noise of a noisy f (a bfloat16 matmul inside, a float32 cast in a float64 loss)
swamps the difference quotient, and a pass there would say nothing.  Each such direction j is sampled at
x + t H_j d_j, t = -4..4, with H_j large enough for the noise to fall to a third of the tolerance (at most
``COARSE_MAX_STEP * max(1, |x_j|)`` for 4 H_j), and the slope of a least-squares cubic through the 9 values is the
derivative: the cubic term absorbs the third-derivative truncation of a central difference, and 9 points average the
noise.  Its error is ``MEASURED_NOISE_FACTOR`` standard deviations of that slope.  The same fit at H_j / 4 (256x
less fifth-order truncation) decides whether the wide one can stand.  A direction whose fit leaves residuals beyond
the noise (a kink, a domain edge or a period of f within 4 H_j) is left to the shrinking ladder.

A strategy supplies the sampling (``Sample``: f's sides at t = 1..4 along its directions, and the step realised);
the widths, the fits and the decision are here, once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fastcheck.engine.tables import COARSE_MAX_STEP, MEASURED_NOISE_FACTOR
from fastcheck.judge import compare

# width [k] -> (f(x + t width d), f(x - t width d) [m, 4, k] for t = 1..4, the unit step realised [k])
Sample = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]

_NODES = np.vander(np.arange(-4.0, 5.0), 4, increasing=True)  # [9, 4]: 1, t, t^2, t^3
_CUBIC_FIT = np.linalg.pinv(_NODES)  # [4, 9]
SLOPE_NOISE = float(np.sqrt(np.linalg.inv(_NODES.T @ _NODES)[1, 1]))


def limited(noise: np.ndarray, numerical: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """Where the noise allowance exceeds the tolerance's own: the elements whose pass would say nothing."""
    with np.errstate(invalid="ignore"):
        return noise > compare.allowance(numerical, atol, rtol)


def widths(a: np.ndarray, sigma: np.ndarray, base: np.ndarray, scale: np.ndarray, atol: float,
           rtol: float) -> np.ndarray:
    """H [k] per direction: the noise ``sigma`` [m, 1 or k] at a third of the tolerance of every element of ``a``
    [m, k] (its largest need), at least 4 base steps, at most ``COARSE_MAX_STEP * scale / 4``."""
    spread = MEASURED_NOISE_FACTOR * SLOPE_NOISE
    with np.errstate(divide="ignore", invalid="ignore"):
        needed = np.nanmax(3 * spread * sigma / compare.allowance(a, atol, rtol), axis=0)
    return np.clip(needed, 4 * base, COARSE_MAX_STEP * scale / 4)


def coarsened(along: Callable, a: np.ndarray, y0: np.ndarray, sigma: np.ndarray, base: np.ndarray,
              scale: np.ndarray, cols: np.ndarray, eps_eval: float, atol: float,
              rtol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(taken [k], estimate [k], error [k]) of noise-limited elements of a Jacobian (their analytical values ``a``,
    f at their outputs ``y0``, its noise ``sigma``, their columns' first steps ``base`` and ``scale`` and their
    columns ``cols``, all [k]) re-estimated at wide steps, in full and coloured mode alike: each column moved by the
    widest step its elements need (``widths``); ``along(width [k])`` -> f(x + t d), f(x - t d) [4, k] at each
    element's output for t = 1 .. 4, and the step realised [k]."""
    need = widths(a[None, :], sigma[None, :], base, scale, atol, rtol)
    distinct, slot = np.unique(cols, return_inverse=True)
    widest = np.zeros(len(distinct))
    np.maximum.at(widest, slot, need)

    def sample(width: np.ndarray):
        plus, minus, realised = along(width)
        return plus[None], minus[None], realised

    taken, estimate, error = fitted(sample, widest[slot], y0[None, :], sigma[None, :], eps_eval)
    return taken, estimate[0], error[0]


def fitted(sample: Sample, width: np.ndarray, y0: np.ndarray, sigma: np.ndarray,
           eps_eval: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(taken [k], estimate, error [m, k]): the wide fit where a cubic fits it and the narrow one (H / 4) agrees,
    else the narrow one; a direction is taken where its fit is smooth and finite at every element.  ``y0``: f at
    the point, ``sigma``: its measured noise, both [m, 1 or k]."""
    wide, wide_error, wide_residual = _slopes(sample, width, y0, sigma)
    narrow, narrow_error, narrow_residual = _slopes(sample, width / 4, y0, sigma)
    with np.errstate(invalid="ignore"):
        fits = 3 * sigma + 64 * eps_eval * np.abs(y0)
        agree = (np.abs(wide - narrow) <= narrow_error) & (wide_residual <= fits)
        estimate = np.where(agree, wide, narrow)
        error = np.where(agree, wide_error, narrow_error)
        smooth = np.where(agree, wide_residual, narrow_residual) <= fits
    return np.all(smooth & np.isfinite(estimate), axis=0), estimate, error


def _slopes(sample: Sample, width: np.ndarray, y0: np.ndarray, sigma: np.ndarray):
    """Slopes [m, k] of least-squares cubics through f at x + t width_j d_j (t = -4..4), their error
    (``MEASURED_NOISE_FACTOR`` standard deviations) and the fits' residuals."""
    plus, minus, unit = sample(width)
    m, _, count = plus.shape
    values = np.concatenate([minus[:, ::-1], np.broadcast_to(y0[:, None, :], (m, 1, count)), plus], axis=1)
    # One least-squares solve for every element: the nodes are t = -4..4 in units of each direction's step
    # (rounding moves them by far less than the noise allows).
    with np.errstate(invalid="ignore", over="ignore"):
        coefficients = np.einsum("ct,mtk->mck", _CUBIC_FIT, values)  # [m, 4, k]
        residual = np.sqrt(np.mean((values - np.einsum("tc,mck->mtk", _NODES, coefficients)) ** 2, axis=1))
        estimate = coefficients[:, 1] / unit[None, :]
    outside = ~np.all(np.isfinite(values), axis=1)  # outside f's domain: not for this ladder
    estimate[outside], residual[outside] = np.nan, np.inf
    return estimate, MEASURED_NOISE_FACTOR * SLOPE_NOISE * sigma / width[None, :], residual
