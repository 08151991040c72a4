#!/usr/bin/env bash
# The GPU check of issue 5, in one accelerator session (first run, one H200, 2026-12-04: 450 s
# with TREE_SECONDS=60 SERVING_SECONDS=60 BENCH_SECONDS=100; steps took build 37 s, tests 62,
# launches 5, capture 12, bench_ops 85, tree_check > 60 (cut), bench_tree 30, compat_check 12,
# serving_check 24, bench_serving 50, bench_compat 55; docs/gpu.md has what it found):
#   1. build the CUDA extension in place,
#   2. run the test suite's CUDA cases, count launches per call, capture a call in a CUDA graph,
#   3. run `specdec bench ops` on the GPU (triton.testing.do_bench, CUDA graphs where the op can
#      be captured) over the "gpu" grid, write JSON + PNG, and check the kernel targets;
#   4. tree verification: kernel vs reference on the device, graph capture, tree vs chain timings;
#   5. check the drop-in adapters and the flattened layout on the GPU and time their overhead
#      (`specdec bench compat`).
# Everything (log, JSON, PNG, summary) goes to OUTDIR. Each step has its own time limit so a
# slow step cannot eat the next one's; a failed step is logged and the script goes on.
#
# Usage: bench/gpu_check.sh OUTDIR        (from anywhere; PYTHON=... to pick the interpreter)
#        BENCH_SECONDS=150 TEST_SECONDS=120 BUILD_SECONDS=200 to change the step limits;
#        STEPS=build,extension,tests,tree_check to run only the named steps (a re-check).
set -uo pipefail

OUT="${1:?usage: bench/gpu_check.sh OUTDIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python}"
BUILD_SECONDS="${BUILD_SECONDS:-200}"
TEST_SECONDS="${TEST_SECONDS:-120}"
BENCH_SECONDS="${BENCH_SECONDS:-150}"
mkdir -p "${OUT}"
OUT="$(cd "${OUT}" && pwd)"
LOG="${OUT}/gpu_check.log"
cd "${ROOT}"
export PYTHONPATH="${ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
unset TRITON_INTERPRET  # compiled kernels on the GPU, never the interpreter

status=0
STEPS="${STEPS:-all}"
# The whole check fits one device call of under 8 minutes: every step's limit is cut to what is
# left of TOTAL_SECONDS, and a step with under 15 s left is skipped (logged). The steps run in
# order of importance: build, the ops table and its targets first.
TOTAL_SECONDS="${TOTAL_SECONDS:-450}"
step() {  # step NAME SECONDS CMD...: run with a time limit, log it, remember a failure
  local name="$1" secs="$2"; shift 2
  if [[ "${STEPS}" != all && ",${STEPS}," != *",${name},"* ]]; then
    echo "=== ${name}: not in STEPS" | tee -a "${LOG}"
    return 0
  fi
  local left=$((TOTAL_SECONDS - SECONDS))
  if (( left < 15 )); then
    echo "=== ${name}: skipped, ${left} s left of TOTAL_SECONDS=${TOTAL_SECONDS}" | tee -a "${LOG}"
    status=1
    return 0
  fi
  (( secs > left )) && secs=${left}
  echo "=== ${name} (limit ${secs} s): $*" | tee -a "${LOG}"
  local t0=$SECONDS
  timeout --kill-after=10 "${secs}" "$@" 2>&1 | tee -a "${LOG}"
  local rc=${PIPESTATUS[0]}
  echo "=== ${name}: exit ${rc} after $((SECONDS - t0)) s" | tee -a "${LOG}"
  [[ ${rc} -eq 0 ]] || status=1
  return 0
}

{
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo none)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv || true
  "${PYTHON}" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'device', torch.cuda.get_device_name(0))"
} 2>&1 | tee "${LOG}"

