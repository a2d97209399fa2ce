"""The eager loops by f's traced sparsity pattern: rows, and columns, that share nothing share a call.

Where the eager path's loops would be long (``EAGER_COLOUR_SECONDS`` at two calls of f a row or column), f is traced
once for its Jacobian's structural pattern (``trace``, as coloured mode reads it; kept beside f's kernels) and
coloured (``colouring``):

* reverse mode (``rows``): rows that share no input element share one VJP, whose cotangent is their sum; each
  nonzero is read from its row's colour.  Every term another row of the colour adds to a column is an exact zero
  (the pattern says it does not reach it), so the nonzeros are the row loop's numbers bit for bit.  What the pattern
  leaves out is checked by one VJP of a random signed cotangent w: where it differs from w times the blocks by more
  than their rounding (or atol / 2), or a value is not finite, the loop runs -- a gradient leaking outside f's
  pattern (a wrong one) shows there, as the loop shows it.
* numerical side (``differences``): columns that share no output move together in one call of f a side.  An
  output reads one moved column at most, so its value is bit for bit the one-column call's; an output no moved
  column reaches is f at x (the centre), as that call gives it.  Only after the rows' colours passed their check
  in the same check, or the row loop's own blocks (a row loop too short to colour, or the element-wise rows of
  ``diagonal``) kept to the pattern (``holds``, traced for only where they leave room for the columns' colours,
  ``may_pay``): the gradient then has nothing outside the pattern beyond atol / 2, so f has no dependence the
  pattern misses that could mix two moved columns.

At most ``COLOUR_SHARE`` of the rows (columns) in colours; real outputs and checked inputs only.  Anything else
-- f does not trace, an op without a dependency rule -- leaves the loops as they are.  Routing prices the loops by
the colours (``loops``) where its probe traced f, reading the pattern from the probe's graph: a check whose
loops by colours cost less than tracing stays eager (``paths.choose_route``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from fastcheck.engine.config import MACHINE_EPSILON, CheckConfig
from fastcheck.engine.kernels import cached, plan_key
from fastcheck.engine.plan import REFUSALS, Plan
from fastcheck.engine.tables import COLOUR_SHARE
from fastcheck.sparsity import colouring
from fastcheck.sparsity.pattern import ranges
from fastcheck.sparsity.trace import patterns_of


class Structure(NamedTuple):
    """f's traced pattern per checked input, its row colours [m] and each input's column colours [n_k]."""

    patterns: list
    row_labels: np.ndarray
    column_labels: list


def structure(plan: Plan, config: CheckConfig, native: Sequence, elements: int, graph=None) -> Structure | None:
    """f's ``Structure`` where the loop over ``elements`` rows or columns would be long enough to pay for tracing
    f, else None (traced once per f and signature, or read from ``graph``, f's flat function traced by routing: kept
    beside its kernels, None included)."""
    if (not _long(plan, config, elements) or any(o.dtype.is_complex for o in plan.outputs)
            or any(s.is_complex for s in plan.checked)):
        return None
    return cached(plan_key(plan, config) + ("eager colours",),
                  lambda: _eager_colours_kernel(plan, config, native, graph))


def _long(plan: Plan, config: CheckConfig, elements: int) -> bool:
    """Whether a loop over ``elements`` rows or columns, two calls of f each, is long enough to colour."""
    return 2 * elements * plan.call_seconds >= config.table("EAGER_COLOUR_SECONDS")


def loops(plan: Plan, config: CheckConfig, found: Structure) -> tuple[int, int]:
    """(calls of f, VJPs) of the eager loops under ``found``'s colours, as ``rows`` and ``differences`` take them."""
    row_colours = _colours(found.row_labels)
    coloured_rows = _long(plan, config, plan.m) and 0 < row_colours <= COLOUR_SHARE * plan.m
    calls = 0
    for spec, labels in zip(plan.checked, found.column_labels):
        colours = _colours(labels)
        calls += 2 * (colours if colours <= COLOUR_SHARE * spec.size else spec.size)
    return calls, row_colours + 1 if coloured_rows else min(plan.n, plan.m)


def _eager_colours_kernel(plan: Plan, config: CheckConfig, native: Sequence, graph=None) -> Structure | None:
    # (named ``_kernel``: TensorFlow's retracing warning is filtered for fastcheck's kernels, ``kernels``)
    try:
        if graph is None:
            function = tf.function(lambda *vs: plan.call_flat(list(vs)), autograph=False)
            graph = function.get_concrete_function(*[tf.TensorSpec(v.shape, v.dtype) for v in native]).graph
        patterns = patterns_of(graph, plan)
        columns, rows = colouring.colourings(patterns, plan, config.seed)
    except Exception:  # noqa: BLE001 -- no pattern (an op without a rule, an untraceable f): the loops run
        return None
    return Structure(patterns, rows, columns) if patterns[0].shape[0] == plan.m else None


def _colours(labels: np.ndarray) -> int:
    return int(labels.max()) + 1 if labels.size else 0


