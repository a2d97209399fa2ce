"""Where f does not move: a mismatch whose difference quotient is f's output not changing.

A numerical derivative of 0 (or a few roundings of f over the step) against a nonzero analytical value is not by
itself a wrong gradient.  f may be piecewise constant there (a quantizer, ``sign``: the analytical value is a
surrogate gradient, e.g. a straight-through estimator, which no difference quotient can check), or float32 rounding
inside f may swallow the change (a batch-norm beta deep in a float32 network).  Larger steps tell these apart from
a wrong gradient: at steps 4 h, 16 h, ... up past ``FLAT_MAX_STEP * max(1, |x_j|)``, where f first moves

* by a jump (the next step moves it less than ``FLAT_JUMP_GROWTH`` times as far, where past a kink a 4x step moves
  a piecewise-linear f 4x or more): piecewise constant;
* or with a quotient within ``FLAT_AGREES`` of the analytical value, or only at the largest step;

the element is FLAT, undecidable.  f that moves at no step does not depend on x_j there while its gradient says it
does (a VJP writing gradient where f does not depend), and f that moves steadily with another slope (a dead ReLU
whose gradient leaks 1% of the live slope): the mismatch stands -- unless f's measured noise is as large as f
itself (``NOISE_IS_F`` of |f_i| or more: sin at 1e20, whose neighbouring representable points lie periods apart),
where no step can resolve a derivative, and the element is UNRESOLVED, undecidable.
"""

from __future__ import annotations

import numpy as np

from fastcheck.engine.config import MACHINE_EPSILON
from fastcheck.engine.tables import (
    FLAT_AGREES,
    FLAT_JUMP_GROWTH,
    FLAT_MAX_STEP,
    FLAT_ROUNDINGS,
    NOISE_IS_F,
    REFINE_RATIO,
)
from fastcheck.judge import compare


def rounding_level(plan) -> np.ndarray:
    """[m] the error of one evaluation of f: its rounding, or its measured noise where larger."""
    return compare.rounding_level(plan.eval_output, plan.row_epsilon, None if plan.noise is None else plan.noise.sigma,
                                   1.0, 1.0)


def noise_is_f(plan, rows: np.ndarray) -> np.ndarray:
    """[len(rows)] whether output ``rows``' measured noise is ``NOISE_IS_F`` of |f_i| or more: f's evaluations there
    keep fewer than ~3 bits of its value, and no step resolves a derivative."""
    if plan.noise is None:
        return np.zeros(len(rows), bool)
    sigma, y0 = plan.noise.sigma[rows], np.abs(plan.eval_output[rows])
    with np.errstate(invalid="ignore"):
        return (sigma > 0) & (sigma >= NOISE_IS_F * y0)


def levels(plan, config) -> int:
    """How many larger steps h * REFINE_RATIO**k (k = 1 ...) the test takes: one past ``FLAT_MAX_STEP``, so that f
    first moving within it has a next step to tell a jump by."""
    relative = config.step(MACHINE_EPSILON[plan.eval_dtype])
    return max(1, int(np.ceil(np.log(FLAT_MAX_STEP / relative) / np.log(REFINE_RATIO)))) + 1


def status(plan, config, rows: np.ndarray, analytical: np.ndarray, along) -> np.ndarray:
    """[len(rows)] the status of flat mismatches at outputs ``rows`` (with their ``analytical`` values) that larger
    steps show along each one's column: FLAT, UNRESOLVED, or MISMATCH where it stands (see the module docstring).
    ``along(multiples)`` -> f(x + t h), f(x - t h) and the spans [levels, elements] at the steps t h, whatever
    evaluates them (the executor's columns, coloured mode's colours)."""
    if not len(rows):
        return np.zeros(0, np.int8)
    plus, minus, spans = along(REFINE_RATIO ** np.arange(1, levels(plan, config) + 1))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        quotient = (plus - minus) / spans
    return decided(plan, rows, plus.T, minus.T, quotient.T, analytical)


def decided(plan, rows: np.ndarray, plus: np.ndarray, minus: np.ndarray, quotient: np.ndarray,
            analytical: np.ndarray) -> np.ndarray:
    """``status`` from f's sides and quotients [elements, levels] at the larger steps."""
    y0 = plan.eval_output[rows][:, None]
    count = plus.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        moved = np.fmax(np.abs(plus - y0), np.abs(minus - y0))
        moves = moved > FLAT_ROUNDINGS * rounding_level(plan)[rows][:, None]
        first = np.argmax(moves, axis=1)
        index = np.arange(len(rows))
        following = np.minimum(first + 1, count - 1)
        last = first == count - 1
        jump = ~last & (moved[index, following] < FLAT_JUMP_GROWTH * moved[index, first])
        agrees = np.abs(quotient[index, following] - analytical) <= FLAT_AGREES * np.abs(analytical)
    moving = np.any(moves, axis=1)
    return np.select([moving & (jump | last | agrees), ~moving & noise_is_f(plan, rows)],
                     [compare.FLAT, compare.UNRESOLVED], compare.MISMATCH).astype(np.int8)
