"""The one place that decides which implementation runs an op.

Backends (:data:`BACKENDS`):

``"triton"``     the Triton kernels (:mod:`specdec_kernels.ops`), compiled for CUDA tensors; on CPU
                 tensors they run in Triton's interpreter, which Triton decides once, when it is
                 first imported, from ``TRITON_INTERPRET``: ``import specdec_kernels`` sets
                 ``TRITON_INTERPRET=1`` on a machine without CUDA (unless triton was already
                 imported or the variable is set). Where the interpreter is off, ``"triton"`` on
                 CPU tensors falls back to the reference with a one-time warning. The
                 interpreter keeps the running launch in globals, so interpreted launches are
                 serialised by one process-wide lock (:func:`specdec_kernels.ops._common.launch`):
                 thread-safe, one kernel at a time; compiled launches take no lock.
``"native"``     the C++ CPU kernels of the extension ``specdec_kernels._C`` (CPU tensors only).
                 Where the extension is not built it falls back to the reference, and on other
                 devices to that device's automatic choice, each with a one-time warning.
``"reference"``  the pure-PyTorch specification (:mod:`specdec_kernels.reference`), any device.

``backend=None`` means: Triton for CUDA tensors; for CPU tensors the native kernels where the
extension is built, else the reference; unless the environment variable ``SPECDEC_BACKEND`` names
one.

The routing table (:func:`kernel`) maps ``(op, backend)`` to the function that runs it; every
custom op's body is one lookup there. Each op's kernels take the same arguments on every backend
(the op's schema without ``backend``): the adapters below are the only code that knows how a
backend's entry (``torch.ops.specdec.native_*``, a Triton launcher, a reference function) spells
them. A backend without a kernel for an op runs the reference, with a one-time warning. The KV
ops have no ``backend=``: :func:`kv_backend` picks ``"native"`` (C++, and CUDA in a CUDA build)
where the extension has a kernel for the cache's device, else ``"reference"``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading
from collections.abc import Callable

import torch

from specdec_kernels import _extension
from specdec_kernels._warnings import warn_once
from specdec_kernels.reference import accept_reject as ref_accept_reject
from specdec_kernels.reference import accept_tests as ref_accept_tests
from specdec_kernels.reference import bitmask as ref_bitmask
from specdec_kernels.reference import expected_accepts as ref_expected_accepts
from specdec_kernels.reference import finish_ms as ref_finish_ms
from specdec_kernels.reference import kv_cache as ref_kv
from specdec_kernels.reference import layout as ref_layout
from specdec_kernels.reference import logprobs as ref_logprobs
from specdec_kernels.reference import processors as ref_processors
from specdec_kernels.reference import verify_chain as ref_chain
from specdec_kernels.reference import verify_tree as ref_tree

BACKENDS = ("triton", "native", "reference")
_ENV_VAR = "SPECDEC_BACKEND"


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def native_available() -> bool:
    """True when the extension ``specdec_kernels._C`` is loaded with its native verification
    kernels (``torch.ops.specdec.native_verify_ex``)."""
    return _extension.native_ops_available()


def _auto(device: torch.device) -> str:
    if device.type == "cuda":
        return "triton"
    if device.type == "cpu" and native_available():
        return "native"
    return "reference"


def check_backend(backend: str | None) -> str | None:
    """``backend`` itself when it is ``None`` or one of :data:`BACKENDS`: what the entry points
    above the ops (the decoding loop, generators, compat adapters) call before any work.

    Raises
    ------
    ValueError
        ``backend`` is not ``None`` or one of :data:`BACKENDS` (the message names it).
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    return backend


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """Return ``"triton"``, ``"native"`` or ``"reference"`` for an op whose tensors live on
    ``device``.

    Raises
    ------
    ValueError
        ``backend`` (or ``SPECDEC_BACKEND``) is not one of :data:`BACKENDS`.
    """
    source = "backend"
    if backend is None:
        env = os.environ.get(_ENV_VAR)
        if env:
            backend, source = env.strip().lower(), f"the environment variable {_ENV_VAR}"
        else:
            return _auto(device)
    if backend not in BACKENDS:
        raise ValueError(f"{source} must be one of {BACKENDS} or None, got {backend!r}")
    if backend == "native":
        return _resolve_native(device)
    if backend == "triton":
        return _resolve_triton(device)
    return backend


