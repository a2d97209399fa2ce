"""One mechanism, three strategies: full, coloured and fast mode give one verdict on TensorFlow's own gradient
tests (``benchmarks.tf_tests``: 173 correct cases and 12 planted defects), each case in every mode that runs it."""

import pytest
import tensorflow as tf

import fastcheck
from benchmarks.tf_tests import all_cases, defect_cases

CASES = [(case, True) for case in all_cases()] + [(case, False) for case in defect_cases()]
PARTS = 6


@pytest.mark.parametrize("part", range(PARTS))
def test_every_mode_gives_the_same_verdict_on_tensorflows_own_gradient_tests(part):
    # Fast mode said undecidable on reduce_euclidean_norm (its element-wise J d, the VJP's own derivative, is NaN
    # at a finite gradient); coloured mode refuses an op without a sparsity rule (a ValueError naming it).
    disagree = []
    for case, correct in CASES[part::PARTS]:
        verdicts = {}
        for mode in ("full", "coloured", "fast"):
            f, xs = case.make()
            try:
                report = fastcheck.check_gradients(f, [tf.convert_to_tensor(x) for x in xs], mode=mode, progress=False)
            except ValueError as error:
                assert mode == "coloured" and "sparsity" in str(error), (case.name, mode, error)
                continue
            verdicts[mode] = report.verdict
        if len(set(verdicts.values())) != 1 or (not correct and verdicts["full"] != "fail"):
            disagree.append((case.name, verdicts))
    assert not disagree, disagree
