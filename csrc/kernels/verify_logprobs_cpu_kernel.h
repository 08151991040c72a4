// The chain verification kernel fused with the logprob kernel (specdec::native_verify_logprobs):
// run_fused<T, Q>, T the logits' and Q the draft probabilities' C++ type.
//
// Included once per CPU capability by logprobs_cpu_launcher.h, after verify_cpu_kernel.h and
// logprobs_cpu_kernel.h, in an anonymous namespace like them. The verification kernel runs as
// native_verify_ex does (verify_cpu::run_with) with a LogprobHook, which takes each position's
// logprob statistics (M, log Z, the filter's kappa, the running top-n) as verification takes its
// own, then, once the row is decided, scores each emitted token with one logit load (emit()).
// The arithmetic is the logprob kernel's, so the scores are native_emitted_logprobs' bit for bit.
//
// Where verification reads the very values the logprob kernel does (x = l: T = 1, no
// probability input; raw mode also without mask and edits) and the distribution is unfiltered
// (greedy rows, sampled rows at T = 1 without filters), verification's statistics pass carries
// the logprob statistics (ChunkTap, per chunk: the max it already takes, its exp(x - max)
// vectors summed a second way, in float lanes flushed to double as the logprob kernel sums
// them, and a top-n) and the row is read once. Elsewhere (a temperature other than 1, filters,
// raw scores of a masked or edited row) the two passes do not share their exp (x / T - m is not
// (l - M) / T), and the hook reads the row again right after verification's pass (prepare()),
// while it is still in L1 / L2. Positions walked but not emitted (block verification walks past
// its stop) are scored and dropped.
#pragma once

#include <cstdint>
#include <vector>

#include "logprobs_cpu.h"

namespace specdec {
namespace logprobs_cpu {
namespace {

using verify_cpu::RowInputs;
using verify_cpu::VerifyArgs;

// One chunk's share of a position's logprob statistics, taken by verification's own pass over
// it (verify_cpu::chunk_stats) where that pass reads x = l: its sum of exp(x - chunk max)
// (LaneSum's arithmetic over the very vectors scan_chunk sums: float lanes, FLUSH vectors at a
// time, added to a double lane 0 first) and its max; the first chunk of a thread's range also
// keeps the range's top-n (one top-n per row in the row strategy: as few insertions as the
// logprob kernel's). Held in a std::vector, so no Vec member (the heap need not give it a Vec's
// alignment).
struct ChunkTap {
  static constexpr int FLUSH = logprobs_cpu::FLUSH;
  TopN top;
  float bar = kNegInf;  // what a lane must beat to be offered: top.floor(), +inf for n = 0
  double total = 0.0;
  float m = kNegInf;

  void reset(int64_t n) {
    top.n = n;
    top.count = 0;
    bar = n > 0 ? kNegInf : std::numeric_limits<float>::infinity();
    total = 0.0;
    m = kNegInf;
  }
  C10_ALWAYS_INLINE void offer(const Vec& x, int64_t first) {  // tokens [first, first + W)
    if ((x > Vec(bar)).zero_mask() != kAllLanes) offer_lanes(x, first);
  }
  C10_NOINLINE void offer_lanes(const Vec& x, int64_t first) {  // -inf past V: never listed
    alignas(64) float v[W];
    x.store(v);
    for (int64_t l = 0; l < W; ++l) top.offer(v[l], first + l);
    bar = top.floor();
  }
  void add(const Vec& part) {  // LaneSum::flush
    alignas(64) float lanes[W];
    part.store(lanes);
    for (int64_t l = 0; l < W; ++l) total += lanes[l];
  }
  void done(float chunk_max) { m = chunk_max; }
};

// Per thread range: the logprob kernel's scratch and the prepared positions of the row being
// verified.
template <typename T>
struct LogprobHook {
  const FusedScores* out;
  Scan sc;
  std::vector<ChunkTap> taps;  // one per vocabulary chunk
  std::vector<Scored> scored;  // [K+1]: the positions walked

  LogprobHook(const FusedScores& scores, int64_t K) : out(&scores), scored(K + 1) {}

  // Position j's row as the logprob kernel reads it: processed, with the row's mask and edits
  // (edit_vals[b, j]); raw, the logits alone.
  template <typename Q>
  Row<T> row_of(const RowInputs<T, Q>& r, int64_t j, const T* logits) const {
    if (!out->processed) return Row<T>{logits, nullptr, r.V};
    const VerifyArgs& a = r.a;
    const float* vals =
        r.edits != nullptr ? a.edit_vals + (r.b * (r.K + 1) + j) * a.num_edits : nullptr;
    return Row<T>{logits, r.xmap(j).mask, r.V, r.edits, vals};
  }

