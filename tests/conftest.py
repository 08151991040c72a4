"""Shared test fixtures: seeding, the verbose comparison helper, markers."""

import pytest
import torch

import specdec_kernels  # noqa: F401  (sets TRITON_INTERPRET=1 on machines without CUDA)
from specdec_kernels._dispatch import native_available

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

#: The C++ CPU kernels' backend, skipped only where the extension is not built (CI asserts it is).
NATIVE = pytest.param(
    "native",
    marks=pytest.mark.skipif(
        not native_available(), reason="the C++ extension (native backend) is not built"
    ),
)
#: The backends with kernels of their own, compared with the reference.
KERNEL_BACKENDS = ["triton", NATIVE]
#: Every backend.
ALL_BACKENDS = ["reference", "triton", NATIVE]


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


def available(backends) -> list[str]:
    """The names among ``backends`` (strings or the params above) whose skip marks do not
    apply, for tests that loop over backends inside one test."""
    return [
        b if isinstance(b, str) else b.values[0]
        for b in backends
        if isinstance(b, str) or not any(m.args[0] for m in b.marks)
    ]


def skip_native_off_cpu(backend, device) -> None:
    """The native backend is CPU only (elsewhere it falls back): nothing of its own to test."""
    if backend == "native" and torch.device(device).type != "cpu":
        pytest.skip("the native backend runs on CPU tensors only")


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Exact (bit-for-bit for floats) equality; the message shows how many entries differ and
    the first five mismatching indices with their values."""
    assert actual.shape == expected.shape, (
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    )
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if a.is_floating_point():
        bits = _BITS[a.element_size()]
        bad = a.contiguous().view(bits) != e.contiguous().view(bits)
    else:
        bad = a != e
    if bool(bad.any()):
        idx = bad.nonzero()[:5].tolist()
        shown = ", ".join(f"{tuple(i)}: {a[tuple(i)].item()} != {e[tuple(i)].item()}" for i in idx)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} entries differ; first {shown}"
        )


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
