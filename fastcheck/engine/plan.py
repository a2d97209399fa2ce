"""Plan a check: normalise inputs and outputs, probe ``f``, choose precision and path.

Everything downstream works on one view of the problem: a function of the *checked* inputs (each a real tensor;
complex inputs are viewed as a trailing axis of (real, imag)) returning one flat real vector of all differentiable
outputs.  Both Jacobians are computed for that function, so every pair (output, input) comes out of one pass.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_array_ops, gen_math_ops

from fastcheck.engine.config import (
    MACHINE_EPSILON,
    PRECISION_EPSILON,
    CheckConfig,
    least_precise,
    less_precise,
    most_precise,
    precision_name,
    real_dtype,
)
from fastcheck.engine.cost import CallCost
from fastcheck.engine.precision import Noise, low_precision_op, measure_noise, tensorfloat32_op
from fastcheck.engine.raised import Raised, own_error
from fastcheck.engine.tables import (
    EQUAL_BLOCK,
    NOISY_EPSILONS,
    UPCAST_MAX_ELEMENTS,
)
from fastcheck.report.events import CallNoise, LowPrecisionOp, NumericalSide, TensorFloat32


@dataclasses.dataclass
class InputSpec:
    """One positional input of ``f``."""

    position: int
    name: str
    value: tf.Tensor  # the value as passed, in its own dtype
    checked: bool  # floating or complex: perturbed and differentiated
    variable: tf.Variable | None = None

    @property
    def dtype(self) -> tf.DType:
        return self.value.dtype

    @property
    def is_complex(self) -> bool:
        return self.value.dtype.is_complex

    @property
    def real_view(self) -> tf.Tensor:
        """The checked view: complex values as a trailing (real, imag) axis."""
        return to_real_view(self.value)

    @functools.cached_property
    def size(self) -> int:
        """Number of real scalars in the checked view (read on every use of the spec: computed once)."""
        return self.real_view.shape.num_elements() if self.checked else 0


@dataclasses.dataclass
class OutputSpec:
    """One differentiable leaf of ``f``'s output structure."""

    name: str
    shape: tuple
    dtype: tf.DType
    offset: int  # first row of this output in the flat vector
    size: int  # number of real scalars (complex counts twice)


def as_float64(value: tf.Tensor) -> tf.Tensor:
    """A real eager tensor as float64: TensorFlow's Cast op itself (what ``tf.cast`` runs for a real tensor),
    without ``tf.cast``'s Python overhead."""
    return value if value.dtype == tf.float64 else gen_math_ops.cast(value, tf.float64)


def to_real_view(value: tf.Tensor) -> tf.Tensor:
    if value.dtype.is_complex:
        return tf.stack([tf.math.real(value), tf.math.imag(value)], axis=-1)
    return value


