"""Benchmark problems: one function and one set of inputs, shared by every contender.

A *family* (``dense``, ``conv``, ``mlp``, ``betainc``, ``owens_t``, ``corpus``)
comes in several sizes; each size is an ``Instance``.  Every instance carries

* ``f`` and ``inputs``: what ``fastcheck.check_gradients(f, inputs)``,
  ``tf.test.compute_gradient(f, inputs)`` and the element loop all receive;
* ``hand_batched``: a factory for the "hand-batched limit" -- the same central
  differences (step ``eps**(1/3) * max(1, |x_j|)``, as fastcheck uses) written by
  hand for *this* function as one batched computation (``x + h_j e_j`` for a chunk
  of ``j`` stacked into a matrix, the function evaluated on the whole batch at
  once), plus ``tape.jacobian`` (or ``tape.gradient`` for a scalar), both inside
  ``tf.function``.  Each call of the factory builds fresh ``tf.function`` objects,
  so its first run is cold (tracing and compilation included).

All problems are seeded, so every run sees the same numbers.  They are float64,
except the two fast-mode problems (``fast_scale``, ``fast_defect``): float32
inputs of 1e6 to 1e7 elements, where fastcheck's ``mode="auto"`` picks random
projections.  Their contenders are fastcheck and the ``reference`` (the
irreducible work of a k-probe projection check, done eagerly by hand: 2k
forward calls, one VJP, one JVP); compute_gradient, the element loop and a
hand-batched full Jacobian are out of reach there and recorded as skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from benchmarks.names import FAMILIES  # noqa: F401 -- re-exported

DTYPE = tf.float64
EPS = float(np.finfo(np.float64).eps) ** (1.0 / 3.0)  # fastcheck's default relative step for float64
# Bytes one hand-batched chunk may use (fastcheck's default memory_budget is 1 GiB too).
HAND_BUDGET = 1 << 30


# Sizes per family and preset.  dense: n inputs; conv: image side s (1 x s x s x 4);
# mlp: target parameter count (the actual count is reported); betainc / owens_t:
# elements; corpus: None = every case (smoke: the first few).
SIZES = {
    "full": {
        "dense": [256, 1024, 4096, 16384],
        "conv": [8, 16, 32],
        "mlp": [1_000, 20_000, 100_000],
        "betainc": [300],
        "owens_t": [200],
        "corpus": [None],
        "fast_scale": [10_000_000],
        "fast_defect": [1_000_000],
    },
    "quick": {
        "dense": [256, 1024, 4096],
        "conv": [8, 16],
        "mlp": [1_000, 5_000],
        "betainc": [300],
        "owens_t": [200],
        "corpus": [None],
        "fast_scale": [1_000_000],
        "fast_defect": [1_000_000],
    },
    "smoke": {
        "dense": [64],
        "conv": [4],
        "mlp": [200],
        "betainc": [20],
        "owens_t": [20],
        "corpus": [5],
        "fast_scale": [10_000],
        "fast_defect": [2_000],
    },
}
# mode="auto" runs fastcheck's fast mode only above 200,000 input elements; the
# smoke sizes of the fast-mode problems ask for it explicitly.
FAST_AUTO_ABOVE = 200_000


@dataclasses.dataclass
class CorpusCase:
    """One case of ``benchmarks.corpus.CASES`` at float64."""

    name: str
    f: Callable
    inputs: list
    correct: bool


@dataclasses.dataclass
class Instance:
    """One problem at one size.

    ``size`` is the x axis of the plots: the number of checked input elements
    (for the corpus: the number of cases).  ``n`` and ``m`` are the Jacobian's
    columns and rows (corpus: summed over cases).
    """

    family: str
    size: int
    label: str
    description: str
    f: Callable | None
    inputs: list
    n: int
    m: int
    hand_batched: Callable | None = None  # () -> run; run() -> (numerical [m, n], analytical [m, n])
    sweep_flops: float | None = None  # FLOPs of the 2n perturbed evaluations (dense only)
    cases: list | None = None  # corpus only
    correct: bool = True  # the gradient TF computes for f is right
    notes: list = dataclasses.field(default_factory=list)
    # Extra keyword arguments of fastcheck.check_gradients for this problem (e.g. mode="full").
    check_options: dict = dataclasses.field(default_factory=dict)
    # Contenders not run on this problem: name -> why (recorded as "skipped").
    skip: dict = dataclasses.field(default_factory=dict)
    # Fast-mode problems: (u, d), the cotangent and tangent of the "reference" contender.
    reference: tuple | None = None
    # fast_defect: (first, last) flat indices of the planted defect (inclusive), and its rows.
    defect: dict | None = None


def _constant(array) -> tf.Tensor:
    return tf.constant(np.asarray(array, dtype=np.float64), dtype=DTYPE)


def _chunk(n: int, elements_per_row: int) -> int:
    """Perturbations per hand-batched call: +/- rows, ~3 live copies of each, 8 bytes each."""
    return int(max(1, min(n, HAND_BUDGET // (2 * 3 * 8 * max(1, elements_per_row)))))


def hand_batched_factory(batched_f: Callable, f: Callable, x: tf.Tensor, m: int, chunk: int, jit: bool = True):
    """The hand-batched limit for ``f`` at ``x``.

    ``batched_f`` maps a batch ``X`` of shape ``[k, n]`` (one flattened input per
    row) to ``[k, m]`` in one computation, written for the specific problem.
    Returns a factory; each call makes fresh ``tf.function``s and returns ``run()``.
    """
    n = int(np.prod(x.shape))
    x_flat = tf.reshape(x, [1, n])
    steps = tf.constant(EPS * np.maximum(1.0, np.abs(x.numpy().reshape(-1))), dtype=x.dtype)

    def make():
        @tf.function(jit_compile=jit)
        def differences(start):
            idx = start + tf.range(chunk)
            # Rows past n (last chunk) are all-zero perturbations: sliced off below.
            e = tf.one_hot(idx, n, dtype=x.dtype) * tf.gather(steps, tf.minimum(idx, n - 1))[:, None]
            return batched_f(x_flat + e) - batched_f(x_flat - e)

        @tf.function(jit_compile=jit)
        def analytical():
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.reshape(f(x), [-1])
            if m == 1:
                return tf.reshape(tape.gradient(y, x), [1, n])
            return tf.reshape(tape.jacobian(y, x), [m, n])

        def run():
            parts = [differences(tf.constant(start, tf.int32)).numpy() for start in range(0, n, chunk)]
            diff = np.concatenate(parts)[:n]  # [n, m]
            numerical = (diff / (2.0 * steps.numpy())[:, None]).T
            return numerical, analytical().numpy()

        return run

    return make


# ----------------------------------------------------------------------------- families


def dense(n: int) -> Instance:
    """tanh(W x) with W of shape [64, n]; Jacobian 64 x n."""
    rng = np.random.default_rng(n)
    m = 64
    w = _constant(rng.normal(size=(m, n)) / np.sqrt(n))
    x = _constant(rng.normal(size=n))

    def f(x):
        return tf.tanh(tf.linalg.matvec(w, x))

    def batched(xs):  # [k, n] -> [k, 64]: one matmul for the whole chunk
        return tf.tanh(tf.matmul(xs, w, transpose_b=True))

    return Instance(
        "dense", n, f"dense n={n}", f"tanh(W x), W: 64 x {n}, float64; Jacobian 64 x {n}",
        f, [x], n, m,
        hand_batched=hand_batched_factory(batched, f, x, m, _chunk(n, n + m)),
        sweep_flops=2.0 * n * (2.0 * m * n),
    )


def conv(side: int, channels: int = 4) -> Instance:
    """tanh(conv3x3(x)) on a 1 x s x s x 4 image, 4 -> 4 channels, SAME padding."""
    rng = np.random.default_rng(side)
    kernel = _constant(rng.normal(size=(3, 3, channels, channels)) / np.sqrt(9 * channels))
    x = _constant(rng.normal(size=(1, side, side, channels)))
    n = m = side * side * channels

    def f(x):
        return tf.tanh(tf.nn.conv2d(x, kernel, strides=1, padding="SAME"))

    def batched(xs):  # [k, n] -> [k, m]: the batch dimension of conv2d holds the perturbations
        images = tf.reshape(xs, [-1, side, side, channels])
        return tf.reshape(tf.tanh(tf.nn.conv2d(images, kernel, strides=1, padding="SAME")), [-1, m])

    return Instance(
        "conv", n, f"conv {side}x{side}x{channels}",
        f"tanh(conv3x3(x)), x: 1x{side}x{side}x{channels}, 4->4 channels, float64; Jacobian {m} x {n}",
        f, [x], n, m, hand_batched=hand_batched_factory(batched, f, x, m, _chunk(n, n + m)),
    )


MLP_IN, MLP_OUT, MLP_BATCH = 32, 8, 32


def _mlp_hidden(params: int, features: int = MLP_IN, outputs: int = MLP_OUT) -> int:
    # params = features*h + h + h*outputs + outputs
    return max(1, round((params - outputs) / (features + 1 + outputs)))


def mlp(target_params: int, features: int = MLP_IN, outputs: int = MLP_OUT) -> Instance:
    """Scalar MSE loss of a 2-layer tanh MLP (features -> h -> outputs, batch 32) w.r.t. its flattened parameters.

    The default layout is 32 -> h -> 8; ``mlp(9610, features=64, outputs=10)`` is 64 -> 128 -> 10, 9,610
    parameters exactly.
    """
    hidden = _mlp_hidden(target_params, features, outputs)
    shapes = [(features, hidden), (hidden,), (hidden, outputs), (outputs,)]
    sizes = [int(np.prod(s)) for s in shapes]
    p = sum(sizes)
    rng = np.random.default_rng(target_params)
    inputs = _constant(rng.normal(size=(MLP_BATCH, features)))
    targets = _constant(rng.normal(size=(MLP_BATCH, outputs)))
    theta = _constant(np.concatenate([
        rng.normal(size=sizes[0]) / np.sqrt(features), np.zeros(sizes[1]) + 0.1,
        rng.normal(size=sizes[2]) / np.sqrt(hidden), np.zeros(sizes[3]),
    ]))

    def f(theta):
        w1, b1, w2, b2 = (tf.reshape(t, s) for t, s in zip(tf.split(theta, sizes), shapes))
        out = tf.matmul(tf.tanh(tf.matmul(inputs, w1) + b1), w2) + b2
        return tf.reduce_mean(tf.square(out - targets))

    def batched(thetas):  # [k, p] -> [k, 1]: every parameter vector of the chunk in one einsum chain
        k = tf.shape(thetas)[0]
        w1, b1, w2, b2 = (tf.reshape(t, [k, *s]) for t, s in zip(tf.split(thetas, sizes, axis=1), shapes))
        h = tf.tanh(tf.einsum("bi,kih->kbh", inputs, w1) + b1[:, None, :])
        out = tf.einsum("kbh,kho->kbo", h, w2) + b2[:, None, :]
        return tf.reduce_mean(tf.square(out - targets[None]), axis=[1, 2])[:, None]

    per_row = p + 2 * MLP_BATCH * hidden + 2 * MLP_BATCH * outputs
    # The largest MLP is the "full check at 1e5 parameters" figure: ask for full
    # mode explicitly, so that it is measured even if auto's thresholds move.
    full = target_params >= 100_000
    return Instance(
        "mlp", p, f"mlp p={p}",
        f"MSE of a 2-layer tanh MLP {features}->{hidden}->{outputs} on a batch of 32, w.r.t. {p} flattened parameters; Jacobian 1 x {p}",
        f, [theta], p, 1, hand_batched=hand_batched_factory(batched, f, theta, 1, _chunk(p, per_row)),
        check_options={"mode": "full"} if full else {},
        notes=["fastcheck runs with mode='full' (the full-check-at-1e5-parameters figure)"] if full else [],
    )


def betainc(n: int) -> Instance:
    """tfp.math.betainc(a, b, x) w.r.t. a (custom gradient, series with while_loops)."""
    import tensorflow_probability as tfp

    rng = np.random.default_rng(n)
    a = _constant(rng.uniform(0.5, 3.0, size=n))
    b = _constant(rng.uniform(0.5, 3.0, size=n))
    x = _constant(rng.uniform(0.1, 0.9, size=n))

    def f(a):
        return tfp.math.betainc(a, b, x)

    def batched(rows):  # [k, n] -> [k, n]: elementwise, broadcast over the batch
        return tfp.math.betainc(rows, b[None], x[None])

    return Instance(
        "betainc", n, f"betainc n={n}",
        f"tfp.math.betainc(a, b, x) w.r.t. a ({n} elements, custom gradient); Jacobian {n} x {n} (diagonal)",
        f, [a], n, n,
        # Graph mode: XLA's betainc kernel is ~50x slower than TF's on CPU, so
        # jit_compile=True would not be the limit.
        hand_batched=hand_batched_factory(batched, f, a, n, _chunk(n, 4 * n), jit=False),
        notes=["hand-batched runs as a graph tf.function (XLA's betainc is far slower on CPU)"],
    )


def owens_t(n: int) -> Instance:
    """tfp.math.owens_t(h, a) w.r.t. h (custom gradient)."""
    import tensorflow_probability as tfp

    rng = np.random.default_rng(n + 1)
    h = _constant(rng.normal(size=n))
    a = _constant(rng.uniform(0.1, 2.0, size=n))

    def f(h):
        return tfp.math.owens_t(h, a)

    def batched(rows):
        return tfp.math.owens_t(rows, tf.broadcast_to(a[None], tf.shape(rows)))

    return Instance(
        "owens_t", n, f"owens_t n={n}",
        f"tfp.math.owens_t(h, a) w.r.t. h ({n} elements, custom gradient); Jacobian {n} x {n} (diagonal)",
        f, [h], n, n,
        hand_batched=hand_batched_factory(batched, f, h, n, _chunk(n, 4 * n), jit=False),
        notes=["hand-batched runs as a graph tf.function (owens_t has while_loops)"],
    )


# ----------------------------------------------------------------------------- fast mode at scale

OUT_OF_REACH = ("out of reach at this size: one eager call (compute_gradient) or one backward pass per output "
                "element and two eager calls per input element")


def _fast_common(elements: int, seed: int, shape: tuple):
    """float32 input of ``shape``, the reference's (u, d), and options/notes for small (smoke) sizes."""
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=shape).astype(np.float32))
    u = tf.constant(rng.normal(size=shape).astype(np.float32))
    d = tf.constant(rng.normal(size=shape).astype(np.float32))
    # Fast mode is what these problems measure: auto would pick full below FAST_AUTO_ABOVE
    # elements and coloured mode above it for the elementwise defect (``benchmarks.coloured``).
    options, notes = {"mode": "fast"}, []
    if elements <= FAST_AUTO_ABOVE:
        notes.append(f"{elements} elements: below auto's fast-mode threshold, so mode='fast' is passed explicitly")
    skip = {"compute_gradient": OUT_OF_REACH, "loop": OUT_OF_REACH}
    return x, (u, d), options, notes, skip


