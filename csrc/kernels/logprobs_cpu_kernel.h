// The CPU logprob kernel: run<T>, T the logits' C++ type (float, c10::BFloat16, c10::Half).
//
// Included once per CPU capability by logprobs_cpu_launcher.h, after verify_cpu_kernel.h (whose
// helpers it reuses: Vec, CHUNK, load_vec, Candidates, Stats, thresholds) and in an anonymous
// namespace like it, so each capability gets its own copy.
//
// One task per emitted position (b, p), spread over threads with at::parallel_for; a task is
// serial, so results never depend on the thread count. With l = float(logit) (-inf where the
// bitmask disallows the token, processed mode only), T the temperature (1 for raw mode and greedy
// rows) and M = max l, a task reads its logits row once, in chunks of CHUNK tokens resident in
// L1: per chunk the max, then (unfiltered rows) sum exp((l - max) / T) (ATen's exp_u20, as the
// verifier's statistics: 20 ulp, so log Z is off by at most 1.2e-6) in float lanes flushed
// to double every FLUSH vectors and merged across chunks in double (online log-sum-exp), the
// top-n insertion array (a token enters only when it beats the n-th value, so ties keep the lower
// id: tokens come in id order), and (filtered rows) the top-k / top-p candidates of the
// verification kernels, from x = l / T in float as they see it. Filtered rows then take the
// verifier's threshold kappa (thresholds()) and the kept mass Z = sum over x >= kappa of
// exp((l - M) / T): from the ids of the pushed candidates where top-k is on, else by reading the
// row a second time (top-p alone). Values are (double(l) - M) / T - log Z in double:
// within 1e-5 of a float64 log_softmax for float32 logits. No [B, P, V] tensor: per thread only
// the verifier's candidate buffer (up to V floats for top-p alone, as in the verifier).
//
// Processed mode reads the sparse logit edits where it reads a logit (Row: l is the edit value of
// an edited token, before the bitmask; the verifier's EditIndex bitmap, one load-shift-and-test
// per vector) and takes min_p with the verifier's thresholds(); without top-p, candidates below
// min_p's floor are never pushed (as Candidates::add does).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "logprobs_cpu.h"

namespace specdec {
namespace logprobs_cpu {
namespace {

using verify_cpu::Candidates;
using verify_cpu::CHUNK;
using verify_cpu::EditIndex;
using verify_cpu::Filter;
using verify_cpu::kNegInf;
using verify_cpu::Stats;
using verify_cpu::Vec;
using verify_cpu::W;

static_assert(32 % W == 0, "a vector of tokens must lie within one bitmask word");
constexpr uint32_t kLaneBits = W == 32 ? 0xFFFFFFFFu : (1u << W) - 1;
constexpr int kAllLanes = (1 << W) - 1;  // zero_mask() of a comparison that no lane passes
constexpr int FLUSH = 16;  // vectors summed in float before the lanes go to double

// One emitted position's logits row, its bitmask words (nullptr: every token allowed) and its
// edits (edits nullptr: none).
template <typename T>
struct Row {
  const T* logits;       // [V]
  const int32_t* mask;   // [ceil(V / 32)] or nullptr
  int64_t V;
  const EditIndex* edits = nullptr;  // the row's edited ids, or nullptr
  const float* vals = nullptr;       // [E] the position's edit values

  bool allowed(int64_t t) const {
    return mask == nullptr || ((static_cast<uint32_t>(mask[t >> 5]) >> (t & 31)) & 1u) != 0;
  }

  // The edit value of token t, or the logit where t is not edited.
  float raw(int64_t t) const {
    if (edits != nullptr) {
      const uint32_t word = edits->bits[t >> 5];
      if ((word >> (t & 31)) & 1u) {
        return vals[edits->first[t >> 5] +
                    verify_cpu::popcount32(word & ((1u << (t & 31)) - 1u))];
      }
    }
    return static_cast<float>(logits[t]);
  }

  // l of token t < V: its edit value or logit, -inf where disallowed.
  float at(int64_t t) const { return allowed(t) ? raw(t) : kNegInf; }

