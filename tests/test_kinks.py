"""Kinks along the steps: verdicts in full and fast mode, and the noise measurement that must not mistake them for noise.

The functions put every ReLU input of a layer within ``distance`` of its kink, as a
deep ReLU network does: a calibrated MobileNetV2 moved along all its weights crosses
kinks within 1e-7 of the point, a freshly initialised one within 1e-11.  A step that
crosses a kink is no evidence against a gradient: kinks that smaller steps resolve
must give a true verdict, and kinks that no step resolves an undecidable one, never
a FAIL.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import events_of

import fastcheck
from fastcheck.engine import precision as _precision

N = 512


def _layer(distance: float, dtype, factor: float = 1.0, seed: int = 0, point: float = 0.0, decades: float = 1.0):
    """(f, w): f(w) = 1 + sum(v * relu(w - point + o)) at w = point, every |o_i| log-uniform in
    [distance, 10**decades distance].

    ``factor`` scales the custom gradient (1.0: correct).  The point w = 0 keeps
    w + o exact in float32 too, so the kinks sit exactly ``|o_i|`` away.
    """
    rng = np.random.default_rng(seed)
    offsets = distance * 10 ** rng.uniform(0, decades, N) * rng.choice([-1.0, 1.0], N)
    weights = rng.normal(size=N)

    @tf.custom_gradient
    def f(w):
        z = w + tf.constant(offsets - point, w.dtype)
        v = tf.constant(weights, w.dtype)

        def grad(dy):
            return dy * factor * v * tf.cast(z > 0, w.dtype)

        return 1 + tf.reduce_sum(v * tf.nn.relu(z)), grad

    return f, tf.fill([N], tf.constant(point, dtype))


MODES = ["full", "fast"]
DTYPES = [tf.float64, tf.float32]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_kinks_that_smaller_steps_resolve_give_a_true_verdict(mode, dtype):
    # Kinks 1e-8 .. 1e-7 away: the default step (~6e-6) crosses all of them, h/4**5 none.
    f, w = _layer(1e-8, dtype)
    report = fastcheck.check_gradients(f, w, mode=mode)
    assert report.ok, str(report)
    wrong, w = _layer(1e-8, dtype, factor=1.01)
    report = fastcheck.check_gradients(wrong, w, mode=mode)
    assert report.verdict == "fail", str(report)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_kinks_no_step_resolves_are_never_a_fail(mode, dtype):
    # Kinks 1e-13 .. 1e-12 away, like a freshly initialised deep network's last layers.
    f, w = _layer(1e-13, dtype)
    report = fastcheck.check_gradients(f, w, mode=mode)
    assert report.verdict != "fail", str(report)
    if not report.ok:
        assert "kinks" in str(report)
    # A gradient off by 1% there cannot be told from the kinks' one-sided derivatives, but
    # it must not pass either where the analytical value lies outside them.
    wrong, w = _layer(1e-13, dtype, factor=1.01)
    assert fastcheck.check_gradients(wrong, w, mode=mode).verdict != "pass"


def _noise(f, x) -> float:
    evaluate = lambda values: np.atleast_1d(np.asarray(f(*values), np.float64))  # noqa: E731
    y0 = evaluate([x])
    return _precision.measure_noise(evaluate, [x], [0], y0, float(np.finfo(np.float64).eps)).relative


def test_kinks_near_the_point_are_not_measured_as_noise():
    # Measured at |w| = 1 (the noise scales are relative to |w|), kinks at every distance
    # from 1e-9 to 1e-4: the coarsest fine scale crosses many, the confirming one 32x finer few.
    f, w = _layer(1e-9, tf.float64, point=1.0, decades=5)
    assert _noise(f, w) < 16 * np.finfo(np.float64).eps


def test_a_float32_rounding_inside_a_float64_function_is_still_measured_as_noise():
    # The smooth float64 part moves at every scale; the float32 part is rough at every
    # scale above its quantum, the finer confirming scale included.
    x = tf.constant(np.random.default_rng(1).normal(size=64), tf.float64)

    def mixed(x):
        return tf.sin(x) + tf.cast(tf.cast(tf.cos(x), tf.float32), tf.float64)

    assert _noise(mixed, x) > 1e-9


def _dense_layer(distance: float, factor: float = 1.0, seed: int = 0):
    """(f, w): f(w) = W^T relu(w + o), 8 outputs, kinks as in ``_layer``; the custom gradient scaled by ``factor``."""
    rng = np.random.default_rng(seed)
    offsets = distance * 10 ** rng.uniform(0, 1, N) * rng.choice([-1.0, 1.0], N)
    weights = rng.normal(size=(N, 8)) / np.sqrt(N)

    @tf.custom_gradient
    def f(w):
        z = w + tf.constant(offsets, w.dtype)
        matrix = tf.constant(weights, w.dtype)

        def grad(dy):
            return factor * tf.linalg.matvec(matrix, dy) * tf.cast(z > 0, w.dtype)

        return tf.linalg.matvec(matrix, tf.nn.relu(z), transpose_a=True), grad

    return f, tf.zeros([N], tf.float64)


@pytest.mark.parametrize("distance, factor, verdicts", [
    (1e-8, 1.0, {"pass"}), (1e-8, 1.01, {"fail"}),  # resolved by smaller steps: the true verdict
    (1e-13, 1.0, {"pass", "undecidable"}), (1e-13, 1.01, {"undecidable", "fail"}),  # never resolved: never a false FAIL
])
def test_fast_mode_kinks_with_several_outputs(distance, factor, verdicts):
    # Several outputs: J d from the derivative of the VJP, every refinement level shifted by J (r_0 - r_k).
    f, w = _dense_layer(distance, factor)
    report = fastcheck.check_gradients(f, w, mode="fast")
    assert report.verdict in verdicts, str(report)


def test_float32_steps_crossing_relu_kinks_are_not_a_mismatch():
    # A float32 numerical side (precision="native") over a small CNN's conv kernel: h and h/4 cross
    # ReLU/MaxPool kinks (their one-sided quotients differ by ~0.085 at both), the finer steps are
    # float32 noise.  Refinement re-evaluates h with its sides, so the kink shows at two steps;
    # before, this ladder passed the settled test on noise and kernel[2, 1, 0, 2] was a confident
    # mismatch (numerical 0.2687 against the exact 0.2238, which float64 differences confirm).
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 8, 8, 3)).astype("float32")
    y = np.eye(4, dtype="float32")[rng.integers(0, 4, 4)]
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, padding="same"),
                              keras.layers.BatchNormalization(), keras.layers.ReLU(), keras.layers.MaxPooling2D(),
                              keras.layers.Dropout(0.2), keras.layers.Flatten(), keras.layers.Dense(4)])
    report = fastcheck.check_model(model, keras.losses.CategoricalCrossentropy(from_logits=True), (x, y),
                                   precision="native")
    kernel = next(p for p in report.pairs if "conv2d" in p.input_name and p.input_name.endswith("/kernel"))  # conv2d_1 after others
    assert kernel.statuses[0, np.ravel_multi_index((2, 1, 0, 2), (3, 3, 3, 4))] != "mismatch", str(report)


def _float32_relu_mlp(seed: int, defect: str | None = None):
    """MSE of a ReLU MLP over float32 data held in f (so no float64 evaluation): 2,048 ReLU inputs, a
    few within the default step of their kinks; every gradient hand-written, ``defect`` planted in one."""
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(64, 16)).astype(np.float32))
    y = tf.constant(rng.normal(size=(64, 4)).astype(np.float32))

    @tf.custom_gradient
    def first(w1, b1):
        def grad(dy):
            gw, gb = tf.matmul(x, dy, transpose_a=True), tf.reduce_sum(dy, 0)
            return (gw * {"w1_times_0.97": 0.97, "w1_times_1.1": 1.1}.get(defect, 1.0)
                    + (tf.reshape(tf.one_hot(101, 512) * 0.01, [16, 32]) if defect == "one_element" else 0.0),
                    gb * (0.0 if defect == "no_bias" else 1.0))

        return tf.matmul(x, w1) + b1, grad

    @tf.custom_gradient
    def relu(z):
        return tf.nn.relu(z), lambda dy: dy * tf.where(z > 0, 1.0, 0.05 if defect == "leaky_derivative" else 0.0)

    @tf.custom_gradient
    def second(h, w2):
        def grad(dy):
            return tf.matmul(dy, w2, transpose_b=True), tf.matmul(h, dy, transpose_a=True) * (
                -1.0 if defect == "w2_sign" else 1.0)

        return tf.matmul(h, w2), grad

    def loss(w1, b1, w2, b2):
        return tf.reduce_mean(tf.square(second(relu(first(w1, b1)), w2) + b2 - y))

    weights = [rng.normal(size=(16, 32)).astype(np.float32) / 4, np.zeros(32, np.float32) + 0.01,
               rng.normal(size=(32, 4)).astype(np.float32) / 6, np.zeros(4, np.float32)]
    return loss, weights


@pytest.mark.parametrize("seed", range(6))
def test_a_float32_relu_mlp_raises_no_false_alarm(seed):
    # Seeds 0-5 each FAILed 2-14 correct weights: steps h and h/4 crossed a kink (at 0.1-0.8 h/4), the
    # finer steps were float32 noise, and the pair settled on that noise, extrapolated with a 15th of its
    # gap as error; kinks crossed steadily (one-sided gaps of 6-16 standard deviations) were not
    # "visible", and kinks crossed by the noise tables inflated the noise up to 3.9x.  Now a pass, or
    # undecidable where the only step resolving a kink is float32 noise (never a mismatch).
    loss, weights = _float32_relu_mlp(seed)
    report = fastcheck.check_gradients(loss, weights)
    assert not events_of(report, "NumericalSide")[0].upcast  # the float32 side under test
    statuses = np.concatenate([pair.statuses.ravel() for pair in report.pairs])
    assert report.verdict != "fail" and not np.any(statuses == "mismatch"), str(report)
    if seed in (0, 1):
        assert report.verdict == "pass", str(report)


# (defect, the weights whose pair fails): each planted in the MLP's hand-written gradients.
FLOAT32_MLP_DEFECTS = [("w1_times_0.97", [0]), ("w1_times_1.1", [0]), ("one_element", [0]), ("no_bias", [1]),
                       ("leaky_derivative", [0, 1]), ("w2_sign", [2])]


@pytest.mark.parametrize("defect, failing", FLOAT32_MLP_DEFECTS)
@pytest.mark.parametrize("seed", [0, 2])
def test_every_planted_defect_of_a_float32_relu_mlp_fails(seed, defect, failing):
    loss, weights = _float32_relu_mlp(seed, defect)
    report = fastcheck.check_gradients(loss, weights)
    assert report.verdict == "fail", str(report)
    assert [i for i, pair in enumerate(report.pairs) if pair.count(1)] == failing, str(report)
    if defect == "one_element":
        assert report.pairs[0].worst_element.input_index == (3, 5), str(report)


@pytest.mark.parametrize("defect", [None, "w1_times_0.97", "one_element"])
def test_fast_mode_on_a_float32_relu_mlp(defect):
    # A probe along all of W1 crosses several kinks at every coarse step; its pair (h, h/4) settled at
    # -0.1747 +- 1.5e-3 with every finer step at -0.1675 +- 1.1e-3, because a finer step had the whole
    # pair gap as slack: every seed of the correct MLP FAILed in fast mode.
    loss, weights = _float32_relu_mlp(0, defect)
    report = fastcheck.check_gradients(loss, weights, mode="fast")
    if defect is None:
        assert report.verdict != "fail", str(report)
    else:
        assert report.verdict == "fail", str(report)
        assert not report.pairs[0].ok and all(pair.ok for pair in report.pairs[1:]), str(report)


@pytest.mark.parametrize("seed", [0])  # seed 3 did so too, with a part at 1.00x its allowance: not kept (CPU-dependent)
def test_fast_mode_calls_a_group_whose_parts_all_pass_undecidable(seed):
    # The correct MLP's probes over all four weights FAIL at ~2.2x their allowance while every probe
    # restricted to a part of them passes (0.02-0.76x): the group's allowance (atol ||d||) grows less
    # than the sum of its parts', and kinks crossed add up.  No part, so no element, is shown wrong:
    # undecidable, not FAIL (seed 0 FAILed so on the AMD EPYC of 2026-12-01, its parts at 0.02-0.76x;
    # it passed outright on another CPU, whose float32 rounding differs -- either is right here).
    loss, weights = _float32_relu_mlp(seed)
    report = fastcheck.check_gradients(loss, weights, mode="fast")
    assert report.verdict != "fail", str(report)
    for pair in report.pairs:
        assert pair.ok or _says_check_it_in_full_mode(pair), str(report)


@pytest.mark.parametrize("seed", [2, 4])
def test_fast_mode_fails_no_correct_float32_relu_mlp_by_kinks_its_parts_do_not_show(seed):
    # Seeds 2 and 4 FAILed (AMD EPYC, 2026-12-01): seed 2 its {w1, w2} group at 1.1x with no part failing,
    # seed 4 its {b1, b2} group at 5.9x, then b1's own probes at 5x while b1's worst element sat at a kink
    # (left -0.0307, right -0.0386, analytical -0.0386: full mode's NONDIFFERENTIABLE, a pass).  A FAIL
    # needs a part, then an element, shown wrong: undecidable here.
    loss, weights = _float32_relu_mlp(seed)
    report = fastcheck.check_gradients(loss, weights, mode="fast")
    assert report.verdict != "fail", str(report)
    assert not any(pair.count(1) for pair in report.pairs), str(report)
    assert all(pair.ok or _says_check_it_in_full_mode(pair) for pair in report.pairs), str(report)


def _says_check_it_in_full_mode(pair) -> bool:
    """An undecidable fast-mode pair: it names no wrong element, and its hint, where it has one, does not say the
    gradient is wrong and says what to try (full mode)."""
    named = pair.worst_element is not None and pair.worst_element.status == "mismatch"
    said = pair.hint is None or ("mode='full'" in pair.hint and " is wrong" not in pair.hint)
    return pair.label == "undec." and not named and said


@pytest.mark.parametrize("defect, failing", FLOAT32_MLP_DEFECTS)
def test_fast_mode_never_passes_a_planted_defect_nor_blames_an_innocent_weight(defect, failing):
    # Seed 4 is the hard one: its correct MLP's {b1, b2} probes fail through kinks.  Before, every
    # defect there FAILed b1 (input 1) -- the w1, w2 defects were never named, and b1 was innocent.
    loss, weights = _float32_relu_mlp(4, defect)
    report = fastcheck.check_gradients(loss, weights, mode="fast")
    assert report.verdict != "pass", str(report)
    blamed = [i for i, pair in enumerate(report.pairs) if pair.count(1)]
    assert set(blamed) <= set(failing), str(report)


def _ladder(derivatives, noises, y0=1.0, h=4.9e-3):
    """``compare.refine`` levels of one element: central differences with equal sides, steps h/4**k."""
    levels = []
    for k, (d, noise) in enumerate(zip(derivatives, noises)):
        step = h / 4**k
        levels.append((np.array([[d]]), np.array([[noise]]), np.array([[y0 + d * step]]),
                       np.array([[y0 - d * step]]), np.array([2 * step])))
    return levels, np.array([y0])


@pytest.mark.parametrize("case", ["rounding", "kink"])
def test_a_settled_pairs_error_is_the_richardson_one_only_where_it_is_confirmed(case):
    from fastcheck.judge import compare as _compare

    noises = [6.6e-5 * 4**k for k in range(6)]
    if case == "rounding":
        # A linear float32 f: the pair's gap is rounding, which the error's rounding term covers; adding
        # the gap again hid a 1e-3 defect of a float32 conv 32x32x8 (at 1.05 of its allowance).
        derivatives = [0.5, 0.5 + 2e-4, 0.5 - 3e-4, 0.5 + 5e-4, 0.5 - 2e-3, 0.5 + 4e-3]
    else:
        # A kink at 0.77 h/4 moves the pair by 2.3e-3; h/16 and finer are too noisy to confirm h^2.
        derivatives = [-0.04608, -0.04377, -0.04293, -0.04293 + 2e-3, -0.04293 - 8e-3, -0.04293 + 2e-2]
    levels, y0 = _ladder(derivatives, noises)
    best, error, settled, *_ = _compare.refine(levels, y0, 4.0)
    assert settled[0, 0], (best, error)
    if case == "rounding":
        gap, rounding = abs(derivatives[0] - derivatives[1]), noises[1] * 17 / 15 + noises[0] / 15
        assert error[0, 0] == pytest.approx(gap / 15 + rounding, rel=1e-6)
    else:  # the pair (h, h/4) extrapolated to -0.04362 +- 3e-4 before, excluding the derivative at the point
        assert abs(best[0, 0] - -0.04293) <= error[0, 0], (best, error)


def test_a_localised_region_whose_elements_all_pass_is_not_called_a_defect():
    # Seed 1 of the correct float32 MLP FAILed in fast mode: the probes through a slab of W1 disagree at
    # 1.3x their allowance, yet its worst element passes.  The report says exactly that, names no defect,
    # and the verdict is undecidable.  (When fast mode's probes stop disagreeing here, pick another case.)
    loss, weights = _float32_relu_mlp(1)
    report = fastcheck.check_gradients(loss, weights, mode="fast")
    assert report.verdict == "undecidable", str(report)
    passing = [p for p in report.pairs if p.region is not None and p.worst_element is not None and p.worst_element.status == "ok"]
    assert passing, str(report)
    for pair in passing:
        assert "none of its elements is shown wrong on its own" in pair.hint and pair.worst_element.abs_error <= pair.worst_element.allowed
    assert "defect localised" not in str(report) and "disagreement localised" in str(report), str(report)
