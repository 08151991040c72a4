// Input checks shared by the CPU and CUDA adapters of the KV-cache ops, and the conversion of
// checked tensors into the plain-pointer argument structs the kernels take.
//
// Every failed check raises ValueError in Python (TORCH_CHECK_VALUE) and names the argument and
// the shapes it saw. The checks only look at metadata (shapes, dtypes, devices, strides), never at
// device memory; the CPU adapter checks values in addition (kv_cache_cpu.cpp).
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "kernels/kv_layout.h"

namespace specdec {

inline void check_cache(const char* op, const at::Tensor& kv_cache) {
  TORCH_CHECK_VALUE(kv_cache.dim() == 6, op, ": kv_cache must be 6-d [L, 2, R, H, P, D], got ",
                    kv_cache.sizes());
  TORCH_CHECK_VALUE(kv_cache.size(1) == 2, op, ": kv_cache dim 1 must be 2 (K and V), got ",
                    kv_cache.sizes());
  TORCH_CHECK_VALUE(kv_cache.stride(5) == 1 || kv_cache.size(5) == 1, op,
                    ": kv_cache's last dim must be contiguous (stride 1), got strides ",
                    kv_cache.strides());
}

inline void check_index(const char* op, const char* name, const at::Tensor& t, int64_t dim,
                        at::ScalarType dtype, const at::Tensor& kv_cache) {
  TORCH_CHECK_VALUE(t.dim() == dim, op, ": ", name, " must be ", dim, "-d, got shape ",
                    t.sizes());
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype, ", got ",
                    t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == kv_cache.device(), op, ": ", name, " is on ", t.device(),
                    " but kv_cache is on ", kv_cache.device());
}

inline void check_rows(const char* op, const char* name, const at::Tensor& t, int64_t rows,
                       const char* rows_from) {
  TORCH_CHECK_VALUE(t.size(0) == rows, op, ": ", name, " has shape ", t.sizes(), " but ",
                    rows_from, " has ", rows, " rows");
}

inline KvLayout make_layout(const at::Tensor& kv_cache) {
  const int64_t item = kv_cache.element_size();
  KvLayout c;
  c.base = static_cast<char*>(kv_cache.data_ptr());
  c.layer_stride = kv_cache.stride(0) * item;
  c.kv_stride = kv_cache.stride(1) * item;
  c.row_stride = kv_cache.stride(2) * item;
  c.head_stride = kv_cache.stride(3) * item;
  c.pos_stride = kv_cache.stride(4) * item;
  c.num_layers = kv_cache.size(0);
  c.num_rows = kv_cache.size(2);
  c.num_heads = kv_cache.size(3);
  c.num_pos = kv_cache.size(4);
  c.row_bytes = kv_cache.size(5) * item;
  return c;
}

inline BlockTable make_table(const at::Tensor* block_tables) {
  if (block_tables == nullptr) return BlockTable{nullptr, 0, 0, false};
  return BlockTable{block_tables->data_ptr<int32_t>(), block_tables->stride(0),
                    block_tables->size(1), true};
}