  // l of the W tokens [i, i + W) (i a multiple of W): -inf past V and where disallowed. With
  // edits, one more test per vector; a vector with an edited token is read lane by lane.
  Vec load(int64_t i) const {
    uint32_t bits = kLaneBits;
    if (mask != nullptr) {
      bits = (static_cast<uint32_t>(mask[i >> 5]) >> (i & 31)) & kLaneBits;
      if (bits == 0) return Vec(kNegInf);
    }
    const bool edited =
        edits != nullptr && ((edits->bits[i >> 5] >> (i & 31)) & kLaneBits) != 0;
    if (i + W <= V && bits == kLaneBits && !edited) return verify_cpu::load_vec(logits + i);
    alignas(64) float lanes[W];
    for (int64_t l = 0; l < W; ++l) {
      lanes[l] = i + l < V && ((bits >> l) & 1u) ? (edited ? raw(i + l)
                                                           : static_cast<float>(logits[i + l]))
                                                 : kNegInf;
    }
    return Vec::loadu(lanes);
  }
};

// The n most likely tokens seen so far, by l descending (ties: the earlier, i.e. lower, id).
struct TopN {
  float val[kMaxLogprobs];
  int64_t id[kMaxLogprobs];
  int64_t n = 0, count = 0;

  float floor() const { return count < n ? kNegInf : val[n - 1]; }  // what a token must beat

  void offer(float v, int64_t t) {
    if (!(v > floor())) return;  // -inf and NaN never enter
    int64_t j = count < n ? count++ : n - 1;
    for (; j > 0 && val[j - 1] < v; --j) {
      val[j] = val[j - 1];
      id[j] = id[j - 1];
    }
    val[j] = v;
    id[j] = t;
  }
};

// Sums W float lanes in float for FLUSH vectors at a time, then in double.
struct LaneSum {
  Vec acc = Vec(0.0f);
  double total = 0.0;
  int pending = 0;

  void add(const Vec& v) {
    acc = acc + v;
    if (++pending == FLUSH) flush();
  }
  void flush() {
    alignas(64) float lanes[W];
    acc.store(lanes);
    for (int64_t l = 0; l < W; ++l) total += lanes[l];
    acc = Vec(0.0f);
    pending = 0;
  }
  double value() {
    flush();
    return total;
  }
};

// How one position is scored.
struct Setup {
  float temp = 1.0f;  // T: 1 for raw mode and greedy rows
  bool filtered = false, topk_on = false, topp_on = false;
  int64_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;             // 0: off
  float floor_shift = kNegInf;    // Candidates' min_p floor (log(min_p) - 0.01), or -inf

