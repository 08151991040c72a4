// The KV-cache ops of specdec_kernels: declarations of the checked adapters that bindings.cpp
// registers with torch.library. Schemas (namespace `specdec`):
//
//   kv_write_(Tensor(a!) kv_cache, int layer, Tensor key, Tensor value, Tensor offsets) -> ()
//   kv_compact_(Tensor(a!) kv_cache, Tensor src_positions, Tensor num_keep, Tensor start) -> ()
//   paged_kv_write_(Tensor(a!) kv_cache, int layer, Tensor key, Tensor value,
//                   Tensor block_tables, Tensor offsets) -> ()
//   paged_kv_compact_(Tensor(a!) kv_cache, Tensor block_tables, Tensor src_positions,
//                     Tensor num_keep, Tensor start) -> ()
//
// kv_cache is [L, 2, B, H, S, D] (contiguous cache) or [L, 2, num_blocks, H, block_size, D]
// (paged); key/value [B, H, T, D] of kv_cache's dtype; offsets/num_keep/start [B] int64;
// src_positions [B, P] int64; block_tables [B, max_blocks] int32 (-1 = unused).
// The pure-PyTorch twin of every op is specdec_kernels/reference/kv_cache.py.
#pragma once

#include <ATen/ATen.h>

namespace specdec {

void kv_write_cpu(const at::Tensor& kv_cache, int64_t layer, const at::Tensor& key,
                  const at::Tensor& value, const at::Tensor& offsets);
void kv_compact_cpu(const at::Tensor& kv_cache, const at::Tensor& src_positions,
                    const at::Tensor& num_keep, const at::Tensor& start);
void paged_kv_write_cpu(const at::Tensor& kv_cache, int64_t layer, const at::Tensor& key,
                        const at::Tensor& value, const at::Tensor& block_tables,
                        const at::Tensor& offsets);
void paged_kv_compact_cpu(const at::Tensor& kv_cache, const at::Tensor& block_tables,
                          const at::Tensor& src_positions, const at::Tensor& num_keep,
                          const at::Tensor& start);

#ifdef SPECDEC_WITH_CUDA
void kv_write_cuda(const at::Tensor& kv_cache, int64_t layer, const at::Tensor& key,
                   const at::Tensor& value, const at::Tensor& offsets);
void kv_compact_cuda(const at::Tensor& kv_cache, const at::Tensor& src_positions,
                     const at::Tensor& num_keep, const at::Tensor& start);
void paged_kv_write_cuda(const at::Tensor& kv_cache, int64_t layer, const at::Tensor& key,
                         const at::Tensor& value, const at::Tensor& block_tables,
                         const at::Tensor& offsets);
void paged_kv_compact_cuda(const at::Tensor& kv_cache, const at::Tensor& block_tables,
                           const at::Tensor& src_positions, const at::Tensor& num_keep,
                           const at::Tensor& start);
#endif

}  // namespace specdec
