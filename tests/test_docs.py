"""The examples in docstrings and in README.md run and say what they claim."""

import doctest
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["specdec_kernels.verification"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0


def test_readme_python_blocks_run():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README.md has no python example"
    ran = 0
    for block in blocks:
        # The GPT-2 / distilgpt2 examples load checkpoints from local folders that a test machine
        # does not have (nothing is downloaded); the integration tests run the same calls on tiny
        # random GPT-2 models instead (tests/test_integration_hf.py).
        if "from_pretrained" in block:
            continue
        exec(compile(block, "README.md", "exec"), {})
        ran += 1
    assert ran >= 4, f"only {ran} README examples ran"
