"""specdec_kernels: fused kernels for speculative decoding.

Public contract: the documentation (docs/index.md and its pages). Every name below is part of it.
"""

import os as _os
import sys as _sys

import torch as _torch

# Triton fixes interpreter mode when it is first imported. Without CUDA the interpreter is the only
# way its kernels run, so switch it on here, before anything imports triton.
if (
    "triton" not in _sys.modules
    and "TRITON_INTERPRET" not in _os.environ
    and not _torch.cuda.is_available()
):
    _os.environ["TRITON_INTERPRET"] = "1"

from specdec_kernels import (  # noqa: E402
    compat,
    distributed,
    grammar,
    models,
)
from specdec_kernels._version import __version__  # noqa: E402,F401
from specdec_kernels.generation import (  # noqa: E402
    GenerationOutput,
    GenerationStats,
    SpeculativeGenerator,
    autoregressive_generate,
)
from specdec_kernels.kv_cache import KVCache, PagedKVCache, extension_available  # noqa: E402
from specdec_kernels.models import build, output_size  # noqa: E402
from specdec_kernels.tree_verification import (  # noqa: E402
    TreeVerification,
    tree_attention_mask,
    tree_depths,
    verify_tree_greedy,
    verify_tree_sampling,
)
from specdec_kernels.verification import (  # noqa: E402
    Verification,
    accept_reject,
    verify_greedy,
    verify_sampling,
    verify_typical,
)

__all__ = [
    "GenerationOutput",
    "GenerationStats",
    "SpeculativeGenerator",
    "autoregressive_generate",
    "build",
    "distributed",
    "grammar",
    "models",
    "output_size",
    "Verification",
    "accept_reject",
    "verify_greedy",
    "verify_sampling",
    "verify_typical",
    "compat",
    "TreeVerification",
    "verify_tree_greedy",
    "verify_tree_sampling",
    "tree_attention_mask",
    "tree_depths",
    "KVCache",
    "PagedKVCache",
    "extension_available",
]
