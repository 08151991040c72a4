"""Vocabulary-parallel verification and a tensor-parallel target over ``torch.distributed``.

When a target is sharded with tensor parallelism its LM head produces logits split over the
vocabulary. Gathering them costs ``B * (K+1) * V`` numbers per step; the decision needs a few
numbers per verified position. :func:`verify_greedy` / :func:`verify_sampling` take each rank's
shard and return, on every rank, what the single-device ops return on the gathered logits, with
``O(B * (K+1))`` numbers per collective round (:mod:`.verify` lists the rounds).

:class:`TensorParallelCausalLM` splits a :class:`sk.models.CausalLM` over a group (heads and MLP
columns/rows, vocabulary-parallel LM head); ``sk.SpeculativeGenerator`` runs it through the one
decoding loop with the draft replicated on every rank. :func:`run_parallel` starts a local group.
"""

from specdec_kernels.distributed.launch import free_port, init_group, run_parallel
from specdec_kernels.distributed.model import (
    TensorParallelAdapter,
    TensorParallelCausalLM,
    shard_range,
)
from specdec_kernels.distributed.verification import verify_greedy, verify_sampling

__all__ = [
    "TensorParallelAdapter",
    "TensorParallelCausalLM",
    "free_port",
    "init_group",
    "run_parallel",
    "shard_range",
    "verify_greedy",
    "verify_sampling",
]
