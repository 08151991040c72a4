// Sixteen-lane GCC vectors for the generic (target_clones) code: loads, the fixed pairwise lane
// sum and the dot-product tile. Header-only, inline: instantiated inside each clone.
#pragma once

#include "model_internal.h"

#include <cstdint>
#include <cstring>

namespace specdec {
namespace model_detail {

// Sixteen float lanes as a GCC vector: lowered to one AVX-512 register, two AVX2 or four SSE
// ones; lane-wise arithmetic, so every build computes the same bits.
typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));

SPECDEC_INLINE v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

SPECDEC_INLINE v16f load16(const uint16_t* p) {  // bfloat16 bits -> float32
  v16h h;
  std::memcpy(&h, p, sizeof(h));
  v16u u = __builtin_convertvector(h, v16u) << 16;
  v16f v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

SPECDEC_INLINE float tree_sum(v16f acc) {
  float a[kLanes];
  std::memcpy(a, &acc, sizeof(a));
  for (int s = kLanes / 2; s > 0; s >>= 1)
    for (int l = 0; l < s; ++l) a[l] += a[l + s];
  return a[0];
}

// out[m, r] = dot(x[m, :], w[r, :]) for every m < M and r < kRows.
// x: [M, Cp] float32, rows zero-padded to Cp (a multiple of kLanes); w: kRows rows of Cp
// elements (float or bfloat16 bits), zero-padded likewise; out: [M, kRows] with row stride ld
// (a tile's columns of a wider buffer). pf: the weight tile
// to fetch into cache meanwhile (nullptr: none). A small batch's linear layer waits on memory
// (the weights are read once per call and do not stay in cache between a model's passes): the
// prefetch overlaps the next tiles' loads with this one's arithmetic, which it leaves alone.
template <typename W>
SPECDEC_INLINE void dot_tile(const float* x, int64_t M, int64_t Cp, const W* w, float* out,
                             int64_t ld, const W* pf) {
  for (int64_t c = 0; pf != nullptr && c < Cp * kRows; c += 64 / sizeof(W))
    __builtin_prefetch(pf + c);
  int64_t m = 0;
  for (; m + kCols <= M; m += kCols) {
    v16f acc[kCols][kRows] = {};
    for (int64_t c = 0; c < Cp; c += kLanes) {
      v16f wv[kRows];
      for (int r = 0; r < kRows; ++r) wv[r] = load16(w + r * Cp + c);
      for (int i = 0; i < kCols; ++i) {
        const v16f xv = load16(x + (m + i) * Cp + c);
        for (int r = 0; r < kRows; ++r) acc[i][r] += xv * wv[r];
      }
    }
    for (int i = 0; i < kCols; ++i)
      for (int r = 0; r < kRows; ++r) out[(m + i) * ld + r] = tree_sum(acc[i][r]);
  }
  for (; m < M; ++m) {  // the same per-element arithmetic as above, one input row at a time
    v16f acc[kRows] = {};
    for (int64_t c = 0; c < Cp; c += kLanes) {
      const v16f xv = load16(x + m * Cp + c);
      for (int r = 0; r < kRows; ++r) acc[r] += xv * load16(w + r * Cp + c);
    }
    for (int r = 0; r < kRows; ++r) out[m * ld + r] = tree_sum(acc[r]);
  }
}

}  // namespace model_detail
}  // namespace specdec
