"""The bundled draft/target pair: byte-level models trained on the Python standard library.

Trained by ``scripts/train_bundled.py``; the weights ship in ``specdec_kernels/assets`` as
float16 safetensors (loaded as float32). Token ids are byte values, ``256`` is ``<eos>``.
"""

from __future__ import annotations

import functools
import json
import os

import torch

from specdec_kernels.models.causal_lm import CausalLM, CausalLMConfig

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
EOS_ID = 256
VOCAB_SIZE = 257


def _config(n_embd: int, n_layer: int, n_head: int) -> CausalLMConfig:
    return CausalLMConfig(
        vocab_size=VOCAB_SIZE,
        n_positions=256,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        eos_token_id=EOS_ID,
    )


#: The bundled pairs by name: ``(target config, draft config)``. ``"default"`` is the pair where
#: speculation pays on a CPU (a 10.8M-parameter target, its two-layer draft ~1/25 of its
#: multiply-adds; the draft was trained with one layer, then grown to two, docs/generation.md);
#: ``"tiny"`` is the first pair (1.9M-parameter target), kept because it makes tests fast.
PAIRS: dict[str, tuple[CausalLMConfig, CausalLMConfig]] = {
    "default": (_config(384, 6, 6), _config(128, 2, 2)),
    "tiny": (_config(192, 4, 3), _config(128, 1, 2)),
}
TARGET_CONFIG, DRAFT_CONFIG = PAIRS["default"]


def pair_dir(name: str = "default") -> str:
    """The folder that holds pair ``name``'s weights, ``heldout.txt`` and ``acceptance.json``
    (and, in a checkout, not in the wheel, the training logs ``train_log*.json``)."""
    if name not in PAIRS:
        raise ValueError(f"name must be one of {sorted(PAIRS)}, got {name!r}")
    return os.path.join(ASSETS, name)


