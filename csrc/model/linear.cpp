// rowinv_linear: argument checks, the tile choice and the generic / dot-product tiles' loop.
//
//   rowinv_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor
//     x [..., C] float32/bfloat16 (stride 1 inside a row), weight [N, C] and bias [N] of x's dtype;
//     returns [..., N] in x's dtype (float32 accumulation, rounded once).
#include "model_internal.h"
#include "epilogue.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace specdec {
namespace model_detail {

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
}

}  // namespace model_detail

using namespace model_detail;

at::Tensor rowinv_linear_cpu(const at::Tensor& x, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias,
                             std::optional<c10::string_view> activation) {
  TORCH_CHECK_VALUE(!activation.has_value() || *activation == "gelu_tanh",
                    "rowinv_linear: activation must be None or 'gelu_tanh', got '",
                    activation.value_or(""), "'");
  return rowinv_linear_fused(x, weight, bias, activation.has_value(), std::nullopt);
}

at::Tensor rowinv_linear_fused(const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, bool gelu,
                               const std::optional<at::Tensor>& residual) {
  check_float(x, "x");
  check_float(weight, "weight");
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight must be [N, C], got shape ", weight.sizes());
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == weight.size(1), "x must be [..., C] with C = ",
              weight.size(1), " (weight [N, C] = ", weight.sizes(), "), got shape ", x.sizes());
  TORCH_CHECK_TYPE(x.scalar_type() == weight.scalar_type(), "x (", x.scalar_type(),
              ") and weight (", weight.scalar_type(), ") must have the same dtype");
  const int64_t N = weight.size(0), C = weight.size(1);
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N, "bias must be [N] with N = ", N,
                ", got shape ", bias->sizes());
    TORCH_CHECK_TYPE(bias->scalar_type() == x.scalar_type(), "bias must have x's dtype ",
                x.scalar_type(), ", got ", bias->scalar_type());
  }
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = N;
  at::Tensor res;  // [M, N] contiguous, x's dtype
  if (residual.has_value()) {
    TORCH_CHECK_VALUE(residual->sizes() == at::IntArrayRef(out_sizes) &&
                          residual->scalar_type() == x.scalar_type(),
                      "residual must be ", at::IntArrayRef(out_sizes), " of x's dtype, got ",
                      residual->sizes(), " ", residual->scalar_type());
    res = residual->reshape({-1, N}).contiguous();
  }
  // for bfloat16 models AMX's tiles, else the dot-product instruction, where the CPU has them
  const Tile tile = forced_tile();
  const bool bf16 = x.scalar_type() == at::kBFloat16;  // weight's too (checked above)
  const bool amx = bf16 && (tile == Tile::kAmx || (tile == Tile::kBest && cpu_has_amx()));
  const bool dpbf16 = bf16 && !amx &&
                      (tile == Tile::kDpbf16 || (tile == Tile::kBest && cpu_has_dpbf16()));
  // otherwise the generic clones (AVX-512F's among them)
  const bool avx2 = !dpbf16 && linear_tile_is_avx2();
  const int64_t align = amx || dpbf16 ? 32 : avx2 ? 1 : kLanes;
  const int64_t Cp = (C + align - 1) / align * align;
  // x as float32 (bfloat16 for amx and dpbf16) [M, Cp] and weight [N, Cp], zero-padded (no copy when
  // already aligned); a last tile of fewer than kRows weight rows is padded on its own below
  at::Tensor xf = x.reshape({-1, C}).to(amx || dpbf16 ? at::kBFloat16 : at::kFloat);
  if (Cp != C) xf = at::constant_pad_nd(xf, {0, Cp - C});
  xf = xf.contiguous();
  at::Tensor w = weight;  // the AVX2 tile reads its packed copy instead
  if (!avx2) w = (Cp != C ? at::constant_pad_nd(w, {0, Cp - C}) : w).contiguous();
  const int64_t M = xf.size(0);
  // the bias is read in its own dtype (x's): converting it first cost an allocation per call
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out.view(out_sizes);
#ifdef SPECDEC_HAVE_AMX
  if (amx) {
    linear_amx(reinterpret_cast<const uint16_t*>(xf.data_ptr<at::BFloat16>()), M, Cp,
               reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), N,
               b.defined() ? b.data_ptr<at::BFloat16>() : nullptr,
               out.data_ptr<at::BFloat16>());
    return finish_rows(out, gelu, res).view(out_sizes);
  }
#endif
#ifdef SPECDEC_HAVE_AVX2
  if (avx2) {
    const at::Tensor packed = packed_weight(weight);
    const float* xp = xf.data_ptr<float>();
    if (bf16)
      linear_outer_avx2(xp, M, C, reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()),
                        N, b.defined() ? b.data_ptr<at::BFloat16>() : nullptr, gelu,
                        res.defined() ? res.data_ptr<at::BFloat16>() : nullptr,
                        out.data_ptr<at::BFloat16>());
    else
      linear_outer_avx2(xp, M, C, packed.data_ptr<float>(), N,
                        b.defined() ? b.data_ptr<float>() : nullptr, gelu,
                        res.defined() ? res.data_ptr<float>() : nullptr, out.data_ptr<float>());
    return out.view(out_sizes);
  }
