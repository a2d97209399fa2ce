"""Convolutions that ``tf.vectorized_map`` would run one perturbation at a time, vectorised.

TensorFlow's pfor converts ``Conv2D`` only where its filter is the same in every iteration, and
``DepthwiseConv2dNative`` only where its filter differs in every one; otherwise it falls back to a
``while_loop`` over the batch.  fastcheck's kernels meet both: a kernel perturbing one variable batches the
activations reaching every later depthwise convolution, whose filter is fixed (MobileNetV2), and a kernel
perturbing every input at once batches every filter.  ``converted`` gives the convolutions f creates inside such
a kernel converters of their own -- pfor reads an op's ``pfor_converter`` before its registry --: a batched
``Conv2D`` filter (NHWC) becomes one convolution with the batch's filters side by side, a group per iteration
where the input is batched too (no input is tiled), and a fixed depthwise filter is tiled over the batch.  The
numbers are each perturbation's own convolution; nothing of TensorFlow's changes (only those ops of
fastcheck's own traces carry them), and where TensorFlow's pfor internals are not as expected nothing is given.
"""

from __future__ import annotations

import tensorflow as tf

try:
    from tensorflow.python.ops.parallel_for import pfor as _pfor

    _REGISTERED = _pfor._pfor_converter_registry
    _create_op, _wrap = _pfor._create_op, _pfor.wrap
except (ImportError, AttributeError):  # another TensorFlow's internals: pfor's own conversions stand
    _REGISTERED = {}


def _conv2d(pfor_input):
    """A batched filter: the batch's filters side by side as one filter's output channels, over a fixed input; over
    a batched input, one convolution with a group per iteration.  The output split back, [batch, N, H', W', O]."""
    x, batched, _ = pfor_input.input(0)
    kernel, kernel_batched, _ = pfor_input.input(1)
    if not kernel_batched or pfor_input.get_attr("data_format") != b"NHWC":
        return _REGISTERED["Conv2D"](pfor_input)
    if batched:  # [B, N, H, W, C] -> [N, H, W, B C]: iteration b's channels form group b
        x = tf.reshape(tf.transpose(x, [1, 2, 3, 0, 4]), tf.concat([tf.shape(x)[1:4], [-1]], 0))
    kernels = tf.reshape(tf.transpose(kernel, [1, 2, 3, 0, 4]), tf.concat([tf.shape(kernel)[1:4], [-1]], 0))
    out = _create_op("Conv2D", [x, kernels], [pfor_input.outputs[0].dtype],
                     attrs=pfor_input.op.node_def.attr).outputs[0]  # [N, H', W', B O]
    split = tf.concat([tf.shape(out)[:3], pfor_input.pfor.loop_len_vector, [-1]], 0)
    return _wrap(tf.transpose(tf.reshape(out, split), [3, 0, 1, 2, 4]), True)


def _depthwise(pfor_input):
    """A fixed filter tiled over the batch, for pfor's own conversion of a batched one."""
    pfor_input.stack_inputs(stack_indices=[0, 1])
    return _REGISTERED["DepthwiseConv2dNative"](pfor_input)


_CONVERTERS = {"Conv2D": _conv2d, "DepthwiseConv2dNative": _depthwise} if {"Conv2D", "DepthwiseConv2dNative"} <= set(
    _REGISTERED) else {}

# Routing's list of the ops a joint kernel still loops over, their filter batched: those without a converter here
# (transposed convolutions among them: pfor's own converter wants their filter fixed).
LOOPED_WHEN_JOINT = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput",
                               "Conv3DBackpropInputV2"} - set(_CONVERTERS))


def converted(call, *args):
    """``call(*args)`` inside a ``vectorized_map`` loop function, the convolutions it created given the
    converters."""
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    result = call(*args)
    if _CONVERTERS:
        for op in graph.get_operations()[before:]:
            converter = _CONVERTERS.get(op.type)
            if converter is not None:
                op.pfor_converter = converter
    return result
