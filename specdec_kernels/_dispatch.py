"""The one place that decides which implementation runs an op.

Backends (:data:`BACKENDS`):

``"triton"``     the Triton kernels (:mod:`specdec_kernels.ops`), compiled for CUDA tensors; on CPU
                 tensors they run in Triton's interpreter, which Triton decides once, when it is
                 first imported, from ``TRITON_INTERPRET``: ``import specdec_kernels`` sets
                 ``TRITON_INTERPRET=1`` on a machine without CUDA (unless triton was already
                 imported or the variable is set). Where the interpreter is off, ``"triton"`` on
                 CPU tensors falls back to the reference with a one-time warning. The
                 interpreter keeps the running launch in globals, so interpreted launches are
                 serialised by one process-wide lock (:func:`specdec_kernels.ops._common.launch`):
                 thread-safe, one kernel at a time; compiled launches take no lock.
``"native"``     the C++ CPU kernels of the extension ``specdec_kernels._C`` (CPU tensors only).
                 Where the extension is not built it falls back to the reference, and on other
                 devices to that device's automatic choice, each with a one-time warning.
``"reference"``  the pure-PyTorch specification (:mod:`specdec_kernels.reference`), any device.

``backend=None`` means: Triton for CUDA tensors; for CPU tensors the native kernels where the
extension is built, else the reference; unless the environment variable ``SPECDEC_BACKEND`` names
one.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from specdec_kernels._warnings import warn_once  # noqa: F401  (also imported from here)

BACKENDS = ("triton", "native", "reference")
_ENV_VAR = "SPECDEC_BACKEND"


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def native_available() -> bool:
    """True when the extension ``specdec_kernels._C`` is loaded with its native verification
    kernels (``torch.ops.specdec.native_verify``)."""
    from specdec_kernels import _extension

    return _extension.native_ops_available()


def _auto(device: torch.device) -> str:
    if device.type == "cuda":
        return "triton"
    if device.type == "cpu" and native_available():
        return "native"
    return "reference"


def check_backend(backend: str | None) -> str | None:
    """``backend`` itself when it is ``None`` or one of :data:`BACKENDS`: what the entry points
    above the ops (the decoding loop, generators, compat adapters) call before any work.

    Raises
    ------
    ValueError
        ``backend`` is not ``None`` or one of :data:`BACKENDS` (the message names it).
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    return backend


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """Return ``"triton"``, ``"native"`` or ``"reference"`` for an op whose tensors live on
    ``device``.

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
            return _auto(device)
    if backend not in BACKENDS:
        raise ValueError(f"{source} must be one of {BACKENDS} or None, got {backend!r}")
    if backend == "native":
        return _resolve_native(device)
    if backend == "triton":
        return _resolve_triton(device)
    return backend


def _resolve_native(device: torch.device) -> str:
    if device.type != "cpu":
        fallback = _auto(device)
        warn_once(
            f"native-{device.type}",
            f"specdec_kernels: the native backend runs on CPU "
            f"tensors only; {device.type} tensors use {fallback!r}",
        )
        return fallback
    if not native_available():
        from specdec_kernels import _extension

        warn_once(
            "no-native",
            "specdec_kernels: the native backend needs the C++ extension, "
            f"which is not in use ({_extension.load_error()}); falling back to the "
            "pure-PyTorch reference",
        )
        return "reference"
    return "native"


def _resolve_triton(device: torch.device) -> str:
    if not triton_available():
        warn_once(
            "no-triton",
            "specdec_kernels: triton is not installed; falling back to the pure-PyTorch reference",
        )
        return "reference"
    if device.type == "cpu" and not interpreter_active():
        warn_once(
            "triton-cpu",
            "specdec_kernels: Triton kernels run on CPU tensors only under "
            "Triton's interpreter: set TRITON_INTERPRET=1 before triton is imported; "
            "falling back to the pure-PyTorch reference",
        )
        return "reference"
    if device.type not in ("cuda", "cpu"):
        warn_once(
            f"triton-{device.type}",
            f"specdec_kernels: no Triton path for {device.type} "
            "tensors; falling back to the pure-PyTorch reference",
        )
        return "reference"
    return "triton"


def interpreter_active() -> bool:
    """True when Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