def fast_scale(elements: int) -> Instance:
    """A layer-norm-like function (elementwise ops plus row reductions) of one float32 input."""
    cols = 1000 if elements >= 1_000_000 else 100
    rows = elements // cols
    x, probes, options, notes, skip = _fast_common(elements, 7, (rows, cols))
    rng = np.random.default_rng(8)
    gamma, beta = rng.uniform(0.5, 1.5, size=cols), 0.1 * rng.normal(size=cols)

    def f(x):  # constants follow x's dtype, so a float64 re-evaluation works
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        centered = x - mean
        variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
        normalised = centered * tf.math.rsqrt(variance + tf.constant(1e-5, x.dtype))
        return normalised * tf.constant(gamma, x.dtype) + tf.constant(beta, x.dtype)

    n = rows * cols
    notes.append("reference: 2k forward calls + one VJP (tape.gradient with output_gradients) + one JVP "
                 "(ForwardAccumulator), eager, k = 4 probes (fastcheck's default)")
    return Instance(
        "fast_scale", n, f"layer-norm {rows}x{cols}",
        f"layer-norm-like (row mean/variance, rsqrt, scale and shift) of a float32 {rows} x {cols} input "
        f"({n:.3g} elements); Jacobian {n:.3g} x {n:.3g}: fastcheck's fast mode",
        f, [x], n, n, check_options=options, skip=skip, reference=probes, notes=notes,
    )


