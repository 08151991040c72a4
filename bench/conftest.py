"""pytest-benchmark options of the microbenchmarks.

``pytest bench/ --benchmark-only`` runs the smoke grid (CPU CI); ``--bench-full`` or
``SPECDEC_BENCH_FULL=1`` the issue's full grid; ``--bench-grid gpu`` the GPU check's grid.
``--bench-providers`` picks providers (default: all that apply on the device; Triton's interpreter
only when named on CPU). No timing is asserted anywhere.
"""

import pytest


def pytest_xdist_auto_num_workers(config):
    """The project's ``-n auto`` (pyproject.toml) spreads the tests over the cores; benchmarks
    time, and run in one process (pytest-benchmark turns itself off under workers)."""
    return 0


def pytest_addoption(parser):
    group = parser.getgroup("specdec bench")
    group.addoption("--bench-full", action="store_true", help="the full grid")
    group.addoption("--bench-grid", default=None, help="smoke | gpu | full")
    group.addoption("--bench-providers", default=None, help="comma-separated providers")
    group.addoption("--bench-device", default=None, help="cpu or cuda (default: cuda if any)")


def _grid(config) -> str:
    from specdec_kernels.benchmarks import ops

    if config.getoption("--bench-grid"):
        return config.getoption("--bench-grid")
    return "full" if config.getoption("--bench-full") or ops.full_requested() else "smoke"


def pytest_generate_tests(metafunc):
    if "bench_case" not in metafunc.fixturenames:
        return
    from specdec_kernels.benchmarks import ops

    cases = ops.cases(_grid(metafunc.config))
    params = [(c, p) for c in cases for p in ops.PROVIDERS[c.op]]
    metafunc.parametrize("bench_case,provider", params, ids=[f"{c.name}-{p}" for c, p in params])


@pytest.fixture(scope="session")
def bench_device(request):
    import torch

    name = request.config.getoption("--bench-device")
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


@pytest.fixture(scope="session")
def bench_providers(request, bench_device):
    from specdec_kernels.benchmarks import ops

    chosen = request.config.getoption("--bench-providers")
    return tuple(chosen.split(",")) if chosen else ops.default_providers(bench_device)


@pytest.fixture(scope="session")
def smoke_grid(request):
    return _grid(request.config) == "smoke"


@pytest.fixture(scope="session")
def explicit_providers(request):
    return bool(request.config.getoption("--bench-providers"))
