// The AMX-BF16 linear layer (bfloat16 layers on Intel Sapphire Rapids and later).
#include "model_internal.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef SPECDEC_HAVE_AMX
namespace specdec {
namespace model_detail {

namespace {

// bfloat16 x bfloat16 on AMX's tile unit (Intel Sapphire Rapids and later): TDPBF16PS adds to
// each float32 element of a 16x16 tile the 32 products of one 32-element chunk of its weight row
// and its input row, in the instruction's fixed order, and a tile's element visits the chunks in
// input order; the element's sum never depends on the other rows in the tile, how many there
// are, or which thread computes it. Through inline assembly (binutils >= 2.36 knows the
// instructions; the "memory" clobbers order them with the plain loads and stores around them).
#define SPECDEC_TLOAD(t, p, stride)                                          \
  asm volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(p),                     \
               "r"(static_cast<int64_t>(stride))                             \
               : "memory")
#define SPECDEC_TSTORE(t, p, stride)                                         \
  asm volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(p),                 \
               "r"(static_cast<int64_t>(stride))                             \
               : "memory")
#define SPECDEC_TZERO(t) asm volatile("tilezero %%tmm" #t ::: "memory")
#define SPECDEC_TDP(c, a, b) \
  asm volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

// Every tile 16 rows of 64 bytes: weights (A: 16 weight rows x 32 elements), inputs (B: 16
// element pairs x 16 input rows) and sums (C: 16 weight rows x 16 input rows, float32).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// One group of weight tiles against every input block. w[i]: weight tile i's first row (16 rows
// of Cp bfloat16), x: the inputs packed for B ([blocks][Cp / 32][16][16] element pairs), out:
// [GN * 16][blocks * 16] float32. GN weight tiles (tmm0-2) share each input block (tmm3) with
// GN sums (tmm5-7) when there is one block; with more, two weight tiles (tmm0-1) and two blocks
// (tmm3-4) make four sums (tmm5, 6, 7, 2), blocks a multiple of two.
template <int GN>
void amx_group(const uint16_t* const* w, int64_t Cp, const uint32_t* x, int64_t blocks,
               float* out, const uint16_t* const* pf, int npf) {
  const int64_t chunks = Cp / 32, bs = chunks * 256, ld = blocks * 16 * sizeof(float);
  const int64_t ws = Cp * sizeof(uint16_t);
  // the next group's weights, one line of each row per chunk, while this one computes
  auto fetch = [&](int64_t k) {
    for (int i = 0; i < npf; ++i)
      for (int r = 0; r < 16; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(pf[i] + r * Cp + k * 32), _MM_HINT_T0);
  };
  if (blocks == 1) {
    SPECDEC_TZERO(5);
    if (GN > 1) SPECDEC_TZERO(6);
    if (GN > 2) SPECDEC_TZERO(7);
    for (int64_t k = 0; k < chunks; ++k) {
      fetch(k);
      SPECDEC_TLOAD(3, x + k * 256, 64);
      SPECDEC_TLOAD(0, w[0] + k * 32, ws);
      SPECDEC_TDP(5, 0, 3);
      if (GN > 1) {
        SPECDEC_TLOAD(1, w[1] + k * 32, ws);
        SPECDEC_TDP(6, 1, 3);
      }
      if (GN > 2) {
        SPECDEC_TLOAD(2, w[2] + k * 32, ws);
        SPECDEC_TDP(7, 2, 3);
      }
    }
    SPECDEC_TSTORE(5, out, ld);
    if (GN > 1) SPECDEC_TSTORE(6, out + 16 * 16, ld);
    if (GN > 2) SPECDEC_TSTORE(7, out + 32 * 16, ld);
    return;
  }
  TORCH_INTERNAL_ASSERT(GN <= 2, "amx_group: several input blocks take at most 2 weight tiles");
  for (int64_t j = 0; j < blocks; j += 2) {
    const uint32_t* x0 = x + j * bs;
    const uint32_t* x1 = x0 + bs;
    SPECDEC_TZERO(5);
    SPECDEC_TZERO(6);
    if (GN > 1) {
      SPECDEC_TZERO(7);
      SPECDEC_TZERO(2);
    }
    for (int64_t k = 0; k < chunks; ++k) {
      if (j == 0) fetch(k);
      SPECDEC_TLOAD(3, x0 + k * 256, 64);
      SPECDEC_TLOAD(4, x1 + k * 256, 64);
      SPECDEC_TLOAD(0, w[0] + k * 32, ws);
      SPECDEC_TDP(5, 0, 3);
      SPECDEC_TDP(6, 0, 4);
      if (GN > 1) {
        SPECDEC_TLOAD(1, w[1] + k * 32, ws);
        SPECDEC_TDP(7, 1, 3);
        SPECDEC_TDP(2, 1, 4);
      }
    }
    float* o = out + j * 16;
    SPECDEC_TSTORE(5, o, ld);
    SPECDEC_TSTORE(6, o + 16, ld);
    if (GN > 1) {
      SPECDEC_TSTORE(7, o + 16 * blocks * 16, ld);
      SPECDEC_TSTORE(2, o + 16 * blocks * 16 + 16, ld);
    }
  }
}

// A 16x16 block of 32-bit elements transposed: out[r][i] = in[i][r], in rows by pointer.
SPECDEC_AVX512BW inline void transpose16(const uint32_t* const* in, __m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(in[i]);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// The inputs as B tiles: block b, chunk c, pair row r, input row i = x[16b + i][32c + 2r, +1],
// zero past M.
SPECDEC_AVX512BW void pack_inputs(const uint16_t* x, int64_t M, int64_t Cp, int64_t blocks,
                                  uint32_t* xb) {
  alignas(64) static const uint32_t zeros[16] = {};
  const int64_t chunks = Cp / 32, half = Cp / 2;
  const uint32_t* x32 = reinterpret_cast<const uint32_t*>(x);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t c = 0; c < chunks; ++c) {
      const uint32_t* rows[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t m = b * 16 + i;
        rows[i] = m < M ? x32 + m * half + c * 16 : zeros;
      }
      __m512i r[16];
      transpose16(rows, r);
      uint32_t* o = xb + (b * chunks + c) * 256;
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(o + i * 16, r[i]);
    }
}

// Sums [16 weight rows][ld] (16 input rows from column m0) plus the bias, rounded to bfloat16
// exactly as c10::BFloat16(float) rounds (to nearest even, NaN to 0x7FC0), into out rows m0..
// (at most M), columns n0 .. n0 + cols.
SPECDEC_AVX512BW void store_sums(const float* sums, int64_t ld, int64_t m0, int64_t M,
                                 const at::BFloat16* bias, int64_t n0, int64_t cols, int64_t N,
                                 at::BFloat16* out) {
  const uint32_t* rows[16];
  for (int i = 0; i < 16; ++i) rows[i] = reinterpret_cast<const uint32_t*>(sums + i * ld + m0);
  __m512i r[16];
  transpose16(rows, r);
  const __mmask16 keep = static_cast<__mmask16>((1u << cols) - 1u);
  __m512 bv = _mm512_setzero_ps();
  if (bias != nullptr) {
    const __m256i bb = _mm256_maskz_loadu_epi16(keep, bias + n0);
    bv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bb), 16));
  }
  const __m512i one = _mm512_set1_epi32(1), round = _mm512_set1_epi32(0x7FFF);
  const __m512i nan = _mm512_set1_epi32(0x7FC0);
  for (int64_t i = 0; i < 16 && m0 + i < M; ++i) {
    const __m512 v = _mm512_add_ps(_mm512_castsi512_ps(r[i]), bv);
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i h = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(round, lsb)), 16);
    h = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), h, nan);
    _mm256_mask_storeu_epi16(out + (m0 + i) * N + n0, keep, _mm512_cvtepi32_epi16(h));
  }
}

}  // namespace

