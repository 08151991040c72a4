"""The examples in docstrings and in README.md run and say what they claim.

Every module of the package is found by walking it (nothing to keep in sync by hand), and every
``>>>`` line in a module's source must be an example that doctest finds and runs: an example
that needs what a CI machine lacks is marked ``# doctest: +SKIP`` on its line, never left out.
"""

import doctest
import importlib
import importlib.util
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import specdec_kernels

ROOT = Path(__file__).resolve().parents[1]


def package_modules() -> list[str]:
    """Every Python module of the package (the compiled extension has no docstrings to run)."""
    found = pkgutil.walk_packages(specdec_kernels.__path__, "specdec_kernels.")
    names = [info.name for info in found if info.name != "specdec_kernels._C"]
    return ["specdec_kernels"] + sorted(names)


MODULES = package_modules()


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name.endswith(".__main__"):  # runs a command line when imported: must hold no example
        path = ROOT / (name.replace(".", "/") + ".py")
        assert ">>>" not in path.read_text(), f"{name} cannot be imported to run its examples"
        return
    module = importlib.import_module(name)
    prompts = len(re.findall(r"^[\s#]*>>>", inspect.getsource(module), flags=re.M))
    tests = doctest.DocTestFinder().find(module, name)
    examples = sum(len(t.examples) for t in tests)
    assert examples == prompts, (
        f"{name}: {prompts} '>>>' lines but doctest finds {examples} "
        "examples: some are not in a docstring doctest reads"
    )
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_the_walk_sees_every_module():
    """The walk itself is what makes the list complete: every .py file of the package is in it
    (a file it missed -- a folder without __init__.py, say -- would have unrun examples)."""
    package = ROOT / "specdec_kernels"
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in package.rglob("*.py")}
    files = {name.removesuffix(".__init__") for name in files}
    assert files == set(MODULES)


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


DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_docs_python_blocks_run(page):
    """The documentation site's examples run too (each block on its own, as in the README)."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    for block in blocks:
        # local checkpoints, or the pretrained models of `specdec models fetch`, that a test
        # machine does not have (tests/test_pretrained_models.py runs them where fetched)
        if "from_pretrained" in block or "pretrained.load(" in block:
            continue
        exec(compile(block, str(page.relative_to(ROOT)), "exec"), {})


def test_results_tables_are_generated_from_the_committed_json():
    """docs/results.md is exactly what scripts/results_tables.py writes from bench/results/*.json
    (regenerate it with ``python scripts/results_tables.py`` after adding results)."""
    spec = importlib.util.spec_from_file_location(
        "results_tables", ROOT / "scripts" / "results_tables.py"
    )
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    committed = (ROOT / "docs" / "results.md").read_text()
    assert committed == tables.render(), (
        "docs/results.md is stale: run python scripts/results_tables.py"
    )


API_MODULES = (
    "specdec_kernels",
    "specdec_kernels.compat.flashinfer",
    "specdec_kernels.compat.vllm",
    "specdec_kernels.compat.sglang",
    "specdec_kernels.distributed",
    "specdec_kernels.models",
    "specdec_kernels.integrations.transformers",
    "specdec_kernels.kv_cache",
    "specdec_kernels.decoding",
    "specdec_kernels.grammar",
)


def _resolve(path: str):
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def test_api_pages_document_every_public_name():
    """Every function and class in the ``__all__`` of the package and of its public submodules
    has an autodoc entry in docs/api/ (a new public name cannot be left off the reference)."""
    documented = set()
    directive = re.compile(r"^\.\. auto(function|class|module):: (\S+)\n((?:   :.*\n)*)", re.M)
    for page in (ROOT / "docs" / "api").glob("*.rst"):
        for kind, path, options in directive.findall(page.read_text()):
            obj = _resolve(path)
            documented.add(id(obj))
            if kind == "module" and ":members:" in options:
                listed = re.search(r":members: (.+)", options)
                names = listed.group(1).split(", ") if listed else dir(obj)
                for name in names:
                    member = getattr(obj, name)
                    if getattr(member, "__module__", None) == path:
                        documented.add(id(member))
    missing = []
    for module_name in API_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and id(obj) not in documented:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"public names without an API page entry in docs/api/: {missing}"
