// Fused CPU verification kernels (greedy and rejection sampling): run<T, Q>, T the logits' and Q
// the draft probabilities' C++ type.
//
// Included once per CPU capability by verify_cpu_launchers.h, after the unit has set
// CPU_CAPABILITY (and the matching `#pragma GCC target`): everything here lives in an anonymous
// namespace, so each capability gets its own copy and only launchers_<CPU_CAPABILITY> is
// visible outside.
//
// Vocabulary of the file (as in specdec_kernels/ops/verify_sampling.py): a *row* is one batch
// entry b; a *position* j in [0, k_b] is one logits row [V]; x = logit / T. A row's positions are
// walked in order and the walk stops at the first rejection, so later logits rows are never read.
// Each position's vocabulary is cut into fixed chunks of CHUNK tokens; per chunk the max of x,
// sum(exp(x - max)) and the first argmax are computed, and chunks are merged in chunk order
// (online log-sum-exp). The chunking never depends on the thread count, so the result does not
// either: rows are spread over threads when the batch fills them ("row" strategy), otherwise each
// position's chunks are ("split" strategy), with identical results.
//
// Top-k / top-p: the stats pass also collects candidate logits with a rising cutoff (a streaming
// top-k: whatever falls below the k-th largest seen so far can never be in the top k), then an
// exact selection (nth_element) on the few candidates gives the top-k threshold, and a walk over
// the sorted survivors the top-p one, with the reference's rule (keep x >= threshold; ties kept).
// No sort of V.
//
// Randomness: the uint32 counter RNG of specdec_kernels/reference/rng.py, bit for bit.
//
// Block verification (VerifyArgs::mode == kChainBlock, verify_row_block) walks every position
// up to k_b (or until its weight is 0) before it decides, then races once at the stop; token
// bitmasks are read where the logits are (XMap, load_logits, logit_at): no masked copy.
//
// Sparse logit edits (VerifyArgs::edit_ids / edit_vals) are read there too: a per-row bitmap of
// the edited ids (EditIndex, O(E) to build in a thread's scratch) makes a vector of W tokens
// without an edit cost one more load-shift-and-test; an edited token reads its value in O(1).
// min_p is one more threshold on x, taken with top-k / top-p's (thresholds()).
//
// A reduced draft vocabulary (VerifyArgs::draft_vocab_inv, EAGLE-3's draft-to-target map) is read
// through its [V] inverse index wherever q is (QRow): one lookup for the accept test's q(x) and
// block verification's Q_i(X_{i+1}), one gather per token in the residual passes (the race over
// max(0, p - q) at a rejection, block verification's R_i), where the dense path loads a vector.
// The choice is a template parameter taken outside the vocabulary loops, so calls without a map
// run the dense code unchanged; no scattered [V] copy of q is ever written.
#pragma once

#include <ATen/Parallel.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "counter_rng.h"
#include "verify_cpu.h"

// verify_cpu_launchers.h has already included the vectorised ATen headers for the unit's
// capability (after its target pragma).

namespace specdec {
namespace verify_cpu {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t W = Vec::size();
constexpr int64_t CHUNK = 4096;  // tokens per chunk: 16 KiB of float32 x, resident in L1
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// --- counter RNG: counter_rng.h (specdec_kernels/reference/rng.py's, bit for bit) -----------
using namespace ::specdec::counter_rng;

// --- loading ----------------------------------------------------------------------------------
inline int64_t padded(int64_t n) { return (n + W - 1) / W * W; }

// The bits of a vector's W lanes in a 32-bit word (W divides 32).
constexpr uint32_t kLanes = W >= 32 ? 0xFFFFFFFFu : (1u << W) - 1u;

inline int popcount32(uint32_t v) {
  v = v - ((v >> 1) & 0x55555555u);
  v = (v & 0x33333333u) + ((v >> 2) & 0x33333333u);
  return static_cast<int>((((v + (v >> 4)) & 0x0F0F0F0Fu) * 0x01010101u) >> 24);
}

// The edited ids of one row (VerifyArgs::edit_ids [E], sorted, unique, padded with V) as a bitmap
// over the vocabulary: bit l of bits[w] set = token 32 w + l is edited, and first[w] = the index
// e of word w's first edit (valid where bits[w] != 0), so token t's edit is e = first[t / 32] +
// popcount(bits[t / 32] below t): O(1) per edited token read. build() costs O(E) (and, once per
// thread and larger vocabulary, zeroing 2 ceil(V / 32) words), clear() O(E): one thread's scratch
// (edit_scratch()) serves every row it runs. Ids outside [0, V) are skipped; unsorted or repeated
// ids (a caller's error) give wrong values but e stays in [0, E).
struct EditIndex {
  std::vector<uint32_t> bits;
  std::vector<int32_t> first;
  const int32_t* ids = nullptr;  // [E] of the row built
  int64_t count = 0, vocab = 0;

  void build(const int32_t* row_ids, int64_t E, int64_t V) {
    const size_t words = static_cast<size_t>((V + 31) / 32);
    if (bits.size() < words) {
      bits.resize(words, 0u);
      first.resize(words, 0);
    }
    ids = row_ids;
    count = E;
    vocab = V;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t t = ids[e];
      if (t < 0 || t >= V) continue;
      uint32_t& word = bits[t >> 5];
      if (word == 0) first[t >> 5] = static_cast<int32_t>(e);
      word |= 1u << (t & 31);
    }
  }

  void clear() {
    for (int64_t e = 0; e < count; ++e) {
      const int64_t t = ids[e];
      if (t >= 0 && t < vocab) bits[t >> 5] = 0u;
    }
    count = 0;
  }
};

// The calling thread's EditIndex, built for one row for the lifetime of this guard (cleared
// again however the row ends).
inline EditIndex& edit_scratch() {
  thread_local EditIndex index;
  return index;
}

struct RowEdits {
  EditIndex* index = nullptr;  // nullptr: the call has no edits
  RowEdits(const int32_t* ids, int64_t E, int64_t V) {
    if (ids == nullptr) return;
    index = &edit_scratch();
    index->build(ids, E, V);
  }
  ~RowEdits() {
    if (index != nullptr) index->clear();
  }
  RowEdits(const RowEdits&) = delete;
  RowEdits& operator=(const RowEdits&) = delete;
};

template <typename T>
inline Vec load_vec(const T* src) {
  if constexpr (std::is_same_v<T, float>) {
    return Vec::loadu(src);
  } else {
    Vec out;
    at::vec::load_to_float<T>(src, out);
    return out;
  }
}

// W values of x = float(src[i, i + W)) / temp (no division when temp == 1), read in place;
// lanes at or past n hold `pad`.
template <typename T>
inline Vec load_x(const T* src, int64_t i, int64_t n, float temp, float pad) {
  Vec v;
  if (i + W <= n) {
    v = load_vec(src + i);
  } else {
    alignas(64) float tail[W];
    for (int64_t l = 0; l < W; ++l) tail[l] = i + l < n ? static_cast<float>(src[i + l]) : pad;
    v = Vec::loadu(tail);
  }
  return temp != 1.0f ? v / Vec(temp) : v;
}

// The draft probabilities q of one position (or of a span of it, at()): dense, q(t) = row[t], or
// through a reduced draft vocabulary's inverse index (VerifyArgs::draft_vocab_inv), q(t) =
// row[inv[t]] where inv[t] is in [0, cols), else 0. Nothing (row == nullptr): no draft
// probabilities (one-hot drafts, or a pass without q).
template <typename Q>
struct QRow {
  const Q* row = nullptr;         // [V] (span-relative) dense, or [cols] with inv
  const int32_t* inv = nullptr;   // [V] (span-relative) or nullptr: dense
  int64_t cols = 0;               // V_draft with inv

