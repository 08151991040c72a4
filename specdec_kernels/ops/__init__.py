"""Triton kernels, one module per op: the ``@triton.jit`` kernel(s) and their launcher.

Load them through :func:`specdec_kernels._dispatch.kernel_module`, which also serves CPU tensors
through Triton's interpreter.
"""