def rows(plan: Plan, config: CheckConfig, found: Structure, vjp: Callable[[np.ndarray], list]) -> list | None:
    """The row loop's blocks [m, n_k] from one VJP per row colour (``vjp(weights [m])``: the flat gradient per checked
    input, float64), or None where the colours are too many or the random cotangent's VJP disagrees (see above)."""
    labels = found.row_labels
    colours = _colours(labels)
    if not colours or colours > COLOUR_SHARE * plan.m:
        return None
    compressed = [np.stack(parts) for parts in zip(*(vjp((labels == c).astype(np.float64)) for c in range(colours)))]
    blocks = []
    for pattern, values in zip(found.patterns, compressed):
        block = np.zeros(pattern.shape)
        nonzero_rows, nonzero_cols = pattern.rows, pattern.cols
        block[nonzero_rows, nonzero_cols] = values[labels[nonzero_rows], nonzero_cols]
        blocks.append(block)
    signs = np.random.default_rng(config.seed + 7919).choice([-1.0, 1.0], plan.m)
    atol = config.tolerances(plan.precision)[0]
    eps = MACHINE_EPSILON[plan.analytical_dtype]
    with np.errstate(invalid="ignore", over="ignore"):
        for block, direct, values in zip(blocks, vjp(signs), compressed):
            allowed = np.minimum(64 * eps * (np.abs(block).sum(axis=0) + np.abs(direct)), atol / 2)
            if not (np.isfinite(values).all() and np.all(np.abs(signs @ block - direct) <= allowed)):
                return None
    return blocks


def may_pay(blocks: list) -> bool:
    """Whether the columns of some block [m, n_k] of the row loop's could share calls: its densest row's nonzeros
    (a lower bound of the colours of f's pattern) are at most ``COLOUR_SHARE`` of its columns."""
    return any(np.count_nonzero(block, axis=1).max(initial=0) <= COLOUR_SHARE * block.shape[1] for block in blocks)


def holds(plan: Plan, config: CheckConfig, found: Structure, blocks: list) -> bool:
    """Whether the row loop's ``blocks`` [m, n_k] keep to f's pattern: finite, and nothing outside it beyond the
    rounding of their column's sums or atol / 2 (the rows' colours' check, entry by entry)."""
    atol = config.tolerances(plan.precision)[0]
    eps = MACHINE_EPSILON[plan.analytical_dtype]
    for pattern, block in zip(found.patterns, blocks):
        outside = np.abs(block)
        if not np.isfinite(outside).all():
            return False
        allowed = np.minimum(64 * eps * outside.sum(axis=0), atol / 2)
        outside[pattern.rows, pattern.cols] = 0.0
        if np.any(outside > allowed):
            return False
    return True


def differences(plan: Plan, found: Structure, values: list, position: int, flat: np.ndarray, shape, idx, delta,
                centre: np.ndarray) -> tuple | None:
    """The eager loop's (plus, minus) [m, len(idx)] from two calls of f per column colour among ``idx`` (distinct
    columns of input ``position``, ``flat`` its values in the evaluation dtype, moved by ``delta``), and the number
    of colours; None where the colours are too many or f's outputs changed shape."""
    k = [s.position for s in plan.checked].index(position)
    pattern, labels = found.patterns[k], found.column_labels[k][idx]
    colours = np.unique(labels)
    if len(colours) > COLOUR_SHARE * len(idx):
        return None
    nonzero_rows, nonzero_cols = pattern.rows, pattern.cols
    order = np.argsort(nonzero_cols, kind="stable")  # the pattern by columns: each column's rows
    by_column, starts = nonzero_rows[order], np.searchsorted(nonzero_cols[order], np.arange(pattern.shape[1] + 1))
    # Every (row, column of idx) the pattern holds, grouped by the column's colour: what each colour's call fills.
    counts = starts[idx + 1] - starts[idx]
    reached, column = by_column[ranges(starts[idx], counts)], np.repeat(np.arange(len(idx)), counts)
    by_colour = np.argsort(labels[column], kind="stable")
    bounds = np.searchsorted(labels[column][by_colour], np.append(colours, colours[-1] + 1))  # idx is not empty
    offsets = np.asarray(delta, np.float64).astype(flat.dtype)
    sides = []
    for sign in (1, -1):
        block = np.repeat(centre[:, None], len(idx), axis=1)
        for c, colour in enumerate(colours):
            chosen = np.flatnonzero(labels == colour)
            moved = flat.copy()
            moved[idx[chosen]] = flat[idx[chosen]] + sign * offsets[chosen]
            values[position] = tf.constant(moved.reshape(shape))
            try:
                y = plan.call_flat_numpy(values, plan.eval_upcast)
            except REFUSALS:  # f refuses a point that moves many elements: the loop finds which
                return None
            if y.shape != (plan.m,):
                return None  # the loop raises, naming the element
            pairs = by_colour[bounds[c] : bounds[c + 1]]
            block[reached[pairs], column[pairs]] = y[reached[pairs]]
        sides.append(block)
    return (*sides, len(colours))
