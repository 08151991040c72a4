"""Triton launches per public call: a launch counter that works on a CPU, and the budget table.

At batch 1-8 a verification step costs launches more than bytes (a few microseconds each on a
current GPU, more outside a CUDA graph), so the number of kernel launches of one public call is a
property worth pinning. :func:`count_launches` counts them on any machine: it wraps the launch
path of Triton's JIT functions, the compiled one on a GPU and the interpreted one under
``TRITON_INTERPRET=1``, so the count on a CPU is the count a GPU would see for the same shapes.

``specdec bench ops --launches`` prints :func:`launch_table`.
"""

from __future__ import annotations

import collections
import contextlib

import torch

# Launches per public call allowed at every batch size (tests/test_launch_budget.py pins them).
BUDGET = {
    "verify_greedy": 2,
    "verify_sampling": 3,
    # +1: the split strategy's cutoff launch (a sample of each position's row, <= 1/16 of it),
    # which lets the statistics pass gather the filters' candidates instead of 9-18 search
    # passes over every row.
    "verify_sampling top-k+top-p": 5,
    "accept_reject": 1,
    # the row strategy: 1 (the walk); the split strategy (small batches): the chain's split
    # statistics launches over every node first (greedy: 1; top-k+top-p: cutoff, statistics,
    # thresholds), then the walk, and for sampling the stop node's race over its chunks and the
    # merge of the chunks' winners
    "verify_tree_greedy": 2,
    "verify_tree_sampling top-k+top-p": 6,
}


@contextlib.contextmanager
def count_launches():
    """Count Triton kernel launches inside the ``with`` block, by kernel name.

    Yields a :class:`collections.Counter` that fills as kernels launch.

    Examples
    --------
    >>> import torch, specdec_kernels as sk
    >>> with count_launches() as launches:
    ...     _ = sk.accept_reject(torch.tensor([[1, 2]]), torch.tensor([[1, 3]]), backend="triton")
    >>> sum(launches.values())
    1
    """
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # older triton: the interpreter launches through JITFunction
        pass
    counts: collections.Counter = collections.Counter()
    originals = {cls: cls.run for cls in classes}

    def counting(original):
        def run(self, *args, **kwargs):
            if not kwargs.get("warmup", False):
                counts[getattr(self, "__name__", None) or self.fn.__name__] += 1
            return original(self, *args, **kwargs)

        return run

    try:
        for cls, original in originals.items():
            cls.run = counting(original)
        yield counts
    finally:
        for cls, original in originals.items():
            cls.run = original


def _calls(b: int, k: int, v: int, device):
    """The public calls of the budget table, on random inputs of shape ``[b, k+1, v]``."""
    import specdec_kernels as sk

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b, k + 1, v, generator=g).to(device)
    drafts = torch.randint(0, v, (b, k), generator=g).to(device)
    q = torch.softmax(torch.randn(b, k, v, generator=g), -1).to(device)
    kw = dict(backend="triton", validate=False)
    # a tree of the same number of verified positions: two children per node, breadth first
    parents = torch.tensor([-1] + [(i - 1) // 2 for i in range(1, k + 1)]).expand(b, k + 1)
    tree_tokens = torch.cat([torch.full((b, 1), -1, device=drafts.device), drafts], dim=1)
    parents = parents.contiguous().to(device)
    tree_q = torch.softmax(torch.randn(b, k + 1, v, generator=g), -1).to(device)
    tree_kw = dict(kw, max_depth=k)  # the static width N = K + 1: no depth read, no sync
    return {
        "verify_greedy": lambda: sk.verify_greedy(logits, drafts, **kw),
        "verify_sampling": lambda: sk.verify_sampling(logits, drafts, q, seed=1, **kw),
        "verify_sampling top-k+top-p": lambda: sk.verify_sampling(
            logits, drafts, q, top_k=5, top_p=0.9, seed=1, **kw
        ),
        "accept_reject": lambda: sk.accept_reject(drafts, drafts, backend="triton"),
        "verify_tree_greedy": lambda: sk.verify_tree_greedy(
            logits, tree_tokens, parents, **tree_kw
        ),
        "verify_tree_sampling top-k+top-p": lambda: sk.verify_tree_sampling(
            logits,
            tree_tokens,
            parents,
            tree_q,
            draft_mode="independent",
            top_k=5,
            top_p=0.9,
            seed=1,
            **tree_kw,
        ),
    }


def _strategy(op: str, b: int, device) -> str:
    from specdec_kernels.ops.verify_sampling import pick_strategy

    if op == "accept_reject":
        return "-"
    if op.startswith("verify_tree"):
        return "row"  # one program per row walks its tree
    return pick_strategy(b, device)


def launch_table(batch_sizes=(1, 8, 64, 128), k: int = 4, v: int = 1000, device=None):
    """Rows ``{op, batch, strategy, launches, budget}`` for every op and batch size."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = []
    for b in batch_sizes:
        for op, call in _calls(b, k, v, device).items():
            with count_launches() as launches:
                call()
            rows.append(
                {
                    "op": op,
                    "batch": b,
                    "K": k,
                    "V": v,
                    "strategy": _strategy(op, b, device),
                    "launches": sum(launches.values()),
                    "kernels": dict(launches),
                    "budget": BUDGET[op],
                }
            )
    return rows


def markdown(rows) -> str:
    """The table as Markdown (one line per op and batch size)."""
    lines = ["| call | B | strategy | launches | budget |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| `{r['op']}` | {r['batch']} | {r['strategy']} | {r['launches']} | {r['budget']} |"
        )
    return "\n".join(lines)