  explicit operator bool() const { return row != nullptr; }

  // The span that starts at token `base` of the position.
  QRow at(int64_t base) const {
    if (row == nullptr) return *this;
    return inv != nullptr ? QRow{row, inv + base, cols} : QRow{row + base, nullptr, 0};
  }

  // q of token t of the span (in range). Branchless through the index: in a pass over the
  // vocabulary, whether a token is in the map is a coin flip to the branch predictor (a branch
  // made block verification's mapped R_i passes ~2x the dense ones); column 0 is read instead
  // of a column outside [0, cols) (cols >= 1) and the value dropped.
  float value(int64_t t) const {
    if (inv == nullptr) return static_cast<float>(row[t]);
    const int32_t c = inv[t];
    const bool in_map = static_cast<uint32_t>(c) < static_cast<uint64_t>(cols);
    const float v = static_cast<float>(row[in_map ? c : 0]);
    return in_map ? v : 0.0f;
  }
};

// W values of q at tokens [i, i + W) of a span of n tokens; lanes at or past n hold 0. MAP: the
// span reads through the inverse index, one scalar gather per token (its cost over the dense
// load), the values bit for bit those of the dense load of the scattered row (a bf16 / fp16 to
// float32 conversion is exact either way). The choice is a template parameter, made once per
// pass outside the loop over the vocabulary: the dense path is the same code as before the map.
template <bool MAP, typename Q>
C10_ALWAYS_INLINE Vec load_q(const QRow<Q>& q, int64_t i, int64_t n) {
  if constexpr (!MAP) {
    return load_x(q.row, i, n, 1.0f, 0.0f);
  } else {
    alignas(64) float g[W];
    for (int64_t l = 0; l < W; ++l) g[l] = i + l < n ? q.value(i + l) : 0.0f;
    return Vec::loadu(g);
  }
}

// How a logits row maps to x: x = value / temp, or x = log(value) for probability inputs; the
// position's sparse edits, when there are some: an edited token reads its edit value in place of
// the logit (before the bitmask and the temperature); and the row's token bitmask (xgrammar's
// layout, API.md section 9), when there is one: a token whose bit is clear reads as x = -inf.
// Both apply wherever the kernels read a logit (load_logits, logit_at), so the max, the sums, the
// filters' thresholds, the argmax and the race all see the edited, masked row and no edited or
// masked copy is ever written.
struct XMap {
  float temp = 1.0f;
  bool log = false;
  const int32_t* mask = nullptr;  // [ceil(n / 32)] words of the span the map reads, or nullptr
  const uint32_t* edited = nullptr;  // EditIndex::bits of the span, or nullptr (no edits)
  const int32_t* first = nullptr;    // EditIndex::first of the span
  const float* vals = nullptr;       // [E] the position's edit values

  // The map of the span that starts at token `base` of the row (a multiple of 32: a chunk).
  XMap at(int64_t base) const {
    XMap out = *this;
    if (mask != nullptr) out.mask = mask + base / 32;
    if (edited != nullptr) {
      out.edited = edited + base / 32;
      out.first = first + base / 32;
    }
    return out;
  }

  // Whether token i of the span is allowed.
  bool allowed(int64_t i) const {
    return mask == nullptr || ((static_cast<uint32_t>(mask[i >> 5]) >> (i & 31)) & 1u) != 0;
  }

  // Whether token i of the span is edited, and its value (where it is).
  bool is_edited(int64_t i) const { return edited != nullptr && ((edited[i >> 5] >> (i & 31)) & 1u); }
  float edit_value(int64_t i) const {
    const uint32_t below = edited[i >> 5] & ((1u << (i & 31)) - 1u);
    return vals[first[i >> 5] + popcount32(below)];
  }
};

// x of token i of a logits (or probability) row: its edit value or logit, -inf where the mask
// forbids it.
template <typename T>
inline float logit_at(const T* src, int64_t i, const XMap& xm) {
  if (!xm.allowed(i)) return kNegInf;
  alignas(64) float e[W];
  const float value = xm.is_edited(i) ? xm.edit_value(i) : static_cast<float>(src[i]);
  const Vec v = xm.log ? Vec(value).log() : Vec(value / xm.temp);
  v.store(e);
  return e[0];
}

// v with the lanes of tokens [i, i + W) that the mask forbids set to -inf. W divides 32 and i is
// a multiple of W, so the W bits lie in one word (word i / 32 < ceil(n / 32) for i < n).
// A group with both allowed and forbidden tokens is one blend: a mask register from the bits
// (AVX-512), a lane-bit compare (AVX2), else lane by lane.
inline Vec apply_mask(const Vec& v, int64_t i, const int32_t* mask) {
  const uint32_t bits = (static_cast<uint32_t>(mask[i >> 5]) >> (i & 31)) & kLanes;
  if (bits == kLanes) return v;
  if (bits == 0) return Vec(kNegInf);
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (W == 16) {
    return Vec(_mm512_mask_blend_ps(static_cast<__mmask16>(bits), _mm512_set1_ps(kNegInf),
                                    static_cast<__m512>(v)));
  }
#elif defined(CPU_CAPABILITY_AVX2)
  if constexpr (W == 8) {
    const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i on = _mm256_cmpeq_epi32(
        _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), lane_bits), lane_bits);
    return Vec(_mm256_blendv_ps(_mm256_set1_ps(kNegInf), static_cast<__m256>(v),
                                _mm256_castsi256_ps(on)));
  }
#endif
  alignas(64) float out[W];
  v.store(out);
  for (int64_t l = 0; l < W; ++l) {
    if (((bits >> l) & 1u) == 0) out[l] = kNegInf;
  }
  return Vec::loadu(out);
}

