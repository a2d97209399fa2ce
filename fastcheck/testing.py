"""``GradientTestCase``: gradient assertions for ``tf.test.TestCase`` tests, in eager or graph mode.

Example (a test module)::

    import numpy as np
    import tensorflow as tf
    from fastcheck.testing import GradientTestCase

    class MyOpTest(GradientTestCase, tf.test.TestCase):
        def test_gradient(self):
            self.assertGradientsClose(my_op, np.random.default_rng(0).normal(size=(3, 4)))

A device that runs out of memory is simulated with ``out_of_memory(above=N)``: within the block every batched call
of f over more than N items raises TensorFlow's ``ResourceExhaustedError`` before it runs, and a check halves its
chunks and retries (logged at DEBUG on the ``fastcheck`` logger) to the same result.

A branch that only large checks reach is reached on a small one with ``tunables(NAME=value)``: within the block every
check reads those tunables of ``fastcheck/tables.py`` (the names in its ``CONFIGURABLE``) instead of the table's,
e.g. ``tunables(DENSE_REPORT_ENTRIES=0)`` reports a coloured check's pairs sparse.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import NoReturn

import tensorflow as tf

import fastcheck
from fastcheck.engine.config import tunables
from fastcheck.engine.executor import out_of_memory

__all__ = ["GradientTestCase", "out_of_memory", "tunables"]

_GRAPH_NOTE = (
    "fastcheck checked this eagerly beside the test's graph (in its own thread): f, the model and the data must not use "
    "tensors or variables of that graph. Build them inside f from its arguments, or create them eagerly (outside "
    "`with tf.Graph().as_default()`, e.g. in setUp)."
)


class GradientTestCase:
    """Mixin for ``tf.test.TestCase`` with fastcheck's gradient assertions.

    Both assertions fail the test with the full report (``str(report)``) unless its verdict is ``pass``, and return
    the report otherwise. In graph mode (a test body inside ``with tf.Graph().as_default():``,
    ``run_in_graph_and_eager_modes`` or TensorFlow Probability's ``test_graph_and_eager_modes``) the check runs
    eagerly on the side, in a thread of its own where no graph is the default: graph tensors and variables among
    ``inputs`` and ``data`` are first turned into values with ``self.evaluate``.
    """

    # Provided by tf.test.TestCase, which this class is mixed into.
    fail: Callable[..., NoReturn]
    evaluate: Callable

    def assertGradientsClose(self, f: Callable, inputs, **options):
        """Fail unless ``fastcheck.check_gradients(f, inputs, **options)`` passes.

        Args:
          f: the function to check, called as ``f(*inputs)``.
          inputs: a tensor-like or a list/tuple of them (numpy arrays, Python numbers, tensors).
          **options: options of ``fastcheck.check_gradients`` (``atol``, ``mode``, ``device``, ...).

        Returns:
          The passing ``GradientReport``.
        """
        inputs = self._values(inputs)
        return self._passing(lambda: fastcheck.check_gradients(f, inputs, **options))

    def assertModelGradientsClose(self, model, loss, data, **options):
        """Fail unless ``fastcheck.check_model(model, loss, data, **options)`` passes.

        Args:
          model: a Keras model (or layer) whose trainable variables are checked.
          loss: ``loss(y, model(x, training=training))``, e.g. a ``keras.losses.Loss`` or a name (``"mse"``).
          data: ``(x, y)``.
          **options: arguments and options of ``fastcheck.check_model`` (``variables=``, ``training=True``,
            ``sample_weight=``, ``atol``, ...).

        Returns:
          The passing ``GradientReport``.
        """
        data = self._values(data)
        return self._passing(lambda: fastcheck.check_model(model, loss, data, **options))

    def _values(self, structure):
        """Graph tensors and variables in ``structure`` as numpy values (they have a value only in a session)."""
        if tf.executing_eagerly():
            return structure
        return tf.nest.map_structure(lambda v: self.evaluate(v) if _in_graph(v) else v, structure)

    def _passing(self, check: Callable):
        report = check() if tf.executing_eagerly() else _run_eagerly(check)
        if not report.ok:
            self.fail(str(report))
        return report


def _in_graph(value) -> bool:
    if tf.is_symbolic_tensor(value):
        return True
    try:
        return isinstance(value, tf.Variable) and value.graph is not None
    except AttributeError:  # an eager variable has no graph
        return False


def _run_eagerly(check: Callable):
    # A graph is the default only in the thread that entered it, and tf.init_scope does not leave a tf.Graph: a
    # fresh thread is the public way back to eager execution.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_eager_call, check).result()


def _eager_call(check: Callable):
    if not tf.executing_eagerly():
        raise RuntimeError(
            "fastcheck checks gradients eagerly, and eager execution is disabled in this process "
            "(tf.compat.v1.disable_eager_execution()): run this test with eager execution enabled, the TF2 default."
        )
    try:
        return check()
    except Exception as error:
        if hasattr(error, "add_note"):  # Python >= 3.11
            error.add_note(_GRAPH_NOTE)
        raise
