"""Drop-in replacements for the verification calls of FlashInfer, vLLM and SGLang.

Each function keeps its upstream signature, dtypes, output layout and in-place semantics and
runs on this package's kernels; each docstring names the upstream version it follows and every
deliberate difference. Switching over is a one-line import change, e.g.
``from specdec_kernels.compat.flashinfer import chain_speculative_sampling``.
"""

from specdec_kernels.compat import flashinfer, sglang, vllm

__all__ = ["flashinfer", "sglang", "vllm"]
