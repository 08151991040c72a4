"""Shared test fixtures (seeding, one thread, devices, a private cost cache) and the cuda marker;
the shared helpers are in ``helpers.py``."""

import pytest
import torch

import specdec_kernels  # noqa: F401  (sets TRITON_INTERPRET=1 on machines without CUDA)

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
