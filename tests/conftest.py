"""Shared test fixtures (seeding, one thread, devices, a private cost cache) and the cuda marker;
the shared helpers are in ``helpers.py``."""

import pytest
import torch

import specdec_kernels  # noqa: F401  (sets TRITON_INTERPRET=1 on machines without CUDA)
from specdec_kernels import _dispatch, _warnings

from helpers import DEVICES


def pytest_configure(config):
    """Under pytest-xdist each worker takes its share of the cores for torch's threads (two
    workers on two cores, two threads each, would contend for both)."""
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    # tests/ holds no benchmark (they are under bench/): pytest-benchmark, off, need not warn
    # that xdist turns it off
    if hasattr(config.option, "benchmark_disable"):
        config.option.benchmark_disable = True


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _fallbacks_warn_in_every_test():
    """The package's fallback warnings fire once a process; each test gets them afresh, so that
    (errors under pytest: pyproject.toml's filterwarnings) a route that falls back fails the
    test that takes it, not only the first such test of the process."""
    with _warnings._lock:
        _warnings._warned.clear()
    yield


@pytest.fixture(autouse=True)
def _backend_runs_itself(request, _fallbacks_warn_in_every_test):
    """A test parametrized by ``backend`` runs that backend: on its ``device`` (CPU unless the
    test has one) the name resolves to itself, not to a fallback. The native backend off the CPU
    is skipped by the tests themselves (:func:`helpers.skip_native_off_cpu`)."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    backend, device = params.get("backend"), torch.device(params.get("device", "cpu"))
    if backend in _dispatch.BACKENDS and not (backend == "native" and device.type != "cpu"):
        assert _dispatch.resolve_backend(backend, device) == backend, (backend, device)
    yield


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run faster on one thread, and the CI machine is shared (2 cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _private_cost_cache(tmp_path_factory):
    """Measured pass costs and dtype choices go to a folder of this session, not ~/.cache."""
    import os

    old = os.environ.get("SPECDEC_CACHE_DIR")
    os.environ["SPECDEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("specdec_cache"))
    yield
    if old is None:
        os.environ.pop("SPECDEC_CACHE_DIR", None)
    else:
        os.environ["SPECDEC_CACHE_DIR"] = old
