"""``python -m specdec_kernels.benchmarks ops|e2e ...`` (the same as ``specdec bench``)."""

import sys

from specdec_kernels.benchmarks.cli import main_bench

sys.exit(main_bench())