  float x(float l) const { return temp != 1.0f ? l / temp : l; }  // as the verifier sees it
  Vec x(const Vec& l) const { return temp != 1.0f ? l / Vec(temp) : l; }
};

// Per-row state of the first pass: M (max l), S (sum exp((l - M) / T), unfiltered rows), top-n,
// filter candidates (filtered rows).
struct Scan {
  float m = kNegInf;
  double s = 0.0;
  TopN top;
  Candidates cand;
  // With top-k on: the ids of every candidate pushed, a superset of the kept tokens (the cutoff
  // never passes the final k-th value, and top-p keeps a subset of top-k's), so the kept mass
  // needs no second pass over the row. Given up past kMaxTracked ids (then: kept_mass()).
  std::vector<int64_t> pushed;
  bool track = false;
};

constexpr size_t kMaxTracked = size_t{1} << 15;

inline float lane_max(const Vec& v) {
  alignas(64) float lanes[W];
  v.store(lanes);
  float m = kNegInf;
  for (int64_t l = 0; l < W; ++l) {
    if (lanes[l] > m) m = lanes[l];  // NaN never wins
  }
  return m;
}

// The first pass over chunk [base, base + n) of a row.
template <typename T>
void scan_chunk(const Row<T>& row, int64_t base, int64_t n, const Setup& su, Scan& sc) {
  alignas(64) float lanes[W];
  Vec best(kNegInf);
  for (int64_t i = base; i < base + n; i += W) {
    const Vec v = row.load(i);
    best = Vec::blendv(best, v, v > best);
    if (sc.top.n > 0 && (v > Vec(sc.top.floor())).zero_mask() != kAllLanes) {
      v.store(lanes);
      for (int64_t l = 0; l < W; ++l) sc.top.offer(lanes[l], i + l);  // -inf past V
    }
  }
  const float cmax = lane_max(best);
  if (!(cmax > kNegInf)) return;  // no mass here (all -inf, or NaN)
  if (!su.filtered) {  // online log-sum-exp, chunk sum relative to the chunk's max
    LaneSum sum;
    const Vec shift(cmax);
    for (int64_t i = base; i < base + n; i += W) sum.add(su.x(row.load(i) - shift).exp_u20());
    const float m = cmax > sc.m ? cmax : sc.m;
    const double t = su.temp;
    sc.s = sc.s * std::exp((static_cast<double>(sc.m) - m) / t) +
           sum.value() * std::exp((static_cast<double>(cmax) - m) / t);
    sc.m = m;
    return;
  }
  if (cmax > sc.m) sc.m = cmax;
  Candidates& cand = sc.cand;
  const float lo = su.x(sc.m) + su.floor_shift;  // min_p's floor (-inf: none; NaN: none)
  if (!(su.x(cmax) >= cand.cutoff) || su.x(cmax) < lo) return;
  for (int64_t i = base; i < base + n; i += W) {
    const Vec xv = su.x(row.load(i));
    if ((xv >= Vec(lo > cand.cutoff ? lo : cand.cutoff)).zero_mask() == kAllLanes) continue;
    xv.store(lanes);
    for (int64_t l = 0; l < W && i + l < row.V; ++l) {
      if (!(lanes[l] >= cand.cutoff) || lanes[l] < lo) continue;
      cand.push(lanes[l]);
      if (sc.track) sc.pushed.push_back(i + l);
    }
    if (sc.pushed.size() > kMaxTracked) {
      sc.track = false;
      sc.pushed.clear();
    }
  }
}

// The second pass of a filtered row: sum over kept tokens (x >= kappa) of exp((l - M) / T).
template <typename T>
double kept_mass(const Row<T>& row, const Setup& su, float m, float kappa) {
  LaneSum sum;
  const Vec shift(m), kv(kappa), zero(0.0f);
  for (int64_t i = 0; i < row.V; i += W) {
    const Vec v = row.load(i);
    const Vec keep = su.x(v) >= kv;
    if (keep.zero_mask() == kAllLanes) continue;
    sum.add(Vec::blendv(zero, su.x(v - shift).exp_u20(), keep));
  }
  return sum.value();
}

// The same from the ids of the pushed candidates (a superset of the kept tokens), in double.
template <typename T>
double kept_mass(const Row<T>& row, const std::vector<int64_t>& ids, const Setup& su, float m,
                 float kappa) {
  double z = 0.0;
  for (const int64_t t : ids) {
    const float l = row.at(t);
    if (su.x(l) >= kappa) z += std::exp((static_cast<double>(l) - m) / su.temp);
  }
  return z;
}

// How position (b, p) of a call is scored: T and the filters of row b (processed mode, a sampled
// row), else T = 1 and no filter.
inline Setup setup_of(bool processed, const float* temperature, const int64_t* top_k,
                      const float* top_p, const float* min_p, int64_t b, int64_t V) {
  Setup su;
  const float temp = processed && temperature != nullptr ? temperature[b] : 0.0f;
  if (temp != 0.0f) {  // a sampled row, processed mode: temperature and filters
    su.temp = temp;
    su.top_k = top_k != nullptr ? top_k[b] : 0;
    su.top_p = top_p != nullptr ? top_p[b] : 1.0f;
    su.topk_on = su.top_k > 0 && su.top_k < V;
    su.topp_on = su.top_p < 1.0f;
    if (min_p != nullptr && min_p[b] > 0.0f) su.min_p = min_p[b];
    if (su.min_p > 0.0f && !su.topp_on) {
      su.floor_shift = std::log(std::min(su.min_p, 1.0f)) - 0.01f;
    }
    su.filtered = su.topk_on || su.topp_on || su.min_p > 0.0f;
  }
  return su;
}

// What scoring a position's tokens needs, from one read of its row: the max M, log Z, the
// filter's threshold kappa and the top-n (prepare()); emit() then scores a token with one logit
// load.
struct Scored {
  Setup su;
  float m = kNegInf;        // M (-inf: no finite allowed logit)
  float kappa = kNegInf;    // filtered rows: keep x >= kappa
  double log_z = 0.0;
  TopN top;

