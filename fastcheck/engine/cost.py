"""What one eager call of f costs, counted while it runs: the facts routing and mode choice predict from."""

from __future__ import annotations

import sys

import numpy as np
from tensorflow.python.framework import op_callbacks

from fastcheck.engine.tables import COST_PER_ELEMENT, COST_PER_FLOP, COST_PER_OP, COST_PER_PYTHON_CALL

_PRODUCTS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv3D",
                        "DepthwiseConv2dNative", "Einsum"})


class CallCost:
    """While active, what an eager call of f runs, and the seconds that predicts: its Python calls, its eager ops,
    the elements they write and the multiply-adds of its products and convolutions, each at a constant cost
    (``tables.COST_PER_*``).  Counted, not timed: the same f at the same inputs costs the same on any machine
    under any load, so every choice made from it is the same in every process."""

    def __init__(self):
        self.python_calls = self.ops = self.elements = self.flops = 0
        self._profile = None

    @property
    def seconds(self) -> float:
        """One eager call."""
        return self.python_calls * COST_PER_PYTHON_CALL + self.ops * COST_PER_OP + self.traced_seconds

    @property
    def traced_seconds(self) -> float:
        """One call of f's traced function: no Python, no eager dispatch."""
        return self.elements * COST_PER_ELEMENT + self.flops * COST_PER_FLOP

    def __enter__(self) -> CallCost:
        self._profile = sys.getprofile()
        op_callbacks.add_op_callback(self._op)
        if self._profile is None:  # a profiler of the user's (cProfile) is left alone; f's Python calls go uncounted
            sys.setprofile(self._python)
        return self

    def __exit__(self, *exc) -> None:
        if self._profile is None:
            sys.setprofile(None)
        op_callbacks.remove_op_callback(self._op)

    def _python(self, frame, event, arg) -> None:
        if event in ("call", "c_call"):
            self.python_calls += 1

    def _op(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if graph is not None:  # built into a graph (f tracing a tf.function): it runs later, as one call op
            return None
        self.ops += 1
        written = sum(int(t.shape.num_elements() or 0) for t in outputs)
        self.elements += written
        if op_type in _PRODUCTS and len(inputs) > 1:
            self.flops += 2 * written * _depth(op_type, inputs, dict(zip(attrs[::2], attrs[1::2])) if attrs else {})
        return None


def _depth(op_type: str, inputs, attrs: dict) -> int:
    """Multiply-adds per output element of a product or convolution: its filter's window, or the contracted size."""
    try:
        if op_type in ("Conv2D", "Conv3D", "DepthwiseConv2dNative"):
            window = inputs[1].shape[:-2] if op_type.startswith("Depthwise") else inputs[1].shape[:-1]
            return max(1, int(np.prod([int(d or 1) for d in window], dtype=np.int64)))
        if op_type == "Einsum":
            return 1  # its contraction needs the equation parsed: counted by the elements it writes
        shape = inputs[0].shape
        transposed = attrs.get("transpose_a", False) or attrs.get("adj_x", False)
        return max(1, int(shape[-2] if transposed else shape[-1]))
    except (TypeError, ValueError, IndexError):  # a shape this reading does not know
        return 1
