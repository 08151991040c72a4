"""Accept-test count kernel: the Triton side of ``specdec::accept_tests_passed`` (the FlashInfer
drop-in's accepted-token counter), one launch where the PyTorch reference takes ~60 small ops."""

import torch
import triton
import triton.language as tl

from specdec_kernels.ops._common import (
    PURPOSE_ACCEPT,
    launch,
    row_key,
    stream_key,
    uniform_first,
)


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _accept_tests_kernel(
    q_ptr, stride_qb, stride_qn,  # [B, n, V] draft probabilities (last stride 1)
    p_ptr, stride_pb, stride_pn,  # [B, >= n, V] target probabilities (last stride 1)
    tok_ptr, stride_t,  # [B, n] draft tokens (int32 or int64)
    seed_ptr, after_ptr,  # [B] int64 seeds, [B] int64 accepted prefix
    out_ptr,  # [B] int64 out
    n, V, BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    key = row_key(tl.load(seed_ptr + b))
    after = tl.load(after_ptr + b)
    count = tl.zeros([], tl.int64)
    for start in range(0, n, BLOCK_N):
        i = start + tl.arange(0, BLOCK_N)
        live = (i < n) & (i > after)
        x = tl.load(tok_ptr + b * stride_t + i, mask=i < n, other=-1).to(tl.int64)
        ok = live & (x >= 0) & (x < V)
        safe = tl.where(ok, x, 0)
        q = tl.load(q_ptr + b * stride_qb + i * stride_qn + safe, mask=ok, other=0.0).to(tl.float32)
        p = tl.load(p_ptr + b * stride_pb + i * stride_pn + safe, mask=ok, other=0.0).to(tl.float32)
        u = uniform_first(stream_key(key, i, PURPOSE_ACCEPT))
        passed = ok & (q > 0) & (u * q < p)
        count += tl.sum(passed.to(tl.int64), axis=0)
    tl.store(out_ptr + b, count)
# fmt: on


def accept_tests_passed(draft_probs, draft_tokens, target_probs, seeds, after) -> torch.Tensor:
    """See :func:`specdec_kernels.reference.accept_tests.accept_tests_passed`."""
    b, n, v = draft_probs.shape
    out = torch.zeros((b,), dtype=torch.int64, device=draft_probs.device)
    if b == 0 or n == 0:
        return out
    launch(
        _accept_tests_kernel,
        (b,),
        draft_probs,
        draft_probs.stride(0),
        draft_probs.stride(1),
        target_probs,
        target_probs.stride(0),
        target_probs.stride(1),
        draft_tokens,
        draft_tokens.stride(0),
        seeds,
        after,
        out,
        n,
        v,
        BLOCK_N=min(64, triton.next_power_of_2(n)),
    )
    return out