  // Whether verification's own pass over position j gives the logprob statistics (tapped
  // from chunk_stats, no second read): an unfiltered distribution at T = 1 of the very x
  // verification reads (x = l: T = 1, no log_input; in raw mode no mask and no edits either).
  template <typename Q>
  bool tappable(const RowInputs<T, Q>& r, const Setup& su) const {
    const VerifyArgs& a = r.a;
    if (a.log_input || su.filtered || su.temp != 1.0f || r.temp != 1.0f) return false;
    return out->processed || (a.token_bitmask == nullptr && r.edits == nullptr);
  }

  // Verification's statistics of position j (the plain kernel's, bit for bit), and the
  // position's logprob statistics: tapped from that pass, else from a read of the row right
  // after it (still in cache).
  template <typename Q>
  Stats stats(const RowInputs<T, Q>& r, int64_t j, const T* logits, const verify_cpu::XMap& xm,
              bool need_sum, std::vector<float>& cand) {
    const VerifyArgs& a = r.a;
    // a greedy call scores T = 1 without filters (temperature none: every row greedy)
    const Setup su = setup_of(out->processed, a.greedy_only ? nullptr : a.temperature, a.top_k,
                              a.top_p, a.min_p, r.b, r.V);
    const int64_t n = out->num_logprobs;
    Scored& s = scored[j];
    if (!tappable(r, su)) {
      const Stats st = r.stats(logits, xm, need_sum, cand);
      prepare(row_of(r, j, logits), su, n, sc, s);
      return st;
    }
    const int64_t nchunks = (r.V + CHUNK - 1) / CHUNK;
    if (static_cast<int64_t>(taps.size()) < nchunks) taps.resize(nchunks);
    for (int64_t c = 0; c < nchunks; ++c) taps[c].reset(n);
    // the sum is verification's to take (greedy rows ignore it): its exp feeds the taps
    const Stats st = r.stats(logits, xm, true, cand, taps.data());
    // the chunks merged in order, as scan_chunk merges them
    s.su = su;
    s.kappa = kNegInf;
    s.log_z = 0.0;
    s.top.n = n;
    s.top.count = 0;
    float m = kNegInf;
    double z = 0.0;
    const double t = su.temp;
    for (int64_t c = 0; c < nchunks; ++c) {
      ChunkTap& tap = taps[c];
      for (int64_t i = 0; i < tap.top.count; ++i) s.top.offer(tap.top.val[i], tap.top.id[i]);
      if (!(tap.m > kNegInf)) continue;  // no mass here (all -inf, or NaN)
      const float mm = tap.m > m ? tap.m : m;
      z = z * std::exp((static_cast<double>(m) - mm) / t) +
          tap.total * std::exp((static_cast<double>(tap.m) - mm) / t);
      m = mm;
    }
    s.m = m;
    if (m > kNegInf) s.log_z = std::log(z);
    return st;
  }

  // tokens [K+1] of row b, accepted drafts: positions 0 .. accepted are emitted (and walked).
  template <typename Q>
  void decided(const RowInputs<T, Q>& r, const int64_t* tokens, int64_t accepted) {
    const VerifyArgs& a = r.a;
    const int64_t n = out->num_logprobs, K1 = r.K + 1;
    for (int64_t j = 0; j < K1; ++j) {
      const int64_t task = r.b * K1 + j;
      float* top = out->top_logprobs + task * n;
      int64_t* ids = out->top_ids + task * n;
      // as native_emitted_logprobs: a flat row before the first is padding, not row 0
      const bool before = a.logits_row_start != nullptr && a.logits_row_start[r.b] < -j;
      if (j > accepted || tokens[j] < 0 || before) {
        for (int64_t i = 0; i < n; ++i) {
          top[i] = kNegInf;
          ids[i] = -1;
        }
        out->logprobs[task] = kNegInf;
        continue;
      }
      out->logprobs[task] = emit(scored[j], row_of(r, j, r.logits_row(j)), tokens[j], n, top, ids);
    }
  }
};

template <typename T, typename Q>
void run_fused(const VerifyArgs& a, const FusedScores& out) {
  verify_cpu::run_with<T, Q>(a, [&] { return LogprobHook<T>(out, a.num_draft); });
}

}  // namespace
}  // namespace logprobs_cpu
}  // namespace specdec
