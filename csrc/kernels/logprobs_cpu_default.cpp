// The logprob kernel for ATen's DEFAULT CPU capability (no SIMD assumed; every platform).
#include "verify_cpu_capability.h"

#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT
#include "logprobs_cpu_launcher.h"
