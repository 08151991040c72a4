// The launcher of one CPU capability's build of the logprob kernel (included once by each
// logprobs_cpu_<capability>.cpp after its target and CPU_CAPABILITY are set): ATen's vector
// headers for that capability, the verification kernels' helpers (anonymous namespace: this unit
// gets its own copy) and the kernel, then launcher_<CPU_CAPABILITY>().
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "logprobs_cpu.h"
#include "verify_cpu_kernel.h"
#include "logprobs_cpu_kernel.h"
#include "verify_logprobs_cpu_kernel.h"

namespace specdec {
namespace logprobs_cpu {

#define SPECDEC_LOGPROBS_LAUNCHER_OF_(capability) launcher_##capability
#define SPECDEC_LOGPROBS_LAUNCHER_OF(capability) SPECDEC_LOGPROBS_LAUNCHER_OF_(capability)

Launcher SPECDEC_LOGPROBS_LAUNCHER_OF(CPU_CAPABILITY)() {
  return [](const LogprobArgs& a) {
    switch (a.logits_kind) {
      case FloatKind::kFloat32: return run<float>(a);
      case FloatKind::kBFloat16: return run<c10::BFloat16>(a);
      case FloatKind::kFloat16: return run<c10::Half>(a);
    }
  };
}

#define SPECDEC_FUSED_LAUNCHER_OF_(capability) fused_launcher_##capability
#define SPECDEC_FUSED_LAUNCHER_OF(capability) SPECDEC_FUSED_LAUNCHER_OF_(capability)

namespace {

// f(T{}) for the C++ type T of `kind`.
template <typename F>
void with_type(FloatKind kind, F&& f) {
  switch (kind) {
    case FloatKind::kFloat32: return f(float{});
    case FloatKind::kBFloat16: return f(c10::BFloat16{});
    case FloatKind::kFloat16: return f(c10::Half{});
  }
}

}  // namespace

FusedLauncher SPECDEC_FUSED_LAUNCHER_OF(CPU_CAPABILITY)() {
  return [](const verify_cpu::VerifyArgs& a, const FusedScores& out) {
    // Q: float where there are no draft probabilities (never read then)
    const FloatKind q = a.draft_probs == nullptr ? FloatKind::kFloat32 : a.probs_kind;
    with_type(a.logits_kind, [&](auto t) {
      with_type(q, [&](auto p) { run_fused<decltype(t), decltype(p)>(a, out); });
    });
  };
}

#undef SPECDEC_FUSED_LAUNCHER_OF
#undef SPECDEC_FUSED_LAUNCHER_OF_
#undef SPECDEC_LOGPROBS_LAUNCHER_OF
#undef SPECDEC_LOGPROBS_LAUNCHER_OF_

}  // namespace logprobs_cpu
}  // namespace specdec
