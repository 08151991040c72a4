"""Loading of the C++/CUDA extension ``specdec_kernels._C``, and why it is not in use.

Importing ``specdec_kernels._C`` registers the native ops of ``csrc/bindings.cpp``
(``torch.ops.specdec.native_*``: the C++ verification kernels, the KV-cache kernels in C++ and, in
a CUDA build, CUDA, the row-invariant model kernels). The extension is not used where it is not
built or cannot be loaded, or where ``SPECDEC_FORCE_FALLBACK=1`` was set before the import (what a
machine without it sees). Which op runs which kernel is :mod:`specdec_kernels._dispatch`'s
business; the public KV ops are registered next to the caches
(:mod:`specdec_kernels.kv_cache._ops`).

The extension carries one ABI stamp (``_C.ABI_VERSION``, ``csrc/bindings.cpp``), checked once,
here, at import: an extension of another stamp is not used (:func:`load_error` says why), and one
of this stamp registers exactly :data:`OPS`. The rest of the package asks :func:`has_op`, never
``torch.ops.specdec`` itself.
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = [
    "ABI_VERSION",
    "OPS",
    "has_op",
    "load_error",
    "loaded",
    "native_devices",
    "native_ops_available",
]

FORCE_FALLBACK_ENV = "SPECDEC_FORCE_FALLBACK"
NATIVE_PREFIX = "native_"  # the extension's kernel of a public op `name` is `native_<name>`

#: The ABI stamp this package needs (``csrc/bindings.cpp``'s ``kAbiVersion``): bumped with every op
#: of the extension added, removed or changed in schema, together with :data:`OPS`.
ABI_VERSION = 5
#: The ops that ``csrc/bindings.cpp`` registers at :data:`ABI_VERSION` (``torch.ops.specdec.*``;
#: ``tests/test_extension_abi.py`` checks the list against the file and the loaded extension).
OPS = frozenset(
    {
        *(NATIVE_PREFIX + kv for kv in ("kv_write_", "kv_compact_", "paged_kv_write_",
                                        "paged_kv_compact_")),
        "native_verify_ex", "native_accept_reject", "native_accept_tests_passed",
        "native_expected_accepts", "native_verify_tree", "native_emitted_logprobs",
        "native_verify_logprobs",
        "native_finish_ms", "native_logit_edits", "rowinv_linear", "rowinv_attention",
        "causal_lm_pass", "causal_lm_greedy_chain", "causal_lm_draft_pass", "causal_lm_draft_chain",
        "causal_lm_draft_sample_chain",
    }
)  # fmt: skip


def _load():
    """(the extension module or None, why it is not in use or None)."""
    if os.environ.get(FORCE_FALLBACK_ENV, "0").lower() in ("1", "true", "yes", "on"):
        return None, f"{FORCE_FALLBACK_ENV} is set"
    try:  # importing registers the native ops (csrc/bindings.cpp)
        from specdec_kernels import _C as module
    except ImportError as exc:
        return None, f"specdec_kernels._C could not be imported ({exc})"
    rebuild = (
        f"rebuild it (`python setup.py build_ext --inplace`, or reinstall), or set "
        f"{FORCE_FALLBACK_ENV}=1 to run without it"
    )
    stamp = getattr(module, "ABI_VERSION", None)
    if stamp is None and not hasattr(torch.ops.specdec, NATIVE_PREFIX + "kv_write_"):
        # An extension built from a much older csrc/bindings.cpp defines the public ops itself:
        # they would clash with the package's own definitions.
        raise ImportError(
            f"{module.__file__} was built from an older csrc/bindings.cpp (it has "
            f"no specdec::{NATIVE_PREFIX}kv_write_ op): {rebuild}"
        )
    if stamp != ABI_VERSION:
        return None, (
            f"{module.__file__} was built from another csrc/bindings.cpp (ABI stamp {stamp}, "
            f"this package needs {ABI_VERSION}): {rebuild}"
        )
    return module, None


_C, _load_error = _load()


@functools.cache
def native_devices() -> frozenset[str]:
    """Device types the extension has kernels for (``cpu``; ``cuda`` in a CUDA build)."""
    if _C is None:
        return frozenset()
    op = getattr(torch.ops.specdec, NATIVE_PREFIX + "kv_write_").default
    return frozenset(
        device
        for device, key in (("cpu", "CPU"), ("cuda", "CUDA"))
        if op.has_kernel_for_dispatch_key(key)
    )


def loaded() -> bool:
    """Whether ``specdec_kernels._C`` is loaded (see :func:`load_error` when it is not)."""
    return _C is not None


def has_op(name: str) -> bool:
    """Whether ``torch.ops.specdec.<name>`` is one of the loaded extension's ops (:data:`OPS`,
    promised by its checked ABI stamp): ``False`` for every name where it is not in use."""
    return _C is not None and name in OPS


def native_ops_available() -> bool:
    """Whether the extension's native CPU verification kernels (``native_verify_ex``,
    ``native_accept_reject``: the ``backend="native"`` kernels) are loaded."""
    return has_op("native_verify_ex")


def load_error() -> str | None:
    """Why the extension is not in use (``None`` when it is loaded)."""
    return _load_error
