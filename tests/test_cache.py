"""The measurement cache (``$SPECDEC_CACHE_DIR/pass_costs.json``): what it holds is checked
when it is read (an invalid entry is measured again, with a warning naming the file), writers
of different keys at once all keep theirs, and a failed write leaves no temporary file."""

import json
import math
import multiprocessing
import os
import re
import warnings

import pytest
import torch

from specdec_kernels.models import CausalLM, CausalLMConfig
from specdec_kernels.tuning import PassCosts, _timing, measure, measure_pass_costs

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh cache folder, and nothing remembered in this process."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_timing, "_MEMORY", {})
    return tmp_path


@pytest.fixture
def fake_timings(monkeypatch):
    """``measure_pass_costs`` without timing anything: every pass priced by its shape; the
    list returned grows by one entry for each timed grid row."""
    rows = []

    def passes_ms(entries, context, repeats, quantile=0.25, calls=1, **kw):
        rows.append(entries)
        return [1.0 + 0.5 * b + 0.1 * t for _, b, t, *_ in entries]

    def pass_ms(model, batch, tokens, context, repeats, quantile=0.25, **kw):
        return 0.1 * batch * tokens

    monkeypatch.setattr(measure, "passes_ms", passes_ms)
    monkeypatch.setattr(measure, "pass_ms", pass_ms)
    monkeypatch.setattr(measure, "_step_ms", lambda *args: 0.05)
    return rows


