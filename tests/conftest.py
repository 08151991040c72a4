"""Shared test fixtures: seeding, the verbose comparison helper, markers."""

import pytest
import torch

import specdec_kernels  # noqa: F401  (sets TRITON_INTERPRET=1 on machines without CUDA)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


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


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Exact (bit-for-bit for floats) equality; the message shows how many entries differ and
    the first five mismatching indices with their values."""
    assert actual.shape == expected.shape, \
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if a.is_floating_point():
        bits = _BITS[a.element_size()]
        bad = a.contiguous().view(bits) != e.contiguous().view(bits)
    else:
        bad = a != e
    if bool(bad.any()):
        idx = bad.nonzero()[:5].tolist()
        shown = ", ".join(f"{tuple(i)}: {a[tuple(i)].item()} != {e[tuple(i)].item()}"
                          for i in idx)
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.numel()} entries differ; "
                             f"first {shown}")


def assert_verification_equal(actual, expected, what: str = "") -> None:
    for name, a, e in zip(("tokens", "num_accepted", "num_emitted"), actual, expected):
        assert_same(a.cpu(), e.cpu(), f"{what} {name}")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)

