// The verification kernels for ATen's AVX2 CPU capability. Compiled with a target pragma rather
// than a command-line flag, so the rest of the extension keeps the baseline target; the adapter
// calls this only where at::native::get_cpu_capability() says AVX2 (torch's own choice).
#include "verify_cpu.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(_MSC_VER)
#include "verify_cpu_capability.h"

#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
// GCC's target pragma does not define the ISA macros that sleef.h and ATen's headers test.
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __FMA__
#define __FMA__ 1
#endif
#ifndef __F16C__
#define __F16C__ 1
#endif
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "verify_cpu_kernel.h"
#include "verify_tree_cpu_kernel.h"

namespace specdec {
namespace verify_cpu {

static_assert(Vec::size() == 8, "the AVX2 vector headers were not the ones included");

void launch_verify_tree_AVX2(const TreeArgs& a) {
  switch (a.logits_kind) {
    case FloatKind::kFloat32: return run_tree_logits<float>(a);
    case FloatKind::kBFloat16: return run_tree_logits<c10::BFloat16>(a);
    case FloatKind::kFloat16: return run_tree_logits<c10::Half>(a);
  }
}

void launch_verify_AVX2(const VerifyArgs& a) {
  switch (a.logits_kind) {
    case FloatKind::kFloat32: return run_logits<float>(a);
    case FloatKind::kBFloat16: return run_logits<c10::BFloat16>(a);
    case FloatKind::kFloat16: return run_logits<c10::Half>(a);
  }
}

}  // namespace verify_cpu
}  // namespace specdec

#else  // no AVX2 build on this platform: the adapter never selects it

namespace specdec {
namespace verify_cpu {
void launch_verify_AVX2(const VerifyArgs& a) { launch_verify_DEFAULT(a); }
void launch_verify_tree_AVX2(const TreeArgs& a) { launch_verify_tree_DEFAULT(a); }
}  // namespace verify_cpu
}  // namespace specdec

#endif
