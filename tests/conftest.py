"""Shared test fixtures: seeding, the verbose comparison helper, markers."""

import os

import pytest
import torch

import specdec_kernels  # noqa: F401  (sets TRITON_INTERPRET=1 on machines without CUDA)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


def assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Exact equality with a message that shows the first mismatching indices and values."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    bad = actual != expected
    if bool(bad.any()):
        idx = bad.nonzero()[:5].tolist()
        shown = ", ".join(f"{tuple(i)}: {actual[tuple(i)].item()} != {expected[tuple(i)].item()}" for i in idx)
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.numel()} entries differ; first {shown}")


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


os.environ.setdefault("SPECDEC_TEST", "1")
