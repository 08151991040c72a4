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

#undef SPECDEC_LOGPROBS_LAUNCHER_OF
#undef SPECDEC_LOGPROBS_LAUNCHER_OF_

}  // namespace logprobs_cpu
}  // namespace specdec
