"""Drop-in replacements for ``tf.test.compute_gradient`` and ``gradient_checker_v2.max_error``.

A suite written against TensorFlow's checker switches by one import::

    from fastcheck import compute_gradient, max_error

The arguments, the return layout and the dtypes are TensorFlow's; the numerical Jacobian is fastcheck's batched
central differences (one batched evaluation per chunk of columns instead of two calls of f per column).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from fastcheck._check import jacobian_blocks, on_device
from fastcheck.engine.config import CheckConfig
from fastcheck.engine.plan import FunctionRaised
from fastcheck.problem.problem import function_problem

# The dtypes tf.test.compute_gradient accepts for the inputs and the output.
_ALLOWED = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.complex64, tf.complex128)


def compute_gradient(f: Callable, x, delta=None) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The theoretical and numerical Jacobians of ``f`` at ``x``, as ``tf.test.compute_gradient`` returns them.

    Args:
      f: the function; called as ``f(*x)``.  It returns one tensor (or, beyond TensorFlow, a nested structure of
        them: the rows of its floating leaves are stacked in ``tf.nest.flatten`` order).
      x: a list or tuple of values convertible to tensors (Python floats become float32, as
        ``tf.convert_to_tensor`` makes them), one per argument of f.
      delta: the absolute step of the central differences: element ``j`` moves to ``x_j +- delta``.  ``None``
        (default) takes fastcheck's step instead of TensorFlow's 1/1024: ``eps**(1/3) * max(1, |x_j|)`` for the
        machine epsilon of the evaluation dtype, float64 where f accepts it (about 6e-6; the differences are then
        accurate to ~1e-10 where TensorFlow's float32 ones carry ~1e-4).

    Returns:
      ``(theoretical, numerical)``: two tuples with one 2-D numpy array per input, of shape (output_size,
      input_size) and the input's real dtype (complex values count as (real, imag) pairs, as in TensorFlow).
      Theoretical is the reverse-mode Jacobian.  Empty inputs or outputs give empty arrays of that shape.

    Raises:
      ValueError: ``x`` is not a list or tuple (TensorFlow's error).
      TypeError: an input of a dtype TensorFlow's checker refuses (integers, bool; TensorFlow asserts instead), f
        returning no floating output.
      Whatever f raises, on any call: as itself (as TensorFlow's checker, which calls f directly), with a note
        saying that fastcheck called it.

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> theoretical, numerical = fastcheck.compute_gradient(lambda x: x * x, [tf.constant([3.0])])
      >>> float(theoretical[0][0, 0]), round(float(numerical[0][0, 0]), 6)
      (6.0, 6.0)
    """
    if not isinstance(x, (list, tuple)):
        raise ValueError("`x` must be a list or tuple of values convertible to a Tensor "
                         f"(arguments to `f`), not a {type(x)}")
    with on_device(None):  # inside tf.Graph().as_default() (TF1-style tests): eagerly, on the side
        try:
            return _compute_gradient(f, x, delta)
        except FunctionRaised as raised:  # as TensorFlow's checker, which calls f itself: f's exception as itself
            error = raised.__cause__ if raised.__cause__ is not None else raised
    if hasattr(error, "add_note"):
        error.add_note("fastcheck.compute_gradient: f raised this when called at x")
    raise error


def _compute_gradient(f: Callable, x, delta) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    xs = [tf.convert_to_tensor(value) for value in x]
    for position, value in enumerate(xs):
        if value.dtype.base_dtype not in _ALLOWED:
            raise TypeError(f"Cannot compute gradient for unsupported type {value.dtype.name} of argument {position}: "
                            "compute_gradient differentiates float16, bfloat16, float32, float64 and complex inputs.")
    # delta: every element moves by exactly +- delta (fastcheck's own step is relative: eps * max(1, |x_j|))
    config = (CheckConfig(progress=False, autodiff="reverse") if delta is None
              else CheckConfig(eps=float(delta), absolute_step=True, progress=False, autodiff="reverse"))
    blocks = jacobian_blocks(function_problem(f, xs, config), config, ("analytical", "numerical"))
    theoretical, numerical = ([_stacked(rows, value, position) for position, value in enumerate(xs)]
                              for rows in (blocks["analytical"], blocks["numerical"]))
    return tuple(theoretical), tuple(numerical)


def _stacked(rows: list[list[np.ndarray | None]], value: tf.Tensor, position: int) -> np.ndarray:
    """The Jacobian of every floating output with respect to input ``position``, in its real dtype."""
    parts = [np.asarray(row[position]) for row in rows]  # every input is checked: no None
    block = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    return block.astype(value.dtype.real_dtype.as_numpy_dtype)


def max_error(grad1, grad2):
    """The largest element-wise ``|grad1 - grad2|`` over two lists of arrays, as TensorFlow's
    ``gradient_checker_v2.max_error`` computes it (0 when every array is empty).

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> bool(fastcheck.max_error(*fastcheck.compute_gradient(tf.sin, [tf.constant([0.5], tf.float64)])) < 1e-8)
      True
    """
    error = 0
    for j_t, j_n in zip(grad1, grad2):
        if j_t.size or j_n.size:  # zero-size Jacobians have no gap
            error = np.maximum(error, np.fabs(j_t - j_n).max())
    return error
