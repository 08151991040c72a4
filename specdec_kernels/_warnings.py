"""One-time warnings: a leaf module, imported by :mod:`specdec_kernels._dispatch` and
:mod:`specdec_kernels._extension` alike (so neither imports the other for it)."""

from __future__ import annotations

import threading
import warnings

_lock = threading.Lock()
_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Emit ``message`` as a ``RuntimeWarning`` the first time ``key`` is seen in this process."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
