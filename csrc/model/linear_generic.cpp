// The generic linear tiles: dot_tile in target_clones functions (AVX-512F, AVX2, baseline).
#include "model_internal.h"
#include "vec_generic.h"

namespace specdec {
namespace model_detail {

SPECDEC_CLONES void linear_tile_f32(const float* x, int64_t M, int64_t Cp, const float* w,
                                    float* out, int64_t ld, const float* pf) {
  dot_tile(x, M, Cp, w, out, ld, pf);
}

SPECDEC_CLONES void linear_tile_bf16(const float* x, int64_t M, int64_t Cp, const uint16_t* w,
                                     float* out, int64_t ld, const uint16_t* pf) {
  dot_tile(x, M, Cp, w, out, ld, pf);
}

}  // namespace model_detail
}  // namespace specdec
