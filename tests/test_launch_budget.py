"""GPU readiness on a CPU: launches per public call stay within budget at every batch size, and
with ``validate=False`` no public op synchronises with the device (CUDA-graph capture safety)."""

import contextlib

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.benchmarks.launches import BUDGET, count_launches, launch_table
from specdec_kernels.ops import verify_sampling as triton_chain

from helpers import make_draft_probs, make_inputs, no_host_sync


@pytest.mark.parametrize("strategy", ["split", "row"])
def test_launches_per_call_within_budget(strategy, monkeypatch):
    """Each strategy's launches at batch 3. On a CPU the row strategy runs from 64 rows
    (``_row_strategy_min_batch``), which the interpreter takes ~70 s to run; the threshold is
    lowered to 3 here so that batch 3 takes the row strategy's path (the kernels and launches of
    a strategy do not depend on the batch size; the threshold itself is checked below)."""
    if strategy == "row":
        monkeypatch.setattr(triton_chain, "_row_strategy_min_batch", lambda device: 3)
    rows = launch_table(batch_sizes=(3,), k=3, v=37, device="cpu")
    assert {r["op"] for r in rows} == set(BUDGET)
    chains = [
        r for r in rows if r["op"] != "accept_reject" and not r["op"].startswith("verify_tree")
    ]
    assert chains and {r["strategy"] for r in chains} == {strategy}
    for r in rows:
        assert 1 <= r["launches"] <= r["budget"], r


def test_row_strategy_from_64_rows_on_cpu():
    cpu = torch.device("cpu")
    assert triton_chain.pick_strategy(63, cpu) == "split"
    assert triton_chain.pick_strategy(64, cpu) == "row"


def test_counter_counts_every_launch():
    """The counter is not vacuous: the split strategy's greedy call is exactly stats + decide."""
    logits, drafts, _ = make_inputs(2, 3, 37)
    with count_launches() as launches:
        sk.verify_greedy(logits, drafts, backend="triton")
    assert launches == {"_split_stats_kernel": 1, "_split_decide_kernel": 1}
    with count_launches() as launches:
        sk.verify_greedy(logits, drafts, backend="reference")
    assert sum(launches.values()) == 0


