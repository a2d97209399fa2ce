"""Fast mode over many inputs at once: one joint test, localisation to the input, then within it; mode="auto"'s cost rule.

That the failing probe split over the parts partitions it (a wrong gradient's error is linear in it) is
``test_kinks.test_fast_mode_fails_no_correct_float32_relu_mlp_by_kinks_its_parts_do_not_show``'s: parts that
overlap FAIL its correct seed 2."""

import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import checked, events_of

import fastcheck

RNG = np.random.default_rng(14)
SHAPES = [(6, 5), (7,), (3, 4, 2), (9,), (5, 5), (4,), (8, 3), (6,), (2, 7), (5,), (3, 3), (10,)]


def _inputs(count: int, dtype=tf.float64) -> list:
    return [tf.constant(RNG.normal(size=shape), dtype) for shape in SHAPES[:count]]


def _off_on_rows(rows, factor):
    """x * 1 with a custom gradient that is off by ``factor`` on the given leading-axis rows."""

    @tf.custom_gradient
    def identity(x):
        def grad(g):
            mask = tf.reduce_any(tf.equal(tf.range(tf.shape(x)[0])[:, None], tf.constant(rows)[None, :]), axis=1)
            shape = tf.concat([tf.shape(mask), tf.ones([tf.rank(x) - 1], tf.int32)], 0)
            return g * tf.where(tf.reshape(mask, shape), tf.cast(factor, x.dtype), tf.cast(1.0, x.dtype))

        return tf.identity(x), grad

    return identity


def _network(wrong: int | None = None, rows=(2,), factor=1.5, calls=None):
    """A vector-valued f of several inputs: every input feeds 3 outputs through tanh and sums.

    ``wrong``: the input whose reverse-mode gradient is off by ``factor`` on ``rows``
    (a custom gradient: forward mode and f's values do not see it).
    ``calls``: a list that counts the Python calls of f (a traced kernel calls it once, at tracing).
    """

    def f(*xs):
        if calls is not None:
            calls.append(1)
        total = tf.zeros([3], xs[0].dtype)
        for i, x in enumerate(xs):
            if i == wrong:
                x = _off_on_rows(list(rows), factor)(x)
            flat = tf.reshape(tf.cast(x, total.dtype), [-1])
            weights = tf.cast(tf.reshape(tf.range(3 * flat.shape[0]) % 7 - 3, [3, -1]), total.dtype) / 5.0
            total += tf.tanh(tf.linalg.matvec(weights, tf.sin(flat)) / (1.0 + i))
        return total

    return f


def test_correct_multi_input_function_passes_with_probes_over_groups_of_inputs():
    report = fastcheck.check_gradients(_network(), _inputs(12), mode="fast")
    assert report.ok and report.mode == "fast", str(report)
    assert len(report.pairs) == 12 and all(pair.ok for pair in report.pairs)
    # 12 inputs of 4 to 30 elements: two groups of similar size, 4 probes each, both sides of each.
    (summary,) = events_of(report, "FastSummary")
    assert (summary.groups, summary.inputs, summary.evaluations) == (2, 12, 16), report.notes


@pytest.mark.parametrize("wrong", [0, 7, 11])
def test_defect_in_one_input_fails_that_input_and_localises_it(wrong):
    inputs = _inputs(12)
    report = fastcheck.check_gradients(_network(wrong, rows=(2,)), inputs, mode="fast")
    assert report.verdict == "fail", str(report)
    failing = [pair.input_name for pair in report.failures]
    assert failing == [f"input {wrong}"], failing
    pair = report.failures[0]
    # The defect sits on leading row 2 of that input: the region and the worst element say so.
    assert pair.region[0][0] <= 2 <= pair.region[1][0], pair.region
    assert pair.worst_element is not None and pair.worst_element.input_index[0] == 2 and pair.worst_element.status == "mismatch"
    assert pair.worst_element.analytical == pytest.approx(1.5 * pair.worst_element.numerical, rel=1e-5)
    assert f"localised by bisection over the inputs, then within input {wrong}" in "\n".join(report.notes)
    # Every other input is cleared by probes that pass.
    assert all(p.ok for p in report.pairs if p.input_name != f"input {wrong}")


def test_f_is_called_and_traced_as_often_for_twelve_inputs_as_for_two():
    counts = {}
    for count in (2, 12):
        calls: list = []
        report = fastcheck.check_gradients(_network(calls=calls), _inputs(count), mode="fast", jit_compile=False)
        assert report.ok and report.path == "graph", str(report)
        counts[count] = len(calls)
    # Planning, the route's probe trace, one VJP: never one kernel or VJP per input (12 inputs would add
    # at least 10 calls).
    assert counts[12] <= counts[2], counts


