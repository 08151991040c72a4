"""Loading of the C++/CUDA extension ``specdec_kernels._C`` and registration of the KV-cache ops.

After importing this module, ``torch.ops.specdec.kv_write_``, ``kv_compact_``,
``paged_kv_write_`` and ``paged_kv_compact_`` always exist with the schemas of :data:`SCHEMAS`:

- where the extension is built, ``_C`` defines them (``csrc/bindings.cpp``) with its C++ CPU
  kernel and, in a CUDA build, its CUDA kernel;
- where it is not (or ``SPECDEC_FORCE_FALLBACK=1`` was set before the import), they are defined
  here with the same schemas.

In both cases this module registers the fake (meta) kernels and the pure-PyTorch fallback of
:mod:`specdec_kernels.reference.kv_cache` for ``CompositeExplicitAutograd``: it runs for every
device that has no native kernel (all of them without the extension), with a one-time
``RuntimeWarning``. :func:`force_fallback` routes CPU and CUDA calls to the fallback for a block
of code, which is how the tests exercise it next to the C++ kernels.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import warnings

import torch

from specdec_kernels._dispatch import warn_once
from specdec_kernels.reference import kv_cache as _ref

__all__ = ["SCHEMAS", "extension_available", "force_fallback", "load_error",
           "native_ops_available"]

FORCE_FALLBACK_ENV = "SPECDEC_FORCE_FALLBACK"

# Keep in sync with csrc/bindings.cpp (tests/test_kv_cache.py compares them).
SCHEMAS = {
    "kv_write_":
        "(Tensor(a!) kv_cache, int layer, Tensor key, Tensor value, Tensor offsets) -> ()",
    "kv_compact_":
        "(Tensor(a!) kv_cache, Tensor src_positions, Tensor num_keep, Tensor start) -> ()",
    "paged_kv_write_":
        "(Tensor(a!) kv_cache, int layer, Tensor key, Tensor value, Tensor block_tables, "
        "Tensor offsets) -> ()",
    "paged_kv_compact_":
        "(Tensor(a!) kv_cache, Tensor block_tables, Tensor src_positions, Tensor num_keep, "
        "Tensor start) -> ()",
}

_FALLBACKS = {
    "kv_write_": _ref.kv_write_,
    "kv_compact_": _ref.kv_compact_,
    "paged_kv_write_": _ref.paged_kv_write_,
    "paged_kv_compact_": _ref.paged_kv_compact_,
}


def _load():
    if os.environ.get(FORCE_FALLBACK_ENV, "0").lower() in ("1", "true", "yes", "on"):
        return None, f"{FORCE_FALLBACK_ENV} is set"
    try:  # importing registers the ops; import_module words a missing build plainly
        module = importlib.import_module("specdec_kernels._C")
    except ImportError as exc:
        return None, f"specdec_kernels._C could not be imported ({exc})"
    return module, None


_C, _load_error = _load()
_forced = 0
_forced_lock = threading.Lock()


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


def _fallback_kernel(name: str):
    reference = _FALLBACKS[name]

    def kernel(*args):
        if _forced == 0:
            reason = _load_error or "it has no kernel for this device"
            warn_once(f"kv-fallback-{name}",
                      f"specdec_kernels: torch.ops.specdec.{name} runs the pure-PyTorch "
                      f"fallback because {reason}; build the extension for the C++/CUDA kernels")
        reference(*args)

    kernel.__name__ = f"{name}_fallback"
    return kernel


def _fake_write(kv_cache, layer, key, value, offsets):
    _ref.check_write("kv_write_", kv_cache, layer, key, value, None, offsets)


def _fake_compact(kv_cache, src_positions, num_keep, start):
    _ref.check_compact("kv_compact_", kv_cache, None, src_positions, num_keep, start)


def _fake_paged_write(kv_cache, layer, key, value, block_tables, offsets):
    _ref.check_write("paged_kv_write_", kv_cache, layer, key, value, block_tables, offsets)


def _fake_paged_compact(kv_cache, block_tables, src_positions, num_keep, start):
    _ref.check_compact("paged_kv_compact_", kv_cache, block_tables, src_positions, num_keep,
                       start)


_FAKES = {
    "kv_write_": _fake_write,
    "kv_compact_": _fake_compact,
    "paged_kv_write_": _fake_paged_write,
    "paged_kv_compact_": _fake_paged_compact,
}

# Held for the life of the process: dropping a Library object unregisters what it registered.
_lib = torch.library.Library("specdec", "FRAGMENT")
for _name, _schema in SCHEMAS.items():
    if _C is None:
        _lib.define(_name + _schema)
    _lib.impl(_name, _fallback_kernel(_name), "CompositeExplicitAutograd")
    torch.library.register_fake(f"specdec::{_name}", _FAKES[_name], lib=_lib)


@contextlib.contextmanager
def force_fallback():
    """Run the KV-cache ops with the pure-PyTorch fallback inside the ``with`` block.

    The CPU and CUDA kernels of the extension are overridden for the block (and restored after),
    so code that calls ``torch.ops.specdec.*`` -- the cache classes included -- runs the fallback
    without a warning. Not thread-safe with respect to other threads calling the ops.

    Examples
    --------
    >>> import specdec_kernels as sk
    >>> from specdec_kernels._extension import force_fallback
    >>> with force_fallback():
    ...     sk.extension_available()
    False
    """
    global _forced
    with contextlib.ExitStack() as stack:
        if _C is not None:
            lib = stack.enter_context(torch.library._scoped_library("specdec", "IMPL"))
            with warnings.catch_warnings():  # "Overriding a previously registered kernel": meant
                warnings.filterwarnings("ignore", message=".*[Oo]verrid")
                for name in SCHEMAS:
                    for key in ("CPU", "CUDA"):
                        lib.impl(name, _fallback_kernel(name), key)
        with _forced_lock:
            _forced += 1
        try:
            yield
        finally:
            with _forced_lock:
                _forced -= 1