step build "${BUILD_SECONDS}" env MAX_JOBS="${MAX_JOBS:-16}" "${PYTHON}" setup.py build_ext --inplace
step extension "30" "${PYTHON}" -c "import specdec_kernels as sk, torch; print('extension', sk.extension_available()); assert sk.extension_available(); print(torch.ops.specdec.kv_compact_)"
# The ops table first (issue 52's figures): per case the package's kernel, the reference and its
# torch.compile, the bandwidth limits measured in the same run, and the targets against the
# baseline run of bench/results/gpu/ops.json (commit af49e27).
step bench_ops "${BENCH_SECONDS}" "${PYTHON}" -m specdec_kernels.benchmarks ops --grid gpu --device cuda \
  --ops verify_greedy,verify_sampling,accept_reject,kv_compact_ --budget 0.05 --max-seconds "$((BENCH_SECONDS - 30))" \
  --json "${OUT}/ops_gpu.json" --plot "${OUT}/ops_gpu.png"
step targets "60" "${PYTHON}" - "${OUT}/ops_gpu.json" <<'PY'
import sys
from specdec_kernels.benchmarks import ops, results
rows = results.latest_run(results.load_rows(sys.argv[1]), "ops")
print(f"run {rows[0]['run_id']} on {rows[0]['machine'].get('gpu')}, commit {rows[0]['commit']}, "
      f"copy bandwidth {rows[0].get('copy_bandwidth_gbs')} GB/s")
for line in ops.check_gpu_targets(rows, baseline=results.load_rows("bench/results/gpu/ops.json")):
    print(line)
PY
# every failure, each with its one-line error (-x once stopped at two and hid the rest)
step tests "${TEST_SECONDS}" "${PYTHON}" -m pytest tests -q -m "not slow" -k "cuda" -p no:cacheprovider \
  --tb=line -rf
# Launches per public call with the compiled kernels (the CPU CI counts them under the
# interpreter; this confirms the same figures on the device) and CUDA-graph capture of the ops.
step launches "60" "${PYTHON}" -m specdec_kernels.benchmarks ops --launches --device cuda \
  --batch 1,8,64,128,256
step capture "60" "${PYTHON}" - <<'PY'
import torch, specdec_kernels as sk
b, k, v = 8, 4, 32000
logits = torch.randn(b, k + 1, v, device="cuda")
drafts = torch.randint(0, v, (b, k), device="cuda")
q = torch.softmax(torch.randn(b, k, v, device="cuda"), -1)
seeds = torch.arange(b, device="cuda")
call = lambda: sk.verify_sampling(logits, drafts, q, top_k=50, top_p=0.9, seed=seeds,
                                  validate=False)
