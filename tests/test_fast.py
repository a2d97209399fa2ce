"""Big tensors: random projections, auto mode, localisation, OOM retry, second order, progress."""

import inspect

import numpy as np
import pytest
import tensorflow as tf
from conftest import events_of, logged

import fastcheck
import fastcheck.testing

RNG = np.random.default_rng(3)


def _layer_norm(x):
    mu = tf.reduce_mean(x, -1, keepdims=True)
    var = tf.reduce_mean((x - mu) ** 2, -1, keepdims=True)
    return (x - mu) * tf.math.rsqrt(var + 1e-5)


def _wrong_rows(rows, factor=2.0):
    """sin with a custom gradient that is off by ``factor`` on the given leading-axis rows."""

    @tf.custom_gradient
    def f(x):
        def grad(g):
            mask = tf.reduce_any(tf.equal(tf.range(tf.shape(x)[0])[:, None], tf.constant(rows)[None, :]), axis=1)
            scale = tf.where(mask[:, None], tf.cast(factor, x.dtype), tf.cast(1.0, x.dtype))
            return g * tf.cos(x) * scale

        return tf.sin(x), grad

    return f


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_fast_mode_passes_correct_gradients(dtype_name):
    x = tf.constant(RNG.normal(size=(200, 50)), dtype_name)
    report = fastcheck.check_gradients(_layer_norm, x, mode="fast")
    assert report.ok and report.mode == "fast", str(report)
    assert report.pairs[0].to_dict()["probes"] == 4


def test_fast_mode_catches_and_localises_a_reverse_only_defect():
    # The tape uses the custom gradient; forward mode differentiates sin itself and
    # would not see the defect.  Fast mode's element-wise J d comes from the reverse-mode
    # gradient, so both of its comparisons see it.
    x = tf.constant(RNG.normal(size=(1000, 100)))
    report = fastcheck.check_gradients(_wrong_rows([537]), x, mode="fast")
    assert not report.ok
    pair = report.pairs[0]
    assert np.any(pair.comparison.forward_ratio > 1) and np.any(pair.comparison.reverse_ratio > 1)
    assert pair.region[0][0] == 537 and pair.region[1][0] == 537, pair.region
    assert pair.worst_element.input_index[0] == 537 and pair.worst_element.status == "mismatch"
    assert "throughout" not in pair.hint  # one row wrong: a local defect
    assert pair.worst_element.analytical == pytest.approx(2 * pair.worst_element.numerical, rel=1e-6)
    assert "element-wise J d" in str(report) and "localised to input[(537" in str(report)


def test_fast_mode_catches_a_defect_in_one_percent_of_a_million_elements():
    x = tf.constant(RNG.normal(size=(10_000, 100)), tf.float32)
    rows = list(range(4200, 4300))  # 1% of the elements
    report = fastcheck.check_gradients(_wrong_rows(rows, 1.5), x, mode="fast")
    assert report.mode == "fast" and not report.ok
    first, last = report.pairs[0].region
    assert 4200 <= first[0] and last[0] < 4300, report.pairs[0].region


def test_fast_mode_is_reproducible_and_leaves_global_rng_alone():
    x = tf.constant(RNG.normal(size=(300, 20)))
    tf.random.set_seed(11)
    np.random.seed(11)
    expected_tf, expected_np = tf.random.uniform([3]).numpy(), np.random.uniform(size=3)
    tf.random.set_seed(11)
    np.random.seed(11)
    first = fastcheck.check_gradients(_layer_norm, x, mode="fast", seed=5)
    np.testing.assert_array_equal(tf.random.uniform([3]).numpy(), expected_tf)
    np.testing.assert_array_equal(np.random.uniform(size=3), expected_np)
    second = fastcheck.check_gradients(_layer_norm, x, mode="fast", seed=5)
    other = fastcheck.check_gradients(_layer_norm, x, mode="fast", seed=6)
    np.testing.assert_array_equal(first.pairs[0].comparison.reverse, second.pairs[0].comparison.reverse)
    assert not np.array_equal(first.pairs[0].comparison.reverse, other.pairs[0].comparison.reverse)


def _whole_softmax(x):
    return tf.nn.softmax(tf.reshape(x, [1, -1]))  # every output depends on every input: a dense Jacobian


@pytest.mark.parametrize("f, beyond", [
    (tf.tanh, "coloured"),  # elementwise: one colour, element-wise verdicts on every nonzero
    (_whole_softmax, "fast"),  # dense: too many colours for compression to pay
    (lambda x: tf.reduce_sum(tf.sin(x)), "fast"),  # scalar: one dense row
    (lambda x: tf.math.cumulative_logsumexp(x), "fast"),  # an op without a sparsity rule
])
def test_auto_mode_switches_and_says_why(f, beyond):
    x = tf.constant(RNG.normal(size=300))
    small = fastcheck.check_gradients(f, x)
    assert small.mode not in ("fast", "coloured") and events_of(small, "ModeChosen")[0].mode == "full"
    big = fastcheck.check_gradients(f, x, memory_budget=1_000)
    assert big.mode == beyond and big.ok, str(big)
    (chosen,) = events_of(big, "ModeChosen")
    assert chosen.mode == beyond and type(chosen.why[0]).__name__ == "FullTooLarge", big.notes


