// CUDA kernels and launchers for the KV-cache ops. Copies are done in `Unit`s (16, 8, 4, 2 or 1
// bytes), the widest unit that every address and byte stride involved is aligned to, so a row of
// 128 bf16 values moves as 16 x 16-byte loads/stores. Positions outside the cache are skipped,
// never dereferenced, whatever the index values.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "kv_layout.h"

namespace specdec {
namespace cuda {

constexpr int kMaxThreads = 256;

// Threads per block for `work` copy units per block: whole warps, at most kMaxThreads, so that
// small decode-time copies (T = 1..8 rows per head) do not leave most of a block idle.
inline int threads_for(int64_t work) {
  const int64_t warps = (work + 31) / 32;
  return static_cast<int>(warps < 1 ? 32 : (warps * 32 > kMaxThreads ? kMaxThreads : warps * 32));
}
constexpr int64_t kSharedStageBytes = 48 * 1024;  // default dynamic shared memory limit

// ---------------------------------------------------------------------------------------------
// kv_write_: grid (B * H, 2); block b*H+h, y = K/V, threads stride over (t, unit).
// The pointers (cache [L, 2, R, H, P, D], key/value [B, H, T, D], offsets [B], block tables
// [B, max_blocks]) are in `a`, with their shapes commented in kv_layout.h.
template <typename Unit>
__global__ void kv_write_kernel(KvWriteArgs a) {
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / a.num_heads;
  const int64_t h = bh % a.num_heads;
  const int64_t kv = blockIdx.y;
  const char* src = kv ? a.value : a.key;
  const int64_t* s = kv ? a.value_strides : a.key_strides;
  const int64_t units = a.cache.row_bytes / static_cast<int64_t>(sizeof(Unit));
  const int64_t offset = a.offsets[b];
  for (int64_t idx = threadIdx.x; idx < a.num_tokens * units; idx += blockDim.x) {
    const int64_t t = idx / units;
    const int64_t u = idx % units;
    char* dst = slot_ptr_at(a.cache, a.table, a.layer, kv, b, h, offset, t);
    if (dst == nullptr) continue;
    const Unit* from = reinterpret_cast<const Unit*>(src + b * s[0] + h * s[1] + t * s[2]);
    reinterpret_cast<Unit*>(dst)[u] = from[u];
  }
}

template <typename Unit>
void launch_kv_write_typed(const KvWriteArgs& a, cudaStream_t stream) {
  if (a.batch * a.num_heads == 0 || a.num_tokens == 0 || a.cache.row_bytes == 0) return;
  const dim3 grid(static_cast<unsigned>(a.batch * a.num_heads), 2);
  const int64_t units = a.cache.row_bytes / static_cast<int64_t>(sizeof(Unit));
  kv_write_kernel<Unit><<<grid, threads_for(a.num_tokens * units), 0, stream>>>(a);
}

// ---------------------------------------------------------------------------------------------
// kv_compact_: grid (B * H, 2, L): one launch for all layers and both K and V. Each block owns
// the (layer, K/V, row, head) slice, so all hazards between sources and destinations are inside
// one block: it stages the kept sources of a column chunk (in shared memory, or in the global
// scratch `stage` when P rows do not fit), synchronises, then writes the destinations.
// `a` holds the cache [L, 2, R, H, P, D], src_positions [B, P], num_keep [B], start [B] and
// block tables [B, max_blocks] (shapes in kv_layout.h).
template <typename Unit>
__global__ void kv_compact_kernel(KvCompactArgs a,
                                  Unit* global_stage,  // [L * 2 * B * H, stage_units] or nullptr
                                  int64_t stage_units) {
  extern __shared__ __align__(16) unsigned char shared_raw[];
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / a.cache.num_heads;
  const int64_t h = bh % a.cache.num_heads;
  const int64_t kv = blockIdx.y;
  const int64_t layer = blockIdx.z;
  const int64_t n = clamp_keep(a.num_keep[b], a.num_src);
  if (n == 0) return;
  Unit* stage = reinterpret_cast<Unit*>(shared_raw);
  if (global_stage != nullptr) {
    const int64_t block = (layer * gridDim.y + kv) * gridDim.x + bh;
    stage = global_stage + block * stage_units;
  }
  const int64_t* src = a.src_positions + b * a.num_src;
  const int64_t start = a.start[b];
  const int64_t units = a.cache.row_bytes / static_cast<int64_t>(sizeof(Unit));
  int64_t cols = stage_units / n;  // units of each row staged per pass
  if (cols > units) cols = units;
  for (int64_t c0 = 0; c0 < units; c0 += cols) {
    const int64_t width = (units - c0 < cols) ? units - c0 : cols;
    for (int64_t idx = threadIdx.x; idx < n * width; idx += blockDim.x) {
      const int64_t i = idx / width;
      const int64_t u = c0 + idx % width;
      const char* from = slot_ptr(a.cache, a.table, layer, kv, b, h, src[i]);
      if (from != nullptr) stage[idx] = reinterpret_cast<const Unit*>(from)[u];
    }
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < n * width; idx += blockDim.x) {
      const int64_t i = idx / width;
      const int64_t u = c0 + idx % width;
      char* to = slot_ptr_at(a.cache, a.table, layer, kv, b, h, start, i);
      if (to != nullptr && slot_ptr(a.cache, a.table, layer, kv, b, h, src[i]) != nullptr) {
        reinterpret_cast<Unit*>(to)[u] = stage[idx];
      }
    }
    __syncthreads();
  }
}

// Bytes the global scratch needs when `P` staged rows do not fit in shared memory (0 otherwise).
inline int64_t compact_scratch_bytes(const KvCompactArgs& a) {
  if (a.num_src * a.cache.row_bytes <= kSharedStageBytes) return 0;
  return a.cache.num_layers * 2 * a.batch * a.cache.num_heads * a.num_src * a.cache.row_bytes;
}

// `scratch` must hold compact_scratch_bytes(a) bytes (16-byte aligned) when that is non-zero.
template <typename Unit>
void launch_kv_compact_typed(const KvCompactArgs& a,
                             void* scratch,  // [compact_scratch_bytes(a)] bytes, or nullptr
                             cudaStream_t stream) {
  const int64_t bh = a.batch * a.cache.num_heads;
  if (bh == 0 || a.cache.num_layers == 0 || a.num_src == 0 || a.cache.row_bytes == 0) return;
  const dim3 grid(static_cast<unsigned>(bh), 2, static_cast<unsigned>(a.cache.num_layers));
  const int64_t units = a.cache.row_bytes / static_cast<int64_t>(sizeof(Unit));
  const int64_t stage_units = a.num_src * units;  // all P rows, whole
  const int threads = threads_for(stage_units);
  if (compact_scratch_bytes(a) == 0) {
    // Whole rows of all P sources fit in shared memory: one pass per block.
    kv_compact_kernel<Unit><<<grid, threads, stage_units * sizeof(Unit), stream>>>(
        a, nullptr, stage_units);
  } else {
    kv_compact_kernel<Unit><<<grid, threads, 0, stream>>>(a, static_cast<Unit*>(scratch),
                                                          stage_units);
  }
}

// ---------------------------------------------------------------------------------------------
// Widest copy unit every address and byte stride in `values` is a multiple of.
inline int unit_bytes(std::initializer_list<int64_t> values) {
  int64_t all = 0;
  for (int64_t v : values) all |= v;
  for (int unit = 16; unit > 1; unit /= 2) {
    if (all % unit == 0) return unit;
  }
  return 1;
}

#define SPECDEC_DISPATCH_UNIT(BYTES, ...)                      \
  switch (BYTES) {                                             \
    case 16: { using Unit = uint4; __VA_ARGS__(); break; }     \
    case 8: { using Unit = uint2; __VA_ARGS__(); break; }      \
    case 4: { using Unit = uint32_t; __VA_ARGS__(); break; }   \
    case 2: { using Unit = uint16_t; __VA_ARGS__(); break; }   \
    default: { using Unit = uint8_t; __VA_ARGS__(); break; }   \
  }

inline void launch_kv_write(const KvWriteArgs& a, cudaStream_t stream) {
  const KvLayout& c = a.cache;
  const int bytes = unit_bytes({reinterpret_cast<int64_t>(c.base), c.layer_stride, c.kv_stride,
                                c.row_stride, c.head_stride, c.pos_stride, c.row_bytes,
                                reinterpret_cast<int64_t>(a.key),
                                reinterpret_cast<int64_t>(a.value), a.key_strides[0],
                                a.key_strides[1], a.key_strides[2], a.value_strides[0],
                                a.value_strides[1], a.value_strides[2]});
  SPECDEC_DISPATCH_UNIT(bytes, [&] { launch_kv_write_typed<Unit>(a, stream); });
}

inline void launch_kv_compact(const KvCompactArgs& a,
                              void* scratch,  // [compact_scratch_bytes(a)] bytes, or nullptr
                              cudaStream_t stream) {
  const KvLayout& c = a.cache;
  const int bytes = unit_bytes({reinterpret_cast<int64_t>(c.base), c.layer_stride, c.kv_stride,
                                c.row_stride, c.head_stride, c.pos_stride, c.row_bytes});
  SPECDEC_DISPATCH_UNIT(bytes, [&] { launch_kv_compact_typed<Unit>(a, scratch, stream); });
}

}  // namespace cuda
}  // namespace specdec
