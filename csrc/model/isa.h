// Which instruction sets the model kernels are compiled for (the target attributes, by
// function: every one compiles on every x86-64 machine with GCC or Clang) and which they run
// (isa.cpp: the CPU's own features, read once per process).
#pragma once

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>

// AVX2 with FMA: the AVX2 tiles, vec_avx2.h, the FMA attention and epilogue
#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))
#define SPECDEC_HAVE_AVX2 1
// AVX-512F at sixteen lanes: vec_avx512.h (the AVX2 code's bits)
#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
// AVX512_BF16's dot products: linear_dpbf16.cpp
#define SPECDEC_HAVE_DPBF16 1
#define SPECDEC_DPBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// AMX-BF16's tiles: linear_amx.cpp (its input packing and stores use AVX-512BW)
#define SPECDEC_HAVE_AMX 1
#define SPECDEC_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl")))
#endif

namespace specdec {
namespace model_detail {

bool cpu_has_avx2_fma();
bool cpu_has_avx512f();
bool cpu_has_dpbf16();
bool cpu_has_amx();

// Which tile the linear layer runs (and attention with it): SPECDEC_LINEAR_TILE=generic (the
// target_clones code), avx2 (the AVX2+FMA code), dpbf16 (AVX512_BF16's dot products for
// bfloat16) or amx (AMX's tiles for bfloat16), each where the CPU has it, forces one, read once
// per process (the tests run every tile a CPU has, each in its own process); unset: the CPU's
// best (for bfloat16 AMX, else the dot-product instructions, where there are; AVX2 where
// AVX-512F is missing).
enum class Tile { kBest, kGeneric, kAvx2, kDpbf16, kAmx };

Tile forced_tile();
bool linear_tile_is_avx2();
bool fma_kernels();
bool avx512_kernels();

}  // namespace model_detail
}  // namespace specdec
