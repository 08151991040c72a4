// The logprob kernel for ATen's AVX512 CPU capability (selected only where torch itself uses it).
#include "logprobs_cpu.h"

#if SPECDEC_VERIFY_CPU_X86  // elsewhere the adapter never selects this build
#include "verify_cpu_capability.h"
#define SPECDEC_TARGET_AVX512
#include "cpu_target.h"
#include "logprobs_cpu_launcher.h"

static_assert(specdec::verify_cpu::Vec::size() == 16,
              "the AVX512 vector headers were not the ones included");
#endif