def from_real_view(view: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    if dtype.is_complex:
        real, imag = tf.unstack(view, 2, axis=-1)  # one op: two slices cost ~0.2 ms of Python each in eager mode
        return tf.complex(real, imag)
    return view


def _is_differentiable(dtype: tf.DType) -> bool:
    return dtype.is_floating or dtype.is_complex


def _leaf_names(structure, prefix: str = "") -> list[str]:
    """Names of the leaves of a nested output, in tf.nest.flatten order."""
    if isinstance(structure, dict):  # tf.nest flattens dicts by sorted key
        items = [(f"{prefix}[{key!r}]", structure[key]) for key in sorted(structure)]
    elif isinstance(structure, (list, tuple)) and not hasattr(structure, "_fields"):
        items = [(f"{prefix}[{i}]", item) for i, item in enumerate(structure)]
    elif isinstance(structure, tuple):  # namedtuple
        items = [(f"{prefix}.{field}", getattr(structure, field)) for field in getattr(structure, "_fields", ())]
    else:
        return [prefix]
    return [name for path, item in items for name in _leaf_names(item, path)]


def normalize_inputs(inputs, names=None) -> list[InputSpec]:
    """Turn ``inputs`` (one tensor-like or a list/tuple of them) into specs."""
    items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    specs = []
    for position, item in enumerate(items):
        if names is not None:
            name = names[position]
        else:
            name = f"input {position}" if isinstance(inputs, (list, tuple)) else "input"
        variable = item if isinstance(item, tf.Variable) else None
        if item is None:
            raise TypeError(f"inputs[{position}] is None: pass a tensor, array or number for every positional argument of f.")
        try:
            if variable is not None:
                value = tf.identity(variable.read_value())
            elif isinstance(item, tf.Tensor):
                value = item
            else:
                # Python floats become float64, as numpy makes them: no precision the caller did not ask to lose.
                value = tf.convert_to_tensor(np.asarray(item) if not hasattr(item, "dtype") else item)
        except (TypeError, ValueError) as error:
            raise TypeError(f"inputs[{position}] of type {type(item).__name__} cannot be converted to a tensor "
                            f"({error}); pass a tf.Tensor, tf.Variable, numpy array or Python number.") from None
        if tf.is_symbolic_tensor(value):
            raise TypeError(f"inputs[{position}] is a symbolic graph tensor: fastcheck evaluates f at concrete values; "
                            "pass a numpy array or an eager tensor (inside tf.Graph().as_default(), build the inputs "
                            "with numpy).")
        if value.dtype == tf.string or value.dtype == tf.resource or value.dtype == tf.variant:
            raise TypeError(f"inputs[{position}] has dtype {value.dtype.name}, which cannot be perturbed or passed through.")
        checked = _is_differentiable(value.dtype)
        if checked and real_dtype(value.dtype) not in (tf.float16, tf.bfloat16, tf.float32, tf.float64):
            raise TypeError(f"inputs[{position}] has unsupported dtype {value.dtype.name}.")
        specs.append(InputSpec(position, name, value, checked, variable))
    if not any(s.checked for s in specs):
        dtypes = ", ".join(s.dtype.name for s in specs) or "none"
        raise TypeError(f"None of the inputs is floating point (dtypes: {dtypes}), so there is nothing to check: "
                        "pass at least one float16/bfloat16/float32/float64 or complex input, e.g. "
                        "tf.constant(x, tf.float64).")
    return specs


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """A probed problem: inputs, outputs, the flat function, precision and cost (built once, never mutated)."""

    f: Callable
    inputs: list[InputSpec]
    outputs: list[OutputSpec]
    structure: Any  # f's output at the point, for structure checks
    leaf_is_output: list[bool]  # which flattened leaves are differentiable outputs
    eval_upcast: bool  # numerical side evaluated in float64
    notes: list  # events (``fastcheck.report.events``): call-to-call noise, the numerical side's precision
    call_seconds: float  # one eager call of f, estimated from what it runs (``CallCost``)
    traced_call_seconds: float  # one call of f's traced function, estimated alike
    nondeterministic: str | None = None
    native_output: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))  # flat f(x) as float64
    eval_output: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))  # the same, numerical side
    repeat_output: np.ndarray | None = None  # a second native call at the point (call-to-call noise)
    noise: Noise | None = None  # measured noise of the numerical side's evaluations
    precision: str = "float64"  # the precision the analytical side computes in (tolerance row)
    precision_reason: Any = None  # why it is lower than the dtypes say: LowPrecisionOp, TensorFloat32 or declared text
    declared: tuple | None = None  # (precision, reason) the problem knows f's analytical side computes in
    autograph: bool = False  # kernels trace f with AutoGraph (set from the route: f needs it)
    # The float64 values planning called f with, where the numerical side is upcast: its evaluations start from them
    # (each cast is an eager op).
    upcast_values: tuple | None = None

    @property
    def noise_epsilon(self) -> float:
        """Relative noise of one evaluation on the numerical side: machine epsilon, or the measured noise above it."""
        eps = MACHINE_EPSILON[self.eval_dtype]
        measured = self.noise.relative if self.noise is not None else 0.0
        return measured if measured > NOISY_EPSILONS * eps else eps

    # A plan is never changed in place (``dataclasses.replace`` makes a new one): its sizes, read in every loop of a
    # check, are computed once.
    @functools.cached_property
    def checked(self) -> list[InputSpec]:
        return [s for s in self.inputs if s.checked]

    @functools.cached_property
    def m(self) -> int:
        return sum(o.size for o in self.outputs)

    @functools.cached_property
    def n(self) -> int:
        return sum(s.size for s in self.checked)

    @property
    def empty(self) -> bool:
        """The Jacobian has no entries: every output, or every checked input, has no elements."""
        return not self.m or not self.n

    @functools.cached_property
    def analytical_dtype(self) -> tf.DType:
        """Least precise dtype of the user's computation: tolerances come from it."""
        return least_precise([s.dtype for s in self.checked] + [o.dtype for o in self.outputs])

    @functools.cached_property
    def native_flat_dtype(self) -> tf.DType:
        return most_precise([o.dtype for o in self.outputs])

    @property
    def eval_flat_dtype(self) -> tf.DType:
        return tf.float64 if self.eval_upcast else self.native_flat_dtype

    @property
    def eval_dtype(self) -> tf.DType:
        """Least precise dtype on the numerical path: steps and noise come from it."""
        return tf.float64 if self.eval_upcast else self.analytical_dtype

    @functools.cached_property
    def row_epsilon(self) -> np.ndarray:
        """[m] the unit of rounding of each flat output row as evaluated: its output's dtype, or the checked inputs'
        least precise one where that is coarser (f computes from them); float64 when upcast.  One evaluation's
        rounding allowance per row (steps follow ``eval_dtype``): a float64 output beside a float32 one rounds at
        float64's epsilon (a smaller allowance can only make a first sweep fail, and a failure measures f's noise)."""
        if self.eval_upcast:
            return np.full(self.m, MACHINE_EPSILON[tf.float64])
        eps = np.empty(self.m)
        inputs = [s.dtype for s in self.checked]
        for output in self.outputs:
            eps[output.offset : output.offset + output.size] = MACHINE_EPSILON[least_precise([output.dtype, *inputs])]
        return eps

    @functools.cached_property
    def uniform_epsilon(self) -> float | None:
        """``row_epsilon``'s one value where every row rounds alike (an elementwise f: no m-sized array), else None."""
        if self.eval_upcast:
            return MACHINE_EPSILON[tf.float64]
        inputs = [s.dtype for s in self.checked]
        found = {MACHINE_EPSILON[least_precise([o.dtype, *inputs])] for o in self.outputs}
        return found.pop() if len(found) == 1 else None

    def row_epsilon_at(self, rows) -> float | np.ndarray:
        """``row_epsilon[rows]`` (an index array, a slice, or None for every row), or its one value where uniform."""
        if self.uniform_epsilon is not None:
            return self.uniform_epsilon
        return self.row_epsilon if rows is None else self.row_epsilon[rows]

    def eval_value(self, spec: InputSpec) -> tf.Tensor:
        """The checked input as the numerical side sees it (real view, maybe upcast)."""
        return self._eval_values[spec.position]

    @functools.cached_property
    def _eval_values(self) -> tuple:
        """Every input as the numerical side sees it, cast once per plan (each cast is an eager op)."""
        if self.eval_upcast and self.upcast_values is not None:
            return self.upcast_values
        return tuple((as_float64(s.real_view) if self.eval_upcast else s.real_view) if s.checked else s.value
                     for s in self.inputs)

    def call(self, values: list[tf.Tensor], untaped: bool = False):
        """f's raw result for one value per input (checked complex inputs given as real views).

        ``untaped``: no tape differentiates the call, so an eager real view becomes complex through numpy (the same
        bits, reinterpreted; cheaper than the ops)."""
        if not self._complex_inputs:  # the common case: every value as given
            return self.f(*values)
        args = []
        for spec, value in zip(self.inputs, values):
            if spec.checked and spec.is_complex:
                complex_dtype = tf.complex128 if value.dtype == tf.float64 else tf.complex64
                if untaped and type(value) is EAGER_TENSOR:
                    pairs = np.ascontiguousarray(value.numpy())
                    value = tf.constant(pairs.view(complex_dtype.as_numpy_dtype)[..., 0])
                else:
                    value = from_real_view(value, complex_dtype)
            args.append(value)
        return self.f(*args)

    @functools.cached_property
    def _complex_inputs(self) -> bool:
        """Whether some checked input is complex (given to f as a real view, made complex again by ``call``)."""
        return any(s.checked and s.is_complex for s in self.inputs)

    def output_leaves(self, values: list[tf.Tensor]) -> list[tf.Tensor]:
        """The floating output leaves of f as real views, unreshaped and uncast (for eager tapes)."""
        result = self.call(values)
        if type(result) is EAGER_TENSOR and self.leaf_is_output == [True] and not result.dtype.is_complex:
            return [result]  # one real tensor: nothing to walk or convert
        leaves = tf.nest.flatten(result)
        return [to_real_view(tf.convert_to_tensor(leaf)) for leaf, is_output in zip(leaves, self.leaf_is_output) if is_output]

    def call_flat(self, values: list[tf.Tensor], upcast: bool = False) -> tf.Tensor:
        """Call ``f`` with one value per input (checked ones as real views); flat real outputs.

        Works eagerly and inside ``tf.function``.  With ``upcast`` the outputs are cast to float64 (the values given
        are then the float64 evaluation values).
        """
        target = tf.float64 if upcast else self.native_flat_dtype
        pieces = [tf.reshape(tf.cast(leaf, target), [-1]) for leaf in self.output_leaves(values)]
        return tf.concat(pieces, axis=0) if len(pieces) > 1 else pieces[0]

    def call_flat_numpy(self, values: list[tf.Tensor], upcast: bool = False) -> np.ndarray:
        """``call_flat`` for the eager loop: the same numbers as a numpy vector, with no TensorFlow op besides f's
        own (a reshape or cast op costs as much as a small f)."""
        return self.flat_numpy(self.call(values, untaped=True), upcast)

    def call_flat_numpy_at(self, values: list[tf.Tensor], upcast: bool = False) -> np.ndarray:
        """``call_flat_numpy`` at a point a check moved the inputs to: where f refuses the point (raises
        ``REFUSALS``: an assertion on its values, TFP's ``validate_args``), f is not finite there (NaN), and the
        ladder treats the point as it treats any outside f's domain (smaller steps, one-sided quotients:
        ``refine``'s edge).  f's own exceptions (``raised``) still leave the check as themselves."""
        try:
            return self.call_flat_numpy(values, upcast)
        except REFUSALS:
            return np.full(self.m, np.nan)

    def flat_numpy(self, result, upcast: bool = False) -> np.ndarray:
        """f's raw ``result`` as ``call_flat_numpy`` gives it."""
        target = np.float64 if upcast else self.native_flat_dtype.as_numpy_dtype
        if type(result) is EAGER_TENSOR and not result.dtype.is_complex and self.leaf_is_output == [True]:
            return result.numpy().astype(target, copy=False).reshape(-1)  # one real tensor: nothing to walk
        pieces = []
        for leaf, is_output in zip(tf.nest.flatten(result), self.leaf_is_output):
            if not is_output:
                continue
            # .numpy(): np.asarray of a 0-d bfloat16 tensor fails ("__array__ method not producing an array")
            array = np.asarray(leaf.numpy() if hasattr(leaf, "numpy") else leaf)
            if np.iscomplexobj(array):
                array = np.stack([array.real, array.imag], axis=-1)
            pieces.append(array.astype(target, copy=False).reshape(-1))
        return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]

    def native_values(self) -> list[tf.Tensor]:
        return [s.real_view if s.checked else s.value for s in self.inputs]

    def eval_values(self) -> list[tf.Tensor]:
        return list(self._eval_values)