@pytest.mark.parametrize(("mode", "above", "subject"), [("full", 50, "input"), ("fast", 2, "fast mode")])
def test_out_of_memory_halves_the_chunk_and_retries(mode, above, subject, debug_log):
    x = tf.constant(RNG.normal(size=400))
    reference = fastcheck.check_gradients(lambda x: tf.tanh(x) * 2.0, x, mode=mode, seed=0)
    with fastcheck.testing.out_of_memory(above=above):
        report = fastcheck.check_gradients(lambda x: tf.tanh(x) * 2.0, x, jit_compile=False, mode=mode, seed=0)
    assert report.ok and reference.ok, str(report)
    retries = logged(debug_log, "%s: out of memory at")  # (subject, chunk, unit, retried with)
    assert retries and all(r[3] == r[1] // 2 and r[0] == subject for r in retries), retries
    assert min(r[3] for r in retries) <= above < max(r[1] for r in retries)
    np.testing.assert_allclose(report.pairs[0].numerical, reference.pairs[0].numerical, atol=1e-9)


def test_out_of_memory_is_refused_without_a_positive_item_count():
    for above in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match=r"out_of_memory\(above=\.\.\.\) takes the items"):
            with fastcheck.testing.out_of_memory(above=above):
                pass


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_second_order_correct_and_wrong(mode):
    x = tf.constant(RNG.uniform(0.5, 1.5, size=30))
    assert fastcheck.check_gradients(lambda x: tf.reduce_sum(tf.sin(x) * x**2), x, order=2, mode=mode).ok

    @tf.custom_gradient
    def cube(x):
        def grad(g):
            return g * 3 * tf.stop_gradient(x) ** 2  # right first derivative, but its own gradient is lost

        return x**3, grad

    assert fastcheck.check_gradients(lambda x: tf.reduce_sum(cube(x)), x).ok
    report = fastcheck.check_gradients(lambda x: tf.reduce_sum(cube(x)), x, order=2, mode=mode)
    assert not report.ok, str(report)


def test_second_order_of_a_vector_function():
    x = tf.constant(RNG.normal(size=(4, 3)))
    assert fastcheck.check_gradients(lambda x: tf.nn.softmax(x) * x, x, order=2).ok


def test_progress_bar_when_asked(capsys):
    x = tf.constant(RNG.normal(size=3000))
    report = fastcheck.check_gradients(lambda x: tf.tanh(x), x, progress=True, memory_budget=8 << 20, mode="full",
                                       jit_compile=False)
    assert report.ok
    assert "fastcheck" in capsys.readouterr().err
    quiet = fastcheck.check_gradients(lambda x: tf.tanh(x), x, progress=False, memory_budget=8 << 20, mode="full",
                                      jit_compile=False)
    assert quiet.ok and capsys.readouterr().err == ""


def test_localisation_that_finds_no_block_reports_the_region_without_exploding(monkeypatch):
    from fastcheck.modes import fast as _fast

    original, blocks = _fast._Probes.compare, []

    def blind_blocks(*args, **kwargs):
        result = original(*args, **kwargs)
        if inspect.stack()[1].function == "within":  # the within-input bisection's blocks see nothing
            blocks.append(1)
            result.forward_ratio[:] = 0.0
            result.reverse_ratio[:] = 0.0
        return result

    monkeypatch.setattr(_fast._Probes, "compare", blind_blocks)
    x = tf.constant(RNG.normal(size=(200, 10)))
    report = fastcheck.check_gradients(_wrong_rows([50]), x, mode="fast")
    pair = report.pairs[0]
    assert not report.ok and report.verdict == "fail"
    assert pair.region == ((0, 0), (199, 9)) and pair.worst_element is None
    assert "did not show in any single block" in pair.hint
    assert len(blocks) == _fast.LOCALISE_DRAWS  # every draw of the first level, then no element sweep


def test_fast_mode_names_the_path_its_probes_ran_on(debug_log):
    # Routed to XLA for a full check's work, fast mode's few dozen probes run on the graph path (XLA's compilation
    # does not pay there): the report's path says so; jit_compile=True asks for XLA and gets it.
    rng = np.random.default_rng(5)
    w = tf.constant(rng.normal(size=(300, 40000)))
    x = tf.constant(rng.normal(size=40000))
    f = lambda x: tf.tanh(tf.linalg.matvec(w, x))  # noqa: E731
    auto = fastcheck.check_gradients(f, [x], mode="fast")
    assert auto.ok and logged(debug_log, "route: ")[0][0] == "xla" and auto.path == "graph", str(auto)
    assert "[graph, fast mode" in str(auto)
    forced = fastcheck.check_gradients(f, [x], mode="fast", jit_compile=True)
    assert forced.ok and forced.path == "xla", str(forced)