// load_logits of a vector with edited tokens (their lanes' bits in `edited`): the logits with the
// edit values put in, masked, then divided by the temperature, as load_x reads a dense float32
// copy with the edits scattered in (so bit for bit its x). W scalar loads plus one per edit.
template <typename T>
C10_NOINLINE Vec load_edited(const T* src, int64_t i, int64_t n, const XMap& xm,
                             uint32_t edited) {
  alignas(64) float raw[W];
  for (int64_t l = 0; l < W; ++l) {
    raw[l] = i + l < n ? (((edited >> l) & 1u) ? xm.edit_value(i + l)
                                               : static_cast<float>(src[i + l]))
                       : kNegInf;
  }
  Vec v = Vec::loadu(raw);
  if (xm.log) v = v.log();  // never given edits (the adapter refuses them with log_input)
  if (xm.mask != nullptr) v = apply_mask(v, i, xm.mask);
  return !xm.log && xm.temp != 1.0f ? v / Vec(xm.temp) : v;
}

// W values of x from a logits (or probability) row; lanes at or past n, or masked, hold -inf.
// Edits cost one test per vector when the call has none, a load-shift-and-test of the edit
// bitmap when it has some (load_edited, out of line, only for a vector with an edited token).
// Always inlined: as a call (GCC made one once XMap grew the edit pointers) it cost the
// unfiltered B = 64, V = 128256 call ~10%.
template <typename T>
C10_ALWAYS_INLINE Vec load_logits(const T* src, int64_t i, int64_t n, const XMap& xm) {
  if (xm.mask != nullptr && i < n) {
    if (((static_cast<uint32_t>(xm.mask[i >> 5]) >> (i & 31)) & kLanes) == 0) return Vec(kNegInf);
  }
  if (xm.edited != nullptr && i < n) {
    const uint32_t edited = (xm.edited[i >> 5] >> (i & 31)) & kLanes;
    if (edited != 0) return load_edited(src, i, n, xm, edited);
  }
  const Vec v = xm.log ? load_x(src, i, n, 1.0f, 0.0f).log()  // log(0) = -inf: masked
                       : load_x(src, i, n, xm.temp, kNegInf);
  return xm.mask != nullptr && i < n ? apply_mask(v, i, xm.mask) : v;
}

// --- per-chunk statistics ---------------------------------------------------------------------
struct Stats {
  float m = kNegInf;  // max of x (NaN never wins a comparison)
  float s = 0.0f;     // sum of exp(x - m)
  int64_t a = 0;      // first index of the max
};

inline float safe_max(float m) { return m == kNegInf ? 0.0f : m; }

// No tap: what the plain kernels pass to chunk_stats / position_stats.
struct NoTap {};

// Max, first argmax and (need_sum) sum of exp(x - max) of x = src[0, n) / temp. Taps (a kernel
// fused with verification: verify_logprobs_cpu_kernel.h): `range` (the tap of the first chunk
// of this thread's range) sees every vector of x (offer(x, first token)), `tap` the vectors of
// exp(x - max) summed lane-wise in float, Tap::FLUSH at a time from the chunk's start (add()),
// and the chunk's max (done()). With NoTap the code is the plain kernel's.
template <typename T, typename Tap = NoTap>
inline Stats chunk_stats(const T* src,  // [n]
                         int64_t n, const XMap& xm, int64_t base, bool need_sum,
                         Tap* tap = nullptr, Tap* range = nullptr) {
  constexpr bool TAP = !std::is_same_v<Tap, NoTap>;
  const int64_t npad = padded(n);
  Vec best = load_logits(src, 0, n, xm);
  if constexpr (TAP) range->offer(best, base);
  Vec best_i = Vec::arange(0.0f, 1.0f);  // chunk-local indices, exact in float
  Vec idx = best_i;
  const Vec step(static_cast<float>(W));
  for (int64_t i = W; i < npad; i += W) {
    idx = idx + step;
    const Vec v = load_logits(src, i, n, xm);
    if constexpr (TAP) range->offer(v, base + i);
    const Vec take = v > best;
    best = Vec::blendv(best, v, take);
    best_i = Vec::blendv(best_i, idx, take);
  }
  alignas(64) float lane_m[W];
  alignas(64) float lane_i[W];
  best.store(lane_m);
  best_i.store(lane_i);
  Stats st;
  for (int64_t l = 0; l < W; ++l) {
    if (lane_m[l] > st.m) st.m = lane_m[l];
  }
  float first = 0.0f;
  bool found = false;
  for (int64_t l = 0; l < W; ++l) {
    if (lane_m[l] == st.m && (!found || lane_i[l] < first)) {
      first = lane_i[l];
      found = true;
    }
  }
  st.a = base + static_cast<int64_t>(first);
  if (need_sum) {
    const Vec shift(safe_max(st.m));
    Vec acc(0.0f);
    if constexpr (!TAP) {
      for (int64_t i = 0; i < npad; i += W) {
        acc = acc + (load_logits(src, i, n, xm) - shift).exp_u20();
      }
    } else {  // blocks of Tap::FLUSH vectors, each summed a second time for the tap
      for (int64_t block = 0; block < npad; block += Tap::FLUSH * W) {
        const int64_t end = std::min(npad, block + Tap::FLUSH * W);
        Vec part(0.0f);
        for (int64_t i = block; i < end; i += W) {
          const Vec e = (load_logits(src, i, n, xm) - shift).exp_u20();
          acc = acc + e;
          part = part + e;
        }
        tap->add(part);
      }
    }
    alignas(64) float lane_s[W];
    acc.store(lane_s);
    for (int64_t l = 0; l < W; ++l) st.s += lane_s[l];
  }
  if constexpr (TAP) tap->done(st.m);
  return st;
}

// Merge chunk statistics in chunk order (the running side holds the earlier indices).
inline void merge_stats(Stats& big, const Stats& c) {
  const float m = c.m > big.m ? c.m : big.m;
  const float safe = safe_max(m);
  big.s = big.s * std::exp(big.m - safe) + c.s * std::exp(c.m - safe);
  if (c.m > big.m) big.a = c.a;
  big.m = m;
}

// --- top-k / top-p candidates -----------------------------------------------------------------
// Streaming top-k over x: keeps every value >= the k-th largest seen so far (ties included), so
// the final buffer holds the row's top k and everything tied with its k-th value.
//
// min_p's floor (without top-p, whose mass needs every top-k survivor): a value x below
// (the max seen so far) + log(min_p) - 0.01 has exp(x - m) < min_p e^-0.01 for the row's max m,
// so min_p drops it whatever comes later; it is never pushed (the 0.01 covers the rounding of
// the sums and of exp). Costs one max and one add per chunk.
struct Candidates {
  std::vector<float> buf;
  float cutoff = kNegInf;
  int64_t k = 0;
  size_t cap = 0;
  float floor_shift = kNegInf;  // log(min_p) - 0.01, or -inf: no floor
  float seen_max = kNegInf;     // max x of the chunks added so far

