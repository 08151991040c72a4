"""What each rank runs in tests/test_distributed.py (spawned processes import this module).

Every function takes ``(rank, world_size, ...)``, runs many cases inside one process group and
returns plain data (lists, dicts) that the parent test asserts on; nothing here asserts, so a
failing case is reported with its name instead of killing the group.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

import specdec_kernels as sk
from specdec_kernels.distributed import shard_range
from specdec_kernels.reference import rng

from helpers import make_draft_probs, make_inputs

# --- communication counter ---------------------------------------------------------------------


@contextlib.contextmanager
def traffic():
    """Count the collectives called inside the block and the bytes each rank contributes."""
    log = []
    saved = {name: getattr(dist, name) for name in ("all_reduce", "broadcast", "all_gather")}

    def all_reduce(t, *args, **kwargs):
        log.append(("all_reduce", t.numel() * t.element_size()))
        return saved["all_reduce"](t, *args, **kwargs)

    def broadcast(t, *args, **kwargs):
        log.append(("broadcast", t.numel() * t.element_size()))
        return saved["broadcast"](t, *args, **kwargs)

    def all_gather(out, t, *args, **kwargs):
        log.append(("all_gather", t.numel() * t.element_size()))
        return saved["all_gather"](out, t, *args, **kwargs)

    dist.all_reduce, dist.broadcast, dist.all_gather = all_reduce, broadcast, all_gather
    try:
        yield log
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


# --- verification cases ----------------------------------------------------------------------


def _bounds(v, world, rank, uneven):
    """This rank's ``[start, end)``: even-ish shards, or deliberately lopsided ones."""
    if not uneven:
        return shard_range(v, world, rank)
    cuts = [0] + [max(1, (v * (i * i + 1)) // (world * world + 2)) for i in range(1, world)] + [v]
    cuts = sorted(set(cuts))
    assert len(cuts) == world + 1, cuts
    return cuts[rank], cuts[rank + 1]


def _tie_logits(b, k, v, start_tie):
    """Logits whose max is tied at many ids, in different shards: the first must win."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(b, k + 1, v, generator=g)
    logits[..., start_tie::7] = 4.0  # every 7th id from start_tie ties for the max
    logits[..., : v // 3 : 5] = 3.0  # and a tie group inside the top-k set
    return logits


def _cases(full):
    """(name, full inputs, keyword arguments) of every compared call; ``full=False`` keeps the
    lopsided float32 shards only."""
    out = []
    temps = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.5, 2.0])
    for v in (37, 1000):
        for uneven in (False, True) if full else (True,):
            for dtype in (torch.float32, torch.bfloat16) if full else (torch.float32,):
                logits, drafts, nd = make_inputs(6, 4, v, dtype=dtype, ragged=True, scale=3.0)
                q, qdrafts = make_draft_probs(6, 4, v)
                base = f"V={v} uneven={uneven} {str(dtype)[6:]}"
                out.append(
                    (
                        f"greedy {base}",
                        "greedy",
                        logits,
                        drafts,
                        None,
                        uneven,
                        dict(num_draft_tokens=nd),
                    )
                )
                for top_k, top_p in (
                    (None, None),
                    (5, None),
                    (None, 0.8),
                    (20, 0.9),
                    (300, 0.95),  # above MAX_CANDIDATES: the searches (or off for V = 37)
                    (
                        torch.tensor([0, 3, 50, 1, 7, 40]),
                        torch.tensor([1.0, 0.5, 0.9, 0.3, 0.99, 1.0]),
                    ),
                ):
                    for with_q in (False, True):
                        d = qdrafts if with_q else drafts
                        out.append(
                            (
                                f"sampling {base} q={with_q} top_k={top_k} top_p={top_p}",
                                "sampling",
                                logits,
                                d,
                                q if with_q else None,
                                uneven,
                                dict(
                                    temperature=temps,
                                    top_k=top_k,
                                    top_p=top_p,
                                    num_draft_tokens=nd,
                                    seed=torch.arange(6) * 7919 + 3,
                                ),
                            )
                        )
    ties = _tie_logits(4, 3, 200, 11)
    tie_drafts = torch.tensor([[11, 0, 5], [18, 11, 2], [0, 0, 0], [11, 11, 11]])
    out.append(("greedy ties across shards", "greedy", ties, tie_drafts, None, True, {}))
    for top_k, top_p in ((None, None), (4, None), (30, 0.7), (260, None)):
        out.append(
            (
                f"sampling ties top_k={top_k} top_p={top_p}",
                "sampling",
                ties,
                tie_drafts,
                None,
                True,
                dict(temperature=0.8, top_k=top_k, top_p=top_p, seed=11),
            )
        )
    logits, drafts, _ = make_inputs(3, 0, 50)  # K = 0: only the bonus token
    out.append(("greedy K=0", "greedy", logits, drafts, None, False, {}))
    out.append(("sampling K=0", "sampling", logits, drafts, None, False, dict(seed=1)))
    masked, mdrafts, _ = make_inputs(3, 2, 60, scale=2.0)
    masked[:, :, :30] = float("-inf")  # whole first shard(s) masked: still a valid row
    out.append(("greedy masked shard", "greedy", masked, mdrafts.clamp(30, 59), None, False, {}))
    out.append(
        (
            "sampling masked shard",
            "sampling",
            masked,
            mdrafts.clamp(30, 59),
            None,
            False,
            dict(temperature=torch.tensor([1.0, 0.0, 0.5]), seed=4, top_k=3),
        )
    )
    out.append(
        ("sampling all greedy", "sampling", masked, mdrafts, None, False, dict(temperature=0.0))
    )
    # [B] controls whose values would allow a cheaper plan: the forms decide, for both settings
    for name, kwargs in (
        ("all greedy [B]", dict(temperature=torch.zeros(3), seed=2)),
        (
            "one top_k [B], top_p ones(B)",
            dict(top_k=torch.full((3,), 4), top_p=torch.ones(3), seed=2),
        ),
    ):
        out.append((f"sampling {name}", "sampling", masked, mdrafts, None, False, kwargs))
    return out


def _distributed(kind, logits, drafts, q, start, end, v, kwargs, validate):
    shard = logits[..., start:end]
    if kind == "greedy":
        return sk.distributed.verify_greedy(
            shard, drafts, vocab_start=start, vocab_size=v, validate=validate, **kwargs
        )
    qs = None if q is None else q[..., start:end]
    return sk.distributed.verify_sampling(
        shard, drafts, qs, vocab_start=start, vocab_size=v, validate=validate, **kwargs
    )


def verify_cases(rank, world, full=True):
    """Every op and filter combination against the single-device reference, and the bytes each
    call moved. Returns ``(mismatches, records)``."""
    mismatches, records = [], []
    for name, kind, logits, drafts, q, uneven, kwargs in _cases(full):
        v = logits.shape[-1]
        start, end = _bounds(v, world, rank, uneven)
        if kind == "greedy":
            expected = sk.verify_greedy(logits, drafts, backend="reference", **kwargs)
        else:
            expected = sk.verify_sampling(logits, drafts, q, backend="reference", **kwargs)
        with traffic() as checked_log:  # the agreement round (all_gather_object) is not counted
            got = _distributed(kind, logits, drafts, q, start, end, v, kwargs, validate=True)
        with traffic() as log:
            fast = _distributed(kind, logits, drafts, q, start, end, v, kwargs, validate=False)
        for label, result in (("validate", got), ("fast", fast)):
            for field, a, e in zip(result._fields[:3], result, expected):
                if not torch.equal(a, e):
                    rows = (a != e).reshape(a.shape[0], -1).any(-1).nonzero()[:, 0].tolist()
                    mismatches.append(
                        f"{name} [{label}] {field}: rows {rows}: {a.tolist()} != {e.tolist()}"
                    )
        b, k = drafts.shape
        t = kwargs.get("temperature", 1.0)
        records.append(
            dict(
                name=name,
                kind=kind,
                B=b,
                K=k,
                V=v,
                with_q=q is not None,
                greedy=kind == "greedy" or (isinstance(t, float) and t == 0),
                top_k=kwargs.get("top_k") is not None,
                scalar_top_k=kwargs["top_k"] if isinstance(kwargs.get("top_k"), int) else None,
                top_p=kwargs.get("top_p") is not None,
                log=log,
                checked_log=checked_log,
            )
        )
    return mismatches, records


# --- bad arguments ---------------------------------------------------------------------------


def _bad_cases(rank, world):
    """(name, call) pairs; each call is wrong on at least one rank."""
    v = 40
    logits, drafts, _ = make_inputs(2, 3, v)
    start, end = shard_range(v, world, rank)
    shard = logits[..., start:end]
    last = rank == world - 1
    q, qdrafts = make_draft_probs(2, 3, v)

    def greedy(**over):
        kw = dict(logits_shard=shard, draft_tokens=drafts, vocab_start=start, vocab_size=v)
        kw.update(over)
        return lambda: sk.distributed.verify_greedy(
            kw.pop("logits_shard"), kw.pop("draft_tokens"), **kw
        )

    def sampling(**over):
        kw = dict(logits_shard=shard, draft_tokens=drafts, vocab_start=start, vocab_size=v, seed=3)
        kw.update(over)
        return lambda: sk.distributed.verify_sampling(
            kw.pop("logits_shard"), kw.pop("draft_tokens"), **kw
        )

    nan = shard.clone()
    if last:
        nan[1, 2, 0] = float("nan")
    all_masked = logits.clone()
    all_masked[0, 1] = float("-inf")
    bad_q = q[..., start:end].clone()
    if rank == 0:
        bad_q[0, 0] *= 0.5
    other = drafts.clone()
    if last:
        other[0, 0] = (other[0, 0] + 1) % v
    return [
        ("overlapping shards", greedy(vocab_start=max(0, start - 1) if last else start)),
        ("a gap between shards", greedy(logits_shard=shard[..., :-1] if last else shard)),
        ("vocab_size differs", greedy(vocab_size=v + 1 if last else v)),
        ("shard past vocab_size", greedy(vocab_size=end - 1 if last else v)),
        ("draft_tokens differ", greedy(draft_tokens=other)),
        ("seeds differ", sampling(seed=4 if last else 3)),
        ("temperature differs", sampling(temperature=0.5 if last else 1.0)),
        ("batch differs", greedy(logits_shard=shard[:1] if last else shard)),
        ("NaN in one shard", greedy(logits_shard=nan)),
        ("row masked on every rank", greedy(logits_shard=all_masked[..., start:end])),
        ("draft id >= vocab_size", greedy(draft_tokens=torch.full_like(drafts, v))),
        ("draft_probs do not sum to 1", sampling(draft_probs_shard=bad_q, draft_tokens=qdrafts)),
        ("top_p out of range", sampling(top_p=1.5)),
        ("negative vocab_start", greedy(vocab_start=-1 if rank == 0 else start)),
    ]


def bad_arguments(rank, world):
    """Run every bad call with ``validate=True``; returns ``{name: (error type, message)}``.
    A rank that raised nothing returns ``None`` for the case."""
    outcome = {}
    for name, call in _bad_cases(rank, world):
        try:
            call()
            outcome[name] = None
        except (TypeError, ValueError) as exc:
            outcome[name] = (type(exc).__name__, str(exc))
    # the group still works afterwards: a good call on every rank
    v = 40
    logits, drafts, _ = make_inputs(2, 3, v)
    start, end = shard_range(v, world, rank)
    got = sk.distributed.verify_greedy(
        logits[..., start:end], drafts, vocab_start=start, vocab_size=v
    )
    ok = torch.equal(got.tokens, sk.verify_greedy(logits, drafts, backend="reference").tokens)
    return outcome, ok


# --- equivalent argument forms ----------------------------------------------------------------

CASE_TIMEOUT = 10  # seconds per collective of one case's own group: a hang fails that case fast


def _equivalent_forms(b, v):
    """(name, keyword arguments of rank 0, of the other ranks): the same values in two forms."""
    k5, seeds = torch.full((b,), 5), rng.seeds_for_batch(b, torch.device("cpu"), 11)
    return [
        ("temperature 0.0 / zeros(B)", dict(temperature=0.0), dict(temperature=torch.zeros(b))),
        ("temperature 0.0 / 0-d 0", dict(temperature=0.0), dict(temperature=torch.tensor(0.0))),
        ("temperature 0.7 / [B]", dict(temperature=0.7), dict(temperature=torch.full((b,), 0.7))),
        ("top_k 5 / full(B, 5)", dict(top_k=5), dict(top_k=k5)),
        ("top_k 5 / full(B, 5), top_p", dict(top_k=5, top_p=0.9), dict(top_k=k5, top_p=0.9)),
        ("top_k None / 0", dict(top_k=None), dict(top_k=0)),
        ("top_k None / zeros(B)", dict(top_k=None), dict(top_k=torch.zeros(b, dtype=torch.int64))),
        ("top_k None / V", dict(top_k=None), dict(top_k=v)),
        ("top_k None / full(B, V + 3), q", dict(top_k=None), dict(top_k=torch.full((b,), v + 3))),
        ("top_p 0.9 / [B]", dict(top_p=0.9), dict(top_p=torch.full((b,), 0.9))),
        ("top_p None / 1.0", dict(top_p=None), dict(top_p=1.0)),
        ("top_p None / ones(B)", dict(top_p=None), dict(top_p=torch.ones(b))),
        ("seed 11 / its [B] seeds", dict(seed=11), dict(seed=seeds)),
        (
            "all at once",
            dict(temperature=0.8, top_k=7, top_p=None, seed=11),
            dict(
                temperature=torch.full((b,), 0.8),
                top_k=torch.full((b,), 7),
                top_p=torch.ones(b),
                seed=seeds,
            ),
        ),  # fmt: skip
    ]


def _case_group():
    import datetime

    return dist.new_group(timeout=datetime.timedelta(seconds=CASE_TIMEOUT))


def equivalent_forms(rank, world):
    """Each case on its own group with a short timeout, three calls (``validate=True``) with
    rank 0's form on rank 0 and the other form elsewhere. Returns ``{name: (outcome, equal to
    the single-device reference with rank 0's form)}``; outcome ``None`` or the error."""
    b, v = 3, 50
    logits = torch.randn(3, 4, v, generator=torch.Generator().manual_seed(2)) * 2
    q, drafts = make_draft_probs(b, 3, v)
    start, end = shard_range(v, world, rank)
    out = {}
    for name, first, other in _equivalent_forms(b, v):
        kwargs = dict(seed=11) | (first if rank == 0 else other)
        probs = q if ", q" in name else None
        expected = sk.verify_sampling(
            logits, drafts, probs, backend="reference", **(dict(seed=11) | first)
        )
        group, outcome, same = _case_group(), None, True
        try:
            for _ in range(3):
                got = sk.distributed.verify_sampling(
                    logits[..., start:end],
                    drafts,
                    None if probs is None else probs[..., start:end],
                    vocab_start=start,
                    vocab_size=v,
                    group=group,
                    **kwargs,
                )
                same &= all(torch.equal(a, e) for a, e in zip(got[:3], expected[:3]))
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"[:300]
        out[name] = (outcome, same)
    return out


def _injected_failure(*args, **kwargs):
    raise RuntimeError("injected failure of the local checks")


def local_failures(rank, world):
    """Local-phase errors of types other than ``ValueError`` on the last rank only, each on its
    own group with a short timeout: ``{name: (type, message)}`` per rank (``None``: no error),
    and whether the group still works afterwards."""
    v = 40
    logits, drafts, _ = make_inputs(2, 3, v)
    q, _ = make_draft_probs(2, 3, v, drafts=drafts)
    start, end = shard_range(v, world, rank)
    last = rank == world - 1
    qs = q[..., start:end]
    cases = [
        ("top_k past int64 on one rank", dict(top_k=2**70 if last else 5)),
        ("temperature past float on one rank", dict(temperature=10**400 if last else 1)),
        ("draft_probs_shard None on one rank", dict(draft_probs_shard=None if last else qs)),
        ("an unexpected error on one rank", dict()),
    ]  # fmt: skip
    outcome = {}
    checks = sk.distributed._checks
    saved = checks.local_value_checks
    for name, over in cases:
        if name.startswith("an unexpected") and last:
            checks.local_value_checks = _injected_failure
        kw = dict(vocab_start=start, vocab_size=v, seed=3, group=_case_group()) | over
        try:
            sk.distributed.verify_sampling(logits[..., start:end], drafts, **kw)
            outcome[name] = None
        except Exception as exc:
            outcome[name] = (type(exc).__name__, str(exc))
        finally:
            checks.local_value_checks = saved
    got = sk.distributed.verify_greedy(
        logits[..., start:end], drafts, vocab_start=start, vocab_size=v, group=_case_group()
    )
    ok = torch.equal(got.tokens, sk.verify_greedy(logits, drafts, backend="reference").tokens)
    return outcome, ok


# --- the tensor-parallel target --------------------------------------------------------------


def _tiny_models():
    torch.manual_seed(0)
    cfg = sk.models.CausalLMConfig
    target = sk.models.CausalLM(
        cfg(
            vocab_size=37, n_positions=64, n_embd=12, n_layer=2, n_head=3, tie_word_embeddings=False
        )
    )
    draft = sk.models.CausalLM(cfg(vocab_size=37, n_positions=64, n_embd=8, n_layer=1, n_head=2))
    # sharper distributions than the random init, so greedy has no near-ties
    with torch.no_grad():
        target.lm_head.weight.mul_(40)
        draft.lm_head.weight.mul_(20)
    return target.double().eval(), draft.double().eval()


def generation(rank, world):
    """Greedy (and seeded sampling) generation with the tensor-parallel target against the
    single-process model; returns ``{what: (single, tensor-parallel)}`` plus logits errors."""
    target, draft = _tiny_models()
    tp = sk.distributed.TensorParallelCausalLM.from_single(target)
    prompts = [[1, 2, 3, 4, 5], [7], [3, 3, 9, 20, 1, 0, 36], [5, 6]]
    ids = torch.tensor([prompts[2]])
    err = (tp(ids) - target(ids)[..., tp.vocab_start : tp.vocab_end]).abs().max().item()
    out = {"logits_max_abs_error": err, "shard": (tp.vocab_start, tp.vocab_end, tp.n_head)}
    for name, kw in (
        ("greedy K=3", dict(temperature=0.0)),
        ("greedy K=3 eos", dict(temperature=0.0, eos_token_id=4)),
        ("sampling K=3 seed", dict(temperature=0.9, top_k=10, top_p=0.95, seed=7)),
    ):
        single = sk.SpeculativeGenerator(target, draft, 3).generate(prompts, 16, **kw)
        parallel = sk.SpeculativeGenerator(tp, draft, 3).generate(prompts, 16, **kw)
        out[name] = (single.sequences, parallel.sequences)
    single = sk.autoregressive_generate(target, prompts, 10)
    parallel = sk.autoregressive_generate(tp, prompts, 10)
    out["autoregressive greedy"] = (single.sequences, parallel.sequences)
    try:
        one_head = sk.models.CausalLM(sk.models.CausalLMConfig(vocab_size=37, n_embd=4, n_head=1))
        sk.distributed.TensorParallelCausalLM.from_single(one_head)
        out["too few heads"] = None
    except ValueError as exc:
        out["too few heads"] = str(exc)
    unseeded = sk.SpeculativeGenerator(tp, draft, 2).generate(prompts, 8, temperature=1.0)
    out["unseeded sampling"] = unseeded.sequences  # must agree across ranks
    return out


def everything(rank, world, full=True):
    """All of the above in one process group (spawning groups is the slow part)."""
    cases = verify_cases(rank, world, full)
    return dict(verify=cases, bad=bad_arguments(rank, world), generation=generation(rank, world))


def fail_on_rank_one(rank, world):
    if rank == 1:
        raise ValueError("rank one fails on purpose")
    return rank


def hang_on_rank_one(rank, world):
    if rank == 1:
        import time

        time.sleep(600)
    dist.barrier()  # rank 0 waits here for rank 1
    return rank