def test_defects_in_every_input_fail_every_pair_and_stop_localising_one_by_one():
    @tf.custom_gradient
    def doubled(*xs):
        return tf.add_n([tf.reduce_sum(tf.sin(x)) for x in xs]), lambda g: [2 * g * tf.cos(x) for x in xs]

    report = fastcheck.check_gradients(doubled, _inputs(12), mode="fast")
    assert report.verdict == "fail" and len(report.failures) == 12, str(report)
    localised = [p for p in report.pairs if p.region is not None]
    capped = [p for p in report.pairs if p.hint and "localisation stopped" in p.hint]
    (count,) = {int(re.search(r"localisation stopped after (\d+) failing inputs", p.hint)[1]) for p in capped}
    assert 0 < len(localised) == count < 12 and len(capped) == 12 - count, str(report)


def test_inputs_of_several_dtypes_move_together():
    inputs = [tf.constant(RNG.normal(size=(20,)), tf.float32), tf.constant(RNG.normal(size=(4, 5)), tf.float64)]

    def f(a, b):
        return tf.tanh(tf.cast(a, tf.float64) * tf.reshape(b, [-1]))

    report = fastcheck.check_gradients(f, inputs, mode="fast", precision="native")
    assert report.ok and [p.input_name for p in report.pairs] == ["input 0", "input 1"], str(report)

    report = fastcheck.check_gradients(lambda a, b: _off_on_rows([3], 1.2)(f(a, b)), inputs, mode="fast",
                                       precision="native")
    assert not report.ok, str(report)


def _model(defect: float):
    """A small float64 Keras model whose Scale layer has a custom gradient for its scale variable off by ``defect``."""
    keras = pytest.importorskip("keras")

    class Scale(keras.layers.Layer):
        def build(self, shape):
            self.scale = self.add_weight(shape=(shape[-1],), initializer="ones", name="scale")

        def call(self, x):
            @tf.custom_gradient
            def scaled(x, s):
                def grad(dy):
                    return dy * s, (1.0 + defect) * tf.reduce_sum(dy * x, axis=0)

                return x * s, grad

            return scaled(x, tf.convert_to_tensor(self.scale))

    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,), dtype="float64")
    h = keras.layers.Dense(8, activation="tanh", dtype="float64")(inputs)
    h = Scale(dtype="float64", name="planted")(h)
    h = keras.layers.Dense(8, activation="tanh", dtype="float64")(h)
    model = keras.Model(inputs, keras.layers.Dense(3, dtype="float64")(h))
    x = RNG.normal(size=(5, 6))
    y = RNG.normal(size=(5, 3))
    return model, (x, y)


def test_model_with_a_planted_defect_fails_naming_the_variable_in_fast_mode():
    model, data = _model(0.01)
    report = fastcheck.check_model(model, "mse", data, mode="fast")
    assert report.mode == "fast" and report.verdict == "fail", str(report)
    assert [p.input_name for p in report.failures] == ["planted/scale"], str(report)
    assert report.failures[0].worst_element is not None and report.failures[0].worst_element.status == "mismatch"

    correct, data = _model(0.0)
    assert fastcheck.check_model(correct, "mse", data, mode="fast").ok


def test_supplied_gradients_are_fast_checked_per_input():
    x, y = tf.constant(RNG.normal(size=(30,))), tf.constant(RNG.normal(size=(4, 5)))

    def f(x, y):
        return tf.reduce_sum(tf.sin(x)) + tf.reduce_sum(y**3)

    right = [tf.cos(x), 3 * y**2]
    assert fastcheck.verify_gradients(f, [x, y], right, mode="fast").ok
    wrong = [tf.cos(x), 3 * y**2 * tf.constant(np.where(np.arange(20).reshape(4, 5) == 13, 1.1, 1.0))]
    report = fastcheck.verify_gradients(f, [x, y], wrong, mode="fast")
    assert report.mode == "fast" and [p.input_name for p in report.failures] == ["input 1"], str(report)
    assert report.failures[0].worst_element.input_index == (2, 3)


def test_a_full_check_predicted_too_slow_makes_auto_choose_fast_mode_and_say_so():
    x = tf.constant(RNG.normal(size=30_000))  # the predicted-cost rule applies from 20,000 elements (or 16 inputs)
    total_tanh = lambda x: tf.reduce_sum(tf.tanh(x))  # noqa: E731
    report = checked(total_tanh, x, tables={"FULL_SECONDS": 1e-9})
    assert report.mode == "fast" and report.ok, str(report)
    (chosen,) = events_of(report, "ModeChosen")
    (slow,) = chosen.why
    assert chosen.mode == "fast" and type(slow).__name__ == "FullTooSlow" and slow.budget == 1e-9, report.notes
    relaxed = fastcheck.check_gradients(total_tanh, x)
    (fits,) = events_of(relaxed, "ModeChosen")[0].why
    assert relaxed.mode != "fast" and type(fits).__name__ == "FullFits" and fits.budget == 60, relaxed.notes
    assert checked(total_tanh, x, tables={"FULL_SECONDS": 1e-9}, mode="full").mode != "fast"  # mode='full' wins
