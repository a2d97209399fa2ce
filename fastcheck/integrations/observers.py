"""Who sees every report ``_check.run_check`` returns: the pytest plugin records a session's checks through it,
whichever entry point (gradcheck, GradientTestCase, the plain API) made them.  Kept apart from ``_check`` (no
TensorFlow here), so the plugin can register before the first check of a run loads fastcheck."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

OBSERVERS: list[Callable[[Any], None]] = []
