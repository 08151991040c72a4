// The logprob kernel for ATen's AVX2 CPU capability (selected only where torch itself uses AVX2).
#include "logprobs_cpu.h"

#if SPECDEC_VERIFY_CPU_X86  // elsewhere the adapter never selects this build
#include "verify_cpu_capability.h"
#define SPECDEC_TARGET_AVX2
#include "cpu_target.h"
#include "logprobs_cpu_launcher.h"

static_assert(specdec::verify_cpu::Vec::size() == 8,
              "the AVX2 vector headers were not the ones included");
#endif