def _resolve_native(device: torch.device) -> str:
    if device.type != "cpu":
        fallback = _auto(device)
        warn_once(
            f"native-{device.type}",
            f"specdec_kernels: the native backend runs on CPU "
            f"tensors only; {device.type} tensors use {fallback!r}",
        )
        return fallback
    if not native_available():
        warn_once(
            "no-native",
            "specdec_kernels: the native backend needs the C++ extension, "
            f"which is not in use ({_extension.load_error()}); falling back to the "
            "pure-PyTorch reference",
        )
        return "reference"
    return "native"


def _resolve_triton(device: torch.device) -> str:
    if not triton_available():
        warn_once(
            "no-triton",
            "specdec_kernels: triton is not installed; falling back to the pure-PyTorch reference",
        )
        return "reference"
    if device.type == "cpu" and not interpreter_active():
        warn_once(
            "triton-cpu",
            "specdec_kernels: Triton kernels run on CPU tensors only under "
            "Triton's interpreter: set TRITON_INTERPRET=1 before triton is imported; "
            "falling back to the pure-PyTorch reference",
        )
        return "reference"
    if device.type not in ("cuda", "cpu"):
        warn_once(
            f"triton-{device.type}",
            f"specdec_kernels: no Triton path for {device.type} "
            "tensors; falling back to the pure-PyTorch reference",
        )
        return "reference"
    return "triton"