def _serving_calls():
    """(label, call, serving keywords): chains greedy, sampling (token and block, filters) and
    trees; each call is counted without and with its keywords."""
    b, k, v = 2, 3, 37
    logits, drafts, _ = make_inputs(b, k, v)
    q, _ = make_draft_probs(b, k, v)
    # [B, K+1, W], also the trees' [B, N, W] (N = K + 1)
    mask = torch.full((b, k + 1, (v + 31) // 32), 0x7FFF7FFF, dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0, 1]]).expand(b, k + 1).contiguous()
    tree_tokens = torch.cat([torch.full((b, 1), -1), drafts], dim=1)
    tree_q = torch.softmax(torch.randn(b, k + 1, v), -1)
    kw = dict(backend="triton", validate=False)
    filters = dict(top_k=5, top_p=0.9, seed=1, **kw)

    def greedy(**extra):
        return sk.verify_greedy(logits, drafts, **kw, **extra)

    def sampling(**extra):
        return sk.verify_sampling(logits, drafts, q, seed=1, **kw, **extra)

    def one_hot_filtered(**extra):
        return sk.verify_sampling(logits, drafts, None, **filters, **extra)

    def tree(**extra):
        return sk.verify_tree_sampling(
            logits, tree_tokens, parents, tree_q, draft_mode="independent", max_depth=k,
            **filters, **extra,
        )  # fmt: skip

    def tree_greedy(**extra):
        return sk.verify_tree_greedy(logits, tree_tokens, parents, max_depth=k, **kw, **extra)

    return [
        ("verify_greedy", greedy, dict(token_bitmask=mask)),
        ("verify_sampling", sampling, dict(token_bitmask=mask)),
        ("verify_sampling", sampling, dict(method="block")),
        ("verify_sampling", sampling, dict(method="block", token_bitmask=mask)),
        ("top-k+top-p", one_hot_filtered, dict(method="block")),
        ("top-k+top-p", one_hot_filtered, dict(token_bitmask=mask)),
        ("verify_tree_greedy", tree_greedy, dict(token_bitmask=mask)),
        ("verify_tree_sampling", tree, dict(token_bitmask=mask)),
    ]


@pytest.mark.parametrize("case", range(8))
def test_block_and_bitmask_calls_launch_as_many_kernels(case):
    """``method="block"`` and ``token_bitmask=`` change the kernels' constexprs, not the launch
    plan: the same kernels, as many times, as the call without them (small batch: split)."""
    label, call, extra = _serving_calls()[case]
    with count_launches() as want:
        call()
    with count_launches() as got:
        call(**extra)
    assert got == want, (label, sorted(extra), dict(got), dict(want))


@contextlib.contextmanager
def kernels_stubbed():
    """Launch no Triton kernel (the interpreter itself reads tensors on the host): what remains
    is the launcher's own host code, which must not synchronise."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    saved = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}
    try:
        for cls in saved:
            cls.run = lambda self, *a, **k: None
        yield
    finally:
        for cls, fn in saved.items():
            cls.run = fn


def _calls(backend):
    b, k, v = 4, 3, 50
    logits, drafts, nd = make_inputs(b, k, v, ragged=True)
    q, _ = make_draft_probs(b, k, v)
    temp = torch.tensor([0.0, 0.7, 1.0, 1.3])
    kw = dict(backend=backend, validate=False, num_draft_tokens=nd)
    parents = torch.tensor([[-1, 0, 0, 1]]).expand(b, k + 1).contiguous()
    tree_tokens = torch.cat([torch.full((b, 1), -1), drafts.clamp(min=0)], dim=1)
    tree_q = torch.softmax(torch.randn(b, k + 1, v), -1)
    return [
        lambda: sk.verify_greedy(logits, drafts, **kw),
        lambda: sk.verify_sampling(logits, drafts, q, temperature=temp, seed=torch.arange(b), **kw),
        lambda: sk.verify_sampling(
            logits, drafts, None, temperature=0.8, top_k=5, top_p=0.9, seed=3, **kw
        ),
        lambda: sk.verify_sampling(
            logits,
            drafts,
            q,
            top_k=torch.tensor([0, 3, 5, 50]),
            top_p=torch.tensor([1.0, 0.5, 0.9, 0.99]),
            **kw,
        ),
        lambda: sk.verify_sampling(
            logits, drafts, q, top_k=5, logprobs="processed", num_logprobs=3, seed=3, **kw
        ),
        lambda: sk.accept_reject(drafts, drafts, backend=backend),
        lambda: sk.verify_tree_greedy(
            logits,
            tree_tokens,
            parents,
            num_nodes=nd + 1,
            max_depth=k,
            backend=backend,
            validate=False,
        ),
        lambda: sk.verify_tree_sampling(
            logits,
            tree_tokens,
            parents,
            tree_q,
            draft_mode="without_replacement",
            temperature=temp,
            top_k=5,
            top_p=0.9,
            num_nodes=nd + 1,
            max_depth=k,
            seed=torch.arange(b),
            backend=backend,
            validate=False,
        ),
    ]


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_validate_false_never_synchronises(backend):
    for call in _calls(backend):
        stub = kernels_stubbed() if backend == "triton" else contextlib.nullcontext()
        with stub, no_host_sync():
            call()
    # and the guard really trips on a synchronising call
    with pytest.raises(AssertionError, match="host synchronisation"), no_host_sync():
        sk.verify_greedy(*make_inputs(2, 2, 9)[:2], validate=True)


@pytest.mark.parametrize("num_logprobs", [0, 5])
def test_logprobs_add_no_launch(num_logprobs):
    """``logprobs=`` (with or without the top-n) costs no launch on the Triton chain ops: the
    verification kernels score what they emit (issue 52)."""
    logits, drafts, _ = make_inputs(2, 3, 37)
    kw = dict(top_k=5, top_p=0.9, seed=1, backend="triton", validate=False)
    with count_launches() as plain:
        sk.verify_sampling(logits, drafts, **kw)
    with count_launches() as launches:
        sk.verify_sampling(logits, drafts, logprobs="processed", num_logprobs=num_logprobs, **kw)
    assert launches == plain
