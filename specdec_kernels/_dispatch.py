"""The one place that decides which implementation runs an op.

``backend=None`` means: Triton for CUDA tensors, the pure-PyTorch reference for CPU tensors, unless
the environment variable ``SPECDEC_BACKEND`` names one. ``"triton"`` on CPU tensors runs Triton's
interpreter: the kernel modules are loaded a second time with ``TRITON_INTERPRET=1`` so that the
same source serves both the compiled (CUDA) and the interpreted (CPU) path in one process.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
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


@functools.lru_cache(maxsize=None)
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
    if backend == "triton" and device.type not in ("cuda", "cpu"):
        warn_once(f"triton-{device.type}", f"specdec_kernels: no Triton path for {device.type} "
                  "tensors; falling back to the pure-PyTorch reference")
        return "reference"
    return backend


_interpreted: dict[str, object] = {}
# Modules of shared @triton.jit helpers that kernel modules import: their interpreted copies must
# stand in for them while an interpreted kernel module is loaded.
_SHARED = ("_common",)


def _load_interpreted(name: str):
    full_name = f"specdec_kernels.ops.{name}"
    module = _interpreted.get(name)
    if module is not None:
        return module
    shared = {} if name in _SHARED else {s: _load_interpreted(s) for s in _SHARED}
    spec = importlib.util.find_spec(full_name)
    module = importlib.util.module_from_spec(spec)
    saved_env = os.environ.get("TRITON_INTERPRET")
    saved_modules = {s: sys.modules.get(f"specdec_kernels.ops.{s}") for s in shared}
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for s, m in shared.items():
            sys.modules[f"specdec_kernels.ops.{s}"] = m
        spec.loader.exec_module(module)
    finally:
        for s, m in saved_modules.items():
            if m is None:
                sys.modules.pop(f"specdec_kernels.ops.{s}", None)
            else:
                sys.modules[f"specdec_kernels.ops.{s}"] = m
        if saved_env is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved_env
    _interpreted[name] = module
    return module


def kernel_module(name: str, device: torch.device):
    """The module ``specdec_kernels.ops.<name>`` with kernels compiled for ``device``.

    CUDA tensors get the ordinary import. CPU tensors get a private copy of the module (and of the
    shared helper modules it imports) whose ``@triton.jit`` functions were created under
    ``TRITON_INTERPRET=1``, i.e. run by Triton's interpreter.
    """
    if device.type != "cpu" or os.environ.get("TRITON_INTERPRET") == "1":
        return importlib.import_module(f"specdec_kernels.ops.{name}")
    with _lock:
        return _load_interpreted(name)