EAGER_TENSOR = type(tf.constant(0.0))  # the type of an eager tensor (not a variable, not composite)


class Float64Refused(Exception):
    """precision='float64' was requested and f has no float64 evaluation: ``reason`` (a ``NumericalSide``) says
    why; the runner raises the user's ValueError, its text composed by the report."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


# What f raises to refuse a point it is given (``Plan.call_flat_numpy_at``): TensorFlow's assertions and
# ``validate_args`` raise InvalidArgumentError, a Python check on the values often a ValueError.
REFUSALS = (tf.errors.InvalidArgumentError, ValueError)


class FunctionRaised(ValueError):
    """f raised an error fastcheck handles (``raised.HANDLED``) when planning called it at the inputs; ``__cause__``
    is f's exception.  f's own exception leaves the check as itself, as from any later call (``raised``)."""


def _call_user(f, args, what: str):
    try:
        return f(*args)
    except Exception as error:  # re-raised with the user's context
        own = own_error(error)
        if own is not None:
            raise Raised(own, tracing=False) from None
        raise FunctionRaised(
            f"f raised {type(error).__name__} when called with {what}: {first_line(error)}\n"
            "fastcheck calls f(*inputs) with the inputs you passed; make sure f runs on them on its own, "
            "e.g. `f(*inputs)` in eager mode."
        ) from error


def first_line(error: Exception, limit: int = 300) -> str:
    """The gist of an error: its first lines (Keras puts the cause on the second), shortened."""
    # TensorFlow prefixes an op's error with "{{function_node __wrapped__Op_device_...}}": noise to a reader.
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", str(error))
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    text = " ".join(lines[:3]) if lines else repr(error)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _flatten_output(out, what: str, names: list[str] | None = None):
    """f's output leaves as tensors (``names``: ``_leaf_names(out)``, where the caller has them)."""
    if out is None:
        raise TypeError(f"f returned None {what}: it must return a tensor or a nested list/tuple/dict of tensors.")
    if isinstance(out, tf.Tensor):  # the common case: one tensor, nothing to walk or convert
        return [out]
    leaves = tf.nest.flatten(out)
    tensors = []
    for name, leaf in zip(names if names is not None else _leaf_names(out), leaves):
        if leaf is None:
            raise TypeError(f"f returned None at output{name} {what}: every output leaf must be a tensor.")
        if not isinstance(leaf, (tf.Tensor, tf.Variable, np.ndarray, np.generic, float, int)):
            raise TypeError(f"f returned a {type(leaf).__name__} at output{name} {what}: every output leaf must be a "
                            "tensor (tf.Tensor or numpy array).")
        tensors.append(tf.convert_to_tensor(leaf))
    return tensors


