"""Tuning the decoding loop to a machine: the rows' acceptance (:mod:`.acceptance`), what a step
costs and yields and the ``K`` that finishes a batch soonest (:mod:`.costs`), and timing a pair
once for those costs (:mod:`.measure`, remembered between processes by :mod:`._timing`).
"""

from specdec_kernels.tuning._timing import cache_path
from specdec_kernels.tuning.acceptance import (
    PRIOR_SPREAD_WEIGHT,
    PRIOR_WEIGHT,
    STOP_OPTIMISM,
    AcceptanceTracker,
    expected_accepts,
)
from specdec_kernels.tuning.costs import (
    DRAFT_MARGIN,
    FINISH_QUANTILES,
    PRIOR_MARGIN,
    STOP_MARGIN,
    PassCosts,
    expected_tokens,
    pick_k,
    pick_k_host,
    tokens_per_step,
)
from specdec_kernels.tuning.measure import measure_pass_costs

__all__ = [
    "AcceptanceTracker",
    "DRAFT_MARGIN",
    "FINISH_QUANTILES",
    "PRIOR_MARGIN",
    "PRIOR_SPREAD_WEIGHT",
    "PRIOR_WEIGHT",
    "PassCosts",
    "STOP_MARGIN",
    "STOP_OPTIMISM",
    "cache_path",
    "expected_accepts",
    "expected_tokens",
    "measure_pass_costs",
    "pick_k",
    "pick_k_host",
    "tokens_per_step",
]
