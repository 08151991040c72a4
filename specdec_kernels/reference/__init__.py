"""Pure-PyTorch reference implementations: the specification of every op, the CPU fallback, and
the oracle of the tests and the baseline of the benchmarks. One module per op, named like the
Triton module in :mod:`specdec_kernels.ops` that implements the same op."""