def unstacked(batch: np.ndarray) -> list:
    """``[tf.constant(item) for item in batch]``: the same tensors, from one constant and one Unpack op (each constant
    costs as much as a small f's call, and the eager loops make one per call of f or VJP)."""
    if len(batch) == 1:
        return [tf.constant(batch[0])]
    return list(gen_array_ops.unpack(tf.constant(batch), num=len(batch), axis=0))


def view(tensor) -> np.ndarray:
    """A read-only numpy view of an eager tensor's buffer (``.numpy()`` copies it)."""
    try:
        return np.asarray(memoryview(tensor))
    except (TypeError, ValueError, BufferError):  # no buffer to view (e.g. on some devices): copy
        return tensor.numpy()


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit (one integer comparison, faster than a NaN-aware one)."""
    if a.dtype != b.dtype or a.dtype.kind not in "fciub" or not (a.flags.c_contiguous and b.flags.c_contiguous):
        return False
    if a.nbytes <= EQUAL_BLOCK:  # one block: its bytes
        return a.tobytes() == b.tobytes()
    a, b = a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
    # Block by block: no boolean temporary of the outputs' size.
    return a.size == b.size and all(np.array_equal(a[k : k + EQUAL_BLOCK], b[k : k + EQUAL_BLOCK])
                                    for k in range(0, a.size, EQUAL_BLOCK))


def build_plan(f: Callable, inputs, config: CheckConfig, names=None, computes_in: tuple | None = None,
               hold: Callable = lambda f: f) -> Plan:
    """Normalise, probe ``f`` eagerly at the point, and decide the numerical precision.

    ``computes_in``: (precision, reason) when the problem knows that the analytical side computes below its dtypes
    (a mixed-precision model judged through its float64 copy, whose evaluations show no float16 noise to measure).
    ``hold``: how the plan holds f (``kernels.WeakCall``: as compiled kernels hold it).
    """
    if not callable(f):
        raise TypeError(f"f must be callable (a function, tf.function or Keras layer); got {type(f).__name__}.")
    specs = normalize_inputs(inputs, names)
    native = [s.value for s in specs]
    out = _call_user(f, native, "the inputs")
    names = _leaf_names(out)
    leaves = _flatten_output(out, "at the inputs", names)
    outputs, offset, leaf_is_output = [], 0, []
    for name, leaf in zip(names, leaves):
        differentiable = _is_differentiable(leaf.dtype)
        leaf_is_output.append(differentiable)
        if differentiable:
            size = leaf.shape.num_elements() * (2 if leaf.dtype.is_complex else 1)
            outputs.append(OutputSpec(f"output{name}", tuple(leaf.shape), leaf.dtype, offset, size))
            offset += size
    if not outputs:
        raise TypeError(f"f returned no floating-point output (dtypes: {', '.join(t.dtype.name for t in leaves)}): "
                        "there is no derivative to check.")

    # Second call: a determinism check, and what one evaluation costs, counted (never timed: a check is a function of
    # its inputs, not of the machine's load).
    with CallCost() as cost:
        again = _flatten_output(_call_user(f, native, "the inputs (second call)"), "on the second call", names)
    call_seconds, traced_call_seconds = cost.seconds, cost.traced_seconds
    nondeterministic, notes, same = None, [], True
    for name, first, second in zip(names, leaves, again):
        a, b = view(first), view(second)
        if a.shape == b.shape and (_bitwise_equal(a, b) or np.array_equal(a, b, equal_nan=True)):
            continue
        same = False
        diff = float(np.max(np.abs(a.astype(np.complex128) - b.astype(np.complex128)))) if a.shape == b.shape else float("inf")
        # Parallel reductions (GPU, some CPU kernels) differ between calls in the last bits: noise, measured and
        # allowed for.  A difference beyond sqrt(eps) of the output is beyond what any difference quotient could
        # tolerate: f is random (dropout, random ops).
        magnitude = float(np.max(np.abs(a))) if a.size and _is_differentiable(first.dtype) else 0.0
        if diff <= np.sqrt(MACHINE_EPSILON[real_dtype(first.dtype)]) * magnitude:
            notes.append(CallNoise(name, diff))
            continue
        nondeterministic = (
            f"f is not deterministic: two calls at the same inputs gave different output{name} "
            f"(max difference {diff:.3g}). Finite differences of a random function are meaningless; "
            "disable dropout (training=False), seed or remove random ops, then check again."
        )
        break

    def flat(result_leaves) -> np.ndarray:
        parts = [np.reshape(view(to_real_view(leaf)), [-1]) for leaf, keep in zip(result_leaves, leaf_is_output) if keep]
        if len(parts) == 1:  # one copy, not three
            return parts[0].astype(np.float64)
        return np.concatenate([part.astype(np.float64) for part in parts])

    native_output = flat(leaves)
    plan = Plan(f, specs, outputs, out, leaf_is_output, False, notes, call_seconds, traced_call_seconds, nondeterministic, native_output,
                declared=computes_in)
    if plan.empty:  # no Jacobian entry: nothing to measure or choose (run_check and jacobians say so)
        return dataclasses.replace(plan, f=hold(f))
    # The second call's outputs, once: the precision choice and the call-to-call noise read them (the first call's
    # values where the two are equal: no second float64 copy).
    repeat = native_output if same else flat(again)
    upcast, eval_output, note, upcast_values = _choose_precision(plan, config, repeat)
    precision, reason = _declared_precision(plan)
    return dataclasses.replace(plan, f=hold(f), eval_upcast=upcast, eval_output=eval_output,
                               notes=notes + ([note] if note else []), repeat_output=None if upcast else repeat,
                               precision=precision, precision_reason=reason, upcast_values=upcast_values)


def _declared_precision(plan: Plan) -> tuple[str, Any]:
    """The plan's precision and its reason before any measurement: the dtypes', lowered to a declared one."""
    precision = precision_name(plan.analytical_dtype)
    if plan.declared is None or less_precise([precision, plan.declared[0]]) == precision:
        return precision, None
    return plan.declared[0], plan.declared[1]


def measure_precision(plan: Plan, line=None) -> Plan:
    """The plan with f's measured noise and the precision its analytical side computes in (``line``: a batched
    evaluator of the noise tables, see ``measure_noise``)."""
    eps_eval = MACHINE_EPSILON[plan.eval_dtype]
    values = plan.eval_values()
    positions = [s.position for s in plan.checked]
    noise = measure_noise(lambda moved: plan.call_flat_numpy(moved, plan.eval_upcast), values, positions,
                          plan.eval_output, eps_eval, plan.repeat_output, line=line)
    return with_noise(plan, noise)


def with_noise(plan: Plan, noise: Noise) -> Plan:
    """The plan with a measured noise and the precision that names: when the noise is far above the evaluation
    dtype's rounding, one trace of f names the op computing in low precision (and every output's noise is floored,
    see ``Noise.floored``); TensorFloat-32 on a GPU."""
    eps_eval = MACHINE_EPSILON[plan.eval_dtype]
    precision, reason = _declared_precision(plan)
    signature = [tf.TensorSpec(v.shape, v.dtype) for v in plan.native_values()]
    traced = None
    if noise.relative > NOISY_EPSILONS * eps_eval:
        traced = _traceable(plan, signature)
        found = _safely(lambda: low_precision_op(traced, signature, below=precision))
        if found is not None:
            precision = less_precise([precision, found[0]])
            reason = LowPrecisionOp(found[0], found[1])
            noise = noise.floored(plan.eval_output)
    if precision == "float32" and tf.config.list_logical_devices("GPU"):  # no trace where no GPU can run TF32
        op = _safely(lambda: tensorfloat32_op(traced or _traceable(plan, signature), signature))
        if op is not None:
            precision, reason = "tensorfloat32", TensorFloat32(op)
    return dataclasses.replace(plan, noise=noise, precision=precision, precision_reason=reason)


def _traceable(plan: Plan, signature: list):
    """f as a ``tf.function`` whose ``get_concrete_function(*signature)`` works: without AutoGraph when f traces
    without it (AutoGraph's conversion can cost most of a small check), else with it (Python control flow on
    tensors)."""
    plain = tf.function(lambda *vs: plan.call_flat(list(vs)), autograph=False)
    try:
        plain.get_concrete_function(*signature)
        return plain
    except Exception:
        return tf.function(lambda *vs: plan.call_flat(list(vs)))


def _safely(find):
    """A precision finder's answer, or None when f cannot be traced (it still runs eagerly)."""
    try:
        return find()
    except Exception:  # an untraceable f computes in whatever its eager ops use: nothing more to name
        return None


def _choose_precision(plan: Plan, config: CheckConfig, repeat: np.ndarray) -> tuple:
    """(evaluate the numerical side in float64?, f at the point in that precision as float64, the event saying so,
    the float64 values f was called with where it is)."""
    native = plan.native_output
    low = [d for d in [s.dtype for s in plan.checked] + [o.dtype for o in plan.outputs] if real_dtype(d) != tf.float64]
    if config.precision == "native" or not low:
        return False, native, None, None
    if config.precision == "auto" and plan.n > UPCAST_MAX_ELEMENTS:
        return False, native, NumericalSide(False, "elements", elements=plan.n), None
    # Evaluate the numerical side in float64 when f accepts it: the finite differences then carry ~1e-11 error, so
    # float32 gradients are judged by float32 tolerances alone instead of by float32 finite-difference noise.
    upcast_args = [as_float64(s.real_view) if s.checked else s.value for s in plan.inputs]
    reason: NumericalSide | None = None
    upcast = native
    try:
        out = plan.f(*[from_real_view(v, tf.complex128) if s.checked and s.is_complex else v
                       for s, v in zip(plan.inputs, upcast_args)])
        leaves = [out] if isinstance(out, tf.Tensor) else [tf.convert_to_tensor(t) for t in tf.nest.flatten(out)]
        low_out = [t.dtype.name for t, o in zip(leaves, plan.leaf_is_output) if o and real_dtype(t.dtype) != tf.float64]
        if low_out:
            reason = NumericalSide(False, "returns", dtype=low_out[0])
        elif [t.shape for t in leaves] != [t.shape for t in _flatten_output(plan.structure, "")]:
            reason = NumericalSide(False, "shapes")
        else:
            parts = [to_real_view(t).numpy().reshape(-1).astype(np.float64)
                     for t, o in zip(leaves, plan.leaf_is_output) if o]
            upcast = parts[0] if len(parts) == 1 else np.concatenate(parts)
            reason = _differs_in_float64(plan, upcast, repeat)
    except Exception as error:  # any failure means: f does not run in float64
        reason = NumericalSide(False, "fails", error=f"{type(error).__name__}: {first_line(error)[:120]}")
    if reason is None:
        return True, upcast, NumericalSide(True), tuple(upcast_args)
    if config.precision == "float64":
        raise Float64Refused(reason)
    return False, native, reason, None


