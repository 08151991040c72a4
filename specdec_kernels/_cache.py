"""Measurements kept between processes: where they live, how they are read and written, the CPU
they are keyed by, and the one timed model pass they are made of. A leaf module (it imports
nothing of the package), shared by :mod:`specdec_kernels.adaptive` (pass costs),
:mod:`specdec_kernels.models.bundled` (the fastest dtype) and the benchmarks' machine record.
"""

from __future__ import annotations

import json
import os
import platform
import time

import torch


def cache_path() -> str:
    """Where measured :class:`specdec_kernels.adaptive.PassCosts` (and the fastest dtypes) are
    kept between processes: ``$SPECDEC_CACHE_DIR/pass_costs.json`` (default
    ``~/.cache/specdec_kernels``)."""
    root = os.environ.get("SPECDEC_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "specdec_kernels"
    )
    return os.path.join(root, "pass_costs.json")


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``, else what ``platform``
    says): part of every cache key, and the ``cpu`` of a benchmark row's machine."""
    try:
        with open("/proc/cpuinfo") as fh:
            names = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        if names:
            return names[0]
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_json(path: str) -> dict:
    """The JSON object at ``path``; ``{}`` where it is missing or unreadable."""
    try:
        with open(path) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_json(path: str, data: dict) -> None:
    """Replace ``path`` with ``data`` atomically; silently nothing where it cannot be written."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the in-process cache still holds it


def pass_ms(
    model, batch: int, tokens: int, context: int, repeats: int, quantile: float = 0.25
) -> float:
    """Milliseconds of one cached ``[batch, tokens]`` pass of ``model`` after ``context`` tokens:
    the ``quantile`` of ``repeats`` timed calls (default the lower quartile: other work on the
    machine only ever adds time)."""
    device = next(model.parameters()).device
    cache = model.new_cache(batch, context + tokens + 1)
    x = torch.zeros(batch, tokens, dtype=torch.int64, device=device)
    with torch.inference_mode():
        model.hidden_states(
            torch.zeros(batch, context, dtype=torch.int64, device=device), cache, context
        )
        cache.advance(context)
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            t0 = time.perf_counter()
            model(x, cache, kv_len=context + tokens, validate=False)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
    times = sorted(times[1:])
    return times[min(len(times) - 1, int(len(times) * quantile))] * 1e3


_MEMORY: dict[str, object] = {}


def remembered(key: str, measure, *, dump=lambda v: v, load=lambda v: v, cache: bool = True):
    """``measure()``'s result for ``key``, measured at most once: kept in this process, and in
    :func:`cache_path` (through ``dump`` / ``load`` to and from JSON) unless ``cache=False``.
    A stored value that ``load`` rejects (``KeyError``, ``TypeError``, ``ValueError``) is
    measured again."""
    if key in _MEMORY:
        return _MEMORY[key]
    if cache:
        stored = read_json(cache_path())
        if key in stored:
            try:
                _MEMORY[key] = load(stored[key])
                return _MEMORY[key]
            except (KeyError, TypeError, ValueError):
                pass
    value = measure()
    _MEMORY[key] = value
    if cache:
        stored = read_json(cache_path())
        stored[key] = dump(value)
        write_json(cache_path(), stored)
    return value