def fast_defect(elements: int) -> Instance:
    """sin with a custom gradient off by a factor 1.5 on 1% of the rows (rows 42%..43%)."""
    cols = 100 if elements >= 100_000 else 10
    rows = elements // cols
    first, last = int(round(0.42 * rows)), int(round(0.43 * rows)) - 1  # 10000 rows: 4200..4299
    x, probes, options, notes, skip = _fast_common(elements, 9, (rows, cols))
    factor = np.ones((rows, 1))
    factor[first : last + 1] = 1.5

    @tf.custom_gradient
    def wrong_sin(x):
        def grad(g):
            return g * tf.cos(x) * tf.constant(factor, x.dtype)

        return tf.sin(x), grad

    def f(x):
        return wrong_sin(x)

    n = rows * cols
    return Instance(
        "fast_defect", n, f"1% defect {rows}x{cols}",
        f"sin of a float32 {rows} x {cols} input with a custom gradient 1.5x too large on rows {first}..{last} "
        f"(1% of the rows): a wrong gradient fast mode must catch and localise",
        f, [x], n, n, correct=False, check_options=options, skip=skip, reference=probes, notes=notes,
        defect={"rows": [first, last], "flat": [first * cols, (last + 1) * cols - 1], "shape": [rows, cols]},
    )


