"""The refinement driver (``_refine.descend``) and its confirmation (``_refine.confirmation``) through their
functions, on closed-form f in numpy, and full mode's triage steps (``_full_steps``) each on its own."""

from __future__ import annotations

import numpy as np
import pytest

from fastcheck import _compare, _full_steps
from fastcheck._refine import Line, Rungs, confirmation, descend
from fastcheck._tables import DEEP_LEVELS, REFINE_LEVELS, REFINE_RATIO

H = 1e-3
Y0 = 1.0


def _directions(functions, noise=1e-15):
    """An ``Evaluate`` of f(x + t d_j) = Y0 + functions[j](t) (one output), and the calls it got."""
    calls = []

    def evaluate(selection, powers, factors=None):
        calls.append((np.array(selection), list(powers)) if factors is None else (np.array(selection), list(powers),
                                                                                   list(factors)))
        levels = []
        for p, factor in zip(powers, factors or [1.0] * len(powers)):
            h = H / REFINE_RATIO**p * factor
            plus = np.array([[Y0 + functions[j](h) for j in selection]])
            minus = np.array([[Y0 + functions[j](-h) for j in selection]])
            span = np.full(len(selection), 2 * h)
            levels.append(((plus - minus) / span, np.full(plus.shape, noise / (2 * h)), plus, minus, span))
        return Rungs(levels, np.array([Y0]), None)

    return evaluate, calls


SMOOTH = [lambda t: 3.0 * t + t**2, lambda t: np.sin(2.0 * t), lambda t: -np.expm1(t)]


def test_smooth_directions_settle_on_the_first_ladder():
    evaluate, calls = _directions(SMOOTH)
    found = descend(evaluate, 3, range(0, REFINE_LEVELS + 1), lambda found: ~found.settled.all(axis=0),
                    range(REFINE_LEVELS + 1, DEEP_LEVELS + 1))
    assert [powers for _, powers in calls] == [list(range(0, REFINE_LEVELS + 1))]
    assert found.settled.all()
    np.testing.assert_allclose(found.estimate[0], [3.0, 2.0, -1.0], rtol=1e-9)


@pytest.mark.parametrize("deeper", [range(REFINE_LEVELS + 1, DEEP_LEVELS + 1), range(0, DEEP_LEVELS + 1)])
def test_open_directions_go_deeper_and_replace_the_first_result(deeper):
    """Only the open direction is evaluated again, at the deeper powers; powers above them are the first
    ladder's; the merged result is ``_compare.refine`` of the whole ladder of that direction alone."""
    evaluate, calls = _directions(SMOOTH)
    first = descend(evaluate, 3, range(0, REFINE_LEVELS + 1))
    found = descend(evaluate, 3, range(0, REFINE_LEVELS + 1), lambda found: np.array([False, True, False]), deeper)
    selection, powers = calls[-1]
    assert selection.tolist() == [1] and powers == list(deeper)
    alone, _ = _directions([SMOOTH[1]])
    whole = _compare.refine(alone(np.array([0]), range(0, DEEP_LEVELS + 1)).levels, np.array([Y0]), REFINE_RATIO)
    for merged, before, expected in zip(found, first, whole):
        np.testing.assert_array_equal(merged[:, [0, 2]], before[:, [0, 2]])
        np.testing.assert_array_equal(merged[:, 1], expected[:, 0])


def test_deeper_powers_may_depend_on_the_first_result():
    evaluate, calls = _directions(SMOOTH)
    asked = []

    def deeper(found, selection):
        asked.append((found.estimate.shape, selection.tolist()))
        return range(0, 3)

    descend(evaluate, 3, range(0, 2), lambda found: np.array([True, False, True]), deeper)
    assert asked == [((1, 3), [0, 2])]
    assert [(s.tolist(), p) for s, p in calls] == [([0, 1, 2], [0, 1]), ([0, 2], [0, 1, 2])]


def test_a_rejected_confirmation_unsettles_and_is_asked_after_each_ladder():
    evaluate, _ = _directions(SMOOTH)
    asked = []

    def confirm(selection, found):
        asked.append(selection.tolist())
        return selection != 0

    found = descend(evaluate, 3, range(0, REFINE_LEVELS + 1), lambda found: ~found.settled.all(axis=0),
                    range(0, DEEP_LEVELS + 1), confirm)
    assert asked == [[0, 1, 2], [0]]  # direction 0, unconfirmed, went deeper and was asked again
    assert found.settled.tolist() == [[False, True, True]]


def _confirmed_descent(functions, analytical):
    evaluate, calls = _directions(functions)
    a = np.array([analytical])
    line = Line(lambda selection: np.full(len(selection), H), lambda selection, spans: 1e-15 / spans[None, :])

    def mismatch(selection, found):
        return np.abs(a[:, selection] - found.estimate) > 1e-6

    found = descend(evaluate, len(functions), range(0, REFINE_LEVELS + 1),
                    confirm=confirmation(evaluate, line, a, mismatch))
    return found, calls


