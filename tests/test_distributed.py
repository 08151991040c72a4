"""Vocabulary-parallel verification and the tensor-parallel target, on real gloo process groups.

Two groups are spawned per run (world sizes 2 and 3, on 127.0.0.1, one thread per rank); each
runs every case in :mod:`dist_workers` and returns plain data that the tests below assert on.
Every spawn has a deadline (``run_parallel(timeout=...)`` and the group's collective timeout),
so a hang fails the test instead of blocking CI.
"""

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.distributed import run_parallel, shard_range
from specdec_kernels.distributed.verify import MAX_CANDIDATES, NUM_PIVOTS, SEARCH_ROUNDS

import dist_workers

TIMEOUT = 240  # seconds per spawned group, generous for a loaded 2-core CI machine


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def group_results(request):
    world = request.param
    return world, run_parallel(dist_workers.everything, world, world == 2, timeout=TIMEOUT)


def test_every_rank_matches_single_device(group_results):
    """Greedy, sampling with and without draft probs, top-k, top-p, both, per-row filters,
    temperature-0 rows, ragged drafts, K = 0, ties across shards, masked shards, uneven
    shards, float32 and bfloat16: token for token the reference on the gathered tensors."""
    world, results = group_results
    for rank, res in enumerate(results):
        mismatches, records = res["verify"]
        assert len(records) >= (97 if world == 2 else 30)
        assert not mismatches, f"rank {rank} of {world}:\n" + "\n".join(mismatches[:5])


def _expected_traffic(r):
    """The collectives of one ``validate=False`` call: ``(op, bytes per rank)`` in order."""
    n = r["B"] * (r["K"] + 1)  # verified positions
    rounds = [("all_reduce", 8 * n)]  # packed (max, argmax) keys
    if r["greedy"]:
        return rounds
    k = r["scalar_top_k"]
    top_k_on = r["top_k"] and (k is None or k < r["V"])  # a scalar k >= V keeps everything
    if top_k_on and k is not None and k <= MAX_CANDIDATES:
        rounds += [("all_gather", 4 * n * k)]  # every rank's k largest values
        if r["top_p"]:
            rounds += [("all_reduce", 4 * n)]  # the kept top-k mass
    else:
        if top_k_on:
            rounds += [("all_reduce", 8 * n * NUM_PIVOTS)] * SEARCH_ROUNDS  # int64 counts
        if r["top_p"]:
            rounds += [("all_reduce", 4 * n * (NUM_PIVOTS + 1))]  # float32 masses, + kept mass
            rounds += [("all_reduce", 4 * n * NUM_PIVOTS)] * (SEARCH_ROUNDS - 1)
    draft_numbers = r["B"] * r["K"] * (2 if r["with_q"] else 1)  # p(x_j) [and q(x_j)]
    rounds += [("all_reduce", 4 * (n + draft_numbers))]  # with the kept mass Z
    rounds += [("all_reduce", 16 * r["B"])]  # the race winners
    return rounds


def test_communication_is_bounded_by_formula(group_results):
    """Bytes each rank sends per call, counted by wrapping the collectives: exactly the
    formula in B, K and the filters' rounds, and never anything of size V."""
    world, results = group_results
    _, records = results[0]["verify"]
    for r in records:
        assert r["log"] == _expected_traffic(r), r["name"]
    by_case = {}
    for r in records:
        top_k_on = r["top_k"] and (r["scalar_top_k"] or 0) < r["V"]
        key = (r["name"].replace(f"V={r['V']} ", ""), top_k_on)  # the same case at every V
        by_case.setdefault(key, {})[r["V"]] = sum(b for _, b in r["log"])
    assert sum(len(sizes) > 1 for sizes in by_case.values()) >= 10
    assert all(len(set(sizes.values())) == 1 for sizes in by_case.values())  # V = 37 and 1000
    # a gathered float32 logits tensor is 4 B (K+1) V bytes: with every filter on, the
    # V = 1000 call still moves less than gathering it would
    worst = max(sum(b for _, b in r["log"]) for r in records if r["V"] == 1000)
    b, k = 6, 4
    assert worst < 4 * b * (k + 1) * 1000 * (world - 1)


def test_validate_runs_the_same_verification_collectives(group_results):
    """validate=True adds only its agreement round (the validation: one all_gather_object, not
    counted here); the verification collectives are those of validate=False, call for call,
    also for [B] controls whose values would allow a cheaper plan (all greedy, one top_k)."""
    world, results = group_results
    for rank, res in enumerate(results):
        _, records = res["verify"]
        for r in records:
            assert r["checked_log"] == r["log"], (rank, r["name"])


