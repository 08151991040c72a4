"""specdec_kernels: fused kernels for speculative decoding.

Public contract: ``API.md`` (shared with the project). Every name below is part of it.
"""

from specdec_kernels.verification import (
    Verification,
    accept_reject,
    verify_greedy,
    verify_sampling,
)
from specdec_kernels._extension import extension_available
from specdec_kernels.kv_cache import KVCache, PagedKVCache

__version__ = "0.1.0"

__all__ = [
    "Verification",
    "accept_reject",
    "verify_greedy",
    "verify_sampling",
    "KVCache",
    "PagedKVCache",
    "extension_available",
]
