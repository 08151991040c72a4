// The verification kernels for ATen's AVX2 CPU capability. Compiled with a target pragma rather
// than a command-line flag, so the rest of the extension keeps the baseline target; the adapter
// calls this only where at::native::get_cpu_capability() says AVX2 (torch's own choice).
#include "verify_cpu.h"

#if SPECDEC_VERIFY_CPU_X86  // elsewhere the adapter never selects this build
#include "verify_cpu_capability.h"

#define SPECDEC_TARGET_AVX2
#include "cpu_target.h"
#include "verify_cpu_launchers.h"

static_assert(specdec::verify_cpu::Vec::size() == 8,
              "the AVX2 vector headers were not the ones included");

#endif
