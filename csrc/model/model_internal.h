// Internal declarations of the row-invariant CPU model kernels (csrc/model/): what crosses their
// files, in specdec::model_detail. The public ops are declared in csrc/model.h.
//
// Row-invariant model kernels for the CPU: a linear layer and cached attention whose result for
// one token does not depend on how many other tokens share the call.
//
// A speculative verify pass scores K+1 tokens per row where plain decoding scores one; BLAS and
// oneDNN pick different blockings (and so different reduction orders) for different numbers of
// rows, so the same token's logits can differ by an ulp between the two passes, and greedy
// output can diverge. Here every output element is reduced in one fixed order that depends only
// on the reduction length: 16 partial sums over the input in order, then a fixed pairwise tree.
// (A bfloat16 layer on a CPU with AMX reduces in the tile unit's own fixed order instead, and
// the AVX2 tile in one fused multiply-add chain over the input, on a packed copy of the weights:
// one order per process, whatever the row count; see linear_amx and linear_outer_avx2.)
// Threads split the output columns (linear) or the (row, head, query) triples (attention), never
// a reduction, so the thread count does not change a bit either.
//
// The files: isa (which tile and which vector code run: the CPU's features), vec_generic.h,
// vec_avx2.h and vec_avx512.h (the inline vector helpers), epilogue (bias, rounding, GELU and
// residual add after the sums), linear_generic / linear_avx2 / linear_dpbf16 / linear_amx (the
// linear layer's tiles), linear (rowinv_linear and the tile choice), attention (rowinv_attention
// and the drafter's attention over a prefix), drafter (the float32 draft chain and pass).
//
// Linkage: what one file alone uses stays in an anonymous namespace there; what crosses files
// has external linkage in specdec::model_detail, the header helpers inline or templates. A
// function keeps its target attribute on its definition, and on its declaration here (in C++
// GCC takes a declaration with another target for another version of the function); the
// target_clones functions are declared here without theirs (their own file alone emits the
// clones and the resolver; a caller calls the resolved symbol). g++ fuses a * b + c into one
// FMA (-ffp-contract=fast, its default) inside a function compiled with FMA, across inlined
// calls too: a product passes from one function to another only through inline helpers
// (exp8 into gelu8, exp16 into gelu16), so where a file boundary moves what GCC inlines, no
// result changes.
#pragma once

#include "../model.h"
#include "isa.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <cstdint>

namespace specdec {
namespace model_detail {

constexpr int kLanes = 16;  // partial sums per dot product: the reduction order's only parameter
constexpr int kRows = 4;    // weight rows per register tile
constexpr int kCols = 4;    // input rows per register tile

#define SPECDEC_INLINE inline __attribute__((always_inline))
// fp-contract=fast: a clone with FMA fuses each multiply-add (one rounding); every row of every
// call in a process runs the same clone, so the result still does not depend on the row count.
#define SPECDEC_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=fast")))

void check_float(const at::Tensor& t, const char* name);  // linear.cpp

// linear_generic.cpp: the dot-product tiles of dot_tile (vec_generic.h), one target_clones
// function each. Declared here without the attribute: the definition carries it and its TU
// alone emits the clones and the resolver; a caller calls the resolved symbol.
void linear_tile_f32(const float* x, int64_t M, int64_t Cp, const float* w, float* out,
                     int64_t ld, const float* pf);
void linear_tile_bf16(const float* x, int64_t M, int64_t Cp, const uint16_t* w, float* out,
                      int64_t ld, const uint16_t* pf);

#ifdef SPECDEC_HAVE_AVX2
// linear_avx2.cpp (instantiated there for W = float and uint16_t, bfloat16 bits; O = float with
// float weights, at::BFloat16 with bfloat16 ones)
template <typename W>
SPECDEC_AVX2 void linear_tile_avx2(const float* x, int64_t M, int64_t Cp, const W* w, float* out,
                                   int64_t ld);
template <typename W, typename O>
SPECDEC_AVX2 void linear_outer_avx2(const float* x, int64_t M, int64_t C, const W* wp, int64_t N,
                                    const O* bias, bool gelu, const O* residual, O* y);
at::Tensor packed_weight(const at::Tensor& weight);
#endif

#ifdef SPECDEC_HAVE_DPBF16
// linear_dpbf16.cpp
SPECDEC_DPBF16 void linear_tile_dpbf16(const uint16_t* x, int64_t M, int64_t Cp,
                                       const uint16_t* w, float* out, int64_t ld,
                                       const uint16_t* pf);
#endif

#ifdef SPECDEC_HAVE_AMX
// linear_amx.cpp
void linear_amx(const uint16_t* x, int64_t M, int64_t Cp, const uint16_t* w, int64_t N,
                const at::BFloat16* bias, at::BFloat16* out);
#endif

// attention.cpp (instantiated there for T = float and at::BFloat16)
template <typename T>
void attend_prefix(const float* q, int64_t D, const T* k, int64_t ks, const T* v, int64_t vs,
                   int64_t n, float scale, float* score, int64_t* keys, float* out);

}  // namespace model_detail
}  // namespace specdec
