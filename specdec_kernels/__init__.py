"""specdec_kernels: fused kernels for speculative decoding.

Public contract: ``API.md`` (shared with the project). Every name below is part of it.
"""

from specdec_kernels.verification import (
    Verification,
    accept_reject,
    verify_greedy,
    verify_sampling,
)

from specdec_kernels import models
from specdec_kernels.generation import (
    GenerationOutput,
    GenerationStats,
    SpeculativeGenerator,
    autoregressive_generate,
)
from specdec_kernels.models import build, output_size

__version__ = "0.1.0"

__all__ = [
    "GenerationOutput",
    "GenerationStats",
    "SpeculativeGenerator",
    "autoregressive_generate",
    "build",
    "models",
    "output_size",
    "Verification",
    "accept_reject",
    "verify_greedy",
    "verify_sampling",
]