  void reset(int64_t keep, int64_t vocab, float min_p_floor = kNegInf) {
    buf.clear();
    cutoff = kNegInf;
    k = keep;
    cap = static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(2 * keep, 1024), vocab + 1));
    floor_shift = min_p_floor;
    seen_max = kNegInf;
  }

  void compact() {
    if (static_cast<int64_t>(buf.size()) <= k) return;
    std::nth_element(buf.begin(), buf.begin() + (k - 1), buf.end(), std::greater<float>());
    cutoff = buf[k - 1];
    const float cut = cutoff;
    auto end = std::partition(buf.begin() + k, buf.end(), [cut](float v) { return v >= cut; });
    buf.resize(end - buf.begin());
    if (buf.size() * 2 > cap) cap *= 2;  // many ties at the cutoff
  }

  void push(float v) {
    buf.push_back(v);
    if (buf.size() >= cap) compact();
  }

  // x = src[0, n) / temp of one chunk whose max is chunk_max.
  template <typename T>
  void add(const T* src, int64_t n, const XMap& xm, float chunk_max) {
    if (chunk_max > seen_max) seen_max = chunk_max;
    const float lo = seen_max + floor_shift;  // -inf without a floor (NaN: no floor either)
    if (!(chunk_max >= cutoff) || chunk_max < lo) return;
    alignas(64) float lanes[W];
    for (int64_t i = 0; i < n; i += W) {
      const Vec v = load_logits(src, i, n, xm);
      const float bar = lo > cutoff ? lo : cutoff;
      if ((v >= Vec(bar)).zero_mask() == (1 << W) - 1) continue;  // no lane passes
      v.store(lanes);
      for (int64_t l = 0; l < W && i + l < n; ++l) {
        if (lanes[l] >= cutoff && !(lanes[l] < lo)) push(lanes[l]);
      }
    }
  }
};

// The filter of one position: p(x) = exp(x - m) / z where x >= kappa, else 0.
struct Filter {
  float kappa = kNegInf;
  float z = 0.0f;
  int64_t kept = -1;  // tokens the filter keeps (-1: no filter, every token)
};

// exp(v - shift) for every v in vals (vectorised, the reference's rounding).
inline void exp_shifted(const float* vals, int64_t n, float shift, float* out) {
  int64_t i = 0;
  for (; i + W <= n; i += W) (Vec::loadu(vals + i) - Vec(shift)).exp().store(out + i);
  if (i < n) {
    alignas(64) float tmp[W];
    for (int64_t l = 0; l < W; ++l) tmp[l] = i + l < n ? vals[i + l] : kNegInf;
    (Vec::loadu(tmp) - Vec(shift)).exp().store(tmp);
    for (int64_t l = 0; i + l < n; ++l) out[i + l] = tmp[l];
  }
}

// Thresholds of the top-k, top-p and min_p filters from the candidates
// (reference/verify_sampling.py's filtered_probs): top-k keeps x >= the k-th largest value;
// top-p, on the top-k survivors sorted in descending order, keeps the prefix whose exclusive
// cumulative mass is below top_p * (their total mass), extended to every token tied with its
// last value; min_p (> 0: on) then keeps those with exp(x - m) >= min_p (the max always).
inline Filter thresholds(std::vector<float>& cand, const Stats& st, bool topk_on, int64_t top_k,
                         bool topp_on, float top_p, float min_p = 0.0f) {
  Filter f;
  f.z = st.s;
  const bool minp_on = min_p > 0.0f;
  if (!topk_on && !topp_on && !minp_on) return f;
  const float shift = safe_max(st.m);
  if (topk_on && !cand.empty()) {
    const int64_t n = static_cast<int64_t>(cand.size());
    if (top_k < n) {
      std::nth_element(cand.begin(), cand.begin() + (top_k - 1), cand.end(),
                       std::greater<float>());
      f.kappa = cand[top_k - 1];
    } else {
      f.kappa = *std::min_element(cand.begin(), cand.end());
    }
    const float kappa = f.kappa;
    cand.erase(std::partition(cand.begin(), cand.end(), [kappa](float v) { return v >= kappa; }),
               cand.end());
  }
  std::vector<float> e(cand.size());
  float total = 0.0f;  // top-p's normaliser: the mass of every top-k survivor
  if (topp_on && !topk_on) {
    // Top-p alone: a token whose mass is at most (1 - top_p) Z / n has at least Z - n times that
    // = top_p Z of mass above it, so it is never kept; only the rest needs sorting (half the
    // bound, for the rounding of the sums).
    exp_shifted(cand.data(), static_cast<int64_t>(cand.size()), shift, e.data());
    for (float v : e) total += v;
    const float bound = 0.5f * (1.0f - top_p) * total / static_cast<float>(cand.size());
    size_t live = 0;
    for (size_t i = 0; i < cand.size(); ++i) {
      if (e[i] > bound) cand[live++] = cand[i];
    }
    cand.resize(live);
  }
  std::sort(cand.begin(), cand.end(), std::greater<float>());
  e.resize(cand.size());
  exp_shifted(cand.data(), static_cast<int64_t>(cand.size()), shift, e.data());
  size_t kept = cand.size();
  if (topp_on && !cand.empty()) {
    if (topk_on) {
      for (float v : e) total += v;
    }
    const float target = top_p * total;
    double running = 0.0;  // torch.cumsum accumulates float32 in double on CPU
    size_t last = 0;
    for (size_t i = 0; i < cand.size(); ++i) {
      running += e[i];
      const float above = static_cast<float>(running) - e[i];  // exclusive mass, as cumsum - e
      if (!(above < target)) break;
      last = i;
    }
    f.kappa = cand[last];
    kept = last + 1;
    while (kept < cand.size() && cand[kept] >= f.kappa) ++kept;  // ties at the threshold
  }
  if (minp_on && kept > 0) {
    // exp(x - m) >= min_p, the reference's test on its e: a prefix of the sorted survivors
    // (ties share e; the max, e = 1, stays even for min_p > 1). One pass over the survivors.
    size_t n = 1;
    while (n < kept && e[n] >= min_p) ++n;
    kept = n;
    f.kappa = cand[kept - 1];
  }
  float z = 0.0f;
  for (size_t i = 0; i < kept; ++i) z += e[i];
  f.z = z;
  f.kept = static_cast<int64_t>(kept);
  return f;
}

// --- the exponential race ---------------------------------------------------------------------
// The uniforms v of W consecutive tokens (counter_rng::unit_interval) and floor(log2 v), read off
// v's exponent bits (v >= 2**-33 is a normal float).
inline void uniforms(uint32_t stream, int64_t first, float* v, float* log2_v) {
  for (int64_t l = 0; l < W; ++l) {
    const float u = unit_interval(draw(stream, static_cast<uint32_t>(first + l)));
    v[l] = u;
    uint32_t bits;
    std::memcpy(&bits, &u, sizeof(bits));  // std::bit_cast, C++17-compatible
    log2_v[l] = static_cast<float>(static_cast<int32_t>(bits >> 23) - 127);
  }
}

// The race's exponentials E = -log(1 - v) of W uniforms (counter_rng::exponential, vectorised):
// the series v (1 + v (1/2 + v/3)) below 2**-9, else -log of the exact 1 - v.
inline Vec exponentials(const float* v) {
  const Vec vv = Vec::loadu(v), one(1.0f);
  const Vec series = vv * (one + vv * (Vec(0.5f) + vv * Vec(1.0f / 3.0f)));
  return Vec::blendv((one - vv).log().neg(), series, vv < Vec(SERIES_LIMIT));
}

