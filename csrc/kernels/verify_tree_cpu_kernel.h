// Fused CPU tree verification kernel (greedy and recursive rejection sampling): run_tree<T, Q>.
//
// Included once per CPU capability by verify_cpu_launchers.h right after
// verify_cpu_kernel.h, whose helpers (chunk statistics, top-k / top-p thresholds, counter RNG,
// the race's skip bound) it reuses; everything lives in the same anonymous namespace.
//
// The specification is specdec_kernels/reference/verify_tree.py (same numbers, same formulas):
// a row's walk visits node indices in order; node i is tried when its parent is the current node.
// At each node the walk reaches: the statistics of its logits row (and the filter thresholds);
// per child the accept test (u * q_c(x)) * Z < r(x); a rejected child removes its token from the
// residual ("deterministic": a list of removed tokens, Z -= r(x)) or shrinks it over the
// vocabulary (r = max(0, r - Z q_c) in a per-row buffer, Z = sum r; applied only when a next
// sibling needs it, else folded into the race, so a chain costs what the chain kernel costs).
// The walk ends with one race
// over the stop node's row: the residual when a child was rejected (and it has mass), else p.
#pragma once

#include <vector>

namespace specdec {
namespace verify_cpu {
namespace {

constexpr int32_t kModeDeterministic = 0, kModeWithoutReplacement = 2;

// The race of one chunk over explicit weights: w = weight(i, p) for the W tokens at chunk
// offset i (p the filtered target probabilities there); w <= p, so verify_cpu_kernel.h's skip
// bound (derived from p) still holds. Scores as chunk_race's residual race.
template <typename T, typename WeightFn>
inline void chunk_race_weights(RaceState& rs, const T* src,  // [n]
                               int64_t n, const XMap& xm, int64_t base, float m, const Filter& f,
                               uint32_t stream, const WeightFn& weight) {
  const Vec shift(safe_max(m)), kappa(f.kappa), z(f.z), zero(0.0f), ln2(LN2);
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
    const Vec w = weight(i, p);
    const Vec e = exponentials(u);
    Vec::blendv(zero, w / e, w > zero).store(lanes);
    for (int64_t l = 0; l < W && i + l < n; ++l) rs.offer(lanes[l], base + i + l);
  }
}

// The filtered target probability of one token (the chain's accept-test arithmetic).
template <typename T>
inline float prob_at(const T* row, int64_t token, const XMap& xm, float m, const Filter& f) {
  const float x = logit_at(row, token, xm);
  alignas(64) float e[W];
  (Vec(x) - Vec(safe_max(m))).exp().store(e);
  return x >= f.kappa ? e[0] / f.z : 0.0f;
}

// The state of a row's walk at its current node.
template <typename T, typename Q>
struct TreeWalk {
  const TreeArgs& a;
  int64_t b;
  bool split;
  float temp;
  bool greedy;
  int64_t top_k, keep;
  float top_p;
  bool topk_on, topp_on;
  std::vector<float> cand;
  std::vector<float> r;        // [V padded] residual buffer, allocated by the first shrink()
  std::vector<int64_t> rej;    // the current node's rejected children's in-vocabulary tokens
  const T* row = nullptr;      // [V] logits row of the current node
  XMap xm;                     // how it reads (temperature, the node's bitmask words)
  Stats st;
  Filter f;

  TreeWalk(const TreeArgs& args, int64_t row_index, bool split_chunks)
      : a(args), b(row_index), split(split_chunks) {
    temp = a.greedy_only ? 1.0f : a.temperature[b];
    greedy = a.greedy_only || temp == 0.0f;
    if (temp == 0.0f || a.log_input) temp = 1.0f;
    top_k = (!greedy && a.top_k != nullptr) ? a.top_k[b] : 0;
    top_p = (!greedy && a.top_p != nullptr) ? a.top_p[b] : 1.0f;
    topk_on = top_k > 0 && top_k < a.vocab;
    topp_on = top_p < 1.0f;
    keep = topk_on ? top_k : (topp_on ? a.vocab : 0);
  }

  void enter(int64_t node) {
    row = static_cast<const T*>(a.logits) + b * a.logits_stride_b + node * a.logits_stride_n;
    xm = XMap{temp, a.log_input, nullptr};
    if (a.token_bitmask != nullptr) {
      xm.mask = a.token_bitmask + b * a.mask_stride_b + node * a.mask_stride_n;
    }
    st = position_stats(row, a.vocab, xm, !greedy, keep, split, cand);
    if (!greedy) f = thresholds(cand, st, topk_on, top_k, topp_on, top_p);
    rej.clear();
  }