def load_corpus():
    """``benchmarks.corpus.CASES``, or (None, reason) when it is missing or does not import."""
    try:
        from benchmarks import corpus
    except ModuleNotFoundError as error:
        if error.name in ("benchmarks.corpus",):
            return None, "benchmarks/corpus.py not found"
        return None, f"benchmarks/corpus.py does not import: {type(error).__name__}: {error}"
    except Exception as error:  # noqa: BLE001 -- a half-written corpus must not stop the suite
        return None, f"benchmarks/corpus.py does not import: {type(error).__name__}: {error}"
    cases = getattr(corpus, "CASES", None)
    if not cases:
        return None, "benchmarks/corpus.py defines no CASES"
    return cases, None


def _dtype_names(dtypes) -> set:
    return {tf.as_dtype(d).name if not isinstance(d, str) else d for d in dtypes}


def corpus_instance(limit: int | None) -> tuple[Instance | None, str | None]:
    """Every float64 case of the corpus as one "many small checks" workload."""
    cases, reason = load_corpus()
    if cases is None:
        return None, reason
    chosen, skipped = [], []
    for case in cases:
        if "float64" not in _dtype_names(getattr(case, "dtypes", ("float64",))):
            skipped.append(case.name)
            continue
        chosen.append(CorpusCase(case.name, case.f, list(case.make_inputs(DTYPE)), bool(case.correct)))
    if limit is not None:
        chosen = chosen[:limit]
    n = m = 0
    for case in chosen:
        n += sum(int(np.prod(t.shape)) for t in case.inputs if tf.as_dtype(t.dtype).is_floating)
        m += int(np.prod(tf.convert_to_tensor(case.f(*case.inputs)).shape))
    notes = [f"{len(skipped)} case(s) not run: float64 not among their dtypes ({', '.join(skipped)})"] if skipped else []
    wrong = sum(not c.correct for c in chosen)
    return Instance(
        "corpus", len(chosen), f"corpus {len(chosen)} cases",
        f"every float64 case of benchmarks.corpus.CASES ({len(chosen) - wrong} correct, {wrong} deliberately wrong), "
        "checked one after another",
        None, [], n, m, cases=chosen, notes=notes,
    ), None


BUILDERS = {"dense": dense, "conv": conv, "mlp": mlp, "betainc": betainc, "owens_t": owens_t,
            "fast_scale": fast_scale, "fast_defect": fast_defect}


def instances(preset: str, families):
    """Yield (family, Instance | None, skip reason | None) in the order of ``families``."""
    for family in families:
        for size in SIZES[preset][family]:
            if family == "corpus":
                instance, reason = corpus_instance(size)
                yield family, instance, reason
            else:
                yield family, BUILDERS[family](size), None