// The smallest uniform is 2**-33, so no exponential is below 2**-33: the whole-vector skip bound.
constexpr float kMinLog2Uniform = -33.0f;

enum class RaceKind { kResidual, kPlain };

constexpr float LN2 = 0.69314718f;

// A running race: the best score S so far and its token, plus the bound that lets a token be
// skipped without its exp, log and division when it provably scores below S. With
// E = -log(1 - v) >= v >= 2**floor(log2 v) and w <= p = exp(x - m) / z, a token with
// x - m < log(S z) + ln 2 * floor(log2 v) - 0.01 scores w / E < 0.99 S (the 1% covers every
// rounding of the float arithmetic and of Sleef's exp / log), and since v >= 2**-33 a whole
// vector with x - m < log(S z) - 33 ln 2 - 0.01 is skipped before its uniforms are drawn.
// Skipped tokens score strictly below an earlier token, so the winner (first index on ties) is
// exactly the full race's.
struct RaceState {
  float s;                  // best score so far (0 residual / -1 plain: none yet)
  int64_t index = 0;        // its token (the first on ties: tokens are offered in order)
  float log_sz = kNegInf;   // log(S z) - 0.01 once S > 0
  float log_z;

  RaceState(RaceKind kind, float z)
      : s(kind == RaceKind::kResidual ? 0.0f : -1.0f), log_z(std::log(z)) {}

  void offer(float score, int64_t token) {
    if (!(score > s)) return;
    s = score;
    index = token;
    const float bound = std::log(s) + log_z - 0.01f;
    log_sz = std::isnan(bound) ? kNegInf : bound;
  }

  // Merge the race of later tokens.
  void merge(const RaceState& later) {
    if (later.s > s) {
      s = later.s;
      index = later.index;
    }
  }
};

// The race of one chunk over x = src[0, n) / temp: argmax of w / E with E = -log(1 - v)
// (exponentials) and w = max(0, scale p - q) (residual; scale = 1 for token verification, the weight p_tau
// <= 1 at a block's stop) or p (plain); zero (or NaN) weights never score. q comes from q_src
// [n] (MAP: through its inverse index, load_q) or, when q_src is empty, is one-hot at chunk-local
// `draft_local` (-1: q = 0).
template <RaceKind KIND, bool MAP, typename T, typename Q>
inline void chunk_race(RaceState& rs, const T* src,  // [n]
                       const QRow<Q>& q_src,          // the chunk's span, or empty
                       int64_t draft_local, int64_t n, const XMap& xm, int64_t base, float m,
                       const Filter& f, uint32_t stream, float scale) {
  const Vec shift(safe_max(m)), kappa(f.kappa), z(f.z), zero(0.0f), one(1.0f), ln2(LN2);
  const Vec draft(static_cast<float>(draft_local));
  const int full = (1 << W) - 1;
  alignas(64) float u[W];
  alignas(64) float lg[W];
  alignas(64) float lanes[W];
  for (int64_t i = 0; i < n; i += W) {
    const Vec xv = load_logits(src, i, n, xm);
    const Vec keep = xv >= kappa;
    const Vec d = xv - shift;
    if ((keep & (d >= Vec(rs.log_sz + kMinLog2Uniform * LN2))).zero_mask() == full) continue;
    uniforms(stream, base + i, u, lg);
    if ((keep & (d >= Vec(rs.log_sz) + ln2 * Vec::loadu(lg))).zero_mask() == full) continue;
    const Vec p = Vec::blendv(zero, d.exp() / z, keep);
    Vec w = p;
    if constexpr (KIND == RaceKind::kResidual) {
      const Vec idx = Vec::arange(static_cast<float>(i), 1.0f);
      const Vec qv = q_src ? load_q<MAP>(q_src, i, n) : Vec::blendv(zero, one, idx == draft);
      w = (scale != 1.0f ? Vec(scale) * p : p) - qv;
    }
    const Vec e = exponentials(u);
    const Vec score = KIND == RaceKind::kResidual ? Vec::blendv(zero, w / e, w > zero)
                                                  : Vec::blendv(Vec(-1.0f), w / e, w > zero);
    score.store(lanes);
    for (int64_t l = 0; l < W && i + l < n; ++l) rs.offer(lanes[l], base + i + l);
  }
}

// --- one position -----------------------------------------------------------------------------
// Runs fn(c0, c1) over the chunks [0, nchunks): inline (row strategy; also what a nested
// at::parallel_for does) or split across threads.
//
// Splitting pays only for a pass with enough tokens to work on: waking the pool costs tens of
// microseconds, a chunk of 4096 tokens a few. `work` is the tokens a pass really works on (a
// race under a top-k / top-p filter skips every other token a vector at a time: the kept ones);
// below kSplitMinTokens the pass runs inline. On an AMD EPYC (Zen 3, 2 threads, GNU OpenMP) a
// second thread made B = 1, V = 8000 calls 0-14% slower and sped V = 32000 ones up by 2-23%
// (medians of 31 interleaved calls); an Intel Xeon saw filtered V = 32000 calls take 1.95x
// longer on two threads, where the filtered race has almost nothing to do. The chunking, and so
// the result, is the same either way.
constexpr int64_t kSplitMinTokens = 16384;

// The tokens a race works on: the kept ones under a filter.
inline int64_t race_work(const Filter& f, int64_t V) { return f.kept >= 0 ? f.kept : V; }

template <typename F>
inline void for_chunks(int64_t nchunks, bool split, const F& fn, int64_t work) {
  if (!split || nchunks == 1 || work < kSplitMinTokens) {
    fn(0, nchunks);
  } else {
    at::parallel_for(0, nchunks, 1, fn);
  }
}

// Stats (and top-k/top-p candidates when keep > 0) of one logits row [V].
// floor_shift: Candidates' min_p floor (log(min_p) - 0.01), or -inf. taps: one per chunk (a
// fused kernel's, see chunk_stats; the first of each thread's range of chunks also takes the
// range's x), or none.
template <typename T, typename Tap = NoTap>
inline Stats position_stats(const T* row,  // [V]
                            int64_t V, const XMap& xm, bool need_sum, int64_t keep, bool split,
                            std::vector<float>& cand, float floor_shift = kNegInf,
                            Tap* taps = nullptr) {
  const int64_t nchunks = (V + CHUNK - 1) / CHUNK;
  std::vector<Stats> parts(nchunks);
  std::vector<Candidates> found(keep > 0 ? nchunks : 0);  // one per range, at its first chunk
  for_chunks(nchunks, split, [&](int64_t c0, int64_t c1) {
    Candidates* mine = keep > 0 ? &found[c0] : nullptr;
    if (mine) mine->reset(keep, V, floor_shift);
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t n = std::min(CHUNK, V - c * CHUNK);
      const XMap cm = xm.at(c * CHUNK);
      parts[c] = chunk_stats(row + c * CHUNK, n, cm, c * CHUNK, need_sum,
                             taps != nullptr ? taps + c : nullptr,
                             taps != nullptr ? taps + c0 : nullptr);
      if (mine) mine->add(row + c * CHUNK, n, cm, parts[c].m);
    }
  }, V);
  Stats st;
  for (const Stats& p : parts) merge_stats(st, p);
  cand.clear();
  for (Candidates& c : found) cand.insert(cand.end(), c.buf.begin(), c.buf.end());
  return st;
}