  bool removed(int64_t token, size_t count) const {
    return std::find(rej.begin(), rej.begin() + count, token) != rej.begin() + count;
  }
  bool removed(int64_t token) const { return removed(token, rej.size()); }

  // A rejection whose residual update r = max(0, r - z q_c) is not applied yet: applied (shrink)
  // when the next sibling needs r and Z, or folded into the final race when no sibling follows
  // (a chain's case: then the tree does the chain's work).
  struct Pending {
    bool active = false;
    const Q* q_row = nullptr;
    float z = 0.0f, denom = 1.0f;
    bool first = false;
    size_t rej_count = 0;  // the rejected tokens q_c excludes (without replacement)
  } pending;

  // W lanes at offset i of q_c (the pending child's proposal) over a span of n tokens that
  // starts at vocabulary index base (q points at the span).
  Vec proposal(int64_t base, int64_t i, int64_t n, const Q* q, float denom,
               size_t rej_count) const {
    Vec qv = load_x(q, i, n, 1.0f, 0.0f);
    if (a.mode == kModeWithoutReplacement) {
      alignas(64) float qt[W];
      qv.store(qt);
      for (int64_t l = 0; l < W; ++l) {
        if (removed(base + i + l, rej_count)) qt[l] = 0.0f;
        qt[l] = denom > 0.0f ? qt[l] / denom : 0.0f;
      }
      qv = Vec::loadu(qt);
    }
    return qv;
  }

  // Apply the pending update over the vocabulary: r = max(0, r - z q_c) (r = p before the
  // first rejection); returns the new mass sum r.
  float shrink() {
    const Pending pd = pending;
    pending.active = false;
    const int64_t V = a.vocab;
    if (r.empty()) r.resize(padded(V));  // first use in this row: every lane is written below
    const Vec shift(safe_max(st.m)), kappa(f.kappa), zf(f.z), zero(0.0f), zv(pd.z);
    Vec acc(0.0f);
    for (int64_t i = 0; i < V; i += W) {
      Vec rv;
      if (pd.first) {
        const Vec xv = load_logits(row, i, V, xm);
        rv = Vec::blendv(zero, (xv - shift).exp() / zf, xv >= kappa);
      } else {
        rv = Vec::loadu(r.data() + i);
      }
      const Vec qv = proposal(0, i, V, pd.q_row, pd.denom, pd.rej_count);
      Vec out = at::vec::maximum(rv - zv * qv, zero);
      if (i + W > V) {  // lanes past V hold 0
        alignas(64) float tail[W];
        out.store(tail);
        for (int64_t l = 0; l < W; ++l) {
          if (i + l >= V) tail[l] = 0.0f;
        }
        out = Vec::loadu(tail);
      }
      out.store(r.data() + i);
      acc = acc + out;
    }
    alignas(64) float lanes[W];
    acc.store(lanes);
    float total = 0.0f;
    for (int64_t l = 0; l < W; ++l) total += lanes[l];
    return total;
  }

