"""``python -m specdec_kernels demo``: the same as the ``specdec`` command."""

import sys

from specdec_kernels.cli import main

sys.exit(main())
