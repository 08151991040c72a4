"""The KV-cache ops ``torch.ops.specdec.kv_write_``, ``kv_compact_``, ``paged_kv_write_`` and
``paged_kv_compact_``, registered here, next to the caches that call them.

Each has the schema of :data:`SCHEMAS` and

- one kernel, registered for ``CompositeExplicitAutograd`` (every device), whose body is one
  lookup in the routing table (:func:`specdec_kernels._dispatch.kernel` with
  :func:`specdec_kernels._dispatch.kv_backend`): the extension's ``torch.ops.specdec.native_<name>``
  (same schema, ``csrc/bindings.cpp``: C++ for CPU tensors and, in a CUDA build, CUDA) where it
  has a kernel for the cache's device and :func:`force_fallback` is not active; else the
  pure-PyTorch fallback of :mod:`specdec_kernels.reference.kv_cache` (bit-identical), with a
  one-time ``RuntimeWarning`` unless the fallback was asked for;
- a fake (meta) kernel of the same signature, for ``torch.compile`` and ``opcheck``.

Every registration happens once, at import, through the public ``torch.library`` API; nothing is
overridden later, so no dispatcher warning is raised or filtered.
"""

from __future__ import annotations

import torch

from specdec_kernels import _dispatch, _extension
from specdec_kernels.reference import kv_cache as _ref

__all__ = ["SCHEMAS", "extension_available", "force_fallback"]

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

#: The context manager that makes the KV ops run their fallback (process-wide; blocks nest).
force_fallback = _dispatch.force_kv_reference


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
    return _extension.loaded() and not _dispatch.kv_reference_forced()


def _routing_kernel(name: str):
    def run(kv_cache, *args):
        _dispatch.kernel(name, _dispatch.kv_backend(name, kv_cache.device))(kv_cache, *args)

    run.__name__ = f"{name}_kernel"
    return run


def _fake_write(kv_cache, layer, key, value, offsets):
    _ref.check_write("kv_write_", kv_cache, layer, key, value, None, offsets)


def _fake_compact(kv_cache, src_positions, num_keep, start):
    _ref.check_compact("kv_compact_", kv_cache, None, src_positions, num_keep, start)


def _fake_paged_write(kv_cache, layer, key, value, block_tables, offsets):
    _ref.check_write("paged_kv_write_", kv_cache, layer, key, value, block_tables, offsets)


def _fake_paged_compact(kv_cache, block_tables, src_positions, num_keep, start):
    _ref.check_compact("paged_kv_compact_", kv_cache, block_tables, src_positions, num_keep, start)


FAKES = {
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
    torch.library.register_fake(f"specdec::{_name}", FAKES[_name], lib=_lib)
