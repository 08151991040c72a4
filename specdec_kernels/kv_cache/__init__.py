"""KV caches with per-row rollback for speculative decoding: :class:`KVCache` (contiguous,
:mod:`~specdec_kernels.kv_cache.contiguous`) and :class:`PagedKVCache` (block tables and a free
list, :mod:`~specdec_kernels.kv_cache.paged`).

After verification each row keeps a different number of tokens. Rolling back is bookkeeping
only (the per-row ``lengths``; for the paged cache also the block tables and the free list, all
on the cache's device): no data is copied or cleared. Only ``write`` and ``compact`` move data,
through the ops ``torch.ops.specdec.kv_write_`` / ``kv_compact_`` and their paged twins (C++/CUDA
kernels of ``csrc/``, or their pure-PyTorch fallback where the extension is not built: see
:func:`specdec_kernels.extension_available`).

Both classes have the same verbs -- ``write``, ``advance``, ``rollback``, ``compact`` -- with the
same ``validate`` contract (:data:`~specdec_kernels.kv_cache._checks.VALIDATE_DOC`): metadata is
always checked; with ``validate=True`` (the default) values are checked too, which synchronises
once per call, bad input raises ``ValueError`` naming the row and the numbers, and a failed call
leaves the cache exactly as it was; with ``validate=False`` no verb synchronises with the device.
"""

from specdec_kernels.kv_cache._ops import extension_available, force_fallback
from specdec_kernels.kv_cache.contiguous import KVCache
from specdec_kernels.kv_cache.paged import PagedKVCache

__all__ = ["KVCache", "PagedKVCache", "extension_available", "force_fallback"]
