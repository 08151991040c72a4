"""Start a small process group on this machine: for ``specdec demo --tp N``, tests and benchmarks.

:func:`run_parallel` spawns ``world_size`` processes, joins them into a group (gloo on
``127.0.0.1`` by default), calls ``fn(rank, world_size, *args)`` in each and returns the values,
in rank order. Every wait has a deadline: a hang becomes a ``TimeoutError``, never a blocked
caller; an exception in any rank is raised in the caller with that rank's traceback.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_module
import socket
import sys
import time
import traceback


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank: int, world_size: int, port: int, backend: str = "gloo", timeout=60.0):
    """Join the default process group at ``tcp://127.0.0.1:port`` with a collective timeout."""
    import torch.distributed as dist

    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout),
    )


def _worker(fn, rank, world_size, port, backend, timeout, threads, results, args):
    try:
        import torch

        torch.set_num_threads(threads)
        if backend == "gloo" and sys.platform.startswith("linux"):
            # a local group: loopback, whatever the host name resolves to
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        init_group(rank, world_size, port, backend, timeout)
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
    except BaseException:  # reported to the parent, which raises it
        results.put((rank, False, traceback.format_exc()))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def run_parallel(
    fn,
    world_size: int,
    *args,
    backend: str = "gloo",
    timeout: float = 120.0,
    threads: int = 1,
) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes in one group.

    Parameters
    ----------
    fn : callable
        A module-level (picklable) function; its return value must be picklable.
    world_size : int
        ``>= 1`` processes.
    backend : str
        ``"gloo"`` (CPU) or ``"nccl"``.
    timeout : float
        Seconds for the whole run (and for each collective inside it).
    threads : int
        ``torch.set_num_threads`` in each process.

    Returns
    -------
    list
        ``fn``'s return values in rank order.

    Raises
    ------
    RuntimeError
        A rank raised (its traceback is in the message).
    TimeoutError
        The run took longer than ``timeout``; every process is terminated.
    """
    import torch.multiprocessing as mp

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    env_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, rank, world_size, port, backend, timeout, threads, results, args),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    try:
        for p in procs:
            p.start()
        values: dict[int, object] = {}
        deadline = time.monotonic() + timeout
        while len(values) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"run_parallel: {world_size - len(values)} of {world_size} ranks did not "
                    f"finish within {timeout:.0f} s (ranks done: {sorted(values)})"
                )
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead and not any(r in values for r in dead):
                    raise RuntimeError(
                        f"ranks {dead} died (exit codes {[procs[r].exitcode for r in dead]})"
                    ) from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} of {world_size} failed:\n{value}")
            values[rank] = value
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        return [values[r] for r in range(world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
        if env_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_threads