def interpreter_active() -> bool:
    """True when Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# --- the routing table -----------------------------------------------------------------------
# Chain kernels: (target_logits, draft_tokens, draft_probs, num_draft_tokens, temperature, top_k,
# top_p, seeds, logits_row_start, probs_row_start, token_bitmask, mode, log_input,
# posterior_threshold, posterior_alpha, min_p, edit_ids, edit_vals, draft_vocab_inv) ->
# (tokens, num_accepted);
# mode "greedy", "sampling", "block" (routed as verify_block) or "typical" (routed as
# verify_typical); min_p [B] and the processors' edit list (edit_ids [B, E], edit_vals
# [B, K+1, E]: specdec_kernels.reference.processors) or None; draft_vocab_inv [V] int32 (the
# draft_probs column of each target id, -1 outside a reduced draft vocabulary) or None. Tree
# kernels:
# (target_logits, tree_tokens, parents, draft_probs, num_nodes, mode, temperature, top_k, top_p,
# seeds, token_bitmask, greedy_only) -> (tokens, num_accepted, accepted_nodes), all [B, N] wide.
# Logprob kernels: see specdec_kernels.logprobs. KV kernels: the public op's arguments -> None.


#: ``native_verify_ex``'s ``mode`` (the rule of the rows that are not greedy) per chain mode.
_NATIVE_CHAIN_MODE = {"greedy": 0, "sampling": 0, "block": 1, "typical": 2}


def _native_chain(logits, drafts, probs, nd, temp, topk, topp, seeds, lrs, prs, bitmask, mode,
                  log_input, threshold, alpha, min_p, edit_ids, edit_vals, inv):  # fmt: skip
    # inv: a reduced draft vocabulary, read through the index by the kernels (no [B, K, V] scatter)
    return torch.ops.specdec.native_verify_ex(
        logits, drafts, probs, nd, temp, topk, topp, seeds, mode == "greedy", lrs, prs, bitmask,
        log_input, _NATIVE_CHAIN_MODE[mode], threshold, alpha, min_p, edit_ids, edit_vals, inv,
    )  # fmt: skip


def _native_chain_logprobs(logits, drafts, probs, nd, temp, topk, topp, seeds, lrs, prs, bitmask,
                           mode, log_input, threshold, alpha, min_p, edit_ids, edit_vals, inv,
                           processed, num_logprobs):  # fmt: skip
    # _native_chain's kernel fused with native_emitted_logprobs': each position's row is scored
    # right after verification's statistics pass over it (csrc/kernels/verify_logprobs_cpu_kernel.h)
    return torch.ops.specdec.native_verify_logprobs(
        logits, drafts, probs, nd, temp, topk, topp, seeds, mode == "greedy", lrs, prs, bitmask,
        log_input, _NATIVE_CHAIN_MODE[mode], threshold, alpha, min_p, edit_ids, edit_vals, inv,
        processed, num_logprobs,
    )  # fmt: skip


def _triton_chain(logits, drafts, probs, nd, temp, topk, topp, seeds, lrs, prs, bitmask, mode,
                  log_input, threshold, alpha, min_p, edit_ids, edit_vals, inv):  # fmt: skip
    from specdec_kernels.ops import verify_sampling  # imports triton: lazily

    # a reduced draft vocabulary: the kernels read q through the inverse index (no scatter)
    return verify_sampling.verify(
        logits, drafts, probs, nd, temp, topk, topp, seeds, greedy_only=mode == "greedy",
        logits_row_start=lrs, probs_row_start=prs, log_input=log_input,
        method="block" if mode == "block" else "token", token_bitmask=bitmask, min_p=min_p,
        edit_ids=edit_ids, edit_vals=edit_vals, draft_vocab_inv=inv,
    )  # fmt: skip


def _triton_chain_logprobs(logits, drafts, probs, nd, temp, topk, topp, seeds, lrs, prs,
                           bitmask, mode, log_input, threshold, alpha, min_p, edit_ids, edit_vals,
                           inv, processed, num_logprobs):  # fmt: skip
    """``verify_chain_logprobs`` in one pass: the verification kernels score what they emit
    (:func:`specdec_kernels.ops.verify_sampling.verify` with ``logprobs``). Probabilities as
    inputs (``log_input``) run the two ops, as without a one-pass kernel."""
    from specdec_kernels.ops import verify_sampling  # imports triton: lazily

    args = (logits, drafts, probs, nd, temp, topk, topp, seeds, lrs, prs, bitmask, mode,
            log_input, threshold, alpha, min_p, edit_ids, edit_vals, inv)  # fmt: skip
    if log_input:
        return _two_op_chain_logprobs(args, processed, num_logprobs)
    tokens, accepted, (lp, top, ids) = verify_sampling.verify(
        logits, drafts, probs, nd, temp, topk, topp, seeds, greedy_only=mode == "greedy",
        logits_row_start=lrs, probs_row_start=prs, method="block" if mode == "block" else "token",
        token_bitmask=bitmask, min_p=min_p, edit_ids=edit_ids, edit_vals=edit_vals,
        draft_vocab_inv=inv, logprobs=(processed, num_logprobs),
    )  # fmt: skip
    return tokens, accepted, lp, top, ids


def _two_op_chain_logprobs(args, processed, num_logprobs):
    """The chain kernel, then ``emitted_logprobs``'s over the emitted rows (the Triton kernels
    of the two ops ``specdec_kernels.verification`` chains where no one-pass kernel runs)."""
    from specdec_kernels.ops import logprobs  # imports triton: lazily

    logits, *_, lrs, _, bitmask, mode, _, _, _, min_p, edit_ids, edit_vals, _ = args
    temp, topk, topp = args[4:7]
    tokens, accepted = _triton_chain(*args)
    k1 = tokens.shape[1]
    positions = torch.arange(k1, device=tokens.device)[None, :]
    rows = positions.expand(tokens.shape[0], -1) if lrs is None else lrs[:, None] + positions
    rows = torch.where(positions <= accepted[:, None], rows, -1).contiguous()
    if logits.dim() == 2:  # flat rows: one view per request
        logits = logits.unsqueeze(0).expand(tokens.shape[0], -1, -1)
        if bitmask is not None:
            bitmask = bitmask.unsqueeze(0).expand(tokens.shape[0], -1, -1)
    greedy = mode == "greedy"  # the processed distribution of a greedy call: T = 1, no filters
    lp, top, ids = logprobs.emitted_logprobs(
        logits, rows, tokens, bitmask, None if greedy else temp, None if greedy else topk,
        None if greedy else topp, processed, num_logprobs, None if greedy else min_p,
        edit_ids, edit_vals,
    )  # fmt: skip
    return tokens, accepted, lp, top, ids


def _reference_chain(*args):
    tokens, accepted, _ = ref_chain.verify_chain(*args)
    return tokens, accepted


def _triton_tree(*args):
    from specdec_kernels.ops import verify_tree  # imports triton: lazily

    logits, *head, bitmask, greedy_only, log_input = args
    # the Triton tree kernel reads logits: probabilities get their log first (a [B, N, V]
    # temporary, which the C++ kernel does without)
    logits = ref_layout.as_logits(logits, log_input)
    return verify_tree.verify_tree(logits, *head, greedy_only=greedy_only, token_bitmask=bitmask)


def _reference_tree(logits, tokens, parents, probs, nn, mode, temp, topk, topp, seeds, bitmask,
                    greedy, log_input):  # fmt: skip
    logits = ref_bitmask.masked_logits(ref_layout.as_logits(logits, log_input), bitmask)
    if greedy:
        return ref_tree.verify_tree_greedy(logits, tokens, parents, nn)
    return ref_tree.verify_tree_sampling(
        logits, tokens, parents, probs, nn, mode, temp, topk, topp, seeds
    )


def _reference_logprobs(logits, rows, tokens, bitmask, temp, topk, topp, processed, n,
                        min_p=None, edit_ids=None, edit_vals=None):  # fmt: skip
    b, _, v = logits.shape
    safe = rows.clamp(0, logits.shape[1] - 1)
    gathered = logits.gather(1, safe[..., None].expand(-1, -1, v))  # [B, P, V]
    if processed and edit_ids is not None:
        gathered = ref_processors.apply_edits(gathered, edit_ids, edit_vals)
    if processed and bitmask is not None:
        words = bitmask.gather(1, safe[..., None].expand(-1, -1, bitmask.shape[-1]))
        gathered = ref_bitmask.masked_logits(gathered, words)
    if temp is None:
        temp = torch.zeros(b, dtype=torch.float32, device=logits.device)
    live = (rows >= 0) & (tokens >= 0)
    return ref_logprobs.emitted_logprobs(
        gathered, torch.where(live, tokens, -1), live.sum(1),
        "processed" if processed else "raw", n, temp, topk, topp, min_p if processed else None,
    )  # fmt: skip


def _triton_logprobs(*args):
    from specdec_kernels.ops import logprobs  # imports triton: lazily

    return logprobs.emitted_logprobs(*args)


def _triton_accept_reject(draft_tokens, verifier_tokens):
    from specdec_kernels.ops import accept_reject  # imports triton: lazily

    return accept_reject.accept_reject(draft_tokens, verifier_tokens)


def _triton_accept_tests(*args):
    from specdec_kernels.ops import accept_tests  # imports triton: lazily

    return accept_tests.accept_tests_passed(*args)


def _native(name: str) -> Callable:
    def run(*args):
        return getattr(torch.ops.specdec, name)(*args)

    run.__name__ = name
    return run


KV_OPS = ("kv_write_", "kv_compact_", "paged_kv_write_", "paged_kv_compact_")
#: The model kernels (:mod:`specdec_kernels.models`): native only, the extension's op of the same
#: name; a model runs its own PyTorch pass (their reference) where
#: :func:`specdec_kernels._extension.has_op` says the op is missing, so it asks for none here.
MODEL_OPS = (
    "rowinv_linear",
    "rowinv_attention",
    "causal_lm_pass",
    "causal_lm_greedy_chain",
    "causal_lm_draft_pass",
    "causal_lm_draft_chain",
    "causal_lm_draft_sample_chain",
)

#: (op, backend) -> kernel. ``verify_typical`` / ``verify_block`` are the chain op in typical /
#: block mode.
_TABLE: dict[tuple[str, str], Callable] = {
    ("verify_chain", "native"): _native_chain,
    ("verify_chain", "triton"): _triton_chain,
    ("verify_chain", "reference"): _reference_chain,
    ("verify_typical", "native"): _native_chain,
    ("verify_typical", "reference"): _reference_chain,
    ("verify_tree", "native"): _native("native_verify_tree"),
    ("verify_tree", "triton"): _triton_tree,
    ("verify_tree", "reference"): _reference_tree,
    ("verify_block", "native"): _native_chain,
    ("verify_block", "triton"): _triton_chain,
    ("verify_block", "reference"): _reference_chain,
    ("emitted_logprobs", "native"): _native("native_emitted_logprobs"),
    ("emitted_logprobs", "triton"): _triton_logprobs,
    ("emitted_logprobs", "reference"): _reference_logprobs,
    ("accept_reject", "native"): _native("native_accept_reject"),
    ("accept_reject", "triton"): _triton_accept_reject,
    ("accept_reject", "reference"): ref_accept_reject.accept_reject,
    ("accept_tests_passed", "native"): _native("native_accept_tests_passed"),
    ("accept_tests_passed", "triton"): _triton_accept_tests,
    ("accept_tests_passed", "reference"): ref_accept_tests.accept_tests_passed,
    **{(name, "native"): _native("native_" + name) for name in KV_OPS},
    **{(name, "reference"): getattr(ref_kv, name) for name in KV_OPS},
    **{(name, "native"): _native(name) for name in MODEL_OPS},
    # the decoding loop's "auto" (host-side: no backend choice, see native_kernel)
    ("expected_accepts", "native"): _native("native_expected_accepts"),
    ("expected_accepts", "reference"): ref_expected_accepts.expected_accepts,
    ("finish_ms", "native"): _native("native_finish_ms"),
    ("finish_ms", "reference"): ref_finish_ms.finish_ms,
}
#: The extension's op behind each native kernel (an extension built before it has none).
_NATIVE_ENTRY = {
    "verify_chain": "native_verify_ex",
    "verify_typical": "native_verify_ex",
    "verify_block": "native_verify_ex",
    "verify_tree": "native_verify_tree",
    "emitted_logprobs": "native_emitted_logprobs",
    "accept_reject": "native_accept_reject",
    "accept_tests_passed": "native_accept_tests_passed",
    **{name: "native_" + name for name in KV_OPS},
    **{name: name for name in MODEL_OPS},
    "expected_accepts": "native_expected_accepts",
    "finish_ms": "native_finish_ms",
}


def kernel(op: str, backend: str) -> Callable:
    """The kernel that runs ``op`` on a resolved ``backend`` (:func:`resolve_backend`, or
    :func:`kv_backend` for the KV ops): the routing table's entry, or the reference's with a
    one-time ``RuntimeWarning`` where that backend has no kernel for ``op``."""
    impl = _TABLE.get((op, backend))
    if impl is None:
        warn_once(
            f"{op}-{backend}",
            f"specdec_kernels: {op} has no {backend} kernel yet; using the pure-PyTorch reference",
        )
        return _TABLE[(op, "reference")]
    if backend == "native" and not _extension.has_op(_NATIVE_ENTRY[op]):
        warn_once(
            f"{op}-stale-extension",
            f"specdec_kernels: the loaded C++ extension predates the native {op} kernel "
            f"(torch.ops.specdec.{_NATIVE_ENTRY[op]}; rebuild it); using the pure-PyTorch "
            f"reference",
        )
        return _TABLE[(op, "reference")]
    return impl


#: (op, backend) -> (kernel, the chain modes it runs): kernels that do in one pass what a chain of
#: ops does otherwise; where none is listed (or the extension predates it) the caller runs that
#: chain. ``verify_chain_logprobs``: the chain op's arguments plus ``(processed, num_logprobs)``
#: -> ``(tokens, accepted, logprobs, top_logprobs, top_ids)``.
_FUSED: dict[tuple[str, str], tuple[Callable, tuple[str, ...], str | None]] = {
    ("verify_chain_logprobs", "native"): (
        _native_chain_logprobs,
        ("greedy", "sampling", "block"),
        "native_verify_logprobs",
    ),
    ("verify_chain_logprobs", "triton"): (
        _triton_chain_logprobs,
        ("greedy", "sampling", "block"),
        None,
    ),
}


def fused_kernel(op: str, backend: str, mode: str) -> Callable | None:
    """The one-pass kernel of ``op`` on ``backend`` for chain mode ``mode``, or ``None`` (no
    warning: the caller's chain of ops is exact, only slower)."""
    entry = _FUSED.get((op, backend))
    if entry is None or mode not in entry[1]:
        return None
    impl, _, native_op = entry
    if native_op is not None and not _extension.has_op(native_op):
        return None
    return impl


@contextlib.contextmanager
def chained(op: str, backend: str):
    """Inside the ``with`` block ``op`` has no one-pass kernel on ``backend``
    (:func:`fused_kernel` answers ``None``): its callers run their chain of ops, as before the
    kernel existed (the traffic table's before rows). Process-wide; not thread-safe."""
    entry = _FUSED.pop((op, backend), None)
    try:
        yield
    finally:
        if entry is not None:
            _FUSED[(op, backend)] = entry


def native_kernel(op: str) -> Callable | None:
    """The native kernel of ``op`` where the loaded extension has it, else ``None``: for the
    decoding loop's host-side ops (``expected_accepts``, ``finish_ms``), which steer ``K`` and
    verify nothing, so ``backend=`` and ``SPECDEC_BACKEND`` do not apply and no warning is due;
    the caller runs the reference (``kernel(op, "reference")``) where this is ``None`` or where
    the kernel does not cover its arguments."""
    if not _extension.has_op(_NATIVE_ENTRY[op]):
        return None
    return _TABLE[(op, "native")]


_kv_forced = 0
_kv_forced_lock = threading.Lock()


def kv_backend(op: str, device: torch.device) -> str:
    """``"native"`` where the extension has a kernel of the KV op ``op`` for ``device`` and
    :func:`force_kv_reference` is not active, else ``"reference"`` (with a one-time warning
    unless the reference was asked for)."""
    if _kv_forced:
        return "reference"
    if device.type in _extension.native_devices():
        return "native"
    reason = _extension.load_error() or f"it has no kernel for {device.type} tensors"
    warn_once(
        f"kv-fallback-{op}-{device.type}",
        f"specdec_kernels: torch.ops.specdec.{op} runs the pure-PyTorch fallback because "
        f"{reason}; build the extension for the C++/CUDA kernels",
    )
    return "reference"


def kv_reference_forced() -> bool:
    """True inside :func:`force_kv_reference`."""
    return _kv_forced > 0


@contextlib.contextmanager
def force_kv_reference():
    """Run the KV-cache ops with the pure-PyTorch fallback inside the ``with`` block (no
    warning). Process-wide: other threads calling the ops meanwhile get the fallback too.
    Blocks nest."""
    global _kv_forced
    with _kv_forced_lock:
        _kv_forced += 1
    try:
        yield
    finally:
        with _kv_forced_lock:
            _kv_forced -= 1