want = call()
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    got = call()
graph.replay()
torch.cuda.synchronize()
assert torch.equal(got.tokens, want.tokens), "graph replay differs from the eager call"
print("CUDA graph capture and replay of verify_sampling (top-k + top-p): ok")
PY
# Tree verification (issue 12): the compiled kernel against the reference on the device (every
# draft mode, filters, ragged trees), a CUDA-graph capture, then tree vs chain timings at the same
# number of verified positions (N = K + 1 = 8 and 16).
step tree_check "${TREE_SECONDS:-90}" "${PYTHON}" - <<'PY'
import torch, specdec_kernels as sk
g = torch.Generator(device="cuda").manual_seed(0)
modes = ("deterministic", "independent", "without_replacement")
for b, n, v, dt in ((1, 8, 32000, torch.bfloat16), (8, 16, 32000, torch.float32),
                    (64, 16, 128256, torch.bfloat16)):
    logits = (torch.randn(b, n, v, device="cuda", generator=g) * 3).to(dt)
    parents = torch.tensor([-1] + [(i - 1) // 3 for i in range(1, n)], device="cuda")
    parents = parents.expand(b, n).contiguous()
    top = logits.float().argmax(-1)
    tokens = top.gather(1, parents.clamp(min=0))  # first children often match
    tokens[:, 2::3] = torch.randint(0, v, (b, n), device="cuda", generator=g)[:, 2::3]
    q = torch.softmax(torch.randn(b, n, v, device="cuda", generator=g), -1)
    nn = torch.randint(1, n + 1, (b,), device="cuda", generator=g)
    seeds = torch.arange(b, device="cuda") * 7919
    for mode in modes:
        for tk, tp in ((None, None), (50, 0.9)):
            kw = dict(draft_mode=mode, top_k=tk, top_p=tp, seed=seeds, num_nodes=nn,
                      validate=False)
            want = sk.verify_tree_sampling(logits, tokens, parents, q, backend="reference", **kw)
            got = sk.verify_tree_sampling(logits, tokens, parents, q, backend="triton", **kw)
            diff = int((got.tokens != want.tokens).any(1).sum())
            print(f"tree B={b} N={n} V={v} {dt} {mode} top_k={tk} top_p={tp}: "
                  f"{diff} of {b} rows differ from the reference (rounding near-ties only)")
            assert diff <= max(1, b // 32), "the Triton tree kernel disagrees with the reference"
    want = sk.verify_tree_greedy(logits, tokens, parents, num_nodes=nn, backend="reference")
    got = sk.verify_tree_greedy(logits, tokens, parents, num_nodes=nn, backend="triton")
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.accepted_nodes,
                                                                want.accepted_nodes)
# capture needs the static depth (max_depth): without it the output width is read from the
# device (the documented sync of verify_tree_sampling)
call = lambda: sk.verify_tree_sampling(logits, tokens, parents, q, draft_mode="independent",
                                       top_k=50, top_p=0.9, seed=seeds, max_depth=n - 1,
                                       validate=False)
want = call()
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    got = call()
graph.replay()
torch.cuda.synchronize()
assert torch.equal(got.tokens, want.tokens), "graph replay differs from the eager call"
print("tree kernels match the reference on the GPU; CUDA graph capture and replay: ok")
PY
step bench_tree "${TREE_BENCH_SECONDS:-90}" "${PYTHON}" -m specdec_kernels.benchmarks ops --device cuda \
  --ops verify_tree_greedy,verify_tree_sampling --batch 1,8,64 --k 7,15 --vocab 32000,128256 \
  --dtypes bf16 --acceptance 0.5 --providers triton,chain --budget 0.05 \
  --max-seconds "$((${TREE_BENCH_SECONDS:-90} - 30))" --json "${OUT}/ops_tree_gpu.json"
# Drop-in adapters (issue 13) on the GPU: vLLM's flattened layout and probability inputs through
# the compiled Triton kernels agree with the CPU reference, then the adapter overheads.
step compat_check "90" "${PYTHON}" - <<'PY'
import torch, specdec_kernels as sk
from types import SimpleNamespace
from specdec_kernels.compat.flashinfer import chain_speculative_sampling
from specdec_kernels.compat.vllm import rejection_sample
g = torch.Generator().manual_seed(0)
b, k, v = 16, 4, 32000
logits = torch.randn(b, k + 1, v, generator=g) * 3
q = torch.softmax(torch.randn(b, k, v, generator=g) * 3, -1)
drafts = logits[:, :k].argmax(-1)
nd = torch.randint(0, k + 1, (b,), generator=g)
flat = torch.cat([logits[i, : nd[i] + 1] for i in range(b)])
flat_q = torch.cat([q[i, : nd[i]] for i in range(b)])
flat_d = torch.cat([drafts[i, : nd[i]] for i in range(b)])
seed = torch.arange(b)
want = sk.verify_sampling(logits, drafts, q, num_draft_tokens=nd, seed=seed, top_k=50,
                          backend="reference")
got = sk.verify_sampling(flat.cuda(), flat_d.cuda(), flat_q.cuda(),
                         cu_num_draft_tokens=nd.cumsum(0).cuda(), seed=seed.cuda(), top_k=50)
print("flat layout on cuda == padded reference on cpu:", torch.equal(got.tokens.cpu(), want.tokens))
p = torch.softmax(logits, -1)
fi = chain_speculative_sampling(q.cuda(), drafts.cuda(), p.cuda(), seed=seed.cuda(),
                                offset=torch.zeros_like(seed).cuda())
fc = chain_speculative_sampling(q, drafts, p, seed=seed, offset=torch.zeros_like(seed))
print("flashinfer adapter cuda == cpu:", [torch.equal(x.cpu(), y) for x, y in zip(fi, fc)])
meta = SimpleNamespace(all_greedy=True, all_random=False, temperature=None, generators={})
cu = nd.cumsum(0)
tp = torch.softmax(torch.cat([logits[i, : nd[i]] for i in range(b)]), -1)
bonus = torch.zeros(b, 1, dtype=torch.long)
vg = rejection_sample(flat_d.cuda(), nd.tolist(), k, cu.cuda(), None, tp.cuda(), bonus.cuda(), meta)
vc = rejection_sample(flat_d, nd.tolist(), k, cu, None, tp, bonus, meta)
print("vllm adapter (greedy) cuda == cpu:", torch.equal(vg.cpu(), vc))
PY
# Serving keywords (API.md section 9) with the compiled kernels: block verification, token
# bitmasks and logprobs against the reference on the device, then their cost against plain
# verification (`specdec bench ops --ops verify_serving`).
step serving_check "${SERVING_SECONDS:-90}" "${PYTHON}" - <<'PY'
import torch, specdec_kernels as sk
torch.manual_seed(0)
b, k, v = 16, 4, 128256
logits = torch.randn(b, k + 1, v, device="cuda") * 3
drafts = torch.where(torch.rand(b, k, device="cuda") < 0.6, logits[:, :k].argmax(-1),
                     torch.randint(0, v, (b, k), device="cuda"))
q = torch.softmax(torch.randn(b, k, v, device="cuda"), -1)
mask = torch.randint(-2**31, 2**31 - 1, (b, k + 1, (v + 31) // 32), dtype=torch.int32, device="cuda")
mask[..., 0] |= 1  # token 0 allowed everywhere: every position can be decided
kw = dict(temperature=0.8, top_k=50, top_p=0.95, seed=torch.arange(b, device="cuda"))
for label, extra in (("block", dict(method="block")), ("bitmask", dict(token_bitmask=mask)),
                     ("block+bitmask", dict(method="block", token_bitmask=mask)),
                     ("logprobs", dict(logprobs="processed", num_logprobs=20))):
    for probs in (None, q):
        got = sk.verify_sampling(logits, drafts, probs, backend="triton", **kw, **extra)
        want = sk.verify_sampling(logits, drafts, probs, backend="reference", **kw, **extra)
        same = (got.tokens == want.tokens).all(-1).float().mean().item()
        line = f"{label} draft_probs={probs is not None}: rows equal to the reference {same:.3f}"
        if got.logprobs is not None:
            live = got.tokens >= 0
            err = (got.logprobs - want.logprobs)[live].abs().max().item()
            ids = torch.equal(got.top_ids, want.top_ids)
            line += f", max logprob error {err:.2e}, top ids equal {ids}"
            assert err < 1e-4 and ids
        print(line)
        assert same >= 0.99, line  # near-ties in float rounding may differ, rarely
tree = sk.verify_tree_sampling(logits, torch.randint(0, v, (b, k + 1), device="cuda"),
                               torch.tensor([-1, 0, 0, 1, 1][: k + 1], device="cuda").expand(b, -1),
                               token_bitmask=mask, backend="triton", seed=0, validate=False)
torch.cuda.synchronize()
print("tree verification with a bitmask on the device: ok", tuple(tree.tokens.shape))
PY
step bench_serving "${SERVING_BENCH_SECONDS:-90}" "${PYTHON}" -m specdec_kernels.benchmarks ops \
  --device cuda --ops verify_serving --grid gpu --batch 64,1 --vocab 128256 \
  --providers triton,plain --budget 0.05 --json "${OUT}/ops_serving_gpu.json"
step bench_compat "120" "${PYTHON}" -m specdec_kernels.benchmarks compat --device cuda \
  --batch 1,8,64,256 --json "${OUT}/compat_gpu.json"
grep -E "^(PASS|MISS)|copy bandwidth" "${LOG}" > "${OUT}/targets.txt" || true
echo "gpu_check done: status ${status}; results in ${OUT}" | tee -a "${LOG}"
exit ${status}
