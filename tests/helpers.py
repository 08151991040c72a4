"""Input builders shared by the verification tests."""

import torch


def make_inputs(
    b,
    k,
    v,
    dtype=torch.float32,
    device="cpu",
    accept_rate=0.7,
    ragged=False,
    strided=False,
    scale=2.0,
    seed=0,
):
    """Logits, drafts (mostly equal to the target's argmax) and num_draft_tokens."""
    g = torch.Generator().manual_seed(seed)
    if strided:  # a slice of a wider buffer: stride(0) and stride(1) are not contiguous
        big = torch.randn(b, k + 3, v + 5, generator=g) * scale
        logits = big[:, 1 : k + 2, 2 : v + 2]
    else:
        logits = torch.randn(b, k + 1, v, generator=g) * scale
    logits = logits.to(dtype)
    target = logits.float().argmax(-1)[:, :k]
    wrong = torch.randint(0, v, (b, k), generator=g)
    keep = torch.rand(b, k, generator=g) < accept_rate
    drafts = torch.where(keep, target, wrong)
    if ragged:
        nd = torch.randint(0, k + 1, (b,), generator=g)
        pos = torch.arange(k)[None, :]
        drafts = torch.where(pos < nd[:, None], drafts, torch.full_like(drafts, -1))
    else:
        nd = None
    return logits.to(device), drafts.to(device), None if nd is None else nd.to(device)


def make_draft_probs(b, k, v, drafts=None, seed=1, device="cpu", dtype=torch.float32):
    """Random draft distributions, and drafts sampled from them (or the given drafts)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2, dim=-1)
    if drafts is None:
        drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)
    return q.to(device=device, dtype=dtype), drafts.to(device)
