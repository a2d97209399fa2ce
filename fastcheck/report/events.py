"""What a check learnt that bears on how its verdict reads, as typed facts: every note is composed from these.

Each stage hands over an event (which input, which numbers, which reason) instead of a sentence; ``notes.compose``
is the one place they become text.  ``GradientReport.events`` holds them in the order the check learnt them;
``to_dict`` writes each as ``{"kind": ..., **fields}``.  A few fields still carry text a stage composed (an error's
first line, a model's float64 copy's account, a sparsity pattern's source).

How the work ran -- its route, chunks, kernels, retries, the work per replica -- changes no verdict: the stages log
it at DEBUG on the ``fastcheck`` logger instead (and its seconds are ``GradientReport.timings``).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

# --- fallbacks of the path


@dataclasses.dataclass(frozen=True)
class FellBack:
    """``path`` could not run f for ``what`` (``error``: its type and first line); ``following`` took over.  ``path``
    "tracing": f cannot be traced at all (it calls ``.numpy()``), so it runs eagerly."""

    path: str
    following: str
    what: str
    error: str


# --- the plan: determinism, precision, noise


@dataclasses.dataclass(frozen=True)
class CallNoise:
    """``output`` (its name as a suffix: "" for f's only output) differs between two calls by up to ``difference``,
    within what is counted as noise."""

    output: str
    difference: float


@dataclasses.dataclass(frozen=True)
class NumericalSide:
    """The precision the numerical side was evaluated in: float64 (``upcast``) or native, and why."""

    upcast: bool
    # native: "elements" (too many for float64), "returns" (f returned ``dtype``), "shapes", "fails" (``error``),
    # "differs" (flat output ``row`` is ``float64``/``native``)
    reason: Literal["auto", "elements", "returns", "shapes", "fails", "differs"] = "auto"
    elements: int = 0
    dtype: str = ""
    error: str = ""
    row: int = 0
    float64: float = 0.0
    native: float = 0.0


@dataclasses.dataclass(frozen=True)
class LowPrecisionOp:
    """f computes in ``precision`` inside, below its dtypes: op ``op`` (found by one trace, as noise demanded)."""

    precision: str
    op: str


@dataclasses.dataclass(frozen=True)
class TensorFloat32:
    """f runs float32 op ``op`` on a GPU with TensorFloat-32 enabled."""

    op: str


@dataclasses.dataclass(frozen=True)
class PrecisionFound:
    """The analytical side is judged with ``precision``'s tolerances (``given``: the user's), because ``why``
    (an op computing below f's dtypes, TensorFloat-32, or the reason the problem declared, as text)."""

    why: LowPrecisionOp | TensorFloat32 | str
    precision: str
    atol: float
    rtol: float
    given: bool


@dataclasses.dataclass(frozen=True)
class NoiseMeasured:
    """f's evaluations carry relative noise ``relative``, above ``dtype``'s rounding ``epsilon``."""

    relative: float
    dtype: str
    epsilon: float



# --- mode and path


@dataclasses.dataclass(frozen=True)
class ModeChosen:
    """The mode that ran and why (the chain of reasons, ``_check.choose_mode``'s)."""

    mode: str
    why: tuple  # of the reason events below, in order


@dataclasses.dataclass(frozen=True)
class Requested:
    """config.mode was not "auto"."""


@dataclasses.dataclass(frozen=True)
class FullFits:
    """The full Jacobian's ``entries`` fit memory_budget (predicted ``seconds`` within ``budget``, where timed)."""

    entries: int
    seconds: float | None = None
    budget: float | None = None


@dataclasses.dataclass(frozen=True)
class FullTooLarge:
    """The full Jacobian's ``entries`` are more than ``fitting`` fit memory_budget."""

    entries: int
    fitting: float


@dataclasses.dataclass(frozen=True)
class InputTooLarge:
    """An input has more than ``limit`` elements."""

    limit: int


@dataclasses.dataclass(frozen=True)
class Prediction:
    """How a full check's seconds were predicted: ``by`` "eager" (``calls`` of f at ``per_call`` s), "tracing"
    (``kernels`` to trace at ``per_kernel`` s, more than the budget) or "batched" (and ``calls`` at ``per_call``)."""

    by: Literal["eager", "tracing", "batched"]
    calls: int = 0
    per_call: float = 0.0
    kernels: int = 0
    per_kernel: float = 0.0


@dataclasses.dataclass(frozen=True)
class FullTooSlow:
    """Full Jacobians predicted to take ``seconds`` (``how``), more than ``budget``."""

    seconds: float
    how: Prediction
    budget: float


@dataclasses.dataclass(frozen=True)
class NoPattern:
    """No sparsity pattern for coloured mode (``error``: the tracer's first line)."""

    error: str


@dataclasses.dataclass(frozen=True)
class TooDense:
    """f's Jacobian has ``nonzeros`` in ``colours`` column colours: too dense for coloured mode."""

    nonzeros: int
    colours: int


@dataclasses.dataclass(frozen=True)
class ColouredTooLarge:
    """Coloured mode would hold ``held`` bytes for its ``nonzeros``, more than ``limit``."""

    held: float
    nonzeros: int
    limit: float


@dataclasses.dataclass(frozen=True)
class ColouredTooSlow:
    """Coloured mode (``colours`` column colours) predicted to take ``seconds``, more than ``budget``."""

    colours: int
    seconds: float
    budget: float


@dataclasses.dataclass(frozen=True)
class Sparse:
    """f's Jacobian is sparse: ``nonzeros`` in ``colours`` column colours, predicted ``seconds``."""

    nonzeros: int
    colours: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class Escalated:
    """Coloured mode (chosen for ``coloured``) found the reverse-mode gradient inconsistent with f's sparsity
    pattern, so full Jacobians, which fit, gave the element verdicts."""

    coloured: tuple  # coloured mode's reasons


@dataclasses.dataclass(frozen=True)
class Inconsistent:
    """Coloured mode found the reverse-mode gradient inconsistent with f's sparsity pattern (``found``: what, as
    the problem says it) before full mode's rerun."""

    found: str




# --- nothing to check


@dataclasses.dataclass(frozen=True)
class NothingToCheck:
    """The Jacobian has no entries: ``outputs`` empty (else the checked inputs), ``m`` x ``n`` elements."""

    outputs: bool
    m: int
    n: int


@dataclasses.dataclass(frozen=True)
class EmptyPart:
    """An output or checked input with no elements, in a check of the others."""

    name: str


@dataclasses.dataclass(frozen=True)
class NonfiniteInput:
    """Checked input ``name`` holds ``count`` elements that are not finite (the first few at ``first``, multi-indices,
    with their ``values``): each moves by the relative step itself (``config.step_scale``)."""

    name: str
    count: int
    first: tuple
    values: tuple


# --- the analytical side


@dataclasses.dataclass(frozen=True)
class ForwardNotChecked:
    """autodiff="auto" did not probe forward mode: the check ran eagerly, had fewer than ``evaluations`` evaluations,
    f contains while_loops, or no column of the Jacobian passed on the reverse side (the probe moves only those)."""

    reason: Literal["eager", "few evaluations", "loops", "no passing column"]
    evaluations: int = 0


@dataclasses.dataclass(frozen=True)
class ForwardProbe:
    """What became of forward mode's check (autodiff "auto" or "both"): TensorFlow cannot compute it ("unsupported",
    ``error`` says why), it agrees along ``directions`` random directions ("agrees"), it disagreed and its full
    Jacobian failed ("failed", ``error``: the exception's type), or its full Jacobian was compared ("compared")."""

    result: Literal["unsupported", "agrees", "failed", "compared"]
    directions: int = 0
    error: str = ""


# --- the strategies' own summaries


@dataclasses.dataclass(frozen=True)
class FastSummary:
    """Fast mode's probes over several inputs: ``probes`` random probes over ``inputs`` checked inputs in
    ``groups`` groups of similar size, ``elements`` elements, one VJP and ``evaluations`` evaluations of f;
    ``localised``: the inputs failing probes were localised within (by bisection over the inputs)."""

    probes: int
    inputs: int
    groups: int
    elements: int
    evaluations: int
    localised: tuple = ()


@dataclasses.dataclass(frozen=True)
class FastForwardOnly:
    """Fast mode: the reverse-mode gradient cannot be differentiated once more (``error``: the exception's type);
    the element-wise comparison used forward-mode JVPs, or, where forward mode has none for f (``jvp`` False), was
    skipped."""

    error: str
    jvp: bool = True


@dataclasses.dataclass(frozen=True)
class ColouredBlock:
    """One checked input's share of coloured mode: its pattern's ``nonzeros`` of ``rows`` x ``columns``, in
    ``colours`` column colours; ``cleared``: nonzeros the device's screen passed (the rest judged on the host);
    ``probes``: random dense probes of the pattern (0: a traced diagonal pattern, trusted)."""

    input: str
    nonzeros: int
    rows: int
    columns: int
    colours: int
    cleared: int = 0
    probes: int = 0


@dataclasses.dataclass(frozen=True)
class ColouredSummary:
    """Coloured mode's work: the sparsity pattern (``source``: where it came from), each input's ``blocks``,
    ``row_colours`` VJPs (None: gradients supplied), ``evaluations`` of f; ``noise_rows``: (failing outputs,
    sampled outputs, input elements moved) where f's noise was measured on some outputs only."""

    source: str
    blocks: tuple
    row_colours: int | None
    evaluations: int
    noise_rows: tuple | None = None



# --- problems: models, second order, distributions


@dataclasses.dataclass(frozen=True)
class TapeGradient:
    """check_model: the analytical side is tape.gradient of the loss over the model's own variables."""


@dataclasses.dataclass(frozen=True)
class SecondOrder:
    """verify_gradients(order=2): the Jacobian of grads was checked, not grads against f's derivatives."""


@dataclasses.dataclass(frozen=True)
class FrozenChecked:
    """Variables that are not trainable, checked because variables= names them."""

    names: tuple


@dataclasses.dataclass(frozen=True)
class TrainingMode:
    """check_model(training=True): ``changes`` False where the loss equals the training=False loss."""

    changes: bool


@dataclasses.dataclass(frozen=True)
class ModelCopy:
    """A model's numerical side: on a float64 copy (``copied``; ``detail`` says what was compared) or in the
    model's own precision (``detail`` says why no copy stands in).  ``detail`` is the model module's text."""

    copied: bool
    detail: str


@dataclasses.dataclass(frozen=True)
class SampleNotChecked:
    """check_distribution: ``distribution``'s sample carries no gradient ("not reparameterized"), or its sampler
    is implicitly reparameterized (``sampler``: how it was found)."""

    distribution: str
    reason: Literal["not reparameterized", "implicit"]
    sampler: str = ""


@dataclasses.dataclass(frozen=True)
class SampleSeeded:
    """check_distribution: the sample is drawn with the stateless seed (``seed``, 0) at every evaluation."""

    seed: int


# --- tfp.check_bijector


@dataclasses.dataclass(frozen=True)
class IdentitiesJudged:
    """The bijector's identities judged with ``atol``, ``rtol`` (``given``: the user's, else ``dtype``'s defaults),
    plus the numerical Jacobian's band carried into log|det J| and y's rounding carried through the inverse."""

    atol: float
    rtol: float
    given: bool
    dtype: str


@dataclasses.dataclass(frozen=True)
class LogDetConvention:
    """How ``bijector``'s log-det-Jacobian was judged when it changes the event size: in TFP's ``chart`` of the
    output (``convention`` "chart"), or as the volume change (``convention`` "volume", ``sizes``: numbers per
    event in and out) where fastcheck knows no chart."""

    bijector: str
    convention: Literal["chart", "volume"]
    chart: str = ""
    sizes: tuple = ()


# --- distribution over replicas: where f did not run over them


@dataclasses.dataclass(frozen=True)
class PathsDiffer:
    """The workers routed f to different paths; every worker evaluated ``what`` eagerly."""

    what: str


@dataclasses.dataclass(frozen=True)
class EagerUnsplit:
    """``what`` ran on the eager path, on one device (on every worker where ``multi``), not over the replicas."""

    what: str
    multi: bool


# --- a pair's verdict explained


@dataclasses.dataclass(frozen=True)
class Hint:
    """What explains a pair's verdict, for its hint line (``text.HINTS`` by ``kind``): the kind of defect, or of
    undecidability, its strategy found, with its numbers; ``spread``: fast mode's defect showed in no single block
    of the region it reports; ``distance``: how far from x the nearest jump of f found lies."""

    kind: str
    count: int = 0
    size: int = 0
    factor: float = 0.0
    first: tuple = ()
    spread: bool = False
    distance: float = 0.0
