"""Gradient checks for TensorFlow Probability bijectors and distributions.

    from fastcheck.tfp import check_bijector, check_distribution

``check_bijector`` checks a bijector's forward Jacobian, its ``forward_log_det_jacobian`` against the
log-determinant of the *numerical* Jacobian of ``forward`` (in TFP's own coordinates where the input or output is
a constrained set: a Cholesky factor's lower triangle, a simplex without its last element), the inverse
identities, and the gradient of the log-det-Jacobian.  ``check_distribution`` checks the gradients of
``log_prob`` and, for a reparameterized distribution, of ``sample`` at a fixed stateless seed.

TensorFlow Probability is imported when a check runs, not when this module is.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from fastcheck._api import checked_config, numerical_jacobian
from fastcheck._check import run_check
from fastcheck.engine.config import MACHINE_EPSILON, precision_name
from fastcheck.engine.plan import normalize_inputs
from fastcheck.judge.compare import allowance
from fastcheck.problem.problem import function_problem
from fastcheck.report.events import IdentitiesJudged, LogDetConvention, SampleNotChecked, SampleSeeded
from fastcheck.report.notes import compose
from fastcheck.report.results import GradientReport, event_dict
from fastcheck.report.text import VERDICT_LABELS

__all__ = ["BijectorReport", "IdentityCheck", "check_bijector", "check_distribution"]

# Options that shape the numerical Jacobian behind the log-det identity (the others are the checks').
_JACOBIAN_OPTIONS = ("eps", "jit_compile", "memory_budget", "device", "precision")

# Ops of samplers whose gradient is implicit (see check_distribution): a fixed-seed quotient is not their derivative.
_IMPLICIT_SAMPLER_OPS = ("Gamma", "ParameterizedTruncatedNormal", "Poisson", "Binomial")


@dataclasses.dataclass
class IdentityCheck:
    """One identity a bijector must satisfy, checked element by element (or per batch member).

    ``verdict`` is "pass", "fail" (the bijector's side is wrong), or "undecidable" (the reference side is not
    finite).  The worst element is the one with the largest ``|actual - expected| / allowed``.
    """

    name: str  # the identity, e.g. "forward_log_det_jacobian(x) = log|det J|"
    verdict: str
    actual_name: str
    expected_name: str
    where: str  # "batch member" or "element"
    index: tuple | None = None
    actual: float = 0.0
    expected: float = 0.0
    abs_error: float = 0.0
    allowed: float = 0.0
    failed: int = 0
    size: int = 0

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"

    def __str__(self) -> str:
        label = VERDICT_LABELS[self.verdict]
        at = f"{self.where} {self.index}" if self.index is not None else "the point"
        values = (f"{self.actual_name}={self.actual:.8g}, {self.expected_name}={self.expected:.8g}, "
                  f"|diff|={self.abs_error:.3g}, allowed={self.allowed:.3g}")
        if self.ok:
            return f"{self.name}: ok (worst at {at}: {values})"
        why = "" if self.verdict == "fail" else " (the reference value is not finite: check at a point inside the domain)"
        return f"{self.name}: {label} at {at}: {values}; {self.failed} of {self.size} fail{why}"

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update({key: float(out[key]) for key in ("actual", "expected", "abs_error", "allowed")})
        out.update({key: int(out[key]) for key in ("failed", "size")})
        out["ok"] = self.ok
        out["index"] = list(self.index) if self.index is not None else None
        return out


@dataclasses.dataclass
class BijectorReport:
    """What ``check_bijector`` found: two gradient checks and three identities.

    ``forward`` checks the Jacobian of ``forward``; ``log_det_gradient`` the gradient of
    ``forward_log_det_jacobian``; ``identities`` the log-det-Jacobian against the numerical Jacobian's,
    ``inverse(forward(x)) = x`` and ``inverse_log_det_jacobian(y) = -forward_log_det_jacobian(x)``.
    ``bool(report)`` is ``report.ok``.

    ``convention`` says how the log-det-Jacobian was judged: ``"square"`` (``forward``'s own Jacobian is square),
    ``"chart"`` (TFP's coordinates of a constrained input or output, named in ``chart``), or ``"volume"`` (an
    event-size-changing bijector with no known chart: ``0.5 log det(J^T J)``).  ``mode`` is the checked side of the
    gradient checks (``GradientReport.mode``); ``timings`` the seconds per stage summed over both gradient checks,
    plus ``jacobian`` (the numerical Jacobian behind the log-det identity) and ``identities``.
    """

    title: str
    forward: GradientReport
    log_det_gradient: GradientReport
    identities: list[IdentityCheck]
    events: tuple = ()  # what the check found (``fastcheck.report.events``: IdentitiesJudged, LogDetConvention)
    convention: str = "square"
    chart: str = ""  # the coordinates, when convention == "chart"
    timings: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def notes(self) -> list[str]:
        """The events as the report's notes (composed by ``text``, as a GradientReport's are)."""
        return [compose(event) for event in self.events]

    @property
    def reports(self) -> list[GradientReport]:
        return [self.forward, self.log_det_gradient]

    @property
    def mode(self) -> str:
        """The checked side of both gradient checks (e.g. "reverse"), or "forward Jacobian: a, log-det gradient: b"."""
        modes = [r.mode for r in self.reports]
        return modes[0] if len(set(modes)) == 1 else f"forward Jacobian: {modes[0]}, log-det gradient: {modes[1]}"

    @property
    def seconds(self) -> float:
        return float(sum(self.timings.values()))

    @property
    def verdict(self) -> str:
        """"pass", "fail" (a gradient or an identity is wrong), or "undecidable"."""
        verdicts = [r.verdict for r in self.reports] + [i.verdict for i in self.identities]
        return "fail" if "fail" in verdicts else "undecidable" if "undecidable" in verdicts else "pass"

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"

    def __bool__(self) -> bool:
        return self.ok

    @property
    def failures(self) -> list:
        """The failing gradient reports and identities."""
        return [r for r in self.reports if not r.ok] + [i for i in self.identities if not i.ok]

    def __repr__(self) -> str:
        label = VERDICT_LABELS[self.verdict]
        failing = self.failures
        first = "" if not failing else f", first: {getattr(failing[0], 'title', None) or failing[0].name}"
        return f"<BijectorReport {label}: {len(failing)} of {len(self.reports) + len(self.identities)} checks failed{first}>"

    def __str__(self) -> str:
        label = VERDICT_LABELS[self.verdict]
        lines = [f"fastcheck {self.title}: {label} -- {len(self.failures)} of "
                 f"{len(self.reports) + len(self.identities)} checks failed"]
        for report in self.reports:
            lines.append(f"  {report.title.split(': ', 1)[-1]}: {'ok' if report.ok else report.verdict.upper()}, "
                         f"max abs error {report.max_abs_error:.3g}")
        lines += [f"  {identity}" for identity in self.identities]
        lines += [f"  note: {note}" for note in self.notes]
        for report in self.reports:
            if not report.ok:
                lines += ["", str(report)]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"title": self.title, "ok": self.ok, "verdict": self.verdict, "mode": self.mode,
                "convention": self.convention, "chart": self.chart, "seconds": self.seconds,
                "timings": {stage: float(seconds) for stage, seconds in self.timings.items()},
                "forward": self.forward.to_dict(), "log_det_gradient": self.log_det_gradient.to_dict(),
                "identities": [i.to_dict() for i in self.identities], "notes": list(self.notes),
                "events": [event_dict(event) for event in self.events]}


def check_bijector(bijector, x, event_ndims: int, **options) -> BijectorReport:
    """Check a TensorFlow Probability bijector's gradients and its log-det-Jacobian at ``x``.

    Four checks:

    1. the Jacobian of ``forward`` (``fastcheck.check_gradients``);
    2. ``forward_log_det_jacobian(x, event_ndims)`` against ``log|det J|`` of the numerical Jacobian of ``forward``
       over each batch member's event (for ``event_ndims=0`` the elementwise ``log|dy/dx|``), allowed
       ``atol + rtol * |log|det J|| + ||J^-1||_F ||atol + rtol |J|||_F`` per member (the log-determinant of any
       Jacobian inside the element-wise tolerance band).  Where TFP defines the log-det in coordinates of a
       constrained input or output (``report.convention == "chart"``), ``J`` is the square block of those
       coordinates, as TFP's own ``get_fldj_theoretical`` tests compute it: ``CorrelationCholesky`` the output's
       strictly lower triangle, ``IteratedSigmoidCentered`` / ``SoftmaxCentered`` the output without its last
       element, ``FillTriangular`` / ``FillScaleTriL`` the output's lower triangle, ``CholeskyOuterProduct`` /
       ``CholeskyToInvCholesky`` / ``MatrixInverseTriL`` the lower triangles of both (subclasses, ``Invert`` and
       the ends of a ``Chain`` inherit them).  Another bijector that changes the event size is judged by the
       volume ``0.5 log det(J^T J)`` (``"volume"``), with a note;
    3. ``inverse(forward(x)) = x`` and ``inverse_log_det_jacobian(forward(x)) = -forward_log_det_jacobian(x)``,
       allowing ``atol + rtol * |value|`` plus the rounding of ``y`` carried through the inverse;
    4. the gradient of ``forward_log_det_jacobian`` with respect to ``x``.

    Every call gets fresh tensors (TFP caches results per tensor object, which
    would make the identities hold by construction).

    Args:
      bijector: a ``tfp.bijectors.Bijector`` acting on one tensor.
      x: the point (a floating tensor-like) of shape ``batch_shape + event_shape``.
      event_ndims: the number of rightmost dimensions of ``x`` that form one event,
        at least ``bijector.forward_min_event_ndims``.
      **options: as for ``fastcheck.check_gradients`` (``atol``/``rtol`` also set the
        identities' tolerances; the defaults follow ``x``'s dtype).

    Returns:
      A ``BijectorReport``; ``bool(report)`` tells whether everything passed, and
      ``str(report)`` names any failing identity, by how much and at which element.

    Raises:
      TypeError: ``x`` not floating, ``event_ndims`` not an integer.
      ValueError: ``event_ndims`` larger than ``x``'s rank or smaller than the bijector's minimum, ``x`` not of
        the bijector's dtype, ``forward`` failing on ``x``, or ``x`` not lower-triangular for a bijector of
        lower-triangular matrices.

    Example:
      >>> import tensorflow_probability as tfp
      >>> from fastcheck.tfp import check_bijector
      >>> check_bijector(tfp.bijectors.Softplus(), [0.5, -1.0, 2.0], event_ndims=0).ok
      True
    """
    config = checked_config(options, "check_bijector")
    _tfp()
    x = normalize_inputs([x])[0].value
    if not x.dtype.is_floating:
        raise TypeError(f"x must be floating (a bijector maps real numbers); got {x.dtype.name}.")
    name = type(bijector).__name__
    in_ndims, out_ndims = _event_ndims(bijector, x, event_ndims)
    title = f"check_bijector ({name}, event_ndims={in_ndims})"
    dtype = getattr(bijector, "dtype", None)
    if dtype is not None and tf.as_dtype(dtype) != x.dtype:
        raise ValueError(f"x is {x.dtype.name} but {name} computes in {tf.as_dtype(dtype).name} (its parameters' "
                         f"dtype): pass x as {tf.as_dtype(dtype).name}, or build the bijector with {x.dtype.name} "
                         "parameters.")
    try:
        y = bijector.forward(tf.identity(x))
    except Exception as error:
        raise ValueError(f"{name}.forward failed on x of shape {tuple(x.shape)} ({type(error).__name__}: "
                         f"{str(error).splitlines()[0]}); pass x whose last {in_ndims} dimension(s) form an event the "
                         "bijector accepts.") from error
    batch_shape = tuple(x.shape[: x.shape.rank - in_ndims])
    if tuple(y.shape[: len(batch_shape)]) != batch_shape:
        raise ValueError(f"{name}.forward maps x of shape {tuple(x.shape)} to shape {tuple(y.shape)}: the bijector's "
                         f"batch shape broadcasts x's batch shape {batch_shape}; pass x with the full batch shape, e.g. "
                         f"x of shape {tuple(y.shape[: y.shape.rank - out_ndims]) + tuple(x.shape[len(batch_shape):])}.")

    chart_in = _charts(bijector)[0]
    upper = _chart_mask("lower", tuple(x.shape[len(batch_shape):])) if chart_in in ("lower", "strictly lower") else None
    if upper is not None:
        outside = np.abs(x.numpy().reshape(-1, upper.size)[:, ~upper]).max(initial=0.0)
        if outside > 0:
            raise ValueError(f"{name} acts on lower-triangular matrices, but x has entries up to {outside:.3g} above "
                             "the diagonal (forward ignores them, inverse returns zeros there): pass x "
                             "lower-triangular, e.g. tf.linalg.band_part(x, -1, 0).")
    forward = dataclasses.replace(function_problem(lambda t: bijector.forward(tf.identity(t)), x, config),
                                  title=f"{title}: forward Jacobian")
    log_det = dataclasses.replace(
        function_problem(lambda t: bijector.forward_log_det_jacobian(tf.identity(t), event_ndims=in_ndims), x, config),
        title=f"{title}: gradient of forward_log_det_jacobian")
    forward_report, log_det_report = run_check(forward, config), run_check(log_det, config)

    atol, rtol = config.tolerances(precision_name(x.dtype))
    started = time.perf_counter()
    jacobians = _member_jacobians(bijector, x, batch_shape, options)
    jacobian_seconds = time.perf_counter() - started
    started = time.perf_counter()
    event_in, event_out = tuple(x.shape[len(batch_shape):]), tuple(y.shape[len(batch_shape):])
    convention, chart, chart_jacobians = _in_chart(bijector, jacobians, x, event_in, event_out)
    parts = [chart_jacobians]
    stages = _chart_stages(bijector)
    if stages:  # a Chain's log-det is its stages' sum, each in its own convention
        parts, described, value = [], [], x
        for stage in stages:
            moved = stage.forward(tf.identity(value))
            stage_jacobians = _member_jacobians(stage, value, batch_shape, options)
            kind, words, stage_jacobians = _in_chart(stage, stage_jacobians, value, tuple(value.shape[len(batch_shape):]),
                                                     tuple(moved.shape[len(batch_shape):]))
            parts.append(stage_jacobians)
            described.append(f"{type(stage).__name__}: {words or kind}")
            convention = "volume" if kind == "volume" else convention if convention == "volume" else "chart"
            value = moved
        chart = "stage by stage, summed as Chain sums its stages' log-dets: " + "; ".join(described)
        jacobian_seconds = time.perf_counter() - started + jacobian_seconds
        started = time.perf_counter()
    fldj = _broadcast(bijector.forward_log_det_jacobian(tf.identity(x), event_ndims=in_ndims), batch_shape)
    identities = [_log_det_identity(fldj, parts, atol, rtol, batch_shape, convention, chart),
                  *_inverse_identities(bijector, x, y, fldj, chart_jacobians, in_ndims, out_ndims, atol, rtol,
                                       batch_shape)]
    given = options.get("atol") is not None or options.get("rtol") is not None
    found: list = [IdentitiesJudged(float(atol), float(rtol), given, x.dtype.name)]
    if convention == "chart":
        found.append(LogDetConvention(name, "chart", chart))
    elif convention == "volume":
        found.append(LogDetConvention(name, "volume", sizes=(int(np.prod(event_in)), int(np.prod(event_out)))))
    timings: dict[str, float] = {}
    for report in (forward_report, log_det_report):
        for stage, seconds in report.timings.items():
            timings[stage] = timings.get(stage, 0.0) + float(seconds)
    timings["jacobian"] = jacobian_seconds
    timings["identities"] = time.perf_counter() - started
    return BijectorReport(title, forward_report, log_det_report, identities, tuple(found), convention, chart, timings)


def check_distribution(make_distribution: Callable, params, x=None, *, seed: int = 0, **options) -> GradientReport:
    """Check the gradients of a distribution's ``log_prob`` (and ``sample``) w.r.t. its parameters.

    ``make_distribution(*params)`` builds the distribution.  Checked outputs: ``log_prob(x)`` with respect to every
    floating parameter and, when given and floating, ``x``; and, for a ``FULLY_REPARAMETERIZED`` distribution,
    ``sample`` drawn with the stateless seed ``(seed, 0)``, so that every evaluation uses the same noise.  Samplers
    whose gradient is implicit (Gamma, Beta, Dirichlet, StudentT, TruncatedNormal: it holds the CDF fixed, not the
    noise) or custom are not differentiable at a fixed seed; their ``sample`` is left out, with a note.

    Args:
      make_distribution: a callable taking the parameters positionally, e.g.
        ``tfp.distributions.Normal`` or ``lambda loc, scale: tfd.Normal(loc, scale)``.
      params: one parameter or a list of them (tensor-likes; Python floats become float64).
      x: where ``log_prob`` is evaluated; default a sample drawn with the seed.
      seed: the stateless sampling seed (fast mode's probe seed keeps its default).
      **options: as for ``fastcheck.check_gradients``.

    Returns:
      A ``GradientReport`` with outputs ``log_prob`` (and ``sample``).

    Raises:
      TypeError: ``make_distribution`` not callable.

    Example:
      >>> import tensorflow_probability as tfp
      >>> from fastcheck.tfp import check_distribution
      >>> check_distribution(tfp.distributions.Normal, [0.5, 2.0], x=1.5).ok
      True
    """
    if not callable(make_distribution):
        raise TypeError(f"make_distribution must be callable as make_distribution(*params), e.g. "
                        f"tfp.distributions.Normal; got {type(make_distribution).__name__}.")
    config = checked_config(options, "check_distribution")
    tfp = _tfp()
    params = list(params) if isinstance(params, (list, tuple)) else [params]
    values = [spec.value for spec in normalize_inputs(params)]
    stateless_seed = tf.constant([seed, 0], tf.int32)
    distribution = make_distribution(*values)
    name = type(distribution).__name__
    hint = distribution.dtype if isinstance(distribution.dtype, tf.DType) else None
    fixed_x = distribution.sample(seed=stateless_seed) if x is None else tf.convert_to_tensor(x, dtype_hint=hint)
    x_checked = x is not None and fixed_x.dtype.is_floating
    notes: tuple = ()
    sample = distribution.reparameterization_type == tfp.distributions.FULLY_REPARAMETERIZED
    if not sample:
        notes += (SampleNotChecked(name, "not reparameterized"),)
    elif (why := _implicit_sampler(make_distribution, values, stateless_seed)) is not None:
        sample = False
        notes += (SampleNotChecked(name, "implicit", why),)
    else:
        notes += (SampleSeeded(seed),)

    def outputs(*args):
        distribution = make_distribution(*args[: len(values)])
        result = {"log_prob": distribution.log_prob(args[len(values)] if x_checked else fixed_x)}
        if sample:
            result["sample"] = distribution.sample(seed=stateless_seed)
        return result

    inputs = [*values, fixed_x] if x_checked else values
    problem = function_problem(outputs, inputs, config)
    names = [f"param {i}" for i in range(len(values))] + (["x"] if x_checked else [])
    problem = dataclasses.replace(problem, title=f"check_distribution ({name})", names=names, notes=notes)
    return run_check(problem, config)


def _tfp():
    try:
        import tensorflow_probability as tfp
    except ImportError as error:  # pragma: no cover - a dependency of fastcheck
        raise ImportError("fastcheck.tfp needs TensorFlow Probability: pip install 'tensorflow-probability[tf]'.") from error
    return tfp


def _event_ndims(bijector, x: tf.Tensor, event_ndims) -> tuple[int, int]:
    """(input, output) event ndims, with errors that name the fix."""
    name = type(bijector).__name__
    if isinstance(event_ndims, bool) or not isinstance(event_ndims, (int, np.integer)):
        raise TypeError(f"event_ndims must be an integer (check_bijector takes one tensor x); got {event_ndims!r}.")
    rank = x.shape.rank
    minimum = bijector.forward_min_event_ndims
    if not isinstance(minimum, (int, np.integer)):
        raise TypeError(f"{name} acts on a structure of tensors (forward_min_event_ndims={minimum!r}); check_bijector "
                        "checks bijectors of one tensor.")
    if event_ndims < minimum:
        raise ValueError(f"{name} acts on events of at least {minimum} dimension(s) (forward_min_event_ndims="
                         f"{minimum}), so event_ndims={event_ndims} is too small: pass event_ndims={minimum} (or more) "
                         f"with x of rank >= {minimum}.")
    if event_ndims > rank:
        raise ValueError(f"event_ndims={event_ndims} but x has rank {rank} (shape {tuple(x.shape)}): an event cannot "
                         f"have more dimensions than x; pass event_ndims <= {rank}, or an x with the event's shape.")
    out = bijector.forward_event_ndims(int(event_ndims)) if hasattr(bijector, "forward_event_ndims") else event_ndims
    return int(event_ndims), int(out)


def _member_jacobians(bijector, x: tf.Tensor, batch_shape: tuple, options: dict) -> np.ndarray:
    """The numerical Jacobian of ``forward`` of each batch member over its event: [B, event_out, event_in].

    A member's output depends on its own event only, so one perturbation of an event element moves that element of
    every member at once: the Jacobian of ``d -> forward(x + max(1, |x|) d)`` at ``d = 0`` (2 * event_in
    evaluations, whatever the batch size) stacks every member's block, with its columns scaled by ``max(1, |x|)``
    (the step fastcheck takes for x itself)."""
    scale = tf.maximum(tf.ones_like(x), tf.abs(x))
    event_shape = tuple(x.shape[len(batch_shape):])

    def moved(d):
        return bijector.forward(tf.cast(x, d.dtype) + tf.cast(scale, d.dtype) * d)

    jacobian_options = {k: v for k, v in options.items() if k in _JACOBIAN_OPTIONS}
    block = numerical_jacobian(moved, tf.zeros(event_shape, x.dtype), **jacobian_options)[0][0]
    members = int(np.prod(batch_shape, dtype=np.int64))
    event_in = int(np.prod(event_shape, dtype=np.int64))
    stacked = np.asarray(block, np.float64).reshape(members, -1, event_in)
    return stacked / scale.numpy().astype(np.float64).reshape(members, 1, event_in)


# (class name, input chart, output chart); "all" is every element.  TFP's coordinates for bijectors whose input or
# output is a constrained set of lower dimension than its array: the selections through which TFP's tests compute
# get_fldj_theoretical (correlation_cholesky_test's OutputToUnconstrained, matrix_inverse_tril_test's and
# cholesky_outer_product's Invert(FillTriangular), iterated_sigmoid_centered_test's dropped last element).
_CHARTS = (
    ("CorrelationCholesky", "all", "strictly lower"),
    ("IteratedSigmoidCentered", "all", "all but the last"),
    ("SoftmaxCentered", "all", "all but the last"),
    ("FillScaleTriL", "all", "lower"),
    ("FillTriangular", "all", "lower"),
    ("CholeskyOuterProduct", "lower", "lower"),
    ("CholeskyToInvCholesky", "lower", "lower"),
    ("MatrixInverseTriL", "lower", "lower"),
)
_CHART_WORDS = {"all": "all elements", "lower": "the lower-triangular elements (diagonal included)",
                "strictly lower": "the strictly lower-triangular elements",
                "all but the last": "all but the last element"}


def _charts(bijector) -> tuple[str, str]:
    """(input chart, output chart) of a bijector: its class's (a subclass inherits them), swapped for
    ``Invert``, and for a ``Chain`` the first stage's input chart and the last stage's output chart
    (looking through stages with no chart that keep the event's rank: elementwise ones)."""
    names = [cls.__name__ for cls in type(bijector).__mro__]
    for name, chart_in, chart_out in _CHARTS:
        if name in names:
            return chart_in, chart_out
    if "_Invert" in names and getattr(bijector, "bijector", None) is not None:
        chart_in, chart_out = _charts(bijector.bijector)
        return chart_out, chart_in
    if "_Chain" in names:
        stages = list(reversed(bijector.bijectors))  # in the order they are applied

        def first(stages, side):
            for stage in stages:
                charts = _charts(stage)
                if charts[side] != "all":
                    return charts[side]
                if charts != ("all", "all") or stage.forward_min_event_ndims != stage.inverse_min_event_ndims:
                    return "all"
            return "all"

        return first(stages, 0), first(reversed(stages), 1)
    return "all", "all"


def _stages(bijector) -> list:
    """A Chain's stages in the order they are applied (nested Chains flattened); [bijector] otherwise."""
    names = [cls.__name__ for cls in type(bijector).__mro__]
    if "_Chain" in names and not any(name in names for name, _, _ in _CHARTS):
        return [inner for stage in reversed(bijector.bijectors) for inner in _stages(stage)]
    return [bijector]


def _chart_stages(bijector) -> list | None:
    """A Chain's stages when one has a chart or changes the event's rank (TFP then sums log-dets each in
    its own convention, which no one chart of the whole map reproduces); None otherwise."""
    stages = _stages(bijector)
    special = [stage for stage in stages if _charts(stage) != ("all", "all")
               or stage.forward_min_event_ndims != stage.inverse_min_event_ndims]
    return stages if len(stages) > 1 and special else None


def _chart_mask(chart: str, event_shape: tuple) -> np.ndarray | None:
    """The elements of an event a chart keeps (a flat boolean mask), None where it does not apply."""
    mask = np.ones(event_shape, bool)
    if chart == "all":
        return mask.reshape(-1)
    if chart in ("lower", "strictly lower"):
        if len(event_shape) < 2 or event_shape[-1] != event_shape[-2]:
            return None
        rows, cols = np.indices(event_shape[-2:])
        mask &= rows > cols if chart == "strictly lower" else rows >= cols
    elif chart == "all but the last":
        if not event_shape or event_shape[-1] < 1:
            return None
        mask[..., -1] = False
    return mask.reshape(-1)


def _embedding(chart: str, x_events: np.ndarray, event_shape: tuple) -> np.ndarray:
    """[B, event size, chart size]: d x / d u of the map from a chart's coordinates u back to x.

    "all" and "lower" (the upper triangle ignored, held at zero) select coordinates; "strictly lower" is a
    correlation matrix's Cholesky factor (each diagonal entry ``sqrt(1 - sum of its row's others squared)``),
    "all but the last" a simplex point (the last element ``1 - sum of the others``): determined elements move with u."""
    kept = _chart_mask(chart, event_shape)
    assert kept is not None, chart  # callers pass a chart that applies to the event
    members, size = x_events.shape[0], kept.size
    embedding = np.zeros((members, size, int(kept.sum())))
    embedding[:, np.flatnonzero(kept), np.arange(int(kept.sum()))] = 1.0
    if chart == "strictly lower":
        n = event_shape[-1]
        values = x_events.reshape(members, -1, n, n)
        for column, flat in enumerate(np.flatnonzero(kept)):
            lead, rest = divmod(int(flat), n * n)
            i, j = divmod(rest, n)
            diagonal = lead * n * n + i * n + i
            with np.errstate(all="ignore"):
                embedding[:, diagonal, column] = -values[:, lead, i, j] / values[:, lead, i, i]
    elif chart == "all but the last":
        n = event_shape[-1]
        for column, flat in enumerate(np.flatnonzero(kept)):
            embedding[:, (int(flat) // n) * n + n - 1, column] = -1.0
    return embedding


def _in_chart(bijector, jacobians: np.ndarray, x: tf.Tensor, event_in: tuple,
              event_out: tuple) -> tuple[str, str, np.ndarray]:
    """(convention, chart description, the Jacobians the log-det identity uses): forward's own Jacobians ("square"),
    in TFP's coordinates ("chart": the rows of the output's chart, times the embedding of the input's chart), or, for
    an event-size-changing bijector with no known chart, the full rectangular Jacobians ("volume")."""
    chart_in, chart_out = _charts(bijector)
    rows, cols = _chart_mask(chart_out, event_out), _chart_mask(chart_in, event_in)
    if (chart_in, chart_out) != ("all", "all") and rows is not None and cols is not None and rows.sum() == cols.sum():
        described = f"{_CHART_WORDS[chart_in]} of x to {_CHART_WORDS[chart_out]} of forward(x)"
        x_events = x.numpy().astype(np.float64).reshape(jacobians.shape[0], -1)
        return "chart", described, jacobians[:, rows] @ _embedding(chart_in, x_events, event_in)
    return ("square" if jacobians.shape[1] == jacobians.shape[2] else "volume"), "", jacobians


def _log_det(jacobians: np.ndarray) -> np.ndarray:
    """log|det J| per member; 0.5 log det(J^T J) (the volume change) when J is not square."""
    if jacobians.shape[1] == jacobians.shape[2]:
        return np.linalg.slogdet(jacobians)[1]
    gram = np.einsum("bij,bik->bjk", jacobians, jacobians)
    return 0.5 * np.linalg.slogdet(gram)[1]


def _inverse_norms(jacobians: np.ndarray) -> np.ndarray:
    """||J^+||_F per member (inf for a singular J)."""
    with np.errstate(all="ignore"):
        try:
            return np.linalg.norm(np.linalg.pinv(jacobians), axis=(1, 2))
        except np.linalg.LinAlgError:
            return np.full(len(jacobians), np.inf)


def _log_det_identity(fldj: np.ndarray, parts: list, atol: float, rtol: float,
                      batch_shape: tuple, convention: str = "square", chart: str = "") -> IdentityCheck:
    """``parts``: the Jacobians whose log-dets add up (one; or a Chain's stages, each in its chart)."""
    numerical = np.sum([_log_det(jacobians) for jacobians in parts], axis=0)
    carried = np.sum([_inverse_norms(jacobians) * np.linalg.norm(allowance(jacobians, atol, rtol), axis=(1, 2))
                      for jacobians in parts], axis=0)
    allowed = allowance(numerical, atol, rtol, carried)
    name = "forward_log_det_jacobian(x) = log|det J| of the numerical Jacobian J of forward"
    if convention == "chart":
        name += f" in TFP's chart ({chart})"
    elif convention == "volume":
        name = ("forward_log_det_jacobian(x) = log|det J| as the volume 0.5 log det(J^T J) of the numerical "
                "Jacobian J of forward (no TFP chart known)")
    return _judge(name, "forward_log_det_jacobian", fldj.reshape(-1), "numerical log|det J|", numerical, allowed,
                  batch_shape, "batch member")


def _inverse_identities(bijector, x, y, fldj, jacobians, in_ndims, out_ndims, atol, rtol, batch_shape):
    eps = MACHINE_EPSILON[x.dtype]
    members = len(jacobians)
    y_values = y.numpy().astype(np.float64).reshape(members, -1)
    # y itself is rounded (to 4 eps): the inverse carries that through J^-1.
    carried = _inverse_norms(jacobians) * 4 * eps * np.max(np.abs(y_values), axis=1, initial=0.0)
    x_values = x.numpy().astype(np.float64).reshape(members, -1)
    back = bijector.inverse(tf.identity(y)).numpy().astype(np.float64).reshape(members, -1)
    allowed = allowance(x_values, atol, rtol, carried[:, None])
    event_shape = tuple(x.shape[len(batch_shape):])
    inverse = _judge("inverse(forward(x)) = x", "inverse(forward(x))", back.reshape(-1), "x", x_values.reshape(-1),
                     allowed.reshape(-1), batch_shape + event_shape, "element")

    fresh = tf.identity(y)
    with tf.GradientTape() as tape:
        tape.watch(fresh)
        ildj = bijector.inverse_log_det_jacobian(fresh, event_ndims=out_ndims)
    slope = tape.gradient(ildj, fresh)
    ildj_values = _broadcast(ildj, batch_shape).reshape(-1)
    # The rounding of y carried through d ildj / dy, summed over the event.
    carried = (np.zeros(members) if slope is None else
               np.sum(np.abs(slope.numpy().astype(np.float64).reshape(members, -1)) * 4 * eps * np.abs(y_values), axis=1))
    expected = -fldj.reshape(-1)
    log_det = _judge("inverse_log_det_jacobian(forward(x)) = -forward_log_det_jacobian(x)",
                     "inverse_log_det_jacobian", ildj_values, "-forward_log_det_jacobian", expected,
                     allowance(expected, atol, rtol, carried), batch_shape, "batch member")
    return [inverse, log_det]


def _broadcast(value: tf.Tensor, batch_shape: tuple) -> np.ndarray:
    """A log-det-Jacobian (constant ones may come unbroadcast, e.g. a scalar) over the batch."""
    return np.broadcast_to(np.asarray(value, np.float64), batch_shape).copy()


def _judge(name: str, actual_name: str, actual: np.ndarray, expected_name: str, expected: np.ndarray,
           allowed: np.ndarray, shape: tuple, where: str) -> IdentityCheck:
    """The verdict of ``|actual - expected| <= allowed`` (both finite), element by element."""
    with np.errstate(all="ignore"):
        error = np.abs(actual - expected)
        reference_bad = ~np.isfinite(expected)
        wrong = ~reference_bad & (~np.isfinite(actual) | ~(error <= allowed))
        ratio = np.where(np.isfinite(error), error / np.maximum(allowed, np.finfo(np.float64).tiny), np.inf)
    if wrong.any():
        worst = int(np.flatnonzero(wrong)[np.argmax(ratio[wrong])])
    elif reference_bad.any():
        worst = int(np.flatnonzero(reference_bad)[0])
    else:
        worst = int(np.argmax(ratio)) if ratio.size else 0
    verdict = "fail" if wrong.any() else "undecidable" if reference_bad.any() else "pass"
    index = tuple(int(i) for i in np.unravel_index(worst, shape)) if shape else ()
    return IdentityCheck(name, verdict, actual_name, expected_name, where, index, float(actual[worst]),
                         float(expected[worst]), float(error[worst]), float(allowed[worst]), int((wrong | reference_bad).sum()),
                         int(actual.size))


def _implicit_sampler(make_distribution: Callable, values: list, seed: tf.Tensor) -> str | None:
    """Why ``sample`` is not the derivative of a fixed-noise transform (None: it is)."""
    try:
        graph = tf.function(lambda *p: make_distribution(*p).sample(seed=seed)).get_concrete_function(
            *[tf.TensorSpec(v.shape, v.dtype) for v in values]).graph.as_graph_def()
    except Exception:  # a sampler that does not trace: judged by its reparameterization type alone
        return None
    nodes = [*graph.node, *[node for function in graph.library.function for node in function.node_def]]
    for node in nodes:
        if any(op in node.op for op in _IMPLICIT_SAMPLER_OPS):
            return f"uses op {node.op}"
    for node in graph.node:
        # A custom gradient inside the sampler (TFP's implicit gradients, e.g. VonMises); one on the
        # parameters, built before sample's name scope, is the user's and is checked.
        if "_gradient_op_type" in node.attr and "/sample" in node.name:
            return f"has a custom gradient ({node.name})"
    return None

