"""Triton kernels, one module per op: the ``@triton.jit`` kernel(s) and their launcher.

Import them directly (``from specdec_kernels.ops import verify_sampling``); importing one imports
triton, so :mod:`specdec_kernels.verification` does it lazily, on the first ``backend="triton"``
call. On CPU tensors they run in Triton's interpreter (see :mod:`specdec_kernels._dispatch`).
"""