def test_confirmation_keeps_a_real_mismatch_and_rejects_a_ladder_that_agrees_by_coincidence():
    # On every step H / 4**p the second f is exactly 3.5 t (its sine vanishes there), so its ladder settles at 3.5
    # like the first's; at 0.618 x the steps it is 3.5 t (1 + sin(...)), far from 3.5: a coincidence, unsettled.
    wrong = 3.5
    coincidence = lambda t: wrong * t * (1 + np.sin(np.pi * np.log(abs(t) / H) / np.log(REFINE_RATIO)))  # noqa: E731
    found, calls = _confirmed_descent([lambda t: wrong * t, coincidence, lambda t: 3.0 * t], [3.0, 3.0, 3.0])
    assert found.settled.tolist() == [[True, False, True]]
    assert found.estimate[0, 0] == pytest.approx(wrong) and found.estimate[0, 2] == pytest.approx(3.0)
    # Only the settled mismatches were evaluated again, at the chosen pair's steps times the golden ratio.
    (selection, powers, factors), = [call for call in calls if len(call) == 3]
    assert selection.tolist() == [0, 1] and factors == [pytest.approx(0.618034)] * 2 and powers[1] == powers[0] + 1


def test_a_kink_within_every_step_stays_unsettled():
    """|t| + t: one-sided derivatives 2 and 0 at every step; the driver's deeper ladder does not settle it."""
    evaluate, _ = _directions([lambda t: abs(t) + t])
    found = descend(evaluate, 1, range(0, REFINE_LEVELS + 1), lambda found: ~found.settled.all(axis=0),
                    range(REFINE_LEVELS + 1, DEEP_LEVELS + 1))
    assert not found.settled.any() and found.kink.all()
    assert sorted([found.left[0, 0], found.right[0, 0]]) == pytest.approx([0.0, 2.0])


# -- full mode's triage at h/4, step by step ----------------------------------------------------------


def _quarter(quotient, plus, minus, mismatch, spans=(2 * H / 4,), y0=(Y0,)):
    plus, minus = np.array([plus]), np.array([minus])
    return _full_steps._Quarter(np.array(spans) / 2, np.array([quotient]), plus, minus,
                          _full_steps._curvature(plus, minus, np.array(y0)), np.array(spans), np.array([mismatch]))


def test_triage_is_conclusive_where_the_quarter_step_barely_moves():
    h = H / 4
    smooth = _quarter([3.0], [Y0 + 3 * h], [Y0 - 3 * h], [1.0])
    assert _full_steps._conclusive(smooth, np.array([[3.0]]), np.array([[1e-12]]), 1e-5).all()
    moved = _quarter([3.05], [Y0 + 3.05 * h], [Y0 - 3.05 * h], [1.0])  # moved 5% of the mismatch
    assert not _full_steps._conclusive(moved, np.array([[3.0]]), np.array([[1e-12]]), 1e-5).any()
    kink = _quarter([3.0], [Y0 + 3.5 * h], [Y0 - 2.5 * h], [1.0])  # one-sided 3.5 and 2.5
    assert not _full_steps._conclusive(kink, np.array([[3.0]]), np.array([[1e-12]]), 1e-5).any()


def test_golden_step_agrees_only_with_h_squared_curvature():
    h = H / 4
    quarter = _quarter([3.0], [Y0 + 3 * h + h**2], [Y0 - 3 * h + h**2], [1.0])
    golden = h * _full_steps.CONFIRM_RATIO
    curvature = np.array([[2 * golden**2]])
    spans = np.array([2 * golden])
    assert _full_steps._agrees_at_golden(quarter, np.array([[3.0]]), curvature, spans, np.zeros((1, 1))).all()
    assert not _full_steps._agrees_at_golden(quarter, np.array([[3.0]]), 10 * curvature, spans, np.zeros((1, 1))).any()
    assert not _full_steps._agrees_at_golden(quarter, np.array([[3.5]]), curvature, spans, np.zeros((1, 1))).any()


def test_finest_step_is_the_one_whose_rounding_stays_below_an_eighth_of_the_mismatch():
    mismatch, conclusive = np.array([[1.0, 1.0, 1.0]]), np.ones((1, 3), bool)
    noise = np.array([[1e-3, 1.0, 1e-30]])  # room 125 (4**3.5), none, far beyond the deepest
    assert _full_steps._finest_powers(mismatch, conclusive, noise).tolist() == [3, 0, DEEP_LEVELS]
    quarter = _quarter([3.0, 3.0, 3.0], [0.0] * 3, [0.0] * 3, [1.0, 1.0, 1.0], spans=(1.0, 1.0, 1.0), y0=(0.0,))
    held = _full_steps._agrees_finest(np.array([[3.2, 5.0, 5.0]]), quarter, np.array([3, 0, 3]))
    assert held.tolist() == [[True, True, False]]  # within a quarter of the mismatch; h/4 itself; departed
