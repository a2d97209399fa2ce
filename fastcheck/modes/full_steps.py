"""Full mode's evaluator (_Jacobians: columns at given steps through the executor), and the same as a block's columns
(_DenseColumns: the trivial colouring, what ``block._Block`` judges and refines, and what ``full``'s coarse pass
sharpened and twin mismatch confirmed run over, through the block's ladder).
"""


from __future__ import annotations

import numpy as np

from fastcheck.engine.autodiff import AutodiffJacobian
from fastcheck.engine.executor import Executor, along_columns, measured, steps
from fastcheck.engine.plan import Plan, view
from fastcheck.engine.tables import REFINE_RATIO, SECOND_STEP


class _Jacobians:
    """Both Jacobians of a plan, per checked input, with the numerical noise estimate."""

    def __init__(self, executor: Executor, plan: Plan, timings: dict):
        self.executor, self.plan, self.config, self.timings = executor, plan, executor.config, timings
        self.autodiff = AutodiffJacobian(executor, forward=self.config.autodiff == "forward")
        self._quarters: dict = {}  # position -> (columns, their sides and spans at h/4: the second step)
        self._steps: dict = {}  # position -> its first steps (``executor.steps``): every evaluation reads them

    def steps(self, position: int) -> np.ndarray:
        """The first step of each element of input ``position`` (its evaluation values do not change in a check)."""
        if position not in self._steps:
            self._steps[position] = steps(self.plan, self.config, position)
        return self._steps[position]

    def measure(self) -> None:
        """Measure f's noise and the precision it computes in (see ``precision``)."""
        self.plan = measured(self.executor, self.plan)

    def numerical(self, position: int, columns=None):
        """Central differences [m, k] for ``columns`` (default all) and their spans [k]."""
        size = self.plan.inputs[position].size
        columns = np.arange(size) if columns is None else columns
        if not len(columns):
            return np.zeros((self.plan.m, 0)), np.zeros(0)
        return self.executor.quotients(position, columns, self.steps(position)[columns])

    def sides(self, position: int, rows: np.ndarray, cols: np.ndarray, powers: list, factors=None) -> list:
        """Per power: f(x + d), f(x - d) [k] at each element's row along its column at step h / 4**p (times
        ``factors``, where given), and the spans [k]: what ``block._Block.ladder`` reads, as coloured mode's ``_Columns.sides``."""
        columns, slot = np.unique(cols, return_inverse=True)
        return [(plus[rows, slot], minus[rows, slot], spans[slot])
                for plus, minus, spans in self._levels(position, columns, powers, factors)]

    def _levels(self, position: int, columns: np.ndarray, powers, factors=None) -> list:
        """Per power: f(x + d), f(x - d) [m, k] and the spans [k] of ``columns`` (sorted) at steps h / 4**p (times
        ``factors``), every power in one batch.  The second step's level (h/4) is made once per check: the second
        step before f's noise is measured and the triage after it read the same evaluations."""
        second = factors is None and list(powers) == [SECOND_STEP]
        cached = self._quarters.get(position) if second else None
        if cached is not None and np.isin(columns, cached[0]).all():
            where = np.searchsorted(cached[0], columns)
            return [tuple(value[..., where] for value in cached[1:])]
        count = len(columns)
        base = self.steps(position)[columns]
        divisors = [REFINE_RATIO**k for k in powers]
        delta = np.concatenate([base / d * factor for d, factor in zip(divisors, factors or [1.0] * len(divisors))])
        plus, minus, spans = self.executor.differences(position, np.tile(columns, len(divisors)), delta)
        if second:
            self._quarters[position] = (columns, plus, minus, spans)
        return [(plus[:, k * count:(k + 1) * count], minus[:, k * count:(k + 1) * count], spans[k * count:(k + 1) * count])
                for k in range(len(divisors))]

    def analytical(self) -> list[np.ndarray]:
        if self.plan.n == 0:
            return [np.zeros((self.plan.m, 0)) for _ in self.plan.checked]
        return self.autodiff()


class _DenseColumns:
    """Full mode's evaluations as a block's columns (``block._Block`` over ``Pattern.full``): the trivial colouring,
    every column its own colour; the first sweep is the quotients [m, n_k] themselves (``first``), every further
    evaluation the executor's columns (``_Jacobians.sides``, ``executor.along_columns``)."""

    def __init__(self, jac: _Jacobians, position: int, first: np.ndarray, spans: np.ndarray):
        self.jac, self.position, self.executor, self.first, self.spans = jac, position, jac.executor, first, spans
        self.labels = np.arange(spans.size)
        self.step = jac.steps(position)
        self.x = view(jac.executor.values[position]).reshape(-1)

    def sweep(self) -> np.ndarray:
        return self.first

    def quotients(self, first: np.ndarray, rows, cols, spans: np.ndarray) -> np.ndarray:
        return first[rows, cols]

    def span(self, cols) -> np.ndarray:
        return self.spans[cols]

    def sides(self, rows: np.ndarray, cols: np.ndarray, powers: list, factors=None) -> list:
        return self.jac.sides(self.position, rows, cols, powers, factors)

    def along(self, rows: np.ndarray, cols: np.ndarray, width: np.ndarray, multiples) -> tuple:
        return along_columns(self.executor, self.position, rows, cols, np.asarray(width, np.float64), multiples)
