// The verification kernels for ATen's DEFAULT CPU capability (no SIMD assumed; every platform).
#include "verify_cpu_capability.h"

#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT
#include "verify_cpu_launchers.h"

namespace specdec {
namespace verify_cpu {

// [B, K] int64 drafts and verifier tokens -> [B] common-prefix lengths, parallel over rows.
void launch_accept_reject(const AcceptRejectArgs& a) {
  at::parallel_for(0, a.batch, 1024, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t* d = a.draft + b * a.num_draft;
      const int64_t* v = a.verifier + b * a.num_draft;
      int64_t n = 0;
      while (n < a.num_draft && d[n] == v[n]) ++n;
      a.out[b] = n;
    }
  });
}

}  // namespace verify_cpu
}  // namespace specdec
