"""A tensor-parallel :class:`sk.models.CausalLM` and its adapter for the decoding loop.

Megatron-style splits (Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053): each rank holds
the attention heads ``shard_range(n_head)`` (the column-parallel rows of ``c_attn``, the
row-parallel columns of ``c_proj``) and the MLP's ``shard_range(n_inner)`` hidden units; one
``SUM`` all-reduce of ``[B, T, C]`` after each attention and each MLP. The LM head is
vocabulary-parallel: each rank computes the logits of its ``shard_range(vocab_size)`` columns,
which the vocabulary-parallel verification ops take as they are. Embeddings and layer norms are
replicated. Each rank's KV cache holds its own heads. Inference only (no autograd through the
collectives).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from specdec_kernels.decoding.adapters import CausalLMAdapter
from specdec_kernels.distributed import verification
from specdec_kernels.models.causal_lm import CausalLM, kv_cache_for


def shard_range(n: int, world_size: int, rank: int) -> tuple[int, int]:
    """``[start, end)`` of rank ``rank``'s share of ``n`` items: contiguous, in rank order, the
    first ``n % world_size`` ranks one item more.

    >>> [shard_range(37, 3, r) for r in range(3)]
    [(0, 13), (13, 25), (25, 37)]
    """
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    layer = layer.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


class _RowParallelOut(nn.Module):
    """``sum_r(x_r @ W_r^T)`` over the group, then the (replicated) bias."""

    def __init__(self, linear: nn.Linear, cols: slice, group):
        super().__init__()
        self.proj = _linear(linear.weight[:, cols], None)
        self.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
        return y + self.bias


class ParallelAttention(nn.Module):
    """The heads ``[h0, h1)`` of an ``Attention``; reads and writes a cache of those heads."""

    def __init__(self, attn, heads: tuple[int, int], group):
        super().__init__()
        h0, h1 = heads
        d, c = attn.head_dim, attn.n_head * attn.head_dim
        self.n_head, self.head_dim, self.layer = h1 - h0, d, attn.layer
        rows = torch.cat(
            [torch.arange(part * c + h0 * d, part * c + h1 * d) for part in range(3)]
        )  # the q, k and v rows of these heads
        self.c_attn = _linear(attn.c_attn.weight[rows], attn.c_attn.bias[rows])
        self.c_proj = _RowParallelOut(attn.c_proj, slice(h0 * d, h1 * d), group)

    def forward(self, x, cache=None, mask=None, kv_len=None, validate=True):
        # x: [B, T, C]; mask: [B, 1, T, L] bool (True = attend) when a cache is given
        B, T, _ = x.shape
        width = self.n_head * self.head_dim
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            cache.write(self.layer, k, v, validate=validate)
            keys = cache.key(self.layer)[:, :, :kv_len]  # [B, H_r, L, D]
            values = cache.value(self.layer)[:, :, :kv_len]
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, width))


class ParallelMLP(nn.Module):
    """The hidden units ``[i0, i1)`` of an ``MLP``."""

    def __init__(self, mlp, units: tuple[int, int], group):
        super().__init__()
        cols = slice(*units)
        self.c_fc = _linear(mlp.c_fc.weight[cols], mlp.c_fc.bias[cols])
        self.c_proj = _RowParallelOut(mlp.c_proj, cols, group)
        self.act = mlp.act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class ParallelBlock(nn.Module):
    """GPT-2's pre-norm block with a parallel attention and MLP."""

    def __init__(self, block, heads, units, group):
        super().__init__()
        self.ln_1, self.ln_2 = _copy_norm(block.ln_1), _copy_norm(block.ln_2)
        self.attn = ParallelAttention(block.attn, heads, group)
        self.mlp = ParallelMLP(block.mlp, units, group)

    def forward(self, x, cache=None, mask=None, kv_len=None, validate=True):
        x = x + self.attn(self.ln_1(x), cache, mask, kv_len, validate)
        return x + self.mlp(self.ln_2(x))


def _copy_norm(norm: nn.LayerNorm) -> nn.LayerNorm:
    new = nn.LayerNorm(norm.normalized_shape, eps=norm.eps).to(norm.weight)
    new.load_state_dict(norm.state_dict())
    return new