def encode(text: str) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids (no ``<eos>``)."""
    return list(text.encode("utf-8"))


def decode(ids) -> str:
    """Text of token ids; ``<eos>`` and invalid UTF-8 are replaced, not raised on."""
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def _dtype_arg(name: str, value) -> torch.dtype | str:
    """``value`` as a floating ``torch.dtype`` (a dtype's name like ``"bfloat16"`` taken too),
    or ``"auto"``; anything else raises naming the argument."""
    if value == "auto":
        return value
    named = getattr(torch, value, None) if isinstance(value, str) else value
    if isinstance(named, torch.dtype) and named.is_floating_point:
        return named
    raise ValueError(f"{name} must be a floating torch.dtype, its name or 'auto', got {value!r}")


def load_bundled(
    name: str = "default",
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    *,
    draft_dtype: torch.dtype | str | None = None,
    row_invariant: bool | None = None,
    draft_threads: int | str | None = None,
) -> tuple[CausalLM, CausalLM]:
    """``(target, draft)``: bundled pair ``name`` (``"default"`` or ``"tiny"``), in eval mode.

    Parameters
    ----------
    dtype : torch.dtype, a dtype's name or "auto"
        The target's dtype (``torch.bfloat16`` or ``"bfloat16"``). ``"auto"``: the fastest of
        float32 and bfloat16 for this target on this machine (:func:`fastest_dtype`: measured
        once, cached), bfloat16 where the CPU has the matrix or dot-product units for it,
        float32 where nothing faster exists.
    draft_dtype : torch.dtype, a dtype's name or "auto", optional
        The draft's dtype; default ``dtype`` (with ``"auto"`` the draft's own fastest: a model
        this small is often fastest in float32).
    row_invariant : bool, optional
        Run both models on the row-invariant native kernels (:attr:`CausalLM.row_invariant`),
        so that the speculative loop's greedy output is bitwise the target's own greedy decoding.
        Default: on where they exist (CPU, float32 or bfloat16, C++ extension built).
    draft_threads : int or "auto", optional
        The draft's :attr:`CausalLM.num_threads`; default ``None``, the process's thread count.
        ``"auto"``: one or every core, whichever runs its one-token pass fastest here
        (:func:`fastest_threads`: measured once, cached); on a CPU a draft this small is usually
        fastest on one thread while the target beside it gains from every core.

    Examples
    --------
    >>> target, draft = load_bundled()
    >>> target.config.n_layer, target.config.n_embd, draft.config.n_layer
    (6, 384, 2)
    >>> load_bundled("tiny")[0].config.n_layer
    4
    """
    folder = pair_dir(name)
    paths = (os.path.join(folder, "target.safetensors"), os.path.join(folder, "draft.safetensors"))
    dtype = _dtype_arg("dtype", dtype)
    draft_dtype = None if draft_dtype is None else _dtype_arg("draft_dtype", draft_dtype)
    dtypes = [dtype, dtype if draft_dtype is None else draft_dtype]
    models = []
    for path, dt, tokens in zip(paths, dtypes, ((1, 5), (1,))):
        if dt == "auto":
            dt = fastest_dtype(
                lambda d, path=path: CausalLM.load(path, d, device), device, tokens=tokens
            )
        model = CausalLM.load(path, dt, device)
        on = row_invariant_available(model) if row_invariant is None else row_invariant
        model.row_invariant = on
        models.append(model)
    draft = models[1]
    draft.acceptance_prior = stated_acceptance(name)
    if draft_threads == "auto":
        if torch.device(device).type == "cpu":
            dt = draft.lm_head.weight.dtype
            draft.num_threads = fastest_threads(
                lambda: CausalLM.load(paths[1], dt, device), tokens=(1,)
            )
    elif draft_threads is not None:
        try:
            draft.num_threads = draft_threads
        except ValueError:
            raise ValueError(
                f"draft_threads must be None, 'auto' or a positive int, got {draft_threads!r}"
            ) from None
    return models[0], draft


@functools.cache
def stated_acceptance(name: str = "default") -> float | None:
    """Pair ``name``'s greedy acceptance rate at ``K = 1`` on its held-out text, as its
    ``train_log.json`` recorded it when the pair was exported, read from the copy of that table
    that ships in the wheel, ``acceptance.json`` (``acceptance_heldout_greedy``:
    at ``K = 1`` accepted over drafted is the per-token acceptance itself); ``None`` where the
    log has none. The prior that ``"auto"`` starts from with this pair (``CausalLM.
    acceptance_prior``), instead of a guess for any pair: with the default pair's two-layer
    draft (0.89 then, 0.91 now) a guess of 0.7 priced drafting at the demo's batch of 3 as a
    loss in one run of four, which then decoded with the target alone (0.94x)."""
    try:
        with open(os.path.join(pair_dir(name), "acceptance.json")) as fh:
            table = json.load(fh)["acceptance_heldout_greedy"]
        rate = float(table["1"]["acceptance_rate"])
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return rate if 0 < rate < 1 else None


def row_invariant_available(model: CausalLM) -> bool:
    """Whether :attr:`CausalLM.row_invariant` can be turned on for ``model`` here."""
    return model.row_invariant_problem() is None


#: Candidates of :func:`fastest_dtype`, in order of preference on a tie.
DTYPE_CANDIDATES = (torch.float32, torch.bfloat16)


def fastest_dtype(
    load, device="cpu", *, tokens=(1, 5), repeats: int = 7, cache: bool = True
) -> torch.dtype:
    """The dtype of :data:`DTYPE_CANDIDATES` in which ``load(dtype)`` (a ``CausalLM``) runs
    cached passes of ``tokens`` tokens (default a one-token plus a five-token pass: a target's
    passes in a speculative step; a draft's are ``(1,)``) fastest on this machine, row-invariant
    kernels on where available; measured once and cached beside the pass
    costs (:func:`specdec_kernels.tuning._timing.cache_path`), keyed by the model's config, the CPU,
    the thread count and the torch version.
    """
    import json

    from specdec_kernels.tuning._timing import cpu_name, kernels_id, passes_ms, remembered

    probe = load(DTYPE_CANDIDATES[0])
    key = "dtype:" + json.dumps(
        dict(
            config=repr(probe.config),
            tokens=list(tokens),
            cpu=cpu_name(),
            kernels=kernels_id(),
            threads=torch.get_num_threads(),
            torch=torch.__version__,
        ),
        sort_keys=True,
    )

    def measure() -> torch.dtype:
        # every candidate's passes timed round-robin: a slow spell of the machine falls on all
        # of them (timed one dtype after the other, one disturbed spell chose float32 here on
        # a CPU where bfloat16 runs the default target's passes 1.3x faster, and stayed cached)
        models = []
        for dt in DTYPE_CANDIDATES:
            model = probe if dt == probe.lm_head.weight.dtype else load(dt)
            model.row_invariant = row_invariant_available(model)
            models.append(model)
        ms = passes_ms([(m, 1, t) for m in models for t in tokens], 64, repeats)
        return DTYPE_CANDIDATES[_least_total(ms, len(tokens))]

    return remembered(
        key,
        measure,
        dump=lambda dt: str(dt).replace("torch.", ""),
        load=lambda name: _DTYPE_NAMES[name],
        cache=cache,
    )


def fastest_threads(load, *, tokens=(1, 5), repeats: int = 7, cache: bool = True) -> int:
    """The torch thread count, one or every core (``os.cpu_count()``), at which ``load()`` (a
    ``CausalLM``) runs cached passes of ``tokens`` tokens at batch 1 fastest here (default a
    one-token plus a five-token pass, a target's in a speculative step; a draft's are ``(1,)``);
    measured once and cached like :func:`fastest_dtype`. Sets nothing: the caller calls
    ``torch.set_num_threads`` with the result, or sets :attr:`CausalLM.num_threads`."""
    import json

    from specdec_kernels.tuning._timing import cpu_name, kernels_id, passes_ms, remembered

    cores = os.cpu_count() or 1
    model = load()
    key = "threads:" + json.dumps(
        dict(
            config=repr(model.config),
            dtype=str(model.lm_head.weight.dtype),
            tokens=list(tokens),
            cpu=cpu_name(),
            kernels=kernels_id(),
            cores=cores,
            torch=torch.__version__,
        ),
        sort_keys=True,
    )

    def measure() -> int:
        model.row_invariant = row_invariant_available(model)
        counts = sorted({1, cores})
        # round-robin over the thread counts, as fastest_dtype over its dtypes
        ms = passes_ms([(model, 1, t, n) for n in counts for t in tokens], 64, repeats)
        return counts[_least_total(ms, len(tokens))]

    return remembered(key, measure, load=_thread_count, cache=cache)


def _thread_count(n) -> int:
    """A thread count read back from the cache, checked: an int in ``1 .. os.cpu_count()``,
    else ``ValueError`` (measured again: 100000 threads made ``specdec demo`` die with SIGSEGV,
    0 with a RuntimeError)."""
    cores = os.cpu_count() or 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= cores:
        raise ValueError(f"a thread count must be an int in 1 .. {cores}, got {n!r}")
    return n


def _least_total(ms: list[float], n: int) -> int:
    """The candidate whose ``n`` consecutive entries of ``ms`` sum least (the first of
    equals): the pick of :func:`fastest_dtype` and :func:`fastest_threads`."""
    totals = [sum(ms[i : i + n]) for i in range(0, len(ms), n)]
    return totals.index(min(totals))


def target_threads(name: str = "default", assets: str | None = None) -> int:
    """:func:`fastest_threads` for the target of bundled pair ``name`` (or of the folder
    ``assets``): the thread count ``specdec demo`` and ``specdec bench e2e`` run on with
    ``--threads auto``."""
    folder = pair_dir(name) if assets is None else assets
    return fastest_threads(lambda: CausalLM.load(os.path.join(folder, "target.safetensors")))


_DTYPE_NAMES = {str(d).replace("torch.", ""): d for d in DTYPE_CANDIDATES}


def heldout_text(name: str = "default") -> str:
    """The fixed held-out text (a stdlib file the pair was not trained on) shipped with it."""
    with open(os.path.join(pair_dir(name), "heldout.txt"), encoding="utf-8") as fh:
        return fh.read()