// One race over a position's chunks (per thread range, merged in range order).
// MAP: q_row reads through a reduced draft vocabulary's inverse index (chosen here, once per
// race, by position_race below).
template <RaceKind KIND, bool MAP, typename T, typename Q>
inline RaceState position_race_of(const T* row,  // [V]
                                  const QRow<Q>& q_row,  // draft probabilities, or empty
                                  int64_t draft, int64_t V, const XMap& xm, float m,
                                  const Filter& f, uint32_t stream, bool split, float scale) {
  const int64_t nchunks = (V + CHUNK - 1) / CHUNK;
  std::vector<RaceState> parts(nchunks, RaceState(KIND, f.z));  // one per range, at its start
  std::vector<char> used(nchunks, 0);
  for_chunks(nchunks, split, [&](int64_t c0, int64_t c1) {
    RaceState& rs = parts[c0];
    used[c0] = 1;
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t base = c * CHUNK;
      const int64_t n = std::min(CHUNK, V - base);
      const int64_t draft_local = draft >= base && draft < base + n ? draft - base : -1;
      chunk_race<KIND, MAP>(rs, row + base, q_row.at(base), draft_local, n, xm.at(base), base, m,
                            f, stream, scale);
    }
  }, race_work(f, V));
  RaceState best(KIND, f.z);
  for (int64_t c = 0; c < nchunks; ++c) {
    if (used[c]) best.merge(parts[c]);
  }
  return best;
}

template <RaceKind KIND, typename T, typename Q>
inline RaceState position_race(const T* row,           // [V]
                               const QRow<Q>& q_row,  // draft probabilities, or empty
                               int64_t draft, int64_t V, const XMap& xm, float m,
                               const Filter& f, uint32_t stream, bool split,
                               float scale = 1.0f) {
  if constexpr (KIND == RaceKind::kResidual) {
    if (q_row && q_row.inv != nullptr) {
      return position_race_of<KIND, true>(row, q_row, draft, V, xm, m, f, stream, split, scale);
    }
  }
  return position_race_of<KIND, false>(row, q_row, draft, V, xm, m, f, stream, split, scale);
}

// The extra token of a position: at a rejection the residual race over max(0, scale p - q) (when
// the residual has mass), else (or at the bonus position) the plain race over p.
template <typename T, typename Q>
inline int64_t extra_token(const T* row, const QRow<Q>& q_row, int64_t draft, bool rejected,
                           int64_t V,
                           const XMap& xm, float m, const Filter& f, uint32_t stream, bool split,
                           float scale = 1.0f) {
  if (rejected) {
    const RaceState r = position_race<RaceKind::kResidual>(row, q_row, draft, V, xm, m, f,
                                                           stream, split, scale);
    if (r.s > 0.0f) return r.index;
  }
  return position_race<RaceKind::kPlain, T, Q>(row, QRow<Q>{}, -1, V, xm, m, f, stream, split)
      .index;
}

// Entropy of the filtered distribution of one position: with d = x - m and e = exp(d) over the
// kept tokens, p = e / z and H = -sum p log p = log z - sum(e d) / z (tokens with e = 0 add 0).
template <typename T>
inline float position_entropy(const T* row,  // [V]
                              int64_t V, const XMap& xm, float m, const Filter& f) {
  const Vec shift(safe_max(m)), kappa(f.kappa), zero(0.0f);
  Vec acc(0.0f);
  for (int64_t i = 0; i < V; i += W) {
    const Vec xv = load_logits(row, i, V, xm);
    const Vec d = xv - shift;
    const Vec e = d.exp();
    acc = acc + Vec::blendv(zero, e * d, (xv >= kappa) & (e > zero));
  }
  alignas(64) float lanes[W];
  acc.store(lanes);
  double s = 0.0;
  for (int64_t l = 0; l < W; ++l) s += lanes[l];
  return std::log(f.z) - static_cast<float>(s) / f.z;
}

// Row first + j (j >= 0) of a flattened [rows, V] tensor, clamped into it (bad offsets never read
// out of bounds). Tested as `first > last - j` before the sum is formed: a garbage row start near
// INT64_MAX would wrap it.
inline int64_t clamp_row(int64_t first, int64_t j, int64_t rows) {
  const int64_t last = std::max<int64_t>(rows - 1, 0);
  if (first > last - j) return last;
  return std::max<int64_t>(first + j, 0);
}

// Sum over the vocabulary of max(0, scale p(x) - q(x)) (p the filtered target probabilities of
// one position, q [V] the draft's): block verification's residual mass R_i (scale = p_i). Chunk
// sums are added in chunk order, so the result does not depend on the strategy.
template <bool MAP, typename T, typename Q>
inline float residual_mass_of(const T* row,           // [V]
                              const QRow<Q>& q_row,  // the draft probabilities
                              int64_t V, const XMap& xm, float m, const Filter& f, float scale,
                              bool split) {
  const int64_t nchunks = (V + CHUNK - 1) / CHUNK;
  std::vector<float> parts(nchunks, 0.0f);
  const Vec shift(safe_max(m)), kappa(f.kappa), z(f.z), zero(0.0f), weight(scale);
  for_chunks(nchunks, split, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t base = c * CHUNK;
      const int64_t n = std::min(CHUNK, V - base);
      const XMap cm = xm.at(base);
      const QRow<Q> qs = q_row.at(base);
      Vec acc(0.0f);
      for (int64_t i = 0; i < n; i += W) {
        const Vec xv = load_logits(row + base, i, n, cm);
        const Vec p = Vec::blendv(zero, (xv - shift).exp() / z, xv >= kappa);
        const Vec qv = load_q<MAP>(qs, i, n);
        acc = acc + at::vec::maximum(weight * p - qv, zero);
      }
      alignas(64) float lanes[W];
      acc.store(lanes);
      float sum = 0.0f;
      for (int64_t l = 0; l < W; ++l) sum += lanes[l];
      parts[c] = sum;
    }
  }, V);
  float total = 0.0f;
  for (float v : parts) total += v;
  return total;
}

// residual_mass_of, the dense or the mapped (reduced draft vocabulary) read chosen once.
template <typename T, typename Q>
inline float residual_mass(const T* row, const QRow<Q>& q_row, int64_t V, const XMap& xm,
                           float m, const Filter& f, float scale, bool split) {
  return q_row.inv != nullptr ? residual_mass_of<true>(row, q_row, V, xm, m, f, scale, split)
                              : residual_mass_of<false>(row, q_row, V, xm, m, f, scale, split);
}