// out [M, N] = x [M, Cp] w [N, Cp]^T + bias, rounded once to bfloat16; threads split the weight
// tiles. x and w bfloat16 bits, Cp a multiple of 32.
void linear_amx(const uint16_t* x, int64_t M, int64_t Cp, const uint16_t* w, int64_t N,
                const at::BFloat16* bias, at::BFloat16* out) {
  // one block of 16 inputs, or an even number of them
  int64_t blocks = (M + 15) / 16;
  if (blocks > 1) blocks += blocks % 2;
  std::vector<uint32_t> xb(blocks * (Cp / 32) * 256);
  pack_inputs(x, M, Cp, blocks, xb.data());
  const int GN = blocks == 1 ? 3 : 2;
  const int64_t tiles = (N + 15) / 16, groups = (tiles + GN - 1) / GN;
  // a task streams at least ~128 KB of weights: a draft's small layers run on one thread
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (GN * 16 * Cp));
  at::parallel_for(0, groups, grain, [&](int64_t lo, int64_t hi) {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.colsb[t] = 64;
      cfg.rows[t] = 16;
    }
    asm volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
    std::vector<float> sums(GN * 16 * blocks * 16);
    std::vector<uint16_t> tail;  // a last, partial weight tile, zero-padded to 16 rows
    const int64_t ld = blocks * 16;
    for (int64_t g = lo; g < hi; ++g) {
      const int64_t t0 = g * GN, tn = std::min<int64_t>(GN, tiles - t0);
      const uint16_t* wt[3] = {nullptr, nullptr, nullptr};
      for (int64_t i = 0; i < tn; ++i) {
        const int64_t n0 = (t0 + i) * 16;
        wt[i] = w + n0 * Cp;
        if (N - n0 < 16) {
          tail.assign(16 * Cp, 0);
          std::memcpy(tail.data(), wt[i], (N - n0) * Cp * sizeof(uint16_t));
          wt[i] = tail.data();
        }
      }
      // the next group's full tiles, to prefetch
      const uint16_t* pf[3] = {nullptr, nullptr, nullptr};
      int npf = 0;
      if (g + 1 < hi)
        for (int64_t i = 0; i < GN && (t0 + GN + i + 1) * 16 <= N; ++i)
          pf[npf++] = w + (t0 + GN + i) * 16 * Cp;
      if (tn == 3) amx_group<3>(wt, Cp, xb.data(), blocks, sums.data(), pf, npf);
      else if (tn == 2) amx_group<2>(wt, Cp, xb.data(), blocks, sums.data(), pf, npf);
      else amx_group<1>(wt, Cp, xb.data(), blocks, sums.data(), pf, npf);
      for (int64_t i = 0; i < tn; ++i) {
        const int64_t n0 = (t0 + i) * 16, cols = std::min<int64_t>(16, N - n0);
        for (int64_t m0 = 0; m0 < M; m0 += 16)
          store_sums(sums.data() + i * 16 * ld, ld, m0, M, bias, n0, cols, N, out);
      }
    }
    asm volatile("tilerelease" ::: "memory");
  });
}

}  // namespace model_detail
}  // namespace specdec
#endif  // SPECDEC_HAVE_AMX
