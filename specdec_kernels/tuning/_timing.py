"""Measurements kept between processes: where they live, how they are read and written, the CPU
they are keyed by, and the one timed model pass they are made of. A leaf module (it imports
nothing of the package), shared by :mod:`specdec_kernels.tuning` (pass costs),
:mod:`specdec_kernels.models.bundled` (the fastest dtype) and the benchmarks' machine record.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import sys
import time
import warnings

import torch


def cache_path() -> str:
    """Where measured :class:`specdec_kernels.tuning.PassCosts` (and the fastest dtypes) are
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


#: the CPU flags that decide which kernels run and how fast (``/proc/cpuinfo``'s names)
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


@functools.lru_cache(maxsize=1)
def cpu_flag_set() -> frozenset[str]:
    """Every flag of ``/proc/cpuinfo``'s first ``flags`` line (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((ln.split(":", 1)[1].split() for ln in fh if ln.startswith("flags")), [])
    except OSError:
        flags = []
    return frozenset(flags)


def cpu_flags() -> list[str]:
    """Which of :data:`VECTOR_FLAGS` this CPU has (empty where ``/proc/cpuinfo`` is missing):
    two CPUs of one model name (an "AMD EPYC" of one generation or another) can differ here,
    so every cache key and a benchmark row's machine carry it beside :func:`cpu_name`."""
    return [f for f in VECTOR_FLAGS if f in cpu_flag_set()]


def kernels_id() -> str:
    """Which native kernels this process runs: the loaded extension's file (its size and
    modification time: a rebuild has other kernels, so other pass costs), the linear tile
    ``SPECDEC_LINEAR_TILE`` forces, if any, and :func:`cpu_flags`; part of every cache key beside
    :func:`cpu_name`."""
    path = getattr(sys.modules.get("specdec_kernels._C"), "__file__", None)
    try:
        st = os.stat(path) if path else None
    except OSError:
        st = None
    build = f"{st.st_size}:{st.st_mtime_ns}" if st is not None else "none"
    tile = os.environ.get("SPECDEC_LINEAR_TILE", "")
    return f"{build}:{tile}:{','.join(cpu_flags())}"