// The inputs of one row b: where its positions' logits, draft probabilities and bitmask words
// live, and its sampling controls.
template <typename T, typename Q>
struct RowInputs {
  const VerifyArgs& a;
  int64_t b, K, V, kb;
  const int64_t* drafts;  // [K]
  float temp;
  bool greedy;
  uint32_t key;
  int64_t top_k, keep;
  float top_p, min_p, floor_shift;
  bool topk_on, topp_on, split;
  const EditIndex* edits;  // the row's edited ids, or nullptr

  RowInputs(const VerifyArgs& args, int64_t row, bool split_chunks, const EditIndex* row_edits)
      : a(args), b(row), K(args.num_draft), V(args.vocab), split(split_chunks), edits(row_edits) {
    drafts = a.draft_tokens + b * K;
    kb = std::min(std::max<int64_t>(a.num_draft_tokens[b], 0), K);
    temp = a.greedy_only ? 1.0f : a.temperature[b];
    greedy = a.greedy_only || temp == 0.0f;
    if (temp == 0.0f || a.log_input) temp = 1.0f;
    key = greedy ? 0u : row_key(a.seeds[b]);
    top_k = (!greedy && a.top_k != nullptr) ? a.top_k[b] : 0;
    top_p = (!greedy && a.top_p != nullptr) ? a.top_p[b] : 1.0f;
    topk_on = top_k > 0 && top_k < V;
    topp_on = top_p < 1.0f;
    min_p = (!greedy && a.min_p != nullptr && a.min_p[b] > 0.0f) ? a.min_p[b] : 0.0f;
    // min_p alone collects every x above its floor (top-p alone: every x)
    keep = topk_on ? top_k : (topp_on || min_p > 0.0f ? V : 0);
    floor_shift = min_p > 0.0f && !topp_on ? std::log(std::min(min_p, 1.0f)) - 0.01f : kNegInf;
  }

  template <typename Tap = NoTap>
  Stats stats(const T* row, const XMap& xm, bool need_sum, std::vector<float>& cand,
              Tap* taps = nullptr) const {
    return position_stats(row, V, xm, need_sum, keep, split, cand, floor_shift, taps);
  }
  Filter filter(std::vector<float>& cand, const Stats& st) const {
    return thresholds(cand, st, topk_on, top_k, topp_on, top_p, min_p);
  }

  // The logits row of position j (flat layout: row logits_row_start[b] + j, clamped); the
  // bitmask shares the logits' row layout.
  int64_t flat_row(int64_t j) const { return clamp_row(a.logits_row_start[b], j, a.logits_rows); }
  const T* logits_row(int64_t j) const {
    const T* logits = static_cast<const T*>(a.logits);
    if (a.logits_row_start != nullptr) return logits + flat_row(j) * a.logits_stride_k;
    return logits + b * a.logits_stride_b + j * a.logits_stride_k;
  }
  XMap xmap(int64_t j) const {
    XMap xm{temp, a.log_input, nullptr};
    if (a.token_bitmask != nullptr) {
      xm.mask = a.token_bitmask + (a.logits_row_start != nullptr
                                       ? flat_row(j) * a.mask_stride_k
                                       : b * a.mask_stride_b + j * a.mask_stride_k);
    }
    if (edits != nullptr) {  // edit_vals[b, j], in both layouts
      xm.edited = edits->bits.data();
      xm.first = edits->first.data();
      xm.vals = a.edit_vals + (b * (K + 1) + j) * a.num_edits;
    }
    return xm;
  }
  // The draft probabilities of position j ([V], or [V_draft] read through draft_vocab_inv), or
  // none.
  QRow<Q> probs_row(int64_t j) const {
    const Q* probs = static_cast<const Q*>(a.draft_probs);
    if (probs == nullptr) return {};
    const Q* row = a.probs_row_start != nullptr
                       ? probs + clamp_row(a.probs_row_start[b], j, a.probs_rows) *
                                     a.probs_stride_k
                       : probs + b * a.probs_stride_b + j * a.probs_stride_k;
    return {row, a.draft_vocab_inv, a.draft_vocab};
  }

  // The filtered target probability p_j(x) of token x (clamped into [0, V)): the accept test's
  // arithmetic; 0 for an x outside the vocabulary.
  float prob(const T* row, const XMap& xm, int64_t x, const Stats& st, const Filter& f) const {
    if (x < 0 || x >= V) return 0.0f;
    const float lx = logit_at(row, x, xm);
    alignas(64) float e[W];
    (Vec(lx) - Vec(safe_max(st.m))).exp().store(e);
    return lx >= f.kappa ? e[0] / f.z : 0.0f;
  }
};

// What a verification pass shows a kernel fused with it (verify_logprobs_cpu_kernel.h): the
// statistics pass of every position it walks (stats(), which may tap it, see chunk_stats) and
// the row's decision. The plain kernels pass NoHook: the plain pass, and calls that compile to
// nothing.
struct NoHook {
  // position j's statistics (r.stats(row, xm, need_sum, cand)), which a hook may tap
  template <typename R, typename T>
  Stats stats(const R& r, int64_t, const T* row, const XMap& xm, bool need_sum,
              std::vector<float>& cand) {
    return r.stats(row, xm, need_sum, cand);
  }
  template <typename R>
  void decided(const R&, const int64_t*, int64_t) {}
};

// Token verification (and greedy rows, and typical acceptance): positions walked in order, the
// walk stops at the first rejection. Returns the number of accepted drafts; `extra` gets the
// recovered (or bonus) token.
template <typename T, typename Q, typename Hook>
int64_t verify_row_token(const RowInputs<T, Q>& r, int64_t& extra, Hook& hook) {
  const VerifyArgs& a = r.a;
  const bool typical = a.mode == kChainTypical;
  std::vector<float> cand;
  int64_t j = 0;
  for (;;) {
    const T* row = r.logits_row(j);
    const XMap xm = r.xmap(j);
    const Stats st = hook.stats(r, j, row, xm, !r.greedy, cand);
    const int64_t draft = j < r.kb ? r.drafts[j] : -1;
    bool accepted = j < r.kb && draft == st.a;
    if (r.greedy) {
      if (accepted) {
        ++j;
        continue;
      }
      extra = st.a;
      return j;
    }
    const Filter f = r.filter(cand, st);
    const QRow<Q> q_row = j < r.kb && !typical ? r.probs_row(j) : QRow<Q>{};
    if (j < r.kb) {  // the accept test
      const bool in_vocab = draft >= 0 && draft < r.V;
      const int64_t d = std::min(std::max<int64_t>(draft, 0), r.V - 1);
      const float p = r.prob(row, xm, d, st, f);
      if (typical) {  // p(x) > min(threshold, alpha * exp(-H))
        const float h = position_entropy(row, r.V, xm, st.m, f);
        const float bound = std::min(a.posterior_threshold, a.posterior_alpha * std::exp(-h));
        accepted = p > bound && in_vocab;
      } else {  // u * q(x) < p(x)
        const float q = q_row ? q_row.value(d) : 1.0f;
        const float u = uniform(stream_key(r.key, j, PURPOSE_ACCEPT), 0);
        accepted = (u * q < p) && q > 0.0f && in_vocab;
      }
    }
    if (accepted) {
      ++j;
      continue;
    }
    // Typical acceptance samples the extra token from p itself (the plain race).
    const bool rejected = j < r.kb && !typical;
    const int64_t one_hot = rejected && draft >= 0 && draft < r.V ? draft : -1;
    extra = extra_token(row, q_row, one_hot, rejected, r.V, xm, st.m, f,
                        stream_key(r.key, j, PURPOSE_SAMPLE), r.split);
    return j;
  }
}

