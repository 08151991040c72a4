"""Prefix-match count kernel: the Triton side of :func:`specdec_kernels.accept_reject`."""

import torch
import triton
import triton.language as tl

from specdec_kernels.ops._common import launch


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _accept_reject_kernel(
    draft_ptr, stride_d,  # [B, K] draft token ids
    verifier_ptr, stride_v,  # [B, K] verifier token ids
    out_ptr,  # [B] int64 out: common-prefix lengths
    K, BLOCK_K: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    first_mismatch = tl.full([], K, tl.int32)
    for start in range(0, K, BLOCK_K):
        idx = start + offs
        mask = idx < K
        d = tl.load(draft_ptr + b * stride_d + idx, mask=mask, other=0).to(tl.int64)
        v = tl.load(verifier_ptr + b * stride_v + idx, mask=mask, other=0).to(tl.int64)
        here = tl.min(tl.where(mask & (d != v), idx, K), axis=0)
        first_mismatch = tl.minimum(first_mismatch, here)
    tl.store(out_ptr + b, first_mismatch.to(tl.int64))
# fmt: on


def accept_reject(draft_tokens: torch.Tensor, verifier_tokens: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` integer tensors (last stride 1) -> ``[B]`` int64 common-prefix lengths."""
    batch, k = draft_tokens.shape
    out = torch.empty((batch,), dtype=torch.int64, device=draft_tokens.device)
    if batch == 0:
        return out
    block_k = min(1024, triton.next_power_of_2(max(k, 1)))
    launch(
        _accept_reject_kernel,
        (batch,),
        draft_tokens,
        draft_tokens.stride(0),
        verifier_tokens,
        verifier_tokens.stride(0),
        out,
        k,
        BLOCK_K=block_k,
    )
    return out