  // The recovered token (residual race, when a child was rejected and the residual has mass)
  // or the bonus token (race over p) of the current node at depth `depth`.
  int64_t extra(uint32_t key, int64_t depth, bool rejected) {
    const int64_t V = a.vocab;
    const uint32_t stream = stream_key(key, depth, PURPOSE_SAMPLE);
    if (rejected) {
      const int64_t nchunks = (V + CHUNK - 1) / CHUNK;
      RaceState best(RaceKind::kResidual, f.z);
      std::vector<RaceState> parts(nchunks, RaceState(RaceKind::kResidual, f.z));
      std::vector<char> used(nchunks, 0);
      const bool det = a.mode == kModeDeterministic;
      for_chunks(nchunks, split, [&](int64_t c0, int64_t c1) {
        RaceState& rs = parts[c0];
        used[c0] = 1;
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t base = c * CHUNK;
          const int64_t n = std::min(CHUNK, V - base);
          chunk_race_weights(rs, row + base, n, xm.at(base), base, st.m, f, stream,
                             [&](int64_t i, const Vec& p) {
                               if (!det) {
                                 const Pending& pd = pending;
                                 if (!pd.active) return Vec::loadu(r.data() + base + i);
                                 // the pending update, lane for lane as shrink() computes it
                                 const Vec rv = pd.first ? p : Vec::loadu(r.data() + base + i);
                                 const Vec qv = proposal(base, i, n, pd.q_row + base,
                                                         pd.denom, pd.rej_count);
                                 return at::vec::maximum(rv - Vec(pd.z) * qv, Vec(0.0f));
                               }
                               alignas(64) float lanes[W];
                               p.store(lanes);
                               for (int64_t t : rej) {
                                 const int64_t l = t - base - i;
                                 if (l >= 0 && l < W) lanes[l] = 0.0f;
                               }
                               return Vec::loadu(lanes);
                             });
        }
      }, race_work(f, V));
      for (int64_t c = 0; c < nchunks; ++c) {
        if (used[c]) best.merge(parts[c]);
      }
      if (best.s > 0.0f) return best.index;
    }
    return position_race<RaceKind::kPlain, T, Q>(row, QRow<Q>{}, -1, V, xm, st.m, f, stream,
                                                 split)
        .index;
  }
};

template <typename T, typename Q>
void verify_tree_row(const TreeArgs& a, int64_t b, bool split) {
  const int64_t N = a.num_nodes_max, V = a.vocab;
  const int64_t* tokens = a.tree_tokens + b * N;
  const int64_t* parents = a.parents + b * N;
  const int64_t nb = std::min(std::max<int64_t>(a.num_nodes[b], 1), N);
  const Q* probs = static_cast<const Q*>(a.draft_probs);
  TreeWalk<T, Q> w(a, b, split);
  const uint32_t key = w.greedy ? 0u : row_key(a.seeds[b]);
  int64_t* out = a.tokens + b * N;
  int64_t* path = a.accepted_nodes + b * N;
  for (int64_t i = 0; i < N; ++i) out[i] = path[i] = -1;
  path[0] = 0;

  int64_t cur = 0, depth = 0, sib = 0;
  float z = 1.0f, removed_mass = 0.0f;
  w.enter(0);
  for (int64_t i = 1; i < nb; ++i) {
    if (parents[i] != cur) continue;
    const int64_t x = tokens[i];
    const bool in_vocab = x >= 0 && x < V;
    const int64_t xs = std::min(std::max<int64_t>(x, 0), V - 1);
    bool accept = in_vocab && x == w.st.a;
    float r_x = 0.0f;
    const bool x_removed = in_vocab && w.removed(x);
    const float denom = 1.0f - removed_mass;
    const Q* q_row = probs != nullptr ? probs + b * a.probs_stride_b + cur * a.probs_stride_n
                                      : nullptr;
    if (w.pending.active) z = w.shrink();  // this sibling needs r and Z
    if (!w.greedy) {
      const float p_x = prob_at(w.row, xs, w.xm, w.st.m, w.f);
      float q_x = 1.0f;
      if (a.mode == kModeDeterministic) {
        r_x = x_removed ? 0.0f : p_x;
      } else {
        r_x = sib > 0 ? w.r[xs] : p_x;
        q_x = static_cast<float>(q_row[xs]);
        if (a.mode == kModeWithoutReplacement) {
          q_x = (x_removed ? 0.0f : q_x) / denom;
          if (!(denom > 0.0f)) q_x = 0.0f;
        }
      }
      if (!in_vocab) r_x = 0.0f;
      const float u = uniform(stream_key(key, depth, PURPOSE_ACCEPT), static_cast<uint32_t>(sib));
      accept = in_vocab && r_x > 0.0f && q_x > 0.0f && (u * q_x * z < r_x);
    }
    if (accept) {
      out[depth] = x;
      ++depth;
      path[depth] = i;
      cur = i;
      sib = 0;
      z = 1.0f;
      removed_mass = 0.0f;
      w.enter(i);
      continue;
    }
    if (!w.greedy) {
      if (a.mode == kModeDeterministic) {
        z = std::max(z - r_x, 0.0f);
      } else {
        w.pending = {true, q_row, z, denom, sib == 0, w.rej.size()};
        if (a.mode == kModeWithoutReplacement && in_vocab && !x_removed) {
          removed_mass += static_cast<float>(q_row[xs]);
        }
      }
    }
    if (in_vocab) w.rej.push_back(x);
    ++sib;
  }
  const int64_t extra = w.greedy ? w.st.a : w.extra(key, depth, sib > 0);
  out[depth] = std::min(std::max<int64_t>(extra, 0), V - 1);
  a.num_accepted[b] = depth;
}

template <typename T, typename Q>
void run_tree(const TreeArgs& a) {
  const bool split = a.batch < at::get_num_threads();
  if (split) {
    for (int64_t b = 0; b < a.batch; ++b) verify_tree_row<T, Q>(a, b, true);
  } else {
    at::parallel_for(0, a.batch, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) verify_tree_row<T, Q>(a, b, false);
    });
  }
}

}  // namespace
}  // namespace verify_cpu
}  // namespace specdec
