"""Checks of the benchmark machinery itself (no timing): input construction hits the requested
acceptance, the bytes-needed model, Leviathan's formula, the target checkers and the plots.
Run with ``pytest bench/ --benchmark-disable`` (``--benchmark-only`` skips them)."""

import json

import pytest
import torch

from specdec_kernels.benchmarks import e2e, ops, plot, results

CPU = torch.device("cpu")


@pytest.mark.parametrize("variant", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("acceptance", [0.0, 0.5, 0.9])
def test_sampling_inputs_hit_the_acceptance(variant, acceptance):
    # 4096 Bernoulli(a) draws per case: |mean - a| > 0.05 has probability < 1e-10 (Hoeffding).
    case = ops.Case("verify_sampling", 1024, 4, 50, "fp32", acceptance, *variant)
    g = ops._generator(case, CPU)
    logits, drafts, q = ops._sampling_inputs(case, g)
    p = logits[:, :4].softmax(-1)
    px = p.gather(-1, drafts[..., None])[..., 0]
    if q is None:
        rate = px.mean() if not case.top_k_top_p else None
        if rate is not None:
            assert abs(float(rate) - acceptance) < 1e-3
    else:
        qx = q.gather(-1, drafts[..., None])[..., 0]
        accept = torch.clamp(px / qx, max=1.0)
        assert abs(float(accept.mean()) - acceptance) < 0.05
        assert torch.allclose(q.sum(-1), torch.ones(1024, 4), atol=1e-5)


@pytest.mark.parametrize("op", ["verify_greedy", "verify_sampling", "kv_compact_", "accept_reject"])
def test_bytes_needed_grow_with_acceptance(op):
    lo = ops.SETUP[op](ops.Case(op, 8, 4, 1000, "fp32", 0.0), CPU)
    hi = ops.SETUP[op](ops.Case(op, 8, 4, 1000, "fp32", 0.9), CPU)
    assert hi.num_accepted_mean > lo.num_accepted_mean
    if op != "accept_reject":
        assert hi.bytes_needed > lo.bytes_needed
    if op == "verify_greedy":  # acceptance 0: exactly one logits row per row is needed
        assert lo.num_accepted_mean == 0
        assert lo.bytes_needed - 8 * 1000 * 4 < 8 * 100


@pytest.mark.parametrize("op", ops.TREE_OPS)
def test_tree_rows_run_and_their_chain_matches(op):
    lo = ops.SETUP[op](ops.Case(op, 8, 7, 1000, "fp32", 0.0), CPU)
    hi = ops.SETUP[op](ops.Case(op, 8, 7, 1000, "fp32", 0.9), CPU)
    assert hi.num_accepted_mean > lo.num_accepted_mean
    assert hi.bytes_needed > lo.bytes_needed
    for name in ("native", "reference", "chain"):
        if name in hi.skipped:
            continue
        out = hi.fns[name]()
        assert out[0].shape == (8, 8), name  # [B, N] tokens (chain: [B, K+1])
    if "native" not in hi.skipped:
        assert hi.fns["native"]()[0].tolist() == hi.fns["reference"]()[0].tolist()


def test_providers_agree_on_cpu():
    case = ops.Case("verify_sampling", 2, 4, 300, "fp32", 0.5, True, False)
    bench = ops.SETUP["verify_sampling"](case, CPU)
    ref = bench.fns["reference"]()
    assert ref[0].shape == (2, 5)
    assert "hf" in bench.skipped  # batch 2: transformers' function is batch 1 only


def test_leviathan_formula():
    assert e2e.leviathan_speedup(0.0, 4, 0.0) == pytest.approx(1.0)
    assert e2e.leviathan_speedup(1.0, 4, 0.0) == pytest.approx(5.0)
    # Leviathan et al. Table/Fig. 3 style point: alpha 0.8, gamma 3, c 0.05
    assert e2e.leviathan_speedup(0.8, 3, 0.05) == pytest.approx((1 - 0.8**4) / 0.2 / 1.15)


def test_grid_order_and_sizes():
    gpu = ops.cases("gpu")
    assert gpu[0].B == 256 and gpu[0].V == 128256
    assert {c.op for c in gpu[:7]} == set(ops.OPS)
    assert len(ops.cases("smoke")) <= 16


def _fake_ops_rows():
    rows = []
    for prov, ms in (("triton", 1.0), ("torch_compile", 4.0)):
        for tk, extra in ((False, 0.0), (True, 0.2)):
            c = ops.Case("verify_sampling", 64, 4, 128256, "bf16", 0.5, False, tk)
            rows.append(
                {
                    **c.__dict__,
                    "case": c.name,
                    "provider": prov,
                    "median_ms": ms + extra,
                    "bandwidth_gbs": 4000 / (ms + extra),
                    "copy_bandwidth_gbs": 4800.0,
                }
            )
    return rows


def test_gpu_target_checker():
    rows = _fake_ops_rows()
    slow = [dict(r, median_ms=r["median_ms"] * 10, commit="old") for r in rows]
    lines = ops.check_gpu_targets(rows, baseline=slow)
    assert any("PASS 4.00x vs torch.compile" in ln for ln in lines)
    assert any("PASS 1.20x the time without" in ln for ln in lines)
    # 4000 GB/s over 4800 GB/s of copy bandwidth (no read figure recorded): 83% >= 60%
    assert any("PASS 4000 GB/s = 83% of the copy bandwidth" in ln for ln in lines)
    assert any("was 10 ms (old)" in ln for ln in lines)
    rows = [dict(r, read_bandwidth_gbs=8000.0) for r in rows]  # 50% of the read bandwidth
    lines = ops.check_gpu_targets(rows)
    assert any("MISS 4000 GB/s = 50% of the read bandwidth" in ln for ln in lines)
    b1 = [dict(r, B=1, median_ms=0.05) for r in rows if r["top_k_top_p"]]
    assert any("MISS 50.0 us at B = 1" in ln for ln in ops.check_gpu_targets(b1))


def test_cpu_target_checker():
    rows = []
    for v, native_ms, hf_ms in ((32000, 0.1, 0.4), (128256, 0.2, 3.0)):
        for prov, ms in (("native", native_ms), ("hf", hf_ms)):
            c = ops.Case("verify_sampling", 1, 4, v, "fp32", 0.5, True, False)
            rows.append(
                {
                    **c.__dict__,
                    "case": c.name,
                    "provider": prov,
                    "median_ms": ms,
                    "bandwidth_gbs": 1.0,
                }
            )
        c = ops.Case("verify_sampling", 1, 4, v, "fp32", 0.5, True, True)
        rows.append(
            {
                **c.__dict__,
                "case": c.name,
                "provider": "native",
                "median_ms": 3 * native_ms,
                "bandwidth_gbs": 1.0,
            }
        )
    c = ops.Case("verify_greedy", 64, 4, 128256, "bf16", 0.5)
    rows.append(
        {
            **c.__dict__,
            "case": c.name,
            "provider": "native",
            "median_ms": 1.0,
            "bandwidth_gbs": 6.0,
            "read_bandwidth_gbs": 10.0,
        }
    )
    lines = ops.check_cpu_targets(rows)
    assert any(ln.startswith("MISS") and "4.0x faster" in ln and "(>= 5x)" in ln for ln in lines)
    assert any(ln.startswith("PASS") and "15.0x faster" in ln and "(>= 10x)" in ln for ln in lines)
    assert sum(ln.startswith("MISS") and "3.00x the time" in ln for ln in lines) == 2
    assert any(ln.startswith("PASS") and "60% of the read bandwidth" in ln for ln in lines)


def test_plots_and_json_roundtrip(tmp_path):
    rows = [
        {
            "run_id": "x",
            "kind": "e2e",
            "date": "2026-01-01",
            "commit": "abc",
            "machine": {"cpu": "test"},
            "system": s,
            "batch_size": b,
            "num_speculative_tokens": k,
            "temperature": t,
            "tokens_per_second": 100.0,
            "speedup_vs_target_only": 1.2,
            "ideal_speedup": 1.5,
        }
        for s, k in (("specdec", 2), ("specdec", "auto"), ("hf_assisted", 2))
        for b in (1, 4)
        for t in (0.0, 1.0)
        if not (s == "hf_assisted" and b > 1)
    ]
    path = tmp_path / "e2e.json"
    results.append_rows(str(path), rows)
    results.append_rows(str(path), rows)
    assert len(json.loads(path.read_text())) == 2 * len(rows)
    plot.plot_e2e(
        results.latest_run(results.load_rows(str(path)), "e2e"), str(tmp_path / "e2e.png")
    )
    plot.plot_ops(_fake_ops_rows(), str(tmp_path / "ops.png"))
    assert (tmp_path / "e2e.png").stat().st_size > 1000
    assert (tmp_path / "ops.png").stat().st_size > 1000


def test_tree_e2e_rows_checker_and_plot(tmp_path):
    """A tiny `specdec bench e2e --trees` run: every shape's greedy output equals the target
    alone's, the tokens-per-pass fields agree, the target checker compares the 16-node dynamic
    tree with the chains, and the plot is drawn."""
    cfg = e2e.TreeE2EConfig(
        batch_sizes=(2,),
        shapes=("chain-4", "chain-15", "static-8", "dynamic-16"),
        max_new_tokens=8,
        repeats=1,
        pass_prompts=3,
    )
    rows = e2e.run_tree_e2e(cfg, log=lambda m: None)
    timed = [r for r in rows if r["batch_size"] == 2 and r["system"] != "target_only"]
    assert len(timed) == 4 and all(r["matches_target_only"] for r in timed)
    assert {r["shape"] for r in rows if r["batch_size"] == "all"} == set(cfg.shapes)
    for r in rows:
        assert r["tokens_per_pass"] == pytest.approx(r["mean_accepted"] + 1, abs=1e-3)
        assert 1 <= r["tokens_per_pass"] <= r["num_nodes"]
    lines = e2e.check_tree_targets(rows)
    assert lines and all("dynamic-16" in line for line in lines)
    assert "| dynamic-16 | 16 | 2 |" in e2e.format_tree_table(rows)
    plot.plot_trees(rows, str(tmp_path / "trees.png"))
    assert (tmp_path / "trees.png").stat().st_size > 0
