// The CPU features that pick the model kernels' code, and SPECDEC_LINEAR_TILE.
#include "isa.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>
#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace specdec {
namespace model_detail {

#if defined(__GNUC__) && defined(__x86_64__)
// Why these kernels detect the CPU themselves (__builtin_cpu_supports, cpuid and arch_prctl for
// AMX) where the verification and logprob kernels follow at::native::get_cpu_capability()
// (csrc/kernels/cpu_target.h): that capability is one of DEFAULT / AVX2 / AVX512 (/ ZVECTOR /
// SVE), chosen by torch for its own vectorised code, and cannot express what picks a tile here:
// AVX512_BF16's dot products, AMX-BF16 with the OS's permission for the tile state
// (ARCH_REQ_XCOMP_PERM), or AVX2 with FMA on a CPU whose AVX-512 torch declines (it also needs
// AVX512DQ, and ATEN_CPU_CAPABILITY may lower it). Each tile fixes a reduction order, and the
// row-invariant contract is one order per process whatever torch's capability says, so the
// choice (forced_tile below, SPECDEC_LINEAR_TILE) reads the CPU's features directly; the
// verification kernels need no such contract across capabilities (their exp/log are torch's own,
// so they follow torch's choice).
bool cpu_has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

bool cpu_has_avx512f() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

bool cpu_has_dpbf16() {
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
}

// AMX-TILE and AMX-BF16 in CPUID, and Linux's permission to use the tile state (asked once per
// process: ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; without it the first tile instruction
// faults).
bool cpu_has_amx() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!((d >> 22) & 1u) || !((d >> 24) & 1u)) return false;
    if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl")) return false;
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return yes;
}
#else
bool cpu_has_amx() { return false; }
bool cpu_has_dpbf16() { return false; }
bool cpu_has_avx2_fma() { return false; }
bool cpu_has_avx512f() { return false; }
#endif

Tile forced_tile() {
  static const Tile tile = [] {
    const char* e = std::getenv("SPECDEC_LINEAR_TILE");
    if (e == nullptr || *e == '\0') return Tile::kBest;
    const std::string v(e);
    TORCH_CHECK_VALUE(v == "generic" || v == "avx2" || v == "dpbf16" || v == "amx",
                      "SPECDEC_LINEAR_TILE must be 'generic', 'avx2', 'dpbf16' or 'amx' (or "
                      "unset), got '", v, "'");
    TORCH_CHECK_VALUE(v != "avx2" || cpu_has_avx2_fma(),
                      "SPECDEC_LINEAR_TILE=avx2, but this CPU has no AVX2 with FMA");
    TORCH_CHECK_VALUE(v != "dpbf16" || cpu_has_dpbf16(),
                      "SPECDEC_LINEAR_TILE=dpbf16, but this CPU has no AVX512_BF16");
    TORCH_CHECK_VALUE(v != "amx" || cpu_has_amx(),
                      "SPECDEC_LINEAR_TILE=amx, but this CPU (or its OS) offers no AMX-BF16");
    if (v == "generic") return Tile::kGeneric;
    if (v == "avx2") return Tile::kAvx2;
    return v == "dpbf16" ? Tile::kDpbf16 : Tile::kAmx;
  }();
  return tile;
}

// The AVX2 tile runs where forced, or by choice where AVX-512F is missing (a bfloat16 layer
// uses the dot-product instructions instead where the CPU has them, which implies AVX-512F).
bool linear_tile_is_avx2() {
  const Tile t = forced_tile();
  return t == Tile::kAvx2 || (t == Tile::kBest && cpu_has_avx2_fma() && !cpu_has_avx512f());
}

// Attention (rowinv_attention, every pass's, row-invariant whatever its code: each query is its
// own row) and the drafter's float32 layers (linear_rows_f32: no bitwise contract) run the AVX2
// code wherever the CPU has AVX2 with FMA, AVX-512 CPUs included, unless the generic code is
// forced (SPECDEC_LINEAR_TILE=generic): its FMA chains beat the generic clones' sixteen-lane
// partial sums and scalar tree per output (AMD EPYC with AVX-512 and AVX512_BF16: the bundled
// target's attention at 5 queries 29-36 -> 17 us a layer, the bundled draft's K = 4 chain
// 134 -> 77 us), and GELU's vector exp beats the scalar one.
bool fma_kernels() {
  return cpu_has_avx2_fma() && forced_tile() != Tile::kGeneric;
}

// The sixteen-lane code (finish_cols_avx512, attend_row_avx512: the AVX2 code's bits) wherever
// the CPU has AVX-512F, unless a tile is forced whose CPU lacks it (SPECDEC_LINEAR_TILE=generic
// or avx2: those runs test the code of such CPUs).
bool avx512_kernels() {
  const Tile t = forced_tile();
  return fma_kernels() && cpu_has_avx512f() && t != Tile::kAvx2;
}

}  // namespace model_detail
}  // namespace specdec
