// CPU kernels and launchers for the KV-cache ops: parallel over (layer, K/V, row, head) with
// at::parallel_for, one memcpy per `D`-element run.
#pragma once

#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "kv_layout.h"

namespace specdec {
namespace cpu {

// cache[layer, kv, row(b), h, offsets[b] + t, :] = (kv ? value : key)[b, h, t, :]
// `a` holds the cache [L, 2, R, H, P, D], key/value [B, H, T, D], offsets [B] and block tables
// [B, max_blocks] (shapes in kv_layout.h).
// Bytes moved: 2 (K and V) * B * H * T * row_bytes read and as many written.
inline void launch_kv_write(const KvWriteArgs& a) {
  const int64_t tasks = 2 * a.batch * a.num_heads;
  at::parallel_for(0, tasks, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kv = task / (a.batch * a.num_heads);
      const int64_t b = (task / a.num_heads) % a.batch;
      const int64_t h = task % a.num_heads;
      const char* src = kv ? a.value : a.key;
      const int64_t* s = kv ? a.value_strides : a.key_strides;
      const int64_t offset = a.offsets[b];
      for (int64_t t = 0; t < a.num_tokens; ++t) {
        char* dst = slot_ptr_at(a.cache, a.table, a.layer, kv, b, h, offset, t);
        if (dst == nullptr) continue;
        std::memcpy(dst, src + b * s[0] + h * s[1] + t * s[2], a.cache.row_bytes);
      }
    }
  });
}

// For i < num_keep[b]: cache[l, kv, b, h, start[b] + i] <- old cache[l, kv, b, h, src[b, i]].
// `a` holds the cache [L, 2, R, H, P, D], src_positions [B, P], num_keep [B], start [B] and block
// tables [B, max_blocks] (shapes in kv_layout.h).
// Each task gathers its sources into a private buffer before writing any destination, so the
// result is correct for any overlap and any order of `src_positions`.
// Bytes moved: 2 * L * sum_b num_keep[b] * H * row_bytes, read twice and written twice (gather
// into the buffer, then scatter from it).
inline void launch_kv_compact(const KvCompactArgs& a) {
  const KvLayout& c = a.cache;
  const int64_t tasks = c.num_layers * 2 * a.batch * c.num_heads;
  at::parallel_for(0, tasks, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
    std::vector<char> stage;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t layer = task / (2 * a.batch * c.num_heads);
      const int64_t kv = (task / (a.batch * c.num_heads)) % 2;
      const int64_t b = (task / c.num_heads) % a.batch;
      const int64_t h = task % c.num_heads;
      const int64_t n = clamp_keep(a.num_keep[b], a.num_src);
      if (n == 0) continue;
      stage.resize(static_cast<size_t>(n * c.row_bytes));
      const int64_t* src = a.src_positions + b * a.num_src;
      for (int64_t i = 0; i < n; ++i) {
        const char* from = slot_ptr(c, a.table, layer, kv, b, h, src[i]);
        if (from != nullptr) std::memcpy(stage.data() + i * c.row_bytes, from, c.row_bytes);
      }
      for (int64_t i = 0; i < n; ++i) {
        char* to = slot_ptr_at(c, a.table, layer, kv, b, h, a.start[b], i);
        if (to != nullptr && slot_ptr(c, a.table, layer, kv, b, h, src[i]) != nullptr) {
          std::memcpy(to, stage.data() + i * c.row_bytes, c.row_bytes);
        }
      }
    }
  });
}

}  // namespace cpu
}  // namespace specdec
