// The x86 target of a per-capability compile unit: define SPECDEC_TARGET_AVX2 or
// SPECDEC_TARGET_AVX512, include verify_cpu_capability.h (every non-vector header first), then
// this, then ATen's vector headers. It sets the `#pragma GCC target` (the rest of the unit is
// compiled for that ISA; the extension's other units keep the baseline target), the ISA macros
// that sleef.h and ATen's vector headers test (GCC's pragma does not define them) and
// CPU_CAPABILITY. Such a unit runs only where at::get_cpu_capability() names its capability.
#pragma once

#if defined(SPECDEC_TARGET_AVX512)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
#elif defined(SPECDEC_TARGET_AVX2)
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
#else
#error "define SPECDEC_TARGET_AVX2 or SPECDEC_TARGET_AVX512 before including cpu_target.h"
#endif

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

#if defined(SPECDEC_TARGET_AVX512)
#ifndef __AVX512F__
#define __AVX512F__ 1
#endif
#ifndef __AVX512BW__
#define __AVX512BW__ 1
#endif
#ifndef __AVX512VL__
#define __AVX512VL__ 1
#endif
#ifndef __AVX512DQ__
#define __AVX512DQ__ 1
#endif
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#else
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif
