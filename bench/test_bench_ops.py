"""Kernel microbenchmarks under pytest-benchmark: ``pytest bench/ --benchmark-only``.

The cases, providers, inputs and bytes-needed model are those of ``specdec bench ops``
(:mod:`specdec_kernels.benchmarks.ops`); ``extra_info`` carries the bytes needed and the effective
bandwidth. Timings are never asserted.
"""

import functools

import pytest
import torch

from specdec_kernels.benchmarks import ops


@functools.lru_cache(maxsize=2)  # params run case by case; keep GPU memory low
def _bench(case, device):
    return ops.SETUP[case.op](case, device)


def test_op(
    benchmark, bench_case, provider, bench_device, bench_providers, smoke_grid, explicit_providers
):
    if provider not in bench_providers:
        pytest.skip(f"provider {provider} not selected on {bench_device} (--bench-providers)")
    if (
        provider == "torch_compile"
        and bench_device.type == "cpu"
        and smoke_grid
        and bench_case.op not in ops.SMOKE_COMPILE_OPS
        and not explicit_providers
    ):
        pytest.skip(
            "cold torch.compile of this reference is slow on CPU; name it in "
            "--bench-providers to include it"
        )
    bench = _bench(bench_case, bench_device)
    if provider in bench.skipped or provider not in bench.fns:
        pytest.skip(bench.skipped.get(provider, "not applicable"))
    fn = bench.fns[provider]
    if bench_device.type == "cuda":

        def run():
            fn()
            torch.cuda.synchronize()
    else:
        run = fn
    run()  # compile / warm up outside the timed rounds
    benchmark.group = bench_case.name
    benchmark.extra_info.update(
        bytes_needed=bench.bytes_needed,
        provider=provider,
        num_accepted_mean=bench.num_accepted_mean,
    )
    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    median = benchmark.stats.stats.median
    benchmark.extra_info["bandwidth_gbs"] = bench.bytes_needed / median / 1e9
