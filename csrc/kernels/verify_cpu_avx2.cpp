// The verification kernels for ATen's AVX2 CPU capability. Compiled with a target pragma rather
// than a command-line flag, so the rest of the extension keeps the baseline target; the adapter
// calls this only where at::native::get_cpu_capability() says AVX2 (torch's own choice).
#include "verify_cpu.h"

#if SPECDEC_VERIFY_CPU_X86  // elsewhere the adapter never selects this build
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
#include "verify_cpu_launchers.h"

static_assert(specdec::verify_cpu::Vec::size() == 8,
              "the AVX2 vector headers were not the ones included");

#endif
