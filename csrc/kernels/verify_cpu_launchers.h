// The launchers of one CPU capability's build of the verification kernels, and the one place the
// dtypes of a call pick the kernel instantiation.
//
// Included once by each verify_cpu_<capability>.cpp, after verify_cpu_capability.h, that unit's
// `#pragma GCC target` and its CPU_CAPABILITY (DEFAULT, AVX2 or AVX512) are set: it brings in
// ATen's vector headers for that capability and the kernels, and defines
// launchers_<CPU_CAPABILITY>() (verify_cpu.h), which the adapter (csrc/verify_cpu.cpp) picks by
// at::native::get_cpu_capability().
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "verify_cpu.h"
#include "verify_cpu_kernel.h"
#include "verify_tree_cpu_kernel.h"

namespace specdec {
namespace verify_cpu {
namespace {

// f(T{}) for the C++ type T of `kind` (float, c10::BFloat16 or c10::Half).
template <typename F>
void with_float_type(FloatKind kind, F&& f) {
  switch (kind) {
    case FloatKind::kFloat32: return f(float{});
    case FloatKind::kBFloat16: return f(c10::BFloat16{});
    case FloatKind::kFloat16: return f(c10::Half{});
  }
}

// f(T{}, Q{}) for the types of a.logits_kind (T) and a.probs_kind (Q; float when there are no
// draft probabilities, which then never get read): VerifyArgs and TreeArgs alike.
template <typename Args, typename F>
void with_float_types(const Args& a, F&& f) {
  with_float_type(a.logits_kind, [&](auto t) {
    with_float_type(a.draft_probs == nullptr ? FloatKind::kFloat32 : a.probs_kind,
                    [&](auto q) { f(t, q); });
  });
}

constexpr Launchers kLaunchers = {
    [](const VerifyArgs& a) {
      with_float_types(a, [&](auto t, auto q) { run<decltype(t), decltype(q)>(a); });
    },
    [](const TreeArgs& a) {
      with_float_types(a, [&](auto t, auto q) { run_tree<decltype(t), decltype(q)>(a); });
    },
};

}  // namespace

#define SPECDEC_LAUNCHERS_OF_(capability) launchers_##capability
#define SPECDEC_LAUNCHERS_OF(capability) SPECDEC_LAUNCHERS_OF_(capability)

const Launchers& SPECDEC_LAUNCHERS_OF(CPU_CAPABILITY)() { return kLaunchers; }

#undef SPECDEC_LAUNCHERS_OF
#undef SPECDEC_LAUNCHERS_OF_

}  // namespace verify_cpu
}  // namespace specdec