def test_bad_arguments_raise_on_every_rank(group_results):
    """A wrong argument on one rank is a ValueError on every rank (nobody is left waiting), and
    the group still works afterwards."""
    world, results = group_results
    names = results[0]["bad"][0].keys()
    assert len(names) >= 12
    for name in names:
        seen = [res["bad"][0][name] for res in results]
        assert all(s is not None and s[0] == "ValueError" for s in seen), (name, seen)
        assert len({s[1] for s in seen}) == 1, (name, seen)  # the same message everywhere
    assert all(res["bad"][1] for res in results)


def test_equivalent_forms_take_the_same_collectives():
    """The same values in different forms on different ranks (a scalar or its [B] tensor, an
    off filter as None, 0/1 or a tensor, an int seed or its per-row seeds): with validate=True
    the ranks agree on the collectives and return the reference's tokens. Each case runs on its
    own group with a CASE_TIMEOUT-second collective timeout, so a hang fails only that case."""
    results = run_parallel(dist_workers.equivalent_forms, 2, timeout=TIMEOUT)
    names = results[0].keys()
    assert len(names) >= 14
    failed = {
        n: [res[n] for res in results]
        for n in names
        if any(res[n] != (None, True) for res in results)
    }
    assert not failed, failed


def test_any_local_error_raises_on_every_rank():
    """An error of the local phase that is not a ValueError (an OverflowError-prone top_k, a
    temperature past float, an injected RuntimeError), or draft probabilities on some ranks
    only, raises on every rank with the same type and message, naming the rank; the group
    still works afterwards."""
    world = 2
    results = run_parallel(dist_workers.local_failures, world, timeout=TIMEOUT)
    names = results[0][0].keys()
    assert len(names) == 4
    for name in names:
        seen = [res[0][name] for res in results]
        assert all(s is not None for s in seen), (name, seen)
        assert len(set(seen)) == 1, (name, seen)  # the same type and message everywhere
    top_k = results[0][0]["top_k past int64 on one rank"]
    assert top_k[0] == "ValueError" and "rank 1: top_k" in top_k[1] and str(2**70) in top_k[1]
    injected = results[0][0]["an unexpected error on one rank"]
    assert injected == ("RuntimeError", "rank 1: injected failure of the local checks")
    assert all(res[1] for res in results)


def test_tensor_parallel_target_matches_single_process(group_results):
    """Greedy speculative and autoregressive generation with the tensor-parallel target equal
    the single-process model's output exactly; so does seeded sampling (float64 models: no
    near-ties); unseeded sampling agrees across ranks."""
    world, results = group_results
    spans = [res["generation"]["shard"] for res in results]
    assert [s[:2] for s in spans] == [shard_range(37, world, r) for r in range(world)]
    assert sum(s[2] for s in spans) == 3  # the heads are split
    for rank, res in enumerate(results):
        gen = res["generation"]
        assert gen["logits_max_abs_error"] < 1e-12
        for what in ("greedy K=3", "greedy K=3 eos", "autoregressive greedy", "sampling K=3 seed"):
            single, parallel = gen[what]
            assert parallel == single, (rank, what)
    assert len({str(res["generation"]["unseeded sampling"]) for res in results}) == 1
    assert all("cannot split n_head=1" in res["generation"]["too few heads"] for res in results)


def test_shard_range_tiles():
    for n, world in ((37, 3), (5, 5), (100, 7), (1, 1)):
        spans = [shard_range(n, world, r) for r in range(world)]
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert max(e - s for s, e in spans) - min(e - s for s, e in spans) <= 1


def test_run_parallel_reports_failures_and_timeouts():
    with pytest.raises(RuntimeError, match="rank 1 of 2 failed"):
        run_parallel(dist_workers.fail_on_rank_one, 2, timeout=TIMEOUT)
    with pytest.raises(TimeoutError):
        run_parallel(dist_workers.hang_on_rank_one, 2, timeout=10)


def test_group_of_one_is_the_model():
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(sk.distributed.free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        lm = sk.models.CausalLM(
            sk.models.CausalLMConfig(vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2)
        )
        tp = sk.distributed.TensorParallelCausalLM.from_single(lm)
        ids = torch.tensor([[1, 2, 3]])
        torch.testing.assert_close(tp(ids), lm(ids))
    finally:
        dist.destroy_process_group()
