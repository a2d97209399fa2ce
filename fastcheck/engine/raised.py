"""The user's own exceptions: out of a check as themselves, past every handler on the way.

fastcheck calls f many times after planning: traced into its batched kernels (the probe, the differences, the
autodiff kernels, on xla, graph and loop paths), and eagerly (the eager path, tapes, noise tables).  Its handlers
there read a failure as "this path cannot run f" (fall back a path), "f cannot be traced" (evaluate eagerly), "f
refuses this point" (measure no further) or "f failed in a batched kernel" (a ValueError naming it), and
TensorFlow's AutoGraph re-raises an error of traced code as a ``StagingError`` when it cannot rebuild its type.

An exception f raises that is none of those -- a class of the user's own, or a builtin one outside what tracing
raises (``RuntimeError``, ``KeyError``, ``AssertionError``, ...) raised in f's code rather than in a library's -- is
carried out of the check as ``Raised``, a ``BaseException``: no ``except Exception`` of fastcheck's or TensorFlow's
takes it for one of the above.  The public entry points (``passes_own``) re-raise the user's exception itself: its
type, its message, its traceback into f, with a note saying what fastcheck was doing.  TensorFlow's errors (out of
memory, compile failures, assertions at run time) and the builtin errors tracing raises (``TypeError``,
``ValueError``, ``AttributeError``, ``NotImplementedError``) keep their handling.
"""

from __future__ import annotations

import functools

import tensorflow as tf

# Exceptions of these packages' own classes (and builtins raised in their code) are the libraries', not the user's:
# tracing, pfor, XLA and their models say "cannot run f" with them.
LIBRARIES = frozenset({"builtins", "tensorflow", "keras", "tf_keras", "tensorflow_probability", "numpy", "absl",
                       "fastcheck", "ml_dtypes", "tree", "optree", "wrapt"})
# What tracing raises when a path cannot run f (``.numpy()``: AttributeError; ``np.asarray`` of a symbolic tensor:
# NotImplementedError; Python ``if`` on a tensor: a TypeError), and what f raises to refuse a point: fastcheck
# handles these wherever they come from.
HANDLED = (tf.errors.OpError, TypeError, ValueError, NotImplementedError, AttributeError)


class Raised(BaseException):
    """f's own exception on its way out of a check (see the module docstring)."""

    def __init__(self, error: BaseException, tracing: bool):
        super().__init__(error)
        self.error, self.tracing = error, tracing


def _library(module: str | None) -> bool:
    return (module or "").partition(".")[0] in LIBRARIES


def unwrapped(error: BaseException) -> BaseException:
    """The exception f raised, under AutoGraph's rewrites: ``ag_error_metadata.to_exception`` raises a copy (or a
    ``StagingError``) in the original's ``except`` block, with the context suppressed and the metadata attached to
    both (tensorflow/python/autograph/pyct/error_utils.py)."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        context = error.__context__
        if (context is None or not error.__suppress_context__ or getattr(error, "ag_error_metadata", None) is None
                or getattr(context, "ag_error_metadata", None) is None):
            break
        error = context
    return error


def own_error(error: BaseException) -> BaseException | None:
    """The user's own exception that ``error`` is (or wraps, see ``unwrapped``), or None for one fastcheck handles
    (see the module docstring)."""
    original = unwrapped(error)
    if isinstance(original, tf.errors.OpError):
        return None
    if not _library(type(original).__module__):
        return original  # a class of the user's
    if isinstance(original, HANDLED):
        return None
    last = original.__traceback__
    while last is not None and last.tb_next is not None:
        last = last.tb_next
    if last is None or _library(last.tb_frame.f_globals.get("__name__")):
        return None  # a RuntimeError of TensorFlow's or Keras's own (e.g. "cannot run inside a tf.function")
    return original


def call_carrying_own(f, args, kwargs):
    """``f(*args, **kwargs)``, with the user's own exception carried out as ``Raised``."""
    try:
        return f(*args, **kwargs)
    except Exception as error:
        own = own_error(error)
        if own is None:
            raise
        raise Raised(own, tracing=not tf.executing_eagerly()) from None


def passes_own(entry):
    """Decorate a public entry point: a ``Raised`` from inside comes out as the user's exception itself."""

    @functools.wraps(entry)
    def wrapper(*args, **kwargs):
        try:
            return entry(*args, **kwargs)
        except Raised as raised:
            error, tracing = raised.error, raised.tracing
        note = ("fastcheck: f raised this while fastcheck traced it into a tf.function of its batched evaluations"
                if tracing else "fastcheck: f raised this in one of the eager calls fastcheck made of it")
        metadata = getattr(error, "ag_error_metadata", None)
        if metadata is not None:  # raised in AutoGraph's conversion of f: its frames in f's own source
            try:
                note += "; AutoGraph converted f, whose source says " + metadata.get_message().strip()
            except Exception:  # pragma: no cover - TensorFlow changed the metadata: the traceback alone
                pass
        if hasattr(error, "add_note") and note not in getattr(error, "__notes__", ()):
            error.add_note(note)
        raise error  # outside the except block: the user's exception, its traceback into f, no fastcheck context

    return wrapper