def _pair():
    torch.manual_seed(0)
    cfg = CausalLMConfig(vocab_size=17, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    return CausalLM(cfg).eval(), CausalLM(cfg).eval()


def _corrupt(entry: dict, how: str) -> None:
    """What the issue found in real cache files (and a few of the same kind)."""
    if how == "short row":
        entry["target_ms"][0] = entry["target_ms"][0][:2]
    elif how == "no batch sizes":
        entry["batch"] = []
    elif how == "a string":
        entry["target_ms"][0][0] = "fast"
    elif how == "NaN":
        entry["target_ms"] = [[math.nan] * len(r) for r in entry["target_ms"]]
    elif how == "Infinity":
        entry["draft_ms"] = [math.inf] * len(entry["draft_ms"])
    elif how == "negative":
        entry["draft_ms"] = [-5.0] * len(entry["draft_ms"])
    elif how == "unsorted grid":
        entry["tokens"] = entry["tokens"][::-1]
    elif how == "NaN step":
        entry["step_ms"] = [math.nan]
    elif how == "not an object":
        entry.clear()
        entry["batch"] = 3


CORRUPTIONS = [
    "short row",
    "no batch sizes",
    "a string",
    "NaN",
    "Infinity",
    "negative",
    "unsorted grid",
    "NaN step",
    "not an object",
]


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_an_invalid_cached_pass_cost_is_measured_again(cache_dir, fake_timings, how):
    """An entry that is not a valid ``PassCosts`` (a row too short or no batch sizes: every
    later ``generate()`` raised IndexError; a string: TypeError; NaN or Infinity: "auto" never
    drafted; negative costs were used) is dropped and measured again, with one warning naming
    the file; the file then holds the new entry, read back without a warning."""
    target, draft = _pair()
    good = measure_pass_costs(target, draft, max_k=2, max_batch=2)
    path = cache_dir / "pass_costs.json"
    stored = json.loads(path.read_text())
    (key,) = stored
    _corrupt(stored[key], how)
    path.write_text(json.dumps(stored))  # NaN and Infinity as Python's json writes them
    _timing._MEMORY.clear()  # a later process
    measured = len(fake_timings)
    with pytest.warns(RuntimeWarning, match="invalid entry.*" + re.escape(str(path))) as seen:
        costs = measure_pass_costs(target, draft, max_k=2, max_batch=2)
    assert len([w for w in seen if str(path) in str(w.message)]) == 1
    assert len(fake_timings) > measured  # measured again
    assert costs == good
    assert costs.step_cost(2, 2) > 0 and costs.finish_k([0.9, 0.9], [8.0, 8.0], 2) >= 0
    assert json.loads(path.read_text())[key] == good.to_dict()
    _timing._MEMORY.clear()
    measured = len(fake_timings)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measure_pass_costs(target, draft, max_k=2, max_batch=2) == good
    assert len(fake_timings) == measured  # read, not measured


def test_loop_calibrated_costs_with_negative_corrections_load():
    """The loop's corrections (``step_ms``, ``draft_fixed_ms``) are negative where the loop's
    steps cost less than the timed passes say: valid, unlike negative pass costs."""
    costs = PassCosts(
        (1, 4), (1, 3), ((1.0, 1.2), (1.6, 2.6)), (0.05, 0.1), (-0.3, 0.1), 0.0, (-0.02, 0.0),
        (1, 4), 0.01,
    )  # fmt: skip
    assert PassCosts.from_dict(costs.to_dict()) == costs
    bad = {**costs.to_dict(), "loop_batch": [1, 4, 16]}
    with pytest.raises(ValueError, match="step_ms"):
        PassCosts.from_dict(bad)


@pytest.mark.parametrize("threads", [100000, 0, -1, "2", 1.5, True])
def test_an_invalid_cached_thread_count_is_measured_again(cache_dir, monkeypatch, threads):
    """A cached thread count outside ``1 .. os.cpu_count()`` (100000 made ``specdec demo`` die
    with SIGSEGV, 0 with RuntimeError) or not an int is measured again, with a warning."""
    from specdec_kernels.models.bundled import fastest_threads

    def fake(entries, context, repeats, quantile=0.25, calls=1):
        return [1.0 if e[3] == 1 else 2.0 for e in entries]  # one thread wins

    monkeypatch.setattr(_timing, "passes_ms", fake)
    model = _pair()[0]
    assert fastest_threads(lambda: model) == 1
    path = cache_dir / "pass_costs.json"
    stored = json.loads(path.read_text())
    (key,) = stored
    stored[key] = threads
    path.write_text(json.dumps(stored))
    _timing._MEMORY.clear()
    with pytest.warns(RuntimeWarning, match="invalid entry.*" + re.escape(str(path))):
        assert fastest_threads(lambda: model) == 1
    assert json.loads(path.read_text())[key] == 1


def _write_keys(cache_dir: str, worker: int, count: int, barrier) -> None:
    """One of the processes of the concurrency test: ``count`` keys of its own, each through
    :func:`remembered` (a read-modify-write of the one file), all starting together."""
    os.environ["SPECDEC_CACHE_DIR"] = cache_dir
    barrier.wait()
    for i in range(count):
        _timing.remembered(f"w{worker}:{i}", lambda i=i: [worker, i])


def test_writers_of_different_keys_at_once_keep_every_key(tmp_path):
    """Four processes measuring different keys at once: every key is in the file afterwards
    (without a lock on the read-modify-write, 9 of 40 had been lost)."""
    ctx = multiprocessing.get_context("spawn")
    workers, count = 4, 25
    barrier = ctx.Barrier(workers)
    procs = [
        ctx.Process(target=_write_keys, args=(str(tmp_path), w, count, barrier))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * workers
    stored = json.loads((tmp_path / "pass_costs.json").read_text())
    missing = [
        f"w{w}:{i}" for w in range(workers) for i in range(count) if f"w{w}:{i}" not in stored
    ]
    assert not missing, f"{len(missing)} of {workers * count} keys lost: {missing[:8]}"
    assert stored["w3:7"] == [3, 7]
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    """A write that fails (the path is a folder; a value JSON cannot hold) leaves no
    ``pass_costs.json.<pid>.tmp`` behind; the folder case is silent (a read-only home: the
    process keeps its measurements), the other raises."""
    blocked = tmp_path / "pass_costs.json"
    blocked.mkdir()
    _timing.write_json(str(blocked), {"a": 1})
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    path = tmp_path / "other.json"
    with pytest.raises(TypeError):
        _timing.write_json(str(path), {"a": torch.float32})
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    assert not path.exists()