// Checks of kv_write_ / paged_kv_write_. `block_tables` is nullptr for the contiguous cache.
// Returns the kernel arguments; `offsets` must stay alive (and contiguous) while they are used.
inline KvWriteArgs check_write(const char* op, const at::Tensor& kv_cache, int64_t layer,
                               const at::Tensor& key, const at::Tensor& value,
                               const at::Tensor* block_tables, const at::Tensor& offsets) {
  check_cache(op, kv_cache);
  const int64_t L = kv_cache.size(0), H = kv_cache.size(3), D = kv_cache.size(5);
  TORCH_CHECK_VALUE(0 <= layer && layer < L, op, ": layer ", layer, " is outside [0, ", L,
                    ") for kv_cache of shape ", kv_cache.sizes());
  if (block_tables != nullptr) {
    check_index(op, "block_tables", *block_tables, 2, at::kInt, kv_cache);
  }
  const int64_t B = block_tables ? block_tables->size(0) : kv_cache.size(2);
  const char* rows_from = block_tables ? "block_tables" : "kv_cache (dim 2)";
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"key", key},
                                std::pair<const char*, const at::Tensor&>{"value", value}}) {
    TORCH_CHECK_VALUE(t.dim() == 4, op, ": ", name, " must be 4-d [B, H, T, D], got shape ",
                      t.sizes());
    TORCH_CHECK_VALUE(t.size(0) == B && t.size(1) == H && t.size(3) == D, op, ": ", name,
                      " must have shape [B, H, T, D] = [", B, ", ", H, ", T, ", D,
                      "] to match kv_cache of shape ", kv_cache.sizes(), " and ", rows_from,
                      ", got ", t.sizes());
    TORCH_CHECK_VALUE(t.scalar_type() == kv_cache.scalar_type(), op, ": ", name, " is ",
                      t.scalar_type(), " but kv_cache is ", kv_cache.scalar_type());
    TORCH_CHECK_VALUE(t.device() == kv_cache.device(), op, ": ", name, " is on ", t.device(),
                      " but kv_cache is on ", kv_cache.device());
    TORCH_CHECK_VALUE(t.stride(3) == 1 || D == 1, op, ": ", name,
                      "'s last dim must be contiguous (stride 1), got strides ", t.strides());
  }
  TORCH_CHECK_VALUE(key.sizes() == value.sizes(), op, ": key and value must have the same shape, "
                    "got ", key.sizes(), " and ", value.sizes());
  check_index(op, "offsets", offsets, 1, at::kLong, kv_cache);
  check_rows(op, "offsets", offsets, B, rows_from);

  const int64_t item = kv_cache.element_size();
  KvWriteArgs a;
  a.cache = make_layout(kv_cache);
  a.table = make_table(block_tables);
  a.layer = layer;
  a.key = static_cast<const char*>(key.data_ptr());
  a.value = static_cast<const char*>(value.data_ptr());
  for (int d = 0; d < 3; ++d) {
    a.key_strides[d] = key.stride(d) * item;
    a.value_strides[d] = value.stride(d) * item;
  }
  a.batch = B;
  a.num_heads = H;
  a.num_tokens = key.size(2);
  a.offsets = offsets.data_ptr<int64_t>();
  return a;
}

// Checks of kv_compact_ / paged_kv_compact_. The index tensors must be contiguous.
inline KvCompactArgs check_compact(const char* op, const at::Tensor& kv_cache,
                                   const at::Tensor* block_tables,
                                   const at::Tensor& src_positions, const at::Tensor& num_keep,
                                   const at::Tensor& start) {
  check_cache(op, kv_cache);
  if (block_tables != nullptr) {
    check_index(op, "block_tables", *block_tables, 2, at::kInt, kv_cache);
  }
  const int64_t B = block_tables ? block_tables->size(0) : kv_cache.size(2);
  const char* rows_from = block_tables ? "block_tables" : "kv_cache (dim 2)";
  check_index(op, "src_positions", src_positions, 2, at::kLong, kv_cache);
  check_index(op, "num_keep", num_keep, 1, at::kLong, kv_cache);
  check_index(op, "start", start, 1, at::kLong, kv_cache);
  check_rows(op, "src_positions", src_positions, B, rows_from);
  check_rows(op, "num_keep", num_keep, B, rows_from);
  check_rows(op, "start", start, B, rows_from);

  KvCompactArgs a;
  a.cache = make_layout(kv_cache);
  a.table = make_table(block_tables);
  a.src_positions = src_positions.data_ptr<int64_t>();
  a.num_src = src_positions.size(1);
  a.num_keep = num_keep.data_ptr<int64_t>();
  a.start = start.data_ptr<int64_t>();
  a.batch = B;
  return a;
}

}  // namespace specdec