class TensorParallelCausalLM(nn.Module):
    """A :class:`sk.models.CausalLM` split over the ranks of a process group.

    Build it on every rank with :meth:`from_single` from the same single-device model (or the
    same weights). ``forward`` returns this rank's logit columns ``[..., V_r]`` (global columns
    ``vocab_start .. vocab_end - 1``); ``vocab_size`` is the global size. Every rank must call
    it with the same inputs, in the same order.

    Examples
    --------
    >>> import os, torch, torch.distributed as dist, specdec_kernels as sk
    >>> os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(sk.distributed.free_port()))
    >>> dist.init_process_group("gloo", rank=0, world_size=1)
    >>> lm = sk.models.CausalLM(sk.models.CausalLMConfig(vocab_size=11, n_positions=16,
    ...                                                  n_embd=8, n_layer=1, n_head=2))
    >>> tp = sk.distributed.TensorParallelCausalLM.from_single(lm)
    >>> ids = torch.tensor([[1, 2, 3]])
    >>> torch.allclose(tp(ids), lm(ids), atol=1e-6)
    True
    >>> dist.destroy_process_group()
    """

    hidden_states = CausalLM.hidden_states
    _hidden_states = CausalLM._hidden_states
    _on_own_threads = CausalLM._on_own_threads  # no num_threads: the process's count
    forward = CausalLM.forward

    def _one_op_pass(self, cache) -> bool:
        return False  # its layers are split over the ranks: the Python ops and their all-reduces

    def _kernels_on(self, warn: bool = True) -> bool:
        return False  # the row-invariant kernels neither: CausalLM.forward asks every pass

    def __init__(self, model: CausalLM, group=None):
        super().__init__()
        c = self.config = model.config
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        if c.n_head < self.world_size:
            raise ValueError(
                f"cannot split n_head={c.n_head} attention heads over {self.world_size} ranks"
            )
        heads = shard_range(c.n_head, self.world_size, self.rank)
        units = shard_range(c.n_inner or 4 * c.n_embd, self.world_size, self.rank)
        self.vocab_start, self.vocab_end = shard_range(c.vocab_size, self.world_size, self.rank)
        self.n_head = heads[1] - heads[0]
        t = model.transformer
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding.from_pretrained(t.wte.weight.detach().clone()),
                wpe=nn.Embedding.from_pretrained(t.wpe.weight.detach().clone()),
                h=nn.ModuleList(ParallelBlock(b, heads, units, group) for b in t.h),
                ln_f=_copy_norm(t.ln_f),
            )
        )
        self.lm_head = _linear(model.lm_head.weight[self.vocab_start : self.vocab_end], None)
        self.requires_grad_(False)
        self.train(model.training)

    @classmethod
    def from_single(cls, model: CausalLM, group=None) -> TensorParallelCausalLM:
        """This rank's part of ``model`` (every rank passes the same model, or the same weights).

        Raises ``ValueError`` when the group has more ranks than the model has heads.
        """
        return cls(model, group)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.config.n_positions

    def new_cache(self, batch_size: int, max_seq_len: int | None = None):
        """An empty, zero-filled ``sk.KVCache`` of this rank's heads."""
        return kv_cache_for(self.config, self.n_head, batch_size, max_seq_len, self.lm_head.weight)

    def decoding_adapter(self) -> TensorParallelAdapter:
        """The model adapter of the decoding loop (:mod:`specdec_kernels.decoding`)."""
        return TensorParallelAdapter(self)


class TensorParallelAdapter(CausalLMAdapter):
    """:class:`CausalLMAdapter` for a :class:`TensorParallelCausalLM`: ``extend`` returns this
    rank's logit columns and ``verify_ops`` verifies them with the vocabulary-parallel ops
    (the draft's full ``[B, K, V]`` probabilities are sliced to this rank's columns)."""

    def __init__(self, model: TensorParallelCausalLM):
        super().__init__(model)
        self.vocab_size = model.vocab_size
        shard = dict(vocab_start=model.vocab_start, vocab_size=model.vocab_size, group=model.group)
        start, end = model.vocab_start, model.vocab_end

        def sampling(logits, drafts, draft_probs=None, **kwargs):
            q = None if draft_probs is None else draft_probs[..., start:end]
            return verification.verify_sampling(logits, drafts, q, **shard, **kwargs)

        self.verify_ops = (functools.partial(verification.verify_greedy, **shard), sampling)

    def shared_seed(self) -> int:
        """A random seed drawn on the group's first rank and broadcast: the draft samples and
        verification draws of every rank must agree."""
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64, device=self.device)
        src = 0 if self.model.group is None else dist.get_global_rank(self.model.group, 0)
        dist.broadcast(seed, src=src, group=self.model.group)
        return int(seed)
