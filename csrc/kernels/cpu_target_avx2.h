// The AVX2 target of a per-capability compile unit: the `#pragma GCC target` (the rest of the unit
// is compiled for AVX2, the extension's other units keep the baseline target), the ISA macros that
// sleef.h and ATen's vector headers test (GCC's pragma does not define them) and CPU_CAPABILITY.
// Include after verify_cpu_capability.h (every non-vector header first), before ATen's vector
// headers; the unit is selected only where at::get_cpu_capability() says AVX2.
#pragma once

#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
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