def _differs_in_float64(plan: Plan, upcast: np.ndarray, repeat: np.ndarray) -> NumericalSide | None:
    """Why f in float64 is not the native f (a dtype-dependent weight, layer or code path), or None.

    The float64 value must reproduce the native one within the native rounding: 64 machine epsilons of the output's
    scale (of the declared precision, where f is known to compute below its dtypes), or, beyond that, 8 times the
    native evaluations' measured noise.
    """
    native = plan.native_output
    eps = MACHINE_EPSILON[plan.analytical_dtype]
    if plan.declared is not None:
        eps = max(eps, PRECISION_EPSILON[plan.declared[0]])
    with np.errstate(invalid="ignore", over="ignore"):
        difference = np.abs(upcast - native)
        if np.all(difference <= 64 * eps * np.abs(native)):  # within the allowance below, without its RMS term
            return None
        finite = np.isfinite(native)
        scale = np.abs(native) + np.sqrt(np.mean(np.square(native[finite]))) if finite.any() else 0
        allowed = np.asarray(64 * eps * scale, np.float64)
        outside = difference > allowed
        outside &= finite & np.isfinite(upcast)
        # Not finite in float64 where the native f is (TensorFlow's float64 erf at +-inf is NaN): no noise explains it.
        lost = finite & ~np.isfinite(upcast)
    if not outside.any() and not lost.any():
        return None
    if outside.any():
        noise = measure_noise(lambda moved: plan.call_flat_numpy(moved), plan.native_values(),
                              [s.position for s in plan.checked], native, MACHINE_EPSILON[plan.analytical_dtype],
                              repeat)
        allowed = allowed + 8 * noise.sigma
        outside &= difference > allowed
    if not outside.any() and not lost.any():
        return None
    with np.errstate(invalid="ignore"):
        row = int(np.argmax(np.where(lost, np.inf, np.where(outside, difference / np.maximum(allowed, 1e-300), 0))))
    return NumericalSide(False, "differs", row=row, float64=float(upcast[row]), native=float(native[row]))
