"""What the report says about why a check could not run or could not decide: where f is not finite and which op
made it so (rerunning f under TensorFlow's numerics check), and which side a batched kernel's error came from."""

from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from fastcheck.engine.plan import InputSpec, Plan, first_line

# What a non-finite result of a common op usually means, for the report.
_DOMAIN = {
    "Log": "log received non-positive values",
    "Log1p": "log1p received values <= -1",
    "Sqrt": "sqrt received negative values",
    "Rsqrt": "rsqrt received non-positive values",
    "RealDiv": "a division by zero",
    "DivNoNan": "a division producing a non-finite value",
    "Reciprocal": "a reciprocal of zero",
    "Pow": "pow of a negative base or zero to a negative power",
    "Acos": "acos received values outside [-1, 1]",
    "Asin": "asin received values outside [-1, 1]",
    "Atanh": "atanh received values outside (-1, 1)",
    "Exp": "exp overflowed",
    "Lgamma": "lgamma received a non-positive integer",
    "Digamma": "digamma received a non-positive integer",
}


_OUTSIDE_DOMAIN = {
    "Log": lambda x: x <= 0,
    "Rsqrt": lambda x: x <= 0,
    "Sqrt": lambda x: x < 0,
    "Log1p": lambda x: x <= -1,
    "Reciprocal": lambda x: x == 0,
    "Acos": lambda x: np.abs(x) > 1,
    "Asin": lambda x: np.abs(x) > 1,
    "Atanh": lambda x: np.abs(x) >= 1,
}


def describe_nonfinite(plan: Plan, y0: np.ndarray) -> str:
    """Say where f is not finite at the point and, when TF can tell, which op made it so."""
    bad = np.flatnonzero(~np.isfinite(y0))
    places = []
    for output in plan.outputs:
        rows = bad[(bad >= output.offset) & (bad < output.offset + output.size)] - output.offset
        if len(rows):
            shape = tuple(output.shape) + ((2,) if output.dtype.is_complex else ())
            if shape:
                shown = ", ".join(str(tuple(int(i) for i in np.unravel_index(r, shape))) for r in rows[:5])
                places.append(f"{output.name} at {shown}{' ...' if len(rows) > 5 else ''}")
            else:
                places.append(f"{output.name} (a scalar) is {y0[output.offset]}")
    message = (f"f itself is not finite at the point ({'; '.join(places)}), so its derivative there is undecidable: "
               "the mismatches reported for those elements are not gradient bugs.")
    culprit = _first_nonfinite_op(plan)
    if culprit:
        message += " " + culprit
    if any(not np.all(np.isfinite(spec.real_view.numpy())) for spec in plan.checked):
        return message + (" The inputs themselves hold infinite or NaN elements (named in the notes): f of an "
                          "infinite input is often infinite, and no difference quotient checks its derivative there.")
    return message + " Check f at points inside its domain (e.g. probabilities from a softmax, not a normal sample)."


def _user_has_check_numerics() -> bool:
    """Whether the user turned on ``tf.debugging.enable_check_numerics()`` in this thread (then it stays on)."""
    try:
        from tensorflow.python.debug.lib import check_numerics_callback
    except ImportError:  # pragma: no cover - TensorFlow moved it: assume on, never turn it off
        return True
    return getattr(check_numerics_callback._state, "check_numerics_callback", None) is not None


def _first_nonfinite_op(plan: Plan) -> str | None:
    already_on = _user_has_check_numerics()
    tf.debugging.enable_check_numerics()
    try:
        plan.f(*[s.value for s in plan.inputs])
    except Exception as error:  # the first op that produced NaN/Inf
        text = str(error)
        found = re.search(r'of (?:eagerly-executing|graph) op "([^"]+)"', text)
        if not found:
            return None
        op = found.group(1)
        what = _DOMAIN.get(op, f"op {op} produced NaN/Inf")
        sentence = f"The first non-finite value comes from op {op}: {what}."
        outside = _OUTSIDE_DOMAIN.get(op)
        spec = _logged_input(text, plan)
        if spec is not None and outside is not None:
            x = spec.value.numpy()
            positions = [tuple(int(i) for i in p) for p in np.argwhere(outside(x))[:5]]
            sentence += (f" It received {spec.name} directly, which has {int(np.sum(outside(x)))} element(s) "
                         f"outside its domain, e.g. at {', '.join(map(str, positions))}.")
        return sentence
    finally:
        if not already_on:
            tf.debugging.disable_check_numerics()
    return None


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf")


def _logged_input(text: str, plan: Plan) -> InputSpec | None:
    """The checked input that the failing op received unchanged, read off TF's numerics log."""
    found = re.search(r"Input tensor: tf\.Tensor\((.*?), shape=\(([\d, ]*)\)", text, re.S)
    if not found:
        return None
    shape = tuple(int(d) for d in found.group(2).replace(" ", "").split(",") if d)
    head = [float(v) for v in _NUMBER.findall(found.group(1).split("...")[0])[:8]]
    for spec in plan.checked:
        x = spec.value.numpy()
        if tuple(x.shape) == shape and not spec.is_complex and head:
            flat = x.reshape(-1)[: len(head)].astype(np.float64)
            if len(flat) == len(head) and np.allclose(flat, head, rtol=1e-5, atol=1e-7, equal_nan=True):
                return spec
    return None


# TensorFlow's gradient kernels: an error naming one came from the reverse-mode side, not from f.
_GRADIENT_OP = re.compile(r"\[Op:(\w*(?:Backprop|Grad)\w*)\]|node (?:gradients?|gradient_tape)/")


def kernel_failure(error: Exception, path: str, jit_compile, analytical: bool = False) -> ValueError:
    """The error a strategy raises when f (or its gradient) fails where the check evaluated it (``path``: the one
    that failed, after any fallbacks; ``analytical``: while computing the gradient at the inputs): which side, and
    the cause; no advice to pass an option already passed."""
    gist = first_line(error)
    gradient = _GRADIENT_OP.search(str(error))
    if gradient or analytical:
        op = f" (op {gradient.group(1)})" if gradient and gradient.group(1) else ""
        return ValueError(
            f"f's reverse-mode gradient raised {type(error).__name__}{op}: {gist}\nThe gradient of f (an op's, or a "
            "custom gradient's) fails at these inputs, on this device: a training step would fail the same way. "
            "Check f's custom gradients, and f's ops for the device (some gradients exist only on GPU), or give the "
            "op a tf.custom_gradient.")
    if path == "eager":
        return ValueError(
            f"f raised {type(error).__name__} in one of the eager calls fastcheck made of it near the inputs: {gist}\n"
            "f ran at the inputs themselves; make sure f runs at points a small step away from them.")
    advice = " or pass jit_compile=False" if jit_compile is not False else ""
    return ValueError(
        f"f raised {type(error).__name__} while fastcheck evaluated it in a batched tf.function (path {path!r}): "
        f"{gist}\nf ran eagerly at the inputs; check that it can be traced (no .numpy() calls or Python side "
        f"effects on tensors){advice}.")
