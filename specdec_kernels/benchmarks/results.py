"""Timing, machine description and JSON results shared by the benchmarks."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass

import torch

from specdec_kernels.tuning._timing import cpu_flags, cpu_name

QUANTILES = (0.5, 0.2, 0.8)  # median, then the 20% and 80% quantiles (triton.testing's order)


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call: median and the 20% / 80% quantiles over ``n`` timed calls."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    n: int
    method: str


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def time_cpu(
    fn, *, warmup: int = 1, min_calls: int = 3, max_calls: int = 200, budget_s: float = 0.5
) -> Timing:
    """Wall-clock timing on the host: ``warmup`` untimed calls, then calls until ``budget_s`` is
    spent (at least ``min_calls``, at most ``max_calls``)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_calls and (
        len(times) < min_calls or time.perf_counter() - start < budget_s
    ):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return Timing(
        statistics.median(times),
        _quantile(times, 0.2),
        _quantile(times, 0.8),
        len(times),
        "perf_counter",
    )


def time_cuda(fn, *, rep_ms: int = 50, cuda_graph: bool = True) -> Timing:
    """``triton.testing.do_bench`` (``do_bench_cudagraph`` when ``cuda_graph`` and the function
    can be captured): median and 20% / 80% quantiles in ms."""
    import triton.testing

    fn()  # compile / autotune outside the timed region
    torch.cuda.synchronize()
    if cuda_graph:
        try:
            med, p20, p80 = triton.testing.do_bench_cudagraph(
                fn, rep=rep_ms, quantiles=list(QUANTILES)
            )
            return Timing(med, p20, p80, -1, "do_bench_cudagraph")
        except Exception:  # not capturable (host sync, CPU tensors, ...): plain do_bench
            torch.cuda.synchronize()
    med, p20, p80 = triton.testing.do_bench(fn, warmup=10, rep=rep_ms, quantiles=list(QUANTILES))
    return Timing(med, p20, p80, -1, "do_bench")


def measure(fn, device: torch.device, *, budget_s: float = 0.5, cuda_graph: bool = True) -> Timing:
    """Time ``fn`` on ``device`` with the method that fits it."""
    if device.type == "cuda":
        return time_cuda(fn, rep_ms=max(10, int(budget_s * 1e3)), cuda_graph=cuda_graph)
    return time_cpu(fn, budget_s=budget_s)


def copy_bandwidth_gbs(device: torch.device, nbytes: int = 256 << 20) -> float:
    """Measured device copy bandwidth, GB/s: ``(read + write bytes) / time`` of a large
    ``copy_``; the yardstick for the kernels' effective bandwidth."""
    if device.type == "cpu":
        nbytes = min(nbytes, 64 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), device, budget_s=0.3, cuda_graph=False)
    return 2 * nbytes / (t.median_ms * 1e-3) / 1e9


def read_bandwidth_gbs(device: torch.device, nbytes: int = 256 << 20) -> float:
    """Measured read bandwidth, GB/s: ``nbytes / time`` of ``torch.sum`` over a float32 buffer of
    ``nbytes`` (a streaming read, with the threads torch uses); the yardstick of the CPU kernels'
    effective bandwidth, measured in the same run."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    t = measure(lambda: src.sum(), device, budget_s=0.5, cuda_graph=False)
    return nbytes / (t.median_ms * 1e-3) / 1e9


def git_commit() -> str:
    """Short commit of the checkout the package runs from, ``+dirty`` when it has changes;
    ``v<version>`` outside a git checkout (an installed package)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            check=True,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return sha + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        from specdec_kernels._version import __version__

        return f"v{__version__}"


def machine(device: torch.device) -> dict:
    """What the figures were measured on."""
    info = {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "cpu_flags": cpu_flags(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if hasattr(os, "getloadavg"):
        info["loadavg_1m"] = round(os.getloadavg()[0], 2)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def run_header(device: torch.device, kind: str, **extra) -> dict:
    """The fields every row of one run carries: run id, kind, date (UTC), commit, machine."""
    return {
        "run_id": uuid.uuid4().hex[:12],
        "kind": kind,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine(device),
        "command": command_line(),
        **extra,
    }


def command_line() -> str:
    """The command this process runs, as a user would type it (``specdec ...`` for the CLI)."""
    import shlex
    import sys

    arg0 = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    prog = os.path.basename(arg0)
    if prog in ("specdec", "cli.py", "__main__.py"):
        prog = "specdec"
    elif prog.endswith(".py"):  # a script: as run from the repository root
        prog = "python " + os.path.relpath(arg0)
    return " ".join([prog] + [shlex.quote(a) for a in sys.argv[1:]])


def append_rows(path: str, rows: list[dict]) -> None:
    """Append ``rows`` to the JSON list in ``path`` (created when missing), written by
    :func:`dump_rows`."""
    old = load_rows(path) if os.path.exists(path) else []
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(dump_rows(old + rows))
    os.replace(tmp, path)


def dump_rows(rows: list[dict]) -> str:
    """``rows`` as a JSON list with one compact row a line: a results file stays a line per
    measurement (an indented row took ~60 lines: bench/results/e2e.json was 112k lines), and a
    new run's rows are a diff of their own lines."""
    body = ",\n".join(json.dumps(row, separators=(",", ":")) for row in rows)
    return f"[\n{body}\n]\n" if rows else "[]\n"


def load_rows(path: str) -> list[dict]:
    with open(path) as fh:
        rows = json.load(fh)
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a JSON list of rows")
    return rows


def latest_run(rows: list[dict], kind: str | None = None) -> list[dict]:
    """The rows of the last run (by position in the file) of ``kind``."""
    rows = [r for r in rows if kind is None or r.get("kind") == kind]
    if not rows:
        return []
    last = rows[-1]["run_id"]
    return [r for r in rows if r["run_id"] == last]


def timing_fields(t: Timing) -> dict:
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(t).items()}