#endif
  const float* xp = dpbf16 ? nullptr : xf.data_ptr<float>();
  const float* bp = b.defined() && !bf16 ? b.data_ptr<float>() : nullptr;
  const at::BFloat16* bp_bf16 = b.defined() && bf16 ? b.data_ptr<at::BFloat16>() : nullptr;
  const int64_t tiles = (N + kRows - 1) / kRows, full = N / kRows;
  constexpr int64_t kAhead = 2;  // tiles between the one computed and the one prefetched
  constexpr int64_t kGroup = 8;  // tiles per output store
  at::BFloat16* out_bf16 = bf16 ? out.data_ptr<at::BFloat16>() : nullptr;
  float* out_f32 = bf16 ? nullptr : out.data_ptr<float>();
  const uint16_t* w_bf16 =
      bf16 ? reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()) : nullptr;
  const float* w_f32 = bf16 ? nullptr : w.data_ptr<float>();
  const uint16_t* x_bf16 =
      dpbf16 ? reinterpret_cast<const uint16_t*>(xf.data_ptr<at::BFloat16>()) : nullptr;
  const at::BFloat16* res_bf16 = res.defined() && bf16 ? res.data_ptr<at::BFloat16>() : nullptr;
  const float* res_f32 = res.defined() && !bf16 ? res.data_ptr<float>() : nullptr;
  // a task gets at least ~256k multiply-adds: a small layer (a draft's) runs on one thread,
  // where waking the others would cost more than it saves
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, M * Cp * kRows));
  // threads split whole groups of kGroup tiles: a segment of an output row then starts at a
  // multiple of kGroup * kRows columns and ends at one or at the row's end, as finish_cols
  // needs (GELU eight columns at a time), and the epilogue runs here, on the sums still in
  // cache, instead of in another pass over the output (finish_rows: two more parallel regions
  // a layer, ~0.06 ms of a 5-token pass of the bundled target)
  const int64_t groups = (tiles + kGroup - 1) / kGroup;
  const bool wide = avx512_kernels();
  at::parallel_for(0, groups, (grain + kGroup - 1) / kGroup, [&](int64_t glo, int64_t ghi) {
    const int64_t lo = glo * kGroup, hi = std::min(ghi * kGroup, tiles);
    // kGroup tiles at a time into one buffer [M, kGroup * kRows]: each output row's columns of
    // the group are then rounded and stored contiguously
    std::vector<float> buf(M * kGroup * kRows);
    const int64_t ld = kGroup * kRows;
    std::vector<uint16_t> last_bf16;  // the last, partial tile: its rows, zero-padded to kRows
    std::vector<float> last_f32;
    for (int64_t g = lo; g < hi; g += kGroup) {
      const int64_t g_end = std::min(g + kGroup, hi);
      for (int64_t t = g; t < g_end; ++t) {
        const int64_t n0 = t * kRows;
        const int rows = static_cast<int>(std::min<int64_t>(kRows, N - n0));
        const int64_t ahead = t + kAhead < std::min(hi, full) ? (t + kAhead) * kRows * Cp : -1;
        float* tile = buf.data() + (t - g) * kRows;
        if (bf16) {
          const uint16_t* wt = w_bf16 + n0 * Cp;
          if (rows < kRows) {
            last_bf16.assign(kRows * Cp, 0);
            std::memcpy(last_bf16.data(), wt, rows * Cp * sizeof(uint16_t));
            wt = last_bf16.data();
          }
          const uint16_t* pf = ahead < 0 ? nullptr : w_bf16 + ahead;
          if (dpbf16) {
#ifdef SPECDEC_HAVE_DPBF16
            linear_tile_dpbf16(x_bf16, M, Cp, wt, tile, ld, pf);
#endif
          } else {
            linear_tile_bf16(xp, M, Cp, wt, tile, ld, pf);
          }
        } else {
          const float* wt = w_f32 + n0 * Cp;
          if (rows < kRows) {
            last_f32.assign(kRows * Cp, 0.0f);
            std::memcpy(last_f32.data(), wt, rows * Cp * sizeof(float));
            wt = last_f32.data();
          }
          const float* pf = ahead < 0 ? nullptr : w_f32 + ahead;
          linear_tile_f32(xp, M, Cp, wt, tile, ld, pf);
        }
      }
      const int64_t n0 = g * kRows, cols = std::min<int64_t>(g_end * kRows, N) - n0;
      for (int64_t m = 0; m < M; ++m) {
        float* row = buf.data() + m * ld;
#ifdef SPECDEC_HAVE_AVX2
        if (wide) {  // bias, rounding and epilogue sixteen columns at a time: the same bits
          if (bf16)
            finish_cols_avx512(row, cols, bp_bf16 ? bp_bf16 + n0 : nullptr, gelu,
                               res_bf16 ? res_bf16 + m * N + n0 : nullptr, out_bf16 + m * N + n0);
          else
            finish_cols_avx512(row, cols, bp ? bp + n0 : nullptr, gelu,
                               res_f32 ? res_f32 + m * N + n0 : nullptr, out_f32 + m * N + n0);
          continue;
        }
#endif
        if (bf16) {
          at::BFloat16* o = out_bf16 + m * N + n0;
          if (!gelu && res_bf16 == nullptr) {  // the sums rounded once: no epilogue to run
            for (int64_t j = 0; j < cols; ++j)
              o[j] = at::BFloat16(row[j] + (bp_bf16 ? static_cast<float>(bp_bf16[n0 + j]) : 0.0f));
            continue;
          }
          for (int64_t j = 0; j < cols; ++j)
            row[j] += bp_bf16 ? static_cast<float>(bp_bf16[n0 + j]) : 0.0f;
          finish_segment(row, cols, gelu, res_bf16 ? res_bf16 + m * N + n0 : nullptr, o);
        } else {
          for (int64_t j = 0; j < cols; ++j) row[j] += bp ? bp[n0 + j] : 0.0f;
          finish_segment(row, cols, gelu, res_f32 ? res_f32 + m * N + n0 : nullptr,
                         out_f32 + m * N + n0);
        }
      }
    }
  });
  return out.view(out_sizes);
}

}  // namespace specdec
