"""The one place that decides which implementation runs an op.

``backend=None`` means: Triton for CUDA tensors, the pure-PyTorch reference for CPU tensors, unless
the environment variable ``SPECDEC_BACKEND`` names one. ``"triton"`` on CPU tensors runs Triton's
interpreter, which Triton decides once, when it is first imported, from ``TRITON_INTERPRET``:
``import specdec_kernels`` sets ``TRITON_INTERPRET=1`` on a machine without CUDA (unless triton
was already imported or the variable is set). Where the interpreter is off, ``"triton"`` on CPU
tensors falls back to the reference with a one-time warning.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import threading
import warnings

import torch

BACKENDS = ("triton", "reference")
_ENV_VAR = "SPECDEC_BACKEND"
_lock = threading.Lock()
_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Emit ``message`` as a ``RuntimeWarning`` the first time ``key`` is seen in this process."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """Return ``"triton"`` or ``"reference"`` for an op whose tensors live on ``device``.

    Raises
    ------
    ValueError
        ``backend`` (or ``SPECDEC_BACKEND``) is not one of :data:`BACKENDS`.
    """
    source = "backend"
    if backend is None:
        env = os.environ.get(_ENV_VAR)
        if env:
            backend, source = env.strip().lower(), f"the environment variable {_ENV_VAR}"
        else:
            backend = "triton" if device.type == "cuda" else "reference"
    if backend not in BACKENDS:
        raise ValueError(f"{source} must be one of {BACKENDS} or None, got {backend!r}")
    if backend == "triton" and not triton_available():
        warn_once("no-triton", "specdec_kernels: triton is not installed; "
                  "falling back to the pure-PyTorch reference")
        return "reference"
    if backend == "triton" and device.type == "cpu" and not interpreter_active():
        warn_once("triton-cpu", "specdec_kernels: Triton kernels run on CPU tensors only under "
                  "Triton's interpreter: set TRITON_INTERPRET=1 before triton is imported; "
                  "falling back to the pure-PyTorch reference")
        return "reference"
    if backend == "triton" and device.type not in ("cuda", "cpu"):
        warn_once(f"triton-{device.type}", f"specdec_kernels: no Triton path for {device.type} "
                  "tensors; falling back to the pure-PyTorch reference")
        return "reference"
    return backend


def interpreter_active() -> bool:
    """True when Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernel_module(name: str, device: torch.device):
    """The module ``specdec_kernels.ops.<name>`` holding the Triton kernels of an op.

    Its ``@triton.jit`` functions are compiled for the GPU, or run by Triton's interpreter when
    ``TRITON_INTERPRET=1`` was set before ``triton`` was first imported (``import specdec_kernels``
    sets it on machines without CUDA).
    """
    return importlib.import_module(f"specdec_kernels.ops.{name}")