// Block verification (specdec_kernels/reference/verify_block.py, whose notation this follows:
// gamma = k_b, weights p_i, thresholds h_i, stop tau), in three stages:
//  1. walk positions i = 0 .. gamma - 1: the statistics and filter of P_i, P_i(X_{i+1}) and
//     Q_i(X_{i+1}), the threshold h_i (i >= 1; R_i by a pass over the q row, or p_i (1 -
//     P_i(X_{i+1})) for one-hot drafts) and the next weight p_{i+1}; a weight of 0 ends the walk
//     (every later h is 0, so later rows are never read); h_gamma = p_gamma;
//  2. tau = max{i : eta_i < h_i} (the token method's accept uniforms), 0 when none fires;
//  3. the recovered token by the race over max(0, p_tau P_tau - Q_tau) at tau < gamma (one-hot:
//     max(0, P_tau - Q_tau), the token method's residual), else the bonus token from P_gamma.
template <typename T, typename Q, typename Hook>
int64_t verify_row_block(const RowInputs<T, Q>& r, int64_t& extra, Hook& hook) {
  const int64_t kb = r.kb;
  std::vector<float> cand;
  std::vector<Stats> stats;     // the positions walked
  std::vector<Filter> filters;  // their filters
  std::vector<float> weights;   // p_0 .. of the positions walked
  std::vector<float> h(kb, 0.0f);  // h_1 .. h_gamma at 0-based index i - 1
  float weight = 1.0f;  // p_i
  for (int64_t i = 0; i < kb && weight > 0.0f; ++i) {
    const T* row = r.logits_row(i);
    const XMap xm = r.xmap(i);
    const Stats st = hook.stats(r, i, row, xm, true, cand);
    const Filter f = r.filter(cand, st);
    stats.push_back(st);
    filters.push_back(f);
    weights.push_back(weight);
    const int64_t x = r.drafts[i];
    const bool in_vocab = x >= 0 && x < r.V;
    const QRow<Q> q_row = r.probs_row(i);
    const float p_x = r.prob(row, xm, x, st, f);  // P_i(X_{i+1}), 0 out of vocabulary
    const float q_x = !in_vocab ? 0.0f : (q_row ? q_row.value(x) : 1.0f);
    if (i >= 1) {  // h_i = R_i / (R_i + 1 - p_i), 1 when the denominator is 0
      const float mass = q_row
                             ? residual_mass(row, q_row, r.V, xm, st.m, f, weight, r.split)
                             : weight * (1.0f - p_x);
      const float denom = mass + (1.0f - weight);
      h[i - 1] = denom > 0.0f ? mass / denom : 1.0f;
    }
    // p_{i+1} = min(p_i P_i(X_{i+1}), Q_i(X_{i+1})) / Q_i(X_{i+1}), 0 when Q_i(X_{i+1}) = 0
    weight = q_x > 0.0f ? std::min(weight * p_x, q_x) / q_x : 0.0f;
  }
  // h_gamma = p_gamma (when the walk ended early, p_gamma = 0 = weight)
  if (kb > 0) h[kb - 1] = weight;

  int64_t tau = 0;
  for (int64_t i = kb; i >= 1; --i) {
    if (uniform(stream_key(r.key, i - 1, PURPOSE_ACCEPT), 0) < h[i - 1]) {
      tau = i;
      break;
    }
  }

  const uint32_t stream = stream_key(r.key, tau, PURPOSE_SAMPLE);
  const T* row = r.logits_row(tau);
  const XMap xm = r.xmap(tau);
  if (tau < kb) {  // walked in stage 1: h_tau > 0 needs p_tau > 0
    const QRow<Q> q_row = r.probs_row(tau);
    const int64_t x = r.drafts[tau];
    const int64_t one_hot = x >= 0 && x < r.V ? x : -1;
    const float scale = q_row ? weights[tau] : 1.0f;
    extra = extra_token(row, q_row, one_hot, true, r.V, xm, stats[tau].m, filters[tau], stream,
                        r.split, scale);
  } else {  // the bonus token from P_gamma
    const Stats st = hook.stats(r, tau, row, xm, true, cand);
    const Filter f = r.filter(cand, st);
    extra = extra_token<T, Q>(row, QRow<Q>{}, -1, false, r.V, xm, st.m, f, stream, r.split);
  }
  return tau;
}

// --- one row ----------------------------------------------------------------------------------
template <typename T, typename Q, typename Hook>
void verify_row(const VerifyArgs& a, int64_t b, bool split, Hook& hook) {
  const RowEdits edits(a.edit_ids != nullptr ? a.edit_ids + b * a.num_edits : nullptr,
                       a.num_edits, a.vocab);
  const RowInputs<T, Q> r(a, b, split, edits.index);
  int64_t extra = 0;
  const int64_t j = !r.greedy && a.mode == kChainBlock ? verify_row_block(r, extra, hook)
                                                       : verify_row_token(r, extra, hook);
  int64_t* out = a.tokens + b * (r.K + 1);
  for (int64_t i = 0; i <= r.K; ++i) out[i] = i < j ? r.drafts[i] : (i == j ? extra : -1);
  a.num_accepted[b] = j;
  hook.decided(r, out, j);
}

// Every row of a call, one Hook per thread range (make_hook() makes one); `split`: rows in
// turn, each position's chunks across threads, else rows across threads.
template <typename T, typename Q, typename MakeHook>
void run_with(const VerifyArgs& a, const MakeHook& make_hook) {
  const bool split = a.batch < at::get_num_threads();
  if (split) {
    auto hook = make_hook();
    for (int64_t b = 0; b < a.batch; ++b) verify_row<T, Q>(a, b, true, hook);
  } else {
    at::parallel_for(0, a.batch, 1, [&](int64_t b0, int64_t b1) {
      auto hook = make_hook();
      for (int64_t b = b0; b < b1; ++b) verify_row<T, Q>(a, b, false, hook);
    });
  }
}

template <typename T, typename Q>
void run(const VerifyArgs& a) {
  run_with<T, Q>(a, [] { return NoHook{}; });
}

}  // namespace
}  // namespace verify_cpu
}  // namespace specdec
