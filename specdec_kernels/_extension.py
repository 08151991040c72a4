"""Loading of the C++/CUDA extension ``specdec_kernels._C`` and registration of the KV-cache ops.

After importing this module, ``torch.ops.specdec.kv_write_``, ``kv_compact_``,
``paged_kv_write_`` and ``paged_kv_compact_`` exist with the schemas of :data:`SCHEMAS`. They are
defined here, each with

- one kernel, registered for ``CompositeExplicitAutograd`` (every device), that routes the call:
  to the extension's native kernel ``torch.ops.specdec.native_<name>`` (same schema, defined by
  ``csrc/bindings.cpp``: C++ for CPU tensors and, in a CUDA build, CUDA for CUDA tensors) where
  there is one and :func:`force_fallback` is not active; else to the pure-PyTorch fallback of
  :mod:`specdec_kernels.reference.kv_cache`, with a one-time ``RuntimeWarning`` unless the
  fallback was asked for;
- a fake (meta) kernel of the same signature, for ``torch.compile`` and ``opcheck``.

Every registration happens once, at import, through the public ``torch.library`` API; nothing is
overridden later, so no dispatcher warning is raised or filtered. The extension is not used where
it is not built or cannot be loaded, or where ``SPECDEC_FORCE_FALLBACK=1`` was set before the
import.
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch

from specdec_kernels._warnings import warn_once
from specdec_kernels.reference import kv_cache as _ref

__all__ = ["SCHEMAS", "extension_available", "force_fallback", "load_error", "native_ops_available"]

FORCE_FALLBACK_ENV = "SPECDEC_FORCE_FALLBACK"

# The public ops. Their native kernels are csrc/bindings.cpp's `native_<name>` ops, which must
# have the same arguments (tests/test_kv_cache.py parses bindings.cpp and compares).
SCHEMAS = {
    "kv_write_": (
        "(Tensor(a!) kv_cache, int layer, Tensor key, Tensor value, Tensor offsets) -> ()"
    ),
    "kv_compact_": (
        "(Tensor(a!) kv_cache, Tensor src_positions, Tensor num_keep, Tensor start) -> ()"
    ),
    "paged_kv_write_": (
        "(Tensor(a!) kv_cache, int layer, Tensor key, Tensor value, Tensor block_tables, "
        "Tensor offsets) -> ()"
    ),
    "paged_kv_compact_": (
        "(Tensor(a!) kv_cache, Tensor block_tables, Tensor src_positions, Tensor num_keep, "
        "Tensor start) -> ()"
    ),
}
NATIVE_PREFIX = "native_"

_FALLBACKS = {
    "kv_write_": _ref.kv_write_,
    "kv_compact_": _ref.kv_compact_,
    "paged_kv_write_": _ref.paged_kv_write_,
    "paged_kv_compact_": _ref.paged_kv_compact_,
}


def _load():
    """(the extension module or None, why it is not in use or None)."""
    if os.environ.get(FORCE_FALLBACK_ENV, "0").lower() in ("1", "true", "yes", "on"):
        return None, f"{FORCE_FALLBACK_ENV} is set"
    try:  # importing registers the native ops (csrc/bindings.cpp)
        from specdec_kernels import _C as module
    except ImportError as exc:
        return None, f"specdec_kernels._C could not be imported ({exc})"
    if not hasattr(torch.ops.specdec, NATIVE_PREFIX + "kv_write_"):
        # An extension built from an older csrc/bindings.cpp defines the public ops itself.
        raise ImportError(
            f"{module.__file__} was built from an older csrc/bindings.cpp (it has "
            f"no specdec::{NATIVE_PREFIX}kv_write_ op): rebuild it (`python "
            f"setup.py build_ext --inplace`, or reinstall), or set "
            f"{FORCE_FALLBACK_ENV}=1 to run without it"
        )
    return module, None


_C, _load_error = _load()
_forced = 0
_forced_lock = threading.Lock()


def _native_devices() -> frozenset[str]:
    """Device types the extension has kernels for (``cpu``; ``cuda`` in a CUDA build)."""
    if _C is None:
        return frozenset()
    op = getattr(torch.ops.specdec, NATIVE_PREFIX + "kv_write_").default
    return frozenset(
        device
        for device, key in (("cpu", "CPU"), ("cuda", "CUDA"))
        if op.has_kernel_for_dispatch_key(key)
    )


_NATIVE_DEVICES = _native_devices()


def extension_available() -> bool:
    """Whether the KV-cache ops run the C++ (and, in a CUDA build, CUDA) kernels.

    False where ``specdec_kernels._C`` was not built or could not be loaded, where the
    environment variable ``SPECDEC_FORCE_FALLBACK=1`` was set when the package was imported, and
    inside :func:`force_fallback`; the ops then run the pure-PyTorch fallback of
    :mod:`specdec_kernels.reference.kv_cache` (bit-identical, slower).

    Returns
    -------
    bool

    Examples
    --------
    >>> import specdec_kernels as sk
    >>> isinstance(sk.extension_available(), bool)
    True
    """
    return _C is not None and _forced == 0


def native_ops_available() -> bool:
    """Whether the extension's native CPU verification ops (``torch.ops.specdec.native_verify``,
    ``native_accept_reject``: the ``backend="native"`` kernels) are loaded. Unlike
    :func:`extension_available`, :func:`force_fallback` (a KV-cache switch) does not change it."""
    return _C is not None and hasattr(torch.ops.specdec, "native_verify")


def load_error() -> str | None:
    """Why the extension is not in use (``None`` when it is loaded)."""
    return _load_error


def _routing_kernel(name: str):
    """The one kernel of ``torch.ops.specdec.<name>``: the native kernel or the fallback."""
    native = getattr(torch.ops.specdec, NATIVE_PREFIX + name).default if _C is not None else None
    reference = _FALLBACKS[name]

    def kernel(kv_cache, *args):
        if _forced == 0:
            if kv_cache.device.type in _NATIVE_DEVICES:
                native(kv_cache, *args)
                return
            reason = _load_error or f"it has no kernel for {kv_cache.device.type} tensors"
            warn_once(
                f"kv-fallback-{name}",
                f"specdec_kernels: torch.ops.specdec.{name} runs the pure-PyTorch "
                f"fallback because {reason}; build the extension for the C++/CUDA kernels",
            )
        reference(kv_cache, *args)

    kernel.__name__ = f"{name}_kernel"
    return kernel


def _fake_write(kv_cache, layer, key, value, offsets):
    _ref.check_write("kv_write_", kv_cache, layer, key, value, None, offsets)


def _fake_compact(kv_cache, src_positions, num_keep, start):
    _ref.check_compact("kv_compact_", kv_cache, None, src_positions, num_keep, start)


def _fake_paged_write(kv_cache, layer, key, value, block_tables, offsets):
    _ref.check_write("paged_kv_write_", kv_cache, layer, key, value, block_tables, offsets)


def _fake_paged_compact(kv_cache, block_tables, src_positions, num_keep, start):
    _ref.check_compact("paged_kv_compact_", kv_cache, block_tables, src_positions, num_keep, start)


_FAKES = {
    "kv_write_": _fake_write,
    "kv_compact_": _fake_compact,
    "paged_kv_write_": _fake_paged_write,
    "paged_kv_compact_": _fake_paged_compact,
}

# Held for the life of the process: dropping a Library object unregisters what it registered.
_lib = torch.library.Library("specdec", "FRAGMENT")
for _name, _schema in SCHEMAS.items():
    _lib.define(_name + _schema)
    _lib.impl(_name, _routing_kernel(_name), "CompositeExplicitAutograd")
    torch.library.register_fake(f"specdec::{_name}", _FAKES[_name], lib=_lib)


@contextlib.contextmanager
def force_fallback():
    """Run the KV-cache ops with the pure-PyTorch fallback inside the ``with`` block.

    Sets the flag that the ops' routing kernel reads (nothing is registered or overridden), so
    code that calls ``torch.ops.specdec.*`` -- the cache classes included -- runs the fallback,
    without a warning. The flag is process-wide: other threads calling the ops meanwhile get
    the fallback too. Blocks nest.

    Examples
    --------
    >>> import specdec_kernels as sk
    >>> from specdec_kernels._extension import force_fallback
    >>> with force_fallback():
    ...     sk.extension_available()
    False
    """
    global _forced
    with _forced_lock:
        _forced += 1
    try:
        yield
    finally:
        with _forced_lock:
            _forced -= 1
