"""Public entry points: each builds a problem (``problem``) and runs it (``_check.run_check``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from fastcheck._check import jacobians, run_check
from fastcheck.engine.config import INTERNAL_FIELDS, REMOVED_OPTIONS, CheckConfig
from fastcheck.problem.problem import function_problem, model_problem, supplied_problem
from fastcheck.report.results import GradientCheckError, GradientReport


def check_gradients(f: Callable, inputs, *, eps=None, atol=None, rtol=None, jit_compile="auto",
                    memory_budget=None, device=None, precision="auto", mode="auto", probes=4, seed=0,
                    order=1, progress=None, autodiff="auto", wrt=None, sparsity=None, **removed) -> GradientReport:
    """Compare autodiff Jacobians of ``f`` with batched central differences.

    Every floating or complex input is checked (complex ones as (real, imag)
    pairs); integer and bool inputs are passed through unperturbed.  An element
    passes when ``|analytical - numerical| <= atol + rtol * |numerical| + noise``
    and both are finite, where ``noise`` is the numerical side's own error
    estimate (rounding, and the Richardson estimate for refined columns).
    Every option, with an example of when to use it: docs/options.md.

    Args:
      f: callable taking the inputs positionally and returning a tensor or a
        nested list/tuple/dict of tensors.
      inputs: one tensor-like (tf.Tensor, tf.Variable, numpy array, Python
        number; Python floats become float64) or a list/tuple of them.
      eps: relative step; element ``j`` is perturbed by ``eps * max(1, |x_j|)`` (by ``eps`` where x_j is infinite).
        Default ``machine_epsilon ** (1/3)`` of the evaluation dtype.
      atol, rtol: tolerances; default from the table in ``config.py`` by the
        analytical dtype (float64: 1e-8, 1e-6; float32: 1e-5, 1e-4).
      jit_compile: "auto" (XLA when the batched work pays for compilation and f
        compiles), True or False.
      memory_budget: bytes the batched evaluations may use (default 1 GiB).
      device: where the check runs (default None: TensorFlow places it).  A
        device name such as ``"/GPU:0"`` pins the check to that device.  A
        list of device names such as ``["/GPU:0", "/GPU:1"]`` is shorthand for
        ``tf.distribute.MirroredStrategy(device)``.  A ``tf.distribute.Strategy``
        shares the batched evaluations (full mode's sweep and refinement,
        coloured mode) and the reverse-mode rows among its replicas: each chunk
        of perturbations is split over the replicas in order, so the verdicts
        are those of one device; the work per replica is logged at DEBUG.
        ``MirroredStrategy`` over local devices, or ``MultiWorkerMirroredStrategy``
        across hosts: every worker runs the same check, evaluates its replicas'
        shares and all-gathers the rest, so all print the same report (pin the
        choices a worker's free memory decides with ``mode=`` and ``jit_compile=``).  Each
        replica gets ``1/replicas`` of a chunk: raise ``memory_budget`` to give
        devices with their own memory more.  A device this machine lacks is a
        ``ValueError``.
      precision: "auto" evaluates the numerical side in float64 when f accepts
        float64 inputs, "native" never, "float64" always (error if f cannot).
      mode: "full" (whole Jacobians), "fast" (``probes`` random projections
        spanning every checked input at once, J d checked element by element
        against the reverse-mode gradient and u.J.d against one VJP, a failing
        projection localised to an input and a region of it), or "auto": full
        when the Jacobian fits ``memory_budget``, inputs have at most 200,000
        elements and the full check is predicted (from f's counted call cost
        and graph) to take at most 60 s; the report says which ran, and why.
        "coloured": element-wise verdicts on every structural nonzero of a
        sparse Jacobian from a few differences and VJPs (one per colour of its
        columns / rows); the pattern is ``sparsity`` or traced from f's graph.
      probes, seed: number of random probes in fast mode, and the seed of
        their private generator (global RNG state is never touched).
      order: 1 checks gradients; 2 checks gradients of gradients (Hessian-vector
        products for scalar f; the gradient of u.f for a fixed seeded u otherwise).
      progress: a progress bar for long sweeps: None shows one on a terminal when
        the sweep will take more than 2 s, True always, False never.
      autodiff: the analytical side: "auto" (reverse mode, the gradient training
        uses, with a forward-mode spot check), "reverse", "forward" or "both".
      wrt: which inputs to check (default: every floating one): positions, path
        tuples into structured inputs (``(0, 'dense', 'kernel')``) or report names
        (``"input 0['dense']"``).  Inputs may be any ``tf.nest`` structure (dicts,
        nested lists/tuples, namedtuples), ``tf.SparseTensor`` (values checked) or
        ``tf.RaggedTensor`` (flat values checked); unchecked ones reach f unchanged,
        Python ints and bools as Python numbers.
      sparsity: the Jacobian's sparsity pattern for ``mode="coloured"``: a
        boolean array [m, n] (m: f's flat outputs, n: the checked input's
        elements), index pairs ``(rows, cols)`` (a tuple of two integer arrays),
        a scipy.sparse-like matrix (anything with ``.tocoo()``), or a list of
        those, one per checked input.  Default: traced from f's graph.

    Returns:
      A ``GradientReport``; ``bool(report)`` tells whether every element passed.

    Raises:
      TypeError / ValueError: for misuse (not callable, no floating inputs, f
        raising at the inputs when planning calls it, output shapes changing
        under perturbation, ...).
      f's own exception (a class of the user's, or a builtin one such as
        RuntimeError raised in f's code) on any later call -- traced into a
        batched kernel or eagerly -- as itself, its traceback into f, with a note
        saying what fastcheck was doing; TensorFlow's errors and the TypeError /
        ValueError tracing raises keep their handling (a path falls back).

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> report = fastcheck.check_gradients(tf.sin, tf.constant([0.5, 1.0], tf.float64))
      >>> report.ok
      True
    """
    _refuse_removed(removed, "check_gradients")
    config = CheckConfig(eps, atol, rtol, jit_compile, memory_budget, device, precision, mode, probes, seed, order,
                         progress, autodiff, sparsity)
    return run_check(function_problem(f, inputs, config, wrt), config)


def _refuse_removed(options: dict, entry: str) -> None:
    """A TypeError naming a removed option and what replaces it, or any other unknown keyword."""
    for name in options:
        if name in REMOVED_OPTIONS:
            raise TypeError(f"{entry}() no longer takes {name}=: {REMOVED_OPTIONS[name]}.")
    if entry == "check_gradients" and options:
        raise TypeError(f"check_gradients() got unknown option(s) {', '.join(map(repr, sorted(options)))}.")


def checked_config(options: dict, entry: str) -> CheckConfig:
    """The configuration from keyword options, with a TypeError naming any unknown one."""
    _refuse_removed(options, entry)
    known = {field.name for field in dataclasses.fields(CheckConfig)} - INTERNAL_FIELDS
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"{entry}() got unknown option(s) {', '.join(map(repr, unknown))}; "
                        f"the options are {', '.join(sorted(known))}.")
    return CheckConfig(**options)


def assert_gradients_close(f: Callable, inputs, **options) -> GradientReport:
    """Like ``check_gradients``, but raise ``GradientCheckError`` (its message is the report) on failure.

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> _ = fastcheck.assert_gradients_close(tf.tanh, tf.constant([0.3], tf.float64))
    """
    report = check_gradients(f, inputs, **options)
    if not report.ok:
        raise GradientCheckError(report)
    return report


def numerical_jacobian(f: Callable, inputs, *, wrt=None, **options) -> list[list[np.ndarray | None]]:
    """Batched central-difference Jacobians: ``result[output][input]`` of shape (output_size, input_size).

    Outputs are the floating leaves of ``f``'s result in ``tf.nest.flatten``
    order; non-floating inputs get ``None``.  Options as for ``check_gradients``.
    """
    config = checked_config(options, "numerical_jacobian")
    return jacobians(function_problem(f, inputs, config, wrt), config, "numerical")


def autodiff_jacobian(f: Callable, inputs, *, wrt=None, **options) -> list[list[np.ndarray | None]]:
    """Autodiff Jacobians in the same layout as ``numerical_jacobian``."""
    config = checked_config(options, "autodiff_jacobian")
    return jacobians(function_problem(f, inputs, config, wrt), config, "analytical")


class GradientChecker:
    """Holds default options; every method accepts overrides of them.

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> checker = fastcheck.GradientChecker(rtol=1e-5)
      >>> checker.check(tf.exp, tf.constant([0.1], tf.float64)).ok
      True
    """

    def __init__(self, **defaults):
        self.config = checked_config(defaults, "GradientChecker")

    def _options(self, overrides) -> dict:
        return {**self.config.options(), **overrides}

    def check(self, f: Callable, inputs, **overrides) -> GradientReport:
        return check_gradients(f, inputs, **self._options(overrides))

    def assert_close(self, f: Callable, inputs, **overrides) -> GradientReport:
        return assert_gradients_close(f, inputs, **self._options(overrides))

    def verify_gradients(self, f: Callable, inputs, grads, **overrides) -> GradientReport:
        return verify_gradients(f, inputs, grads, **self._options(overrides))

    def check_model(self, model, loss_fn: Callable, data=None, *, variables=None, **overrides) -> GradientReport:
        return check_model(model, loss_fn, data, variables=variables, **self._options(overrides))



def verify_gradients(f: Callable, inputs, grads, **options) -> GradientReport:
    """Check gradients computed by hand against batched central differences.

    ``f`` returns a scalar; if it returns a tensor (or a structure of them), the
    sum of all its elements is the scalar. ``grads`` are the gradients of that
    scalar with respect to each input -- tensors/arrays with the inputs'
    structure and shapes -- or a callable taking the inputs and returning them.
    The rule and report are those of ``check_gradients``.

    Raises:
      ValueError / TypeError: when ``grads`` does not match the inputs (a wrong
        shape, a missing entry, a ``None``), naming the input.

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> x = tf.constant([1.0, 2.0], tf.float64)
      >>> fastcheck.verify_gradients(lambda x: tf.reduce_sum(x ** 2), x, 2 * x).ok
      True
    """
    config = checked_config(options, "verify_gradients")
    return run_check(supplied_problem(f, inputs, grads, config), config)


def check_model(model, loss_fn, data=None, *, variables=None, training: bool = False, sample_weight=None,
                **options) -> GradientReport:
    """Check the gradient of ``loss_fn(y, model(x, training=training))`` w.r.t. the model's variables.

    One report pair per variable (``model.trainable_variables``, or ``variables``),
    named by the variable's path.  Works for Keras 3 models (via
    ``stateless_call``), tf_keras models and ``tf.Module``s; perturbations of
    variable values are batched and no variable is ever assigned: every value is
    bit-for-bit the same afterwards, even when the check raises.

    With ``training=True`` the loss is the training step's: every evaluation
    draws the same dropout mask (Keras 3 seed-generator states are passed
    unchanged, tf_keras random layers draw from a stateless generator with a
    fixed seed), batch normalization uses the batch's statistics, and moving
    statistics and seed states are restored bit for bit.  A model with no
    training behaviour gets the training=False check, with a note saying so; a
    random op the check cannot hold fixed makes the verdict undecidable, with
    the reason.

    Args:
      model: the model or module.
      loss_fn: ``loss_fn(y_true, y_pred)`` (a function or a Keras loss object)
        returning a scalar (or a tensor, summed), or a Keras loss name (``"mse"``,
        ``"categorical_crossentropy"``, resolved with ``keras.losses.get``).  For a
        model with several outputs: one loss for all, or a list (output order) or
        dict (output names) of them; the per-output losses are summed.
      data: a pair ``(x, y)``; ``x`` a tensor or a list/dict of them for a model
        with several inputs, ``y`` a list/dict for one with several outputs.  Omitted
        (``None``): ``loss_fn`` takes no arguments and computes the loss itself
        (GPflow's ``model.training_loss`` or ``model.training_loss_closure(data)``),
        for any ``tf.Module`` (callable or not); the pairs are named by where the
        module keeps each variable (``likelihood.variance``), a GPflow ``Parameter``
        checked in its unconstrained variable, as training's ``tape.gradient`` sees it.
      variables: the variables to check (default: all trainable ones).
      training: call the model as a training step does (dropout, batch statistics).
      sample_weight: per-sample weights passed to the loss as Keras does (a list or
        dict of them for several outputs).
      **options: as for ``check_gradients``.

    Raises:
      TypeError / ValueError: for misuse (data not a pair, an unknown loss name,
        losses or targets that do not match the model's outputs, a variable that
        is not the model's, ``training=True`` for a module without a training mode).
    """
    config = checked_config(options, "check_model")
    problem = model_problem(model, loss_fn, data, variables, config, training=training, sample_weight=sample_weight)
    return run_check(problem, config)
