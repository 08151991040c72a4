"""The one speculative decoding loop under every generation entry point.

``Decoder`` runs draft -> one target pass -> verify (``sk.verify_*``, the only acceptance rule)
-> commit -> retire over a batch of rows, each with its own length, budget and seed. It talks to
models through a small adapter protocol (:class:`~specdec_kernels.decoding.adapters.CachedModel`:
append tokens and get logits, roll back, keep rows) and to drafters through one interface
(:class:`~specdec_kernels.decoding.drafters.Drafter`), so ``sk.SpeculativeGenerator``,
``autoregressive_generate`` and the ``transformers`` integration are thin wrappers::

    from specdec_kernels.decoding import Decoder, Sampling, CausalLMAdapter, ModelDrafter

    target = CausalLMAdapter(target_lm)                  # or HFAdapter(hf_model)
    drafter = ModelDrafter(CausalLMAdapter(draft_lm))    # or NgramDrafter(3), or None
    decoder = Decoder(target, drafter, num_speculative_tokens=4)
    result = decoder.run(prompts,                        # list of token-id lists, ragged
                         max_new_tokens=64,
                         sampling=Sampling(temperature=0.8, top_k=50, top_p=0.9),
                         eos_token_id=None, seed=0)
    result.sequences, result.from_draft, result.stats    # per row, prompt included

Token trees plug into the same loop through their drafter: ``TreeDrafter(CausalLMAdapter(
draft_lm), DynamicTree(num_nodes=16, top_k=4, depth=5))`` (or a ``StaticTree``) proposes a tree
per row, the target scores it in one pass, ``sk.verify_tree_*`` decides and both caches keep the
accepted path (:mod:`specdec_kernels.decoding.proposals`).

How many tokens a step drafts is a policy's (:mod:`specdec_kernels.decoding.policy`: ``FixedK``,
or ``AutoK`` for ``num_speculative_tokens="auto"``); what it learns lives in each run's state, so
one ``Decoder`` serves call after call.

Serving options (docs: serving.md) ride on :class:`Sampling`: ``verify_method="block"`` (block
verification of sampled chains), ``logprobs="raw"|"processed"`` and ``num_logprobs=n``, which
fill ``result.logprobs[b]`` (``[T_b]`` float32, one per generated token) and
``result.top_logprobs[b]`` (:class:`TopLogprobs`: ``values`` / ``ids`` ``[T_b, n]``) from the
passes that verify.
"""

from specdec_kernels.decoding.adapters import CachedModel, CausalLMAdapter, HFAdapter
from specdec_kernels.decoding.core import (
    Decoder,
    DecodeResult,
    GenerationStats,
    Sampling,
    TopLogprobs,
)
from specdec_kernels.decoding.drafters import Drafter, ModelDrafter, NgramDrafter
from specdec_kernels.decoding.policy import AutoK, FixedK
from specdec_kernels.decoding.proposals import ChainProposal, TreeProposal
from specdec_kernels.decoding.trees import DynamicTree, StaticTree, TreeDrafter

__all__ = [
    "AutoK",
    "CachedModel",
    "CausalLMAdapter",
    "ChainProposal",
    "DecodeResult",
    "Decoder",
    "Drafter",
    "DynamicTree",
    "FixedK",
    "GenerationStats",
    "HFAdapter",
    "ModelDrafter",
    "NgramDrafter",
    "Sampling",
    "StaticTree",
    "TopLogprobs",
    "TreeDrafter",
    "TreeProposal",
]