def test_a_gradient_that_is_not_finite_fails_in_fast_mode_as_in_full_mode():
    # x log x behind tf.where: its gradient is NaN at x = 0 although f is finite there. The probes through those
    # elements were refined as kinks and passed; now they fail as full mode's "analytical not finite", named.
    x = tf.constant([0.0, 0.5, 0.0, 1.5, 2.0, 0.0], tf.float64)

    def f(x):
        return tf.where(x > 0, x * tf.math.log(x), tf.zeros_like(x)) + x

    full, fast = (fastcheck.check_gradients(f, x, mode=mode) for mode in ("full", "fast"))
    assert full.verdict == fast.verdict == "fail", (str(full), str(fast))
    assert fast.pairs[0].count("analytical not finite") and "NaN/Inf at 3 of this input's elements" in str(fast)


def test_a_gradient_not_finite_in_one_input_fails_that_input_alone():
    # One group of two inputs: its probes move both, and 0 * NaN is NaN, so the other input's pair FAILed with
    # "NaN/Inf at 0 of this input's elements". It gets probes of its own, which pass, as in full mode.
    a = tf.constant([0.0, 0.5, 0.0, 1.5, 2.0, 0.7], tf.float64)
    b = tf.constant(np.linspace(0.1, 1.0, 6))

    def f(a, b):
        return tf.where(a > 0, a * tf.math.log(a), tf.zeros_like(a)) + a + tf.sin(b)

    full, fast = (fastcheck.check_gradients(f, [a, b], mode=mode) for mode in ("full", "fast"))
    assert [p.label for p in full.pairs] == [p.label for p in fast.pairs] == ["FAIL", "ok"], (str(full), str(fast))
    assert "NaN/Inf at 2 of this input's elements" in fast.pairs[0].hint


@pytest.mark.parametrize("factor", [1.0, 1.5])
def test_an_op_without_second_derivative_or_jvp_is_checked_by_the_projections(factor):
    # ResizeBilinear: no gradient of its gradient, and forward mode's tangent is None (it read as 0, and a correct
    # resize FAILed fast mode's element-wise comparison). Without either, the projections alone check the
    # gradient: a correct one passes, one 1.5x off does not (tf.image.resize computes in float32, and its
    # refinement finds kinks at float32's rounding: undecidable, where full mode names the elements).
    x = tf.constant(RNG.normal(size=(1, 4, 4, 2)), tf.float32)

    @tf.custom_gradient
    def resize(x):
        def vjp(dy):
            return factor * tf.raw_ops.ResizeBilinearGrad(grads=dy, original_image=x, half_pixel_centers=True)

        return tf.image.resize(x, (7, 7), method="bilinear"), vjp

    report = fastcheck.check_gradients(resize, x, mode="fast")
    assert (report.verdict == "pass") == (factor == 1.0), str(report)
    (only,) = events_of(report, "FastForwardOnly")
    assert not only.jvp and "projection u.J.d alone" in str(report)


@pytest.mark.parametrize("op", ["bicubic", "softsign", "recompute_grad"])
def test_an_op_whose_jvp_raises_is_checked_by_the_projections(op):
    # No second derivative, and forward mode raises (LookupError: ResizeBicubicGrad, SoftsignGrad; recompute_grad's
    # NotImplementedError) where ResizeBilinear's is None: fast mode raised it (12 of the op audit's 569 checks);
    # now the projections alone check the gradient.
    x = tf.constant(RNG.normal(size=(1, 4, 4, 2)), tf.float32)
    f = {"bicubic": lambda x: tf.image.resize(x, (7, 7), method="bicubic"), "softsign": tf.nn.softsign,
         "recompute_grad": tf.recompute_grad(lambda x: tf.tanh(x) * x)}[op]
    report = fastcheck.check_gradients(f, x, mode="fast")
    assert report.verdict == "pass", str(report)
    assert [e.jvp for e in events_of(report, "FastForwardOnly")] == [False]


@pytest.mark.parametrize("factor", [1.0, 1.02])
def test_an_input_its_groups_probes_cannot_resolve_gets_probes_of_its_own(factor):
    # A 1e-3 term beside a 1e3 one, inputs of one size (one group): the group's allowance, atol ||d|| + rtol |J d|,
    # is the large term's, and resolves no 1% error of the small input's gradient. Its own k probes do: a correct
    # gradient passes at a resolution below 1%, a 2% defect FAILs naming that input alone.
    rng = np.random.default_rng(0)  # its own draws: the module's RNG depends on which tests ran before
    a, b = (tf.constant(rng.normal(size=100)) for _ in range(2))

    @tf.custom_gradient
    def small(v):
        return tf.sin(v), lambda dy: dy * tf.cos(v) * factor

    report = fastcheck.check_gradients(lambda a, b: tf.reduce_sum(1e3 * tf.sin(a)) + tf.reduce_sum(1e-3 * small(b)),
                                       [a, b], mode="fast")
    (summary,) = events_of(report, "FastSummary")
    assert summary.groups == 1, str(report)
    if factor == 1.0:
        assert report.verdict == "pass" and report.pairs[1].resolution < 1e-2, str(report)
    else:
        assert report.verdict == "fail" and [p.input_name for p in report.failures] == ["input 1"], str(report)
        assert "wrong throughout it" in report.failures[0].hint  # every block fails: not a local defect
