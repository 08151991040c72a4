// Address arithmetic shared by the CPU and CUDA KV-cache kernels.
//
// Every cache is a 6-d buffer  [L, 2, R, H, P, D]  (layer, K/V, row, head, position, head dim):
//   contiguous cache (KVCache):      R = batch rows,  P = max_seq_len
//   paged cache (PagedKVCache):      R = num_blocks,  P = block_size   (FlashInfer's "HND" pages)
// The kernels only copy whole `D`-element rows, so they work on raw bytes and are dtype-agnostic:
// any element type gives bit-identical copies.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPECDEC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SPECDEC_HOST_DEVICE inline
#endif

namespace specdec {

// Byte strides of a cache buffer `[L, 2, R, H, P, D]`; the last dim is contiguous.
struct KvLayout {
  char* base;  // [L, 2, R, H, P, D] kv_cache, addressed in bytes
  int64_t layer_stride, kv_stride, row_stride, head_stride, pos_stride;  // bytes
  int64_t num_layers, num_rows, num_heads, num_pos;
  int64_t row_bytes;  // D * element size
};

// Block tables of a paged cache: `[B, max_blocks]` int32, -1 where unused. `data == nullptr`
// means "no table": position `pos` of row `b` lives at cache row `b`, slot `pos`.
struct BlockTable {
  const int32_t* data;  // [B, max_blocks] block_tables (or nullptr)
  int64_t stride;      // elements between consecutive rows of the table
  int64_t max_blocks;  // width of the table
};

// Address of the `D`-element run of (layer, kv, batch row b, head h, logical position pos), or
// nullptr when the position is outside the cache (out-of-range offsets are never dereferenced).
SPECDEC_HOST_DEVICE char* slot_ptr(const KvLayout& c, const BlockTable& t, int64_t layer,
                                   int64_t kv, int64_t b, int64_t h, int64_t pos) {
  int64_t row = b;
  int64_t slot = pos;
  if (t.data != nullptr) {
    if (pos < 0 || pos >= t.max_blocks * c.num_pos) return nullptr;
    row = t.data[b * t.stride + pos / c.num_pos];
    slot = pos % c.num_pos;
    if (row < 0 || row >= c.num_rows) return nullptr;
  } else if (pos < 0 || pos >= c.num_pos) {
    return nullptr;
  }
  return c.base + layer * c.layer_stride + kv * c.kv_stride + row * c.row_stride +
         h * c.head_stride + slot * c.pos_stride;
}

// kv_write_: cache[layer, 0|1, row(b), h, offsets[b] + t, :] = key|value[b, h, t, :]
struct KvWriteArgs {
  KvLayout cache;
  BlockTable table;
  int64_t layer;
  const char* key;           // [B, H, T, D] key, addressed in bytes
  const char* value;         // [B, H, T, D] value, addressed in bytes
  int64_t key_strides[3];    // bytes, dims b, h, t of `key`
  int64_t value_strides[3];  // bytes, dims b, h, t of `value`
  int64_t batch, num_heads, num_tokens;
  const int64_t* offsets;  // [B] offsets: first position written per row
};

// kv_compact_: for i < num_keep[b], position start[b] + i <- old position src_positions[b, i],
// in every layer, K and V.
struct KvCompactArgs {
  KvLayout cache;
  BlockTable table;
  const int64_t* src_positions;  // [B, P] src_positions, contiguous
  int64_t num_src;               // P
  const int64_t* num_keep;       // [B] num_keep
  const int64_t* start;          // [B] start: first destination position per row
  int64_t batch;
};

SPECDEC_HOST_DEVICE int64_t clamp_keep(int64_t n, int64_t num_src) {
  return n < 0 ? 0 : (n > num_src ? num_src : n);
}

}  // namespace specdec
