"""Models: the Edifice ``SpeculativeDecoding`` decoders (:func:`build`, :func:`output_size`) and
:class:`CausalLM`, the token-level GPT-2-layout model that generation runs."""

from specdec_kernels.models.bundled import decode, encode, load_bundled
from specdec_kernels.models.causal_lm import CausalLM, CausalLMConfig, TreeAttention
from specdec_kernels.models.decoder import DecoderConfig, DecoderOnly, build, output_size

__all__ = [
    "CausalLM",
    "CausalLMConfig",
    "DecoderConfig",
    "DecoderOnly",
    "TreeAttention",
    "build",
    "decode",
    "encode",
    "load_bundled",
    "output_size",
]

import specdec_kernels._extension  # noqa: E402,F401  (loads _C, which defines the kernels)
from specdec_kernels.models._kernels import register_fakes as _register_fakes  # noqa: E402

_register_fakes()
