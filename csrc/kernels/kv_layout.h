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

// Block tables of a paged cache: `[B, max_blocks]` int32, -1 where unused. `paged == false`
// means "no table": position `pos` of row `b` lives at cache row `b`, slot `pos`. (Not `data ==
// nullptr`: an empty `[B, 0]` table has no data pointer either, and its rows own no position.)
struct BlockTable {
  const int32_t* data;  // [B, max_blocks] block_tables (or nullptr)
  int64_t stride;      // elements between consecutive rows of the table
  int64_t max_blocks;  // width of the table
  bool paged;          // whether there is a table (data may still be nullptr when it is empty)
};

// Positions a row of the cache has: `num_pos` without a table, `max_blocks * num_pos` with one
// (saturated at INT64_MAX, so that garbage sizes cannot make it wrap).
SPECDEC_HOST_DEVICE int64_t row_capacity(const KvLayout& c, const BlockTable& t) {
  if (!t.paged) return c.num_pos;
  if (c.num_pos != 0 && t.max_blocks > INT64_MAX / c.num_pos) return INT64_MAX;
  return t.max_blocks * c.num_pos;
}

// Whether positions [first, first + count) all lie in [0, capacity), for count >= 0, without
// forming first + count (which wraps past INT64_MAX for garbage offsets).
SPECDEC_HOST_DEVICE bool run_inside(int64_t first, int64_t count, int64_t capacity) {
  return first >= 0 && count >= 0 && count <= capacity && first <= capacity - count;
}

// Address of the `D`-element run of (layer, kv, batch row b, head h, logical position pos), or
// nullptr when the position is outside the cache (out-of-range offsets are never dereferenced).
SPECDEC_HOST_DEVICE char* slot_ptr(const KvLayout& c, const BlockTable& t, int64_t layer,
                                   int64_t kv, int64_t b, int64_t h, int64_t pos) {
  if (pos < 0 || pos >= row_capacity(c, t)) return nullptr;
  int64_t row = b;
  int64_t slot = pos;
  if (t.paged) {
    row = t.data[b * t.stride + pos / c.num_pos];
    slot = pos % c.num_pos;
    if (row < 0 || row >= c.num_rows) return nullptr;
  }
  return c.base + layer * c.layer_stride + kv * c.kv_stride + row * c.row_stride +
         h * c.head_stride + slot * c.pos_stride;
}

// slot_ptr of position `first + i` (i >= 0, an index into a run that starts at `first`): nullptr
// when that position is outside the cache, tested as `first < capacity - i` before the sum is
// formed, so an offset near INT64_MAX is skipped instead of wrapping onto a real slot.
SPECDEC_HOST_DEVICE char* slot_ptr_at(const KvLayout& c, const BlockTable& t, int64_t layer,
                                      int64_t kv, int64_t b, int64_t h, int64_t first,
                                      int64_t i) {
  if (i < 0 || first >= row_capacity(c, t) - i) return nullptr;
  return slot_ptr(c, t, layer, kv, b, h, first + i);
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
