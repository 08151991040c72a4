"""Former home of the decoding loop's tuning; its names live in :mod:`specdec_kernels.tuning`
(kept for the docs' and users' ``specdec_kernels.adaptive.PassCosts``; new code imports
``specdec_kernels.tuning``)."""

from specdec_kernels.tuning import *  # noqa: F401,F403
from specdec_kernels.tuning import __all__  # noqa: F401