def read_json(path: str) -> dict:
    """The JSON object at ``path``; ``{}`` where it is missing or unreadable."""
    try:
        with open(path) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_json(path: str, data: dict) -> None:
    """Replace ``path`` with ``data`` atomically; silently nothing where it cannot be written
    (``OSError``); ``TypeError`` / ``ValueError`` where JSON cannot hold ``data``. The
    temporary file beside it is gone afterwards either way."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the in-process cache still holds it
    finally:
        with contextlib.suppress(OSError):  # after os.replace there is none
            os.remove(tmp)


@contextlib.contextmanager
def locked(path: str):
    """Hold an exclusive ``fcntl.flock`` on ``path + ".lock"`` for the block: the
    read-modify-write of ``path`` by several processes at once, one after the other (without
    it, four processes storing different keys at once lost 9 of 40). No lock where there is
    no ``fcntl`` (Windows) or the lock file cannot be made (a read-only home: nothing is
    written there either)."""
    try:
        import fcntl
    except ImportError:
        fcntl = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fh = open(f"{path}.lock", "a") if fcntl is not None else None
    except OSError:
        fh = None
    if fh is None:
        yield
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when fh closes
        yield


def update_json(path: str, key: str, value) -> None:
    """Set ``key`` of the JSON object at ``path`` to ``value``, keeping every other key, as
    one read-modify-write under :func:`locked`: processes storing other keys meanwhile keep
    theirs. Silently nothing where ``path`` cannot be written."""
    with locked(path):
        stored = read_json(path)
        stored[key] = value
        write_json(path, stored)


def pass_ms(
    model,
    batch: int,
    tokens: int,
    context: int,
    repeats: int,
    quantile: float = 0.25,
    *,
    drafting: bool = False,
) -> float:
    """Milliseconds of one cached ``[batch, tokens]`` pass of ``model`` after ``context`` tokens:
    the ``quantile`` of ``repeats`` timed calls (default the lower quartile: other work on the
    machine only ever adds time). ``drafting``: the pass a drafter runs (:func:`one_pass`)."""
    return passes_ms([(model, batch, tokens)], context, repeats, quantile, drafting=drafting)[0]


def one_pass(model, x: torch.Tensor, cache, kv_len: int, drafting: bool = False):
    """A callable running ``model``'s cached pass over ``x`` ``[B, T]`` at ``cache.lengths``
    (not advanced), as the timings take it: the forward with logits of every token, or with
    ``drafting`` the pass a drafter runs (``CausalLM.draft_logits``, one logits row a row,
    float32 kernels without the bitwise contract) where the model has it."""
    if drafting and hasattr(model, "draft_logits"):
        last = torch.full((x.shape[0],), x.shape[1] - 1, dtype=torch.int64, device=x.device)
        return functools.partial(model.draft_logits, x, cache, last, kv_len)
    return functools.partial(model, x, cache, kv_len=kv_len, validate=False)


def passes_ms(
    entries,
    context: int,
    repeats: int,
    quantile: float = 0.25,
    calls: int = 1,
    *,
    drafting: bool = False,
) -> list[float]:
    """:func:`pass_ms` of every ``(model, batch, tokens)`` of ``entries``, timed round-robin:
    ``calls`` calls of each per round, ``repeats`` rounds after a warm-up one, so that a slow
    spell of the machine spreads over every entry instead of inflating a few. With ``calls >
    1`` the first call of each entry's turn is not timed: the others run as a decoding loop
    runs one pass after the same pass (the caches hold its own working set, not what the other
    entries left); with ``calls = 1`` every pass runs after the others'. An entry may name a
    torch thread count fourth, ``(model, batch, tokens, threads)``: its passes run on that many
    threads (the process's count is restored after). ``drafting`` as in :func:`pass_ms`."""
    runs = []
    # one prefilled cache per (model, batch), shared by its entries: a pass writes its tokens'
    # keys and values after the prefix without advancing the cache, and attends only to the
    # prefix and to what it wrote itself
    widest: dict[tuple[int, int], int] = {}
    for model, batch, tokens, *_ in entries:
        key = (id(model), batch)
        widest[key] = max(widest.get(key, 0), tokens)
    caches: dict[tuple[int, int], object] = {}
    with torch.inference_mode():
        for model, batch, tokens, *threads in entries:
            device = next(model.parameters()).device
            cache = caches.get((id(model), batch))
            if cache is None:
                cache = model.new_cache(batch, context + widest[id(model), batch] + 1)
                model.hidden_states(
                    torch.zeros(batch, context, dtype=torch.int64, device=device), cache, context
                )
                cache.advance(context)
                caches[id(model), batch] = cache
            x = torch.zeros(batch, tokens, dtype=torch.int64, device=device)
            threads = threads[0] if threads else None
            run = one_pass(model, x, cache, context + tokens, drafting)
            runs.append((run, device.type == "cuda", threads, x.device))
        times: list[list[float]] = [[] for _ in runs]
        before = torch.get_num_threads()
        try:
            for r in range(repeats + 1):  # the first round warms up
                for t, (run, cuda, threads, device) in zip(times, runs):
                    # an entry without a count runs on the process's, not the last entry's
                    torch.set_num_threads(before if threads is None else threads)
                    for c in range(calls):
                        t0 = time.perf_counter()
                        run()
                        if cuda:
                            torch.cuda.synchronize(device)
                        if r > 0 and (c > 0 or calls == 1):
                            t.append(time.perf_counter() - t0)
        finally:
            torch.set_num_threads(before)
    out = []
    for t in times:
        t = sorted(t)
        out.append(t[min(len(t) - 1, int(len(t) * quantile))] * 1e3)
    return out


_MEMORY: dict[str, object] = {}


def remembered(key: str, measure, *, dump=lambda v: v, load=lambda v: v, cache: bool = True):
    """``measure()``'s result for ``key``, measured at most once: kept in this process, and in
    :func:`cache_path` (through ``dump`` / ``load`` to and from JSON) unless ``cache=False``.

    ``load`` checks what it reads: a stored value it rejects (``KeyError``, ``TypeError``,
    ``ValueError``, ``IndexError``) is dropped and measured again, with a ``RuntimeWarning``
    naming the file. The new value is merged into the file under :func:`locked`, so that
    processes measuring other keys at once keep theirs."""
    if key in _MEMORY:
        return _MEMORY[key]
    path = cache_path()
    if cache:
        stored = read_json(path)
        if key in stored:
            try:
                _MEMORY[key] = load(stored[key])
                return _MEMORY[key]
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                name = key if len(key) <= 60 else key[:57] + "..."
                warnings.warn(
                    f"specdec_kernels: dropped an invalid entry of the measurement cache {path} "
                    f"({name!r}: {type(exc).__name__}: {exc}); measuring it again",
                    RuntimeWarning,
                    stacklevel=2,
                )
    value = measure()
    _MEMORY[key] = value
    if cache:
        update_json(path, key, dump(value))
    return value