  double value(float l) const { return (l - static_cast<double>(m)) / su.temp - log_z; }
  bool kept(float l) const { return !su.filtered || su.x(l) >= kappa; }
};

// Reads the row once (and, top-p alone, a second time for the kept mass): sc is the caller's
// scratch (its candidates' buffer is reused), n the number of top entries.
template <typename T>
void prepare(const Row<T>& row, const Setup& su, int64_t n, Scan& sc, Scored& out) {
  const int64_t V = row.V;
  sc.m = kNegInf;
  sc.s = 0.0;
  sc.top.n = n;
  sc.top.count = 0;
  if (su.filtered) sc.cand.reset(su.topk_on ? su.top_k : V, V);
  sc.track = su.topk_on;
  sc.pushed.clear();
  for (int64_t base = 0; base < V; base += CHUNK) {
    scan_chunk(row, base, std::min(CHUNK, V - base), su, sc);
  }
  out.su = su;
  out.m = sc.m;
  out.top = sc.top;
  out.kappa = kNegInf;
  out.log_z = 0.0;
  if (!(sc.m > kNegInf)) return;  // no finite allowed logit
  double z = sc.s;
  if (su.filtered) {
    Stats st;
    st.m = su.x(sc.m);
    const Filter f = verify_cpu::thresholds(sc.cand.buf, st, su.topk_on, su.top_k, su.topp_on,
                                            su.top_p, su.min_p);
    out.kappa = f.kappa;
    z = sc.track ? kept_mass(row, sc.pushed, su, sc.m, f.kappa)
                 : kept_mass(row, su, sc.m, f.kappa);
  }
  out.log_z = std::log(z);
}

// The log-probability of `token` (>= 0) under a prepared position, and its n top entries
// (top / ids [n], -inf / -1 past the listed ones).
template <typename T>
float emit(const Scored& s, const Row<T>& row, int64_t token, int64_t n, float* top,
           int64_t* ids) {
  for (int64_t i = 0; i < n; ++i) {
    top[i] = kNegInf;
    ids[i] = -1;
  }
  if (!(s.m > kNegInf)) {  // no finite allowed logit: log_softmax is NaN, nothing is listed
    return token < row.V ? std::numeric_limits<float>::quiet_NaN() : kNegInf;
  }
  float lp = kNegInf;
  if (token < row.V && row.allowed(token)) {
    const float l = row.raw(token);
    if (s.kept(l)) lp = static_cast<float>(s.value(l));
  }
  for (int64_t i = 0; i < s.top.count && s.kept(s.top.val[i]); ++i) {
    top[i] = static_cast<float>(s.value(s.top.val[i]));
    ids[i] = s.top.id[i];
  }
  return lp;
}

// Scores one emitted position (b, p): logprobs[b, p] and its n top entries.
template <typename T>
void score_position(const LogprobArgs& a, int64_t b, int64_t p, Scan& sc) {
  const int64_t V = a.vocab, n = a.num_logprobs, task = b * a.positions + p;
  float* out_top = a.top_logprobs + task * n;
  int64_t* out_ids = a.top_ids + task * n;
  const int64_t r = a.rows[task], token = a.tokens[task];
  if (r < 0 || token < 0) {  // padding
    for (int64_t i = 0; i < n; ++i) {
      out_top[i] = kNegInf;
      out_ids[i] = -1;
    }
    a.logprobs[task] = kNegInf;
    return;
  }
  const int64_t rr = std::min(r, a.num_rows - 1);  // out-of-range rows are clamped, never read
  const T* logits = static_cast<const T*>(a.logits) + b * a.logits_stride_b +
                    rr * a.logits_stride_n;
  const int32_t* mask = a.processed && a.bitmask != nullptr
                            ? a.bitmask + b * a.mask_stride_b + rr * a.mask_stride_n
                            : nullptr;
  const verify_cpu::RowEdits edits(
      a.processed && a.edit_ids != nullptr ? a.edit_ids + b * a.num_edits : nullptr,
      a.num_edits, V);
  const Row<T> row{logits, mask, V, edits.index,
                   edits.index != nullptr ? a.edit_vals + task * a.num_edits : nullptr};
  Scored s;
  prepare(row, setup_of(a.processed, a.temperature, a.top_k, a.top_p, a.min_p, b, V), n, sc, s);
  a.logprobs[task] = emit(s, row, token, n, out_top, out_ids);
}

template <typename T>
void run(const LogprobArgs& a) {
  at::parallel_for(0, a.batch * a.positions, 1, [&](int64_t t0, int64_t t1) {
    Scan sc;  // one per thread range: the candidates' buffer is reused
    for (int64_t t = t0; t < t1; ++t) score_position<T>(a, t / a.positions, t % a.positions, sc);
  });
}

}  // namespace
}  // namespace logprobs_cpu
}  // namespace specdec
