"""What the wheel ships of the bundled pairs (``pyproject.toml``'s package-data): every file the
package reads at run time, none of the training logs."""

import fnmatch
import json
import os
from pathlib import Path

import pytest

from specdec_kernels.models.bundled import pair_dir, stated_acceptance

tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads pyproject.toml")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specdec_kernels"
with open(ROOT / "pyproject.toml", "rb") as _fh:
    GLOBS = tomllib.load(_fh)["tool"]["setuptools"]["package-data"]["specdec_kernels"]


def shipped(path: Path) -> bool:
    rel = path.relative_to(PACKAGE).as_posix()
    return any(fnmatch.fnmatch(rel, g) and rel.count("/") == g.count("/") for g in GLOBS)


ASSETS = sorted(p for p in (PACKAGE / "assets").rglob("*") if p.is_file())


@pytest.mark.parametrize("path", ASSETS, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_the_wheel_ships_the_pairs_but_not_their_training_logs(path):
    assert shipped(path) != path.name.startswith("train_log"), path


@pytest.mark.parametrize("name", ["default", "tiny"])
def test_the_shipped_acceptance_table_is_the_training_logs(name):
    """``acceptance.json`` (shipped) holds ``train_log.json``'s table (not shipped), so the
    prior of ``"auto"`` is the one the log recorded; a pair whose log has none ships none."""
    with open(os.path.join(pair_dir(name), "train_log.json")) as fh:
        table = json.load(fh).get("acceptance_heldout_greedy")
    path = os.path.join(pair_dir(name), "acceptance.json")
    if table is None:
        assert not os.path.exists(path) and stated_acceptance(name) is None
        return
    with open(path) as fh:
        assert json.load(fh) == {"acceptance_heldout_greedy": table}
    assert stated_acceptance(name) == table["1"]["acceptance_rate"]
