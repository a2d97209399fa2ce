"""Execution paths: which one runs a check (the route, from a probe of f's graph), how each compiles, and when
it cannot run f (the fallback). The compiled kernels themselves are cached in ``kernels``.

Paths, from fastest per element to cheapest to start:

* ``xla``   -- ``tf.function(jit_compile=True)`` around ``tf.vectorized_map``.
* ``graph`` -- the same without XLA (XLA cannot compile some ops, e.g. the TensorList ops TFP's data-dependent
  ``while_loop``s produce under pfor).
* ``loop``  -- ``tf.function`` around ``tf.map_fn``: no pfor conversion, which for functions with ``while_loop``s
  costs seconds to tens of seconds.
* ``eager`` -- a Python loop of eager calls, for checks so small that tracing (0.1-0.2 s) would cost more than the
  whole loop.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import numpy as np
import tensorflow as tf

from fastcheck.engine import eager_colours
from fastcheck.engine.config import CheckConfig, tunable
from fastcheck.engine.kernels import cached, plan_key
from fastcheck.engine.pfor import LOOPED_WHEN_JOINT
from fastcheck.engine.plan import Plan
from fastcheck.engine.raised import Raised
from fastcheck.engine.tables import (
    BATCHED_FLOPS,
    CACHE_BYTES,
    JOINT_CALL_PERTURBATIONS,
    JOINT_ELEMENTS_PER_SECOND,
    JOINT_EXTRA_ELEMENTS,
    JOINT_MIN_CHUNK,
    MEMORY_BOUND_INTENSITY,
    MEMORY_SAFETY,
    MIN_CACHED_CHUNK,
    VJP_CALLS,
    XLA_MIN_WORK,
)

_log = logging.getLogger(__name__)

XLA, GRAPH, LOOP, EAGER = "xla", "graph", "loop", "eager"
# Each path falls back to the next when it cannot run f: XLA cannot compile some ops, pfor cannot convert some, and
# a function that calls .numpy() or Python-side effects cannot be traced at all but still runs eagerly.
FALLBACK = {XLA: GRAPH, GRAPH: LOOP, LOOP: EAGER}


def _runs_on_cpu(config: CheckConfig) -> bool:
    """Whether the check's kernels run on a CPU (``device``, or no GPU to place them on)."""
    if config.pinned is not None:
        return (tf.DeviceSpec.from_string(config.pinned).device_type or "CPU").upper() == "CPU"
    return not tf.config.list_logical_devices("GPU")


def _is_random(op_type: str) -> bool:
    """Random-number ops (stateless ones with a fixed seed are how a check holds dropout fixed)."""
    return "Random" in op_type or op_type.startswith("StatelessTruncated") or op_type.startswith("StatelessMultinomial")


# Ops whose XLA CPU kernels are far slower than TF's own (betainc: 40x).
XLA_SLOW_OPS = frozenset({"Betainc", "Igamma", "Igammac", "IgammaGradA"})
# ... and on CPU only: XLA's CPU convolutions are slower than TensorFlow's oneDNN ones.
XLA_SLOW_CPU_OPS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative"})


@dataclasses.dataclass(frozen=True)
class Route:
    """The chosen execution path and chunk sizes for one plan (the executor replaces it on a fallback)."""

    path: str
    chunks: dict  # input position -> perturbations per kernel call
    output_chunk: int  # output rows per reverse-mode kernel call
    elements_per_eval: int
    has_loops: bool = False
    flat_function: object = None  # the probe's traced tf.function of the flat function
    flops_per_eval: int = 0
    autograph: bool = False  # kernels are traced with AutoGraph (f needs it)
    predicted: tuple = (0.0, 0.0)  # (eager loop, traced) seconds predicted for the check; 0: not predicted
    # Perturbations per call of the one differences kernel shared by every checked input (``joint_chunk``); 0: one
    # kernel per input.  With it, per argument of f the share of the joint kernel's FLOPs its own kernel would
    # evaluate (from ``Probe.downstream``), and a kernel's predicted trace: what the executor weighs an input's own
    # kernel by (``Executor._rent``).
    joint_chunk: int = 0
    own_shares: tuple = ()
    trace_seconds: float = 0.0
    loops: tuple = ()  # (calls of f, VJPs) of the eager loops by f's pattern, where routing priced them so
    # (the path declined, why) where routing could not take the path f or the user asked for: f cannot be traced
    # ("tracing"), or draws random numbers under jit_compile=True ("xla"); the report notes it as a fallback
    declined: tuple = ()

    @property
    def following(self) -> str | None:
        """The path to fall back to when this one cannot run f (None on the eager path)."""
        return LOOP if self.path == XLA and self.has_loops else FALLBACK.get(self.path)


