"""The extension's one ABI stamp (``csrc/bindings.cpp``'s ``kAbiVersion``, ``_C.ABI_VERSION``):
the loader's :data:`~specdec_kernels._extension.ABI_VERSION` and :data:`~specdec_kernels.
_extension.OPS` say the same as the source and as the loaded extension, and an extension of
another stamp is not used."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from specdec_kernels import _dispatch, _extension

ROOT = Path(__file__).resolve().parents[1]
BINDINGS = (ROOT / "csrc" / "bindings.cpp").read_text()


def _defined_ops() -> set[str]:
    """The name of every ``m.def("name(...")`` in csrc/bindings.cpp (adjacent literals joined)."""
    names = set()
    for call in re.findall(r"\bm\.def\((.*?)\);", BINDINGS, flags=re.S):
        schema = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', call))
        names.add(schema.partition("(")[0])
    return names


def test_the_stamp_in_the_source_is_the_loaders():
    (stamp,) = re.findall(r"constexpr long kAbiVersion = (\d+);", BINDINGS)
    assert int(stamp) == _extension.ABI_VERSION


def test_ops_are_the_ops_bindings_cpp_defines():
    assert _defined_ops() == set(_extension.OPS)


@pytest.mark.skipif(not _extension.loaded(), reason="the C++ extension is not built")
def test_the_loaded_extension_has_the_stamp_and_exactly_the_ops():
    from specdec_kernels import _C

    assert _C.ABI_VERSION == _extension.ABI_VERSION
    registered = {
        name.removeprefix("specdec::").split(".")[0]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("specdec::")
    }
    native = {n for n in registered if n in _extension.OPS or n.startswith(("native_", "rowinv_"))}
    assert native == set(_extension.OPS)
    assert all(_extension.has_op(name) for name in _extension.OPS)


def test_has_op_is_false_for_a_name_outside_the_stamp():
    assert not _extension.has_op("verify_chain")  # a Python-defined op, not the extension's
    assert not _extension.has_op("native_no_such_op")


def test_every_native_route_names_an_op_of_the_stamp():
    """The routing table's native kernels call ops of the stamp (so no route needs a probe)."""
    assert set(_dispatch._NATIVE_ENTRY.values()) <= set(_extension.OPS)


@pytest.mark.skipif(not _extension.loaded(), reason="the C++ extension is not built")
def test_an_extension_of_another_stamp_is_not_used():
    """A fresh interpreter whose ``_C`` carries another stamp: not loaded, no op, the reason
    names both stamps, and the native backend falls back with that reason."""
    from specdec_kernels import _C

    script = f"PATH = {_C.__file__!r}\n" + textwrap.dedent("""
        import importlib.util, sys, warnings
        import torch
        # load _C by hand, before the package does, and restamp it as an extension built from
        # another bindings.cpp would be
        spec = importlib.util.spec_from_file_location("specdec_kernels._C", PATH)
        C = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(C)
        C.ABI_VERSION = -7
        sys.modules["specdec_kernels._C"] = C
        from specdec_kernels import _dispatch, _extension
        assert not _extension.loaded()
        assert not _extension.has_op("native_verify_ex")
        assert "ABI stamp -7" in _extension.load_error(), _extension.load_error()
        assert f"needs {_extension.ABI_VERSION}" in _extension.load_error()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert _dispatch.resolve_backend("native", torch.device("cpu")) == "reference"
        assert any("ABI stamp -7" in str(w.message) for w in caught), caught
        print("ok")
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