def predict(plan: Plan, loops: tuple = ()) -> tuple[float, float]:
    """(eager loop, traced) seconds predicted for a full check of ``plan`` from f's counted call cost
    (``Plan.call_seconds``); ``loops``: the eager loops' calls of f and VJPs where f's pattern colours them
    (``eager_colours.loops``), else 2n and min(n, m)."""
    calls, vjps = loops or (2 * plan.n, 1 if plan.m == 1 else min(plan.n, plan.m))
    eager = (calls + VJP_CALLS * vjps + 1) * plan.call_seconds
    return eager, tunable("TRACE_SECONDS") + tunable("TRACE_CALLS") * plan.call_seconds


def choose_route(plan: Plan, config: CheckConfig) -> Route:
    """The route for ``plan``: a pure function of the plan (sizes, dtypes, f's counted call cost and traced graph)
    and the configuration, never of earlier checks or clocks.  Why, logged."""
    route, why = _route(plan, config)
    _log.debug("route: %s (%s)", route.path, why)
    return route


def _route(plan: Plan, config: CheckConfig) -> tuple[Route, str]:
    n, m = plan.n, plan.m
    predicted_eager, predicted_traced = predict(plan) if config.jit_compile == "auto" else (0.0, 0.0)
    if config.jit_compile == "auto" and predicted_eager < predicted_traced:
        return (Route(EAGER, {s.position: s.size for s in plan.checked}, m, 0,
                      predicted=(predicted_eager, predicted_traced)),
                f"small check: eager loop predicted {predicted_eager * 1e3:.0f} ms, tracing "
                f"{predicted_traced * 1e3:.0f} ms")
    try:
        probe = cached(plan_key(plan, config) + ("probe",), lambda: probe_graph(plan))
    except (Exception, Raised) as error:  # f cannot be traced (.numpy(), Python side effects): it still runs eagerly
        if config.jit_compile is True or (isinstance(error, Raised) and not error.tracing):
            raise
        # f's own exception when traced (an f that refuses tracing) too: the eager calls show whether f raises
        # it there as well, and then it leaves the check as itself.
        cause: BaseException = error.error if isinstance(error, Raised) else error
        untraceable = f"{type(cause).__name__}: {_why(cause)}"
        return (Route(EAGER, {s.position: s.size for s in plan.checked}, m, 0, declined=("tracing", untraceable)),
                f"f cannot be traced ({untraceable})")
    has_loops, elements, flat_function, op_types = probe.has_loops, probe.elements, probe.function, probe.op_types
    if config.jit_compile == "auto" and m > 1:
        # The eager loops by f's pattern (``eager_colours``, read from the probe's graph) may beat tracing after all.
        found = eager_colours.structure(plan, config, plan.native_values(), max(n, m), probe.graph)
        loops = eager_colours.loops(plan, config, found) if found is not None else ()
        eager = predict(plan, loops)[0] if loops else predicted_traced
        if eager < predicted_traced:
            return (Route(EAGER, {s.position: s.size for s in plan.checked}, m, 0, predicted=(eager, predicted_traced),
                          loops=loops),
                    f"eager loops by colours of f's traced pattern predicted {eager * 1e3:.0f} ms, tracing "
                    f"{predicted_traced * 1e3:.0f} ms")
    itemsize = 8 if plan.eval_upcast else plan.eval_dtype.size
    # One perturbation = two evaluations, plus the kernel's own one-hot, x+ and x- rows.
    per_perturbation = (2 * elements + 5 * plan.n + 2 * m) * itemsize * MEMORY_SAFETY
    chunk_rows = max(1, config.budget // per_perturbation)
    chunk_reason = "to fit memory_budget"
    # The working set of a call: f's shared data, and per perturbation its x+ and x- rows with their intermediates
    # (see MIN_CACHED_CHUNK).
    cache = int(config.table("MACHINE_CACHE")) or cache_bytes()
    cache_rows = (cache - probe.shared_bytes) // (2 * (plan.n + probe.written) * itemsize)
    memory_bound = probe.flops < MEMORY_BOUND_INTENSITY * elements
    if memory_bound or cache_rows >= MIN_CACHED_CHUNK:
        cache_rows = max(MIN_CACHED_CHUNK, cache_rows)
        if cache_rows < chunk_rows and 2 * cache_rows < max(s.size for s in plan.checked):
            chunk_rows = cache_rows
            chunk_reason = f"to keep each call's working set within the CPU's {cache >> 20} MiB cache" + (
                f" (f is memory-bound: {probe.flops / elements:.0f} FLOPs per intermediate element)"
                if memory_bound else "")
    if chunk_rows < max(s.size for s in plan.checked):
        _log.debug("differences: %d perturbations per call, %s", chunk_rows, chunk_reason)
    per_eval = (elements + plan.n + m) * itemsize * MEMORY_SAFETY
    chunks = {s.position: int(min(s.size, chunk_rows)) for s in plan.checked}
    output_chunk = int(max(1, min(m, config.budget // (2 * per_eval + 8 * plan.n))))
    work = 2 * n * elements
    random = sorted(op for op in op_types if _is_random(op))
    declined: tuple = ()
    if random and config.jit_compile is not False and not has_loops:
        # XLA draws different numbers than TensorFlow's kernels from the same seed: the compiled evaluations would
        # see another dropout mask than the eager ones.
        path, why = GRAPH, (f"f draws random numbers (op {random[0]}) and XLA draws different ones than TensorFlow's "
                            "kernels from the same seed")
        declined = ("xla", why + ": jit_compile=True overridden") if config.jit_compile is True else ()
    elif config.jit_compile is True:
        path, why = XLA, "jit_compile=True"
    elif has_loops:
        path, why = LOOP, "f contains while_loops: pfor conversion would cost more than it saves"
    elif config.jit_compile is False:
        path, why = GRAPH, "jit_compile=False"
    elif op_types & XLA_SLOW_OPS:
        path, why = GRAPH, f"{sorted(op_types & XLA_SLOW_OPS)[0]} is slow under XLA"
    elif op_types & XLA_SLOW_CPU_OPS and _runs_on_cpu(config):
        path, why = GRAPH, f"{sorted(op_types & XLA_SLOW_CPU_OPS)[0]} is slower under XLA than TensorFlow's own on CPU"
    else:
        path, why = (XLA if work >= XLA_MIN_WORK else GRAPH), f"batched work of {work:.2g} element-evaluations " + (
            "pays for XLA compilation" if work >= XLA_MIN_WORK else "is too small for XLA compilation")
    traced_seconds = predicted_traced or predict(plan)[1]
    # Ops pfor loops over with their filter and input batched, as in a joint kernel (``pfor``); the executor also
    # hands back to per-input kernels wherever a joint kernel's trace has a loop.
    joint = joint_chunk(plan, path, chunk_rows, traced_seconds, probe) if not (has_loops or op_types & LOOPED_WHEN_JOINT) else 0
    own_shares = tuple(d / max(1, probe.checked_flops) for d in probe.downstream) if joint else ()
    return Route(path, chunks, output_chunk, elements, has_loops, flat_function, probe.flops, probe.autograph,
                 (predicted_eager, predicted_traced), joint, own_shares, traced_seconds, declined=declined), why


def _why(error: BaseException) -> str:
    """An exception's message in a line: AutoGraph's "in user code:" frames give their last line (the error)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [""]
    line = lines[-1] if lines[0] == "in user code:" else lines[0]
    prefix = f"{type(error).__name__}: "
    return (line[len(prefix):] if line.startswith(prefix) else line)[:120]


def joint_chunk(plan: Plan, path: str, chunk_rows: int, traced_seconds: float, probe: Probe | None = None) -> int:
    """Perturbations per call of one differences kernel for every checked input, or 0 for a kernel per input (one
    input, the loop or eager path, inputs evaluated in different dtypes, or where the joint kernel's extra work costs
    more than the traces it saves: carrying every input in every evaluation, and evaluating for each input's
    perturbations the ops that depend on the other inputs only -- a per-input kernel batches only the ops that
    follow its input (``Probe.downstream``), and computes a convolution stem once for a dense head's elements)."""
    sizes = [s.size for s in plan.checked]
    if path not in (XLA, GRAPH) or len(sizes) < 2:
        return 0
    if len({tf.float64 if plan.eval_upcast else s.dtype.real_dtype for s in plan.checked}) > 1:
        return 0  # one concatenated span of idx: one dtype
    n = plan.n
    extra = 2 * n * JOINT_EXTRA_ELEMENTS * n / JOINT_ELEMENTS_PER_SECOND
    if probe is not None and probe.downstream:
        extra += sum(2 * s.size * (probe.checked_flops - probe.downstream[s.position]) for s in plan.checked) / BATCHED_FLOPS
    if extra >= (len(sizes) - 1) * traced_seconds:
        return 0
    largest = max(1, min(chunk_rows, max(sizes)))
    candidates = {largest} | {c for c in (1 << k for k in range(31)) if JOINT_MIN_CHUNK <= c < largest}

    def cost(c: int) -> int:
        return sum(-(-size // c) for size in sizes) * (c + JOINT_CALL_PERTURBATIONS)

    return int(min(sorted(candidates), key=cost))


_LOOP_OPS = frozenset({"While", "StatelessWhile", "_While"})
# Ops whose output is their input's buffer under another shape: nothing new in the cache.
_VIEW_OPS = frozenset({"Reshape", "ExpandDims", "Squeeze", "Identity", "IdentityN", "StopGradient", "EnsureShape",
                       "PreventGradient", "Snapshot"})


def _size(shape) -> int:
    dims = shape.as_list() if shape.rank is not None else []
    return int(np.prod([d if d is not None else 1 for d in dims], dtype=np.int64))


def _dim(shape, axis: int) -> int:
    if shape.rank is None or shape.rank < abs(axis) + (axis >= 0):
        return 1
    d = shape.as_list()[axis]
    return d if d is not None else 1


def op_flops(op) -> int:
    """Rough FLOPs of one op: 2*M*N*K for products and convolutions, one per output element otherwise."""
    out = sum(_size(o.shape) for o in op.outputs)
    if op.type == "MatMul":
        return 2 * out * _dim(op.inputs[0].shape, 0 if op.get_attr("transpose_a") else 1)
    if op.type.startswith("BatchMatMul"):
        return 2 * out * _dim(op.inputs[0].shape, -2 if op.get_attr("adj_x") else -1)
    if op.type in ("Conv2D", "Conv3D"):
        return 2 * out * _size(op.inputs[1].shape[:-1])
    if op.type == "DepthwiseConv2dNative":
        return 2 * out * _size(op.inputs[1].shape[:-2])
    if op.type == "Einsum":
        inputs, _, output = op.get_attr("equation").decode().partition("->")
        sizes = {}
        for letters, tensor in zip(inputs.split(","), op.inputs):
            if tensor.shape.rank == len(letters):
                sizes.update({c: d or 1 for c, d in zip(letters, tensor.shape.as_list())})
        return 2 * out * int(np.prod([sizes.get(c, 1) for c in set(inputs) - set(output) - {",", "."}], dtype=np.int64))
    return out


@dataclasses.dataclass(frozen=True)
class Probe:
    """What one trace of the flat function tells about f."""

    has_loops: bool
    elements: int  # elements of the traced tensors that depend on the arguments, per evaluation
    flops: int  # rough FLOPs of those ops, per evaluation
    function: object  # the tf.function of the flat function, reused by the loop path
    op_types: frozenset
    autograph: bool  # f traces only with AutoGraph (Python control flow on tensors)
    shared_bytes: int = 0  # bytes of the constants and variables f captures: shared by a call's evaluations
    written: int = 1  # of ``elements``, those ops write anew (not reshapes and other views of their input)
    downstream: tuple = ()  # per argument of f (a plan's value), the FLOPs of the ops that depend on it
    checked_flops: int = 0  # the FLOPs of the ops that depend on some checked input
    graph: object = None  # the traced graph (``eager_colours`` reads f's pattern from it)


def probe_graph(plan: Plan) -> Probe:
    """Trace the flat function once and measure it: see ``Probe``.

    The returned ``tf.function`` is reused by the loop path, so a function whose tracing is expensive (TFP's
    while-loop functions: ~1 s) is traced only here.
    """
    values = plan.eval_values()
    signature = [tf.TensorSpec(v.shape, v.dtype) for v in values]
    # Without AutoGraph first: converting fastcheck's kernels and f costs most of a cold process's first trace.
    # Only an f with Python control flow on tensors needs it, and says so by failing to trace without it.
    autograph = False
    try:
        function = tf.function(lambda *vs: plan.call_flat(list(vs), plan.eval_upcast), autograph=False)
        concrete = function.get_concrete_function(*signature)
    except Exception:
        autograph = True
        function = tf.function(lambda *vs: plan.call_flat(list(vs), plan.eval_upcast))
        concrete = function.get_concrete_function(*signature)
    graph = concrete.graph
    # Per-evaluation memory: only tensors that depend on the arguments are batched by vectorized_map; captured
    # weights and constants are shared.
    captured = {id(t) for t in concrete.captured_inputs} | {id(t) for _, t in graph.captures}
    # Which arguments each tensor depends on (bit i: argument i), op by op in creation order (inputs first).
    masks = {id(t): 1 << i for i, t in enumerate(graph.inputs[: len(values)]) if id(t) not in captured}
    elements, flops, written = 0, 0, 0
    by_mask: dict[int, int] = {}  # FLOPs by the set of arguments the ops depend on
    for op in graph.get_operations():
        mask = 0
        for tensor in op.inputs:
            mask |= masks.get(id(tensor), 0)
        if not mask:
            continue
        try:
            cost = op_flops(op)
        except (ValueError, TypeError):  # an attribute this TF version names differently
            cost = sum(_size(o.shape) for o in op.outputs)
        flops += cost
        if op.type not in _VIEW_OPS:  # a view evaluates nothing: an input's own kernel saves no work on it
            by_mask[mask] = by_mask.get(mask, 0) + cost
        for output in op.outputs:
            masks[id(output)] = mask
            if output.shape.rank is not None:
                size = _size(output.shape)
                elements += size
                written += 0 if op.type in _VIEW_OPS else size
    downstream = tuple(sum(cost for mask, cost in by_mask.items() if mask >> i & 1) for i in range(len(values)))
    checked = sum(1 << s.position for s in plan.checked)
    checked_flops = sum(cost for mask, cost in by_mask.items() if mask & checked)
    op_types = graph_op_types(graph)
    return Probe(bool(op_types & _LOOP_OPS), max(elements, 1), max(flops, 1), function, frozenset(op_types), autograph,
                 _shared_bytes(graph), max(written, 1), downstream, checked_flops, graph)


def graph_op_types(graph) -> set:
    """The op types of a traced graph and of the functions it calls (nested tf.functions may hide loops)."""
    types = {op.type for op in graph.get_operations()}
    for function_def in graph.as_graph_def().library.function:
        types |= {node.op for node in function_def.node_def}
    return types


def _shared_bytes(graph) -> int:
    """Bytes of the tensors and variables a traced graph captures (a variable: what its reads return)."""
    total = 0
    for _, internal in graph.captures:
        if internal.dtype == tf.resource:
            read = next((c.outputs[0] for c in internal.consumers() if c.type == "ReadVariableOp"), None)
            total += 0 if read is None else _size(read.shape) * read.dtype.size
        elif internal.dtype.is_numeric or internal.dtype.is_bool:
            total += _size(internal.shape) * internal.dtype.size
    return total


def compile_kernel(fn, path: str, autograph: bool = False, input_signature=None):
    """A tf.function of a kernel on ``path``; AutoGraph only for an f that needs it (see ``probe_graph``).  An
    ``input_signature`` with unknown dimensions lets one trace serve every size."""
    return tf.function(fn, input_signature=input_signature, jit_compile=True if path == XLA else None,
                       autograph=autograph)


def is_compile_failure(error: Exception) -> bool:
    """Errors that mean "this path cannot run f", as opposed to "f is broken"."""
    return isinstance(error, (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError,
                              tf.errors.InternalError, NotImplementedError, ValueError, TypeError))


@functools.lru_cache(maxsize=1)
def cache_bytes() -> int:
    """The largest data cache of this machine's CPUs at level 3 or above (Linux sysfs), else CACHE_BYTES."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    found = 0
    try:
        for entry in os.listdir(base):
            if not entry.startswith("index"):
                continue
            with open(os.path.join(base, entry, "level")) as level, open(os.path.join(base, entry, "type")) as kind, \
                    open(os.path.join(base, entry, "size")) as size:
                if int(level.read()) >= 3 and kind.read().strip() != "Instruction":
                    found = max(found, _bytes(size.read().strip()))
    except (OSError, ValueError):
        return CACHE_BYTES
    return found or CACHE_BYTES


def _bytes(text: str) -> int:
    """'32768K' -> 33554432 (sysfs cache sizes: a number with an optional K/M/G suffix)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale
