"""Every ``torch.ops.specdec.*`` op, with sample arguments for ``torch.library.opcheck``.

One :class:`Case` per (op, variant): the op's name in ``torch.ops.specdec``, a label, a builder of
its arguments on a device, what it needs to run (``"extension"``: ``specdec_kernels._C``, the
native entries, the native backend and the row-invariant model kernels; ``"triton_slow"``: a
Triton variant that runs only with ``-m slow``), the devices it runs on and the context it runs
in (the KV ops' native kernels or their forced fallback). The ``native_*`` entries are the C++
CPU kernels behind the public ops, registered without a fake kernel (the public op that calls
them has one), so only their schema and autograd registration are checked
(:data:`NATIVE_UTILS`). ``test_custom_ops.py`` runs opcheck on
each case and fails when an op registered in the ``specdec`` namespace has no case here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdec_kernels.kv_cache import force_fallback
from specdec_kernels.reference.processors import logit_edits

from helpers import (
    DEVICES,
    PLAIN_CHAIN,
    flatten_layout,
    make_draft_probs,
    make_inputs,
    random_draft_probs,
    random_trees,
)
from kv_helpers import random_values


@dataclass(frozen=True)
class Case:
    op: str  # the name in torch.ops.specdec
    label: str
    args: Callable[[torch.device], tuple]
    needs: str | None = None  # "extension" | "triton_slow" | None
    devices: tuple = ("cpu",)
    context: Callable[[], contextlib.AbstractContextManager] = field(default=contextlib.nullcontext)
    utils: tuple | None = None  # opcheck's test_utils; None: all of them

    @property
    def id(self) -> str:
        return f"{self.op}[{self.label}]"


#: opcheck's checks that apply to an op without a fake kernel.
NATIVE_UTILS = ("test_schema", "test_autograd_registration")


def _native(op, label, args) -> Case:
    return Case(op, label, args, "extension", utils=NATIVE_UTILS)


def _on(device, *args) -> tuple:
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


# ---------------------------------------------------------------- chain verification
def _chain_greedy(backend):
    def args(device):
        logits, drafts, _ = make_inputs(3, 4, 40, strided=True)
        nd = torch.tensor([4, 2, 0])
        return _on(device, logits, drafts, None, nd, *(None,) * 7, "greedy", False, 0.0, 0.0,
                   None, None, None, None, backend)  # fmt: skip

    return args


def _chain_sampling(backend, filters):
    def args(device):
        logits, _, _ = make_inputs(3, 4, 40)
        q, drafts = make_draft_probs(3, 4, 40)
        top_k = torch.tensor([0, 5, 40]) if filters else None
        top_p = torch.tensor([0.9, 1.0, 0.5]) if filters else None
        temperature = torch.tensor([1.0, 0.0, 0.7])
        nd, seeds = torch.tensor([4, 3, 1]), torch.tensor([1, 2, 3])
        min_p = torch.tensor([0.0, 0.1, 0.05]) if filters else None
        edits = (None, None)
        if filters:  # the processors' edit list too: a repetition penalty over a short context
            edits = logit_edits(logits, drafts, nd, torch.tensor([[1, 2], [3, -1], [5, 5]]),
                                repetition_penalty=1.5)  # fmt: skip
        return _on(device, logits, drafts, q, nd, temperature, top_k, top_p, seeds, None, None,
                   None, "sampling", False, 0.0, 0.0, min_p, *edits, None, backend)  # fmt: skip

    return args


def _chain_logprobs(backend, sampling):
    """``verify_chain_logprobs``: the chain op's arguments (filters and edits on the sampled
    rows), then ``processed`` and ``num_logprobs``."""

    def args(device):
        chain = (_chain_sampling(backend, True) if sampling else _chain_greedy(backend))(device)
        return (*chain[:-1], sampling, 3, backend)

    return args


def _native_verify_logprobs(device):
    """``native_verify_logprobs``: the sampled chain of :func:`_chain_logprobs` (filters, edits)
    in ``native_verify_ex``'s argument order, then ``processed`` and ``num_logprobs``."""
    chain = _chain_sampling("native", True)(device)
    (logits, drafts, q, nd, temperature, top_k, top_p, seeds, lrs, prs, bitmask, _, log_input,
     threshold, alpha, min_p, ids, vals, inv, _) = chain  # fmt: skip
    return (logits, drafts, q, nd, temperature, top_k, top_p, seeds, False, lrs, prs, bitmask,
            log_input, 0, threshold, alpha, min_p, ids, vals, inv, True, 3)  # fmt: skip


def _accept_reject(backend):
    def args(device):
        a = torch.tensor([[1, 2, 3], [4, 5, 6]])
        return _on(device, a, a.flip(1).contiguous(), backend)

    return args


def _chain_inputs(mode):
    """``verify_chain``'s first 15 arguments in the other input forms: flat-row probabilities
    (``"sampling"``), typical acceptance (``"typical"``), block verification with a token bitmask
    (``"block"``)."""
    b, k, v = 3, 2, 40
    logits, drafts, _ = make_inputs(b, k, v)
    nd = torch.tensor([2, 0, 1])
    flat = mode == "sampling"
    if flat:  # flat [num_tokens + B, V] probabilities with the row offsets
        q, drafts = make_draft_probs(b, k, v)
        target, _, q, cu = flatten_layout(torch.softmax(logits, -1), drafts, nd, q)
        starts = (cu - nd, cu - nd + torch.arange(b))
    else:
        target, q, starts = logits, None, (None, None)
    mask = None
    if mode == "block":  # every other token allowed
        mask = torch.full((b, k + 1, (v + 31) // 32), 0x55555555, dtype=torch.int32)
    temperature, seeds = torch.tensor([1.0, 0.0, 0.7]), torch.tensor([1, 2, 3])
    return (
        target, drafts, q, nd, temperature, None, None, seeds, starts[1], starts[0], mask, mode,
        flat, 0.09, 0.3,
    )  # fmt: skip


def _chain_form(backend, mode):
    return lambda device: _on(device, *_chain_inputs(mode), None, None, None, None, backend)


def _native_verify_ex_plain(device):
    logits, drafts, nd = make_inputs(2, 3, 30, ragged=True)
    return _on(device, logits, drafts, None, nd, None, None, None, None, True, *PLAIN_CHAIN)


def _native_verify_ex(mode):
    def args(device):
        (target, drafts, q, nd, temperature, top_k, top_p, seeds, logits_start, probs_start,
         bitmask, mode_, flat, threshold, alpha) = _chain_inputs(mode)  # fmt: skip
        native_mode = {"sampling": 0, "block": 1, "typical": 2}[mode]
        return _on(
            device, target, drafts, q, nd, temperature, top_k, top_p, seeds, False,
            logits_start, probs_start, bitmask, flat, native_mode, threshold, alpha,
        )  # fmt: skip

    return args


def _emitted_logprobs(backend):
    def args(device):
        logits, _, _ = make_inputs(3, 4, 40)
        rows = torch.tensor([[0, 1, -1, -1, -1], [0, 1, 2, 3, 4], [4, -1, -1, -1, -1]])
        tokens = torch.where(rows >= 0, torch.tensor([5, 7, 9, 11, 13]), -1)
        mask = torch.full((3, 5, 2), -1, dtype=torch.int32)
        mask[1, :, 0] = 0x0F0F0F0F
        temperature, top_k = torch.tensor([1.0, 0.0, 0.7]), torch.tensor([0, 5, 3])
        min_p = torch.tensor([0.05, 0.0, 0.2])
        drafts, context = (
            torch.zeros(3, 4, dtype=torch.int64),
            torch.tensor([[5, 1], [7, 7], [-1, 2]]),
        )
        ids, vals = logit_edits(logits, drafts, torch.zeros(3), context, presence_penalty=0.5)
        return _on(device, logits, rows, tokens, mask, temperature, top_k, None, True, 3, min_p,
                   ids, vals, backend)  # fmt: skip

    return args


def _native_emitted_logprobs(device):
    return _emitted_logprobs("native")(device)[:9]


def _native_logit_edits(device):
    logits, drafts, _ = make_inputs(2, 3, 40)
    nd, context = torch.tensor([3, 1]), torch.tensor([[1, 2, 2], [5, -1, -1]])
    bias = (torch.tensor([[7], [8]]), torch.tensor([[1.5], [-2.0]]))
    penalty = torch.tensor([1.2, 0.9])
    return _on(device, logits, drafts, nd, context, *bias, penalty, penalty, penalty, None)


def _accept_tests(backend):
    def args(device):
        q = torch.softmax(torch.randn(3, 2, 7), -1)
        p = torch.softmax(torch.randn(3, 3, 7), -1)
        d = torch.tensor([[1, 2], [3, 9], [0, 6]])
        return _on(device, q, d, p, torch.tensor([5, -1, 7]), torch.tensor([-1, 0, 1]), backend)

    return args


def _native_accept_tests(device):
    return _accept_tests("native")(device)[:5]


def _native_expected_accepts(device):
    logits = torch.randn(3, 3, 7).to(torch.bfloat16)
    q = torch.softmax(torch.randn(3, 2, 7), -1)
    return _on(device, logits, q, torch.tensor([0, 2, 1]), torch.tensor([2, 2, 0]), 0.7)


def _native_finish_ms(device):
    quantiles = (-1.15, -0.32, 0.32, 1.15)
    return (
        [0.8, 0.3],
        [12.0, 5.0],
        quantiles,
        [float(j % 8 + k) for k in range(3) for j in range(8)],
        2,
    )


def _native_accept_reject(device):
    return _accept_reject("native")(device)[:2]


# ---------------------------------------------------------------- tree verification
def _tree_inputs():
    logits, tokens, parents, nn = random_trees(3, 5, 11, seed=2)
    q = random_draft_probs(3, 5, 11)
    return logits, tokens, parents, nn, q, torch.tensor([0.0, 0.7, 1.0]), torch.tensor([1, 2, 3])


def _tree_greedy(backend):
    def args(device):
        logits, tokens, parents, nn, *_ = _tree_inputs()
        return _on(device, logits, tokens, parents, nn, None, backend)

    return args


def _tree_sampling(backend):
    def args(device):
        logits, tokens, parents, nn, q, temp, seeds = _tree_inputs()
        return _on(
            device, logits, tokens, parents, q, nn, 1, temp, None, None, seeds, None, backend
        )

    return args


def _tree_sampling_probs(backend):
    """The SGLang drop-in's form: probabilities read as ``log p`` (``log_input``)."""

    def args(device):
        logits, tokens, parents, nn, q, temp, seeds = _tree_inputs()
        probs = torch.softmax(logits, -1)
        ones = torch.ones(3)
        return _on(
            device, probs, tokens, parents, None, nn, 0, ones, None, None, seeds, None, backend,
            True,
        )  # fmt: skip

    return args


def _native_verify_tree(device):
    logits, tokens, parents, nn, q, temp, seeds = _tree_inputs()
    mask = torch.full((3, 5, 1), 0x7F7, dtype=torch.int32)  # token 3 forbidden
    return _on(device, logits, tokens, parents, q, nn, 1, temp, None, None, seeds, mask, False)


# ---------------------------------------------------------------- KV caches
def kv_args(device="cpu") -> dict[str, tuple]:
    """Sample arguments of the four public KV ops (the native ones take the same)."""
    g = torch.Generator().manual_seed(1)
    cache = random_values((2, 2, 3, 3, 7, 5), torch.float32, generator=g)
    paged = random_values((2, 2, 7, 3, 3, 5), torch.float32, generator=g)
    k = random_values((3, 3, 2, 5), torch.float32, generator=g)
    v = random_values((3, 3, 2, 5), torch.float32, generator=g)
    tables = torch.tensor([[4, 1, -1], [0, 6, 2], [3, -1, -1]], dtype=torch.int32)
    args = {
        "kv_write_": (cache, 1, k, v, torch.tensor([0, 5, 2])),
        "kv_compact_": (
            cache,
            torch.tensor([[3, 2, 4], [6, 5, 0], [1, 1, 9]]),
            torch.tensor([3, 2, 0]),
            torch.tensor([1, 4, 0]),
        ),
        "paged_kv_write_": (paged, 0, k, v, tables, torch.tensor([2, 7, 0])),
        "paged_kv_compact_": (
            paged,
            tables,
            torch.tensor([[5, 2, 3], [8, 4, 0], [0, 0, 0]]),
            torch.tensor([2, 3, 1]),
            torch.tensor([2, 3, 0]),
        ),
    }
    return {name: _on(device, *t) for name, t in args.items()}


def _kv(name):
    return lambda device: kv_args(device)[name]


# ---------------------------------------------------------------- row-invariant model kernels
def _rowinv_linear(device):
    return _on(device, torch.randn(3, 32), torch.randn(5, 32), torch.randn(5))


def _rowinv_linear_gelu(device):
    return _rowinv_linear(device) + ("gelu_tanh",)


def _rowinv_attention(device):
    q = torch.randn(1, 2, 3, 16)
    return _on(device, q, q, q, torch.ones(1, 1, 3, 3, dtype=torch.bool).tril())


def _causal_lm_pass(device):
    from specdec_kernels.models import CausalLM, CausalLMConfig

    cfg = CausalLMConfig(vocab_size=11, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    model = CausalLM(cfg).eval()
    cache = model.new_cache(2, 16)
    cache.advance(torch.tensor([3, 5]))
    weights = [w.detach() for w in model._pass_weights()]
    ids, index = torch.tensor([[1, 2], [3, 4]]), torch.tensor([1, 0])
    return _on(device, ids, cache.kv, cache.lengths, 8, index) + (weights, 2, 1e-5)


def _causal_lm_greedy_chain(device):
    ids, kv, lengths, kv_len, _, weights, heads, eps = _causal_lm_pass(device)
    num_valid = torch.tensor([2, 1], device=ids.device)
    return (ids, kv, lengths, num_valid, kv_len, 3, weights, heads, eps)


def _causal_lm_draft_sample_chain(device):
    args = _causal_lm_greedy_chain(device)
    return args + (torch.tensor([7, 8], device=args[0].device), 0.8, 5, 0.9)


# ---------------------------------------------------------------- the registry
def _backends(make, *extra, triton="triton"):
    """One case per backend: the native one needs the extension; ``triton="triton_slow"``
    runs the Triton one only with ``-m slow``."""
    return [
        ("reference", make("reference", *extra), None),
        ("triton", make("triton", *extra), "triton_slow" if triton == "triton_slow" else None),
        ("native", make("native", *extra), "extension"),
    ]


def _cases() -> list[Case]:
    cases = []
    for label, args, needs in _backends(_chain_greedy):
        cases.append(Case("verify_chain", f"greedy-{label}", args, needs))
    for filters in (False, True):
        for label, args, needs in _backends(_chain_sampling, filters):
            cases.append(Case("verify_chain", f"sampling-{label}-filters={filters}", args, needs))
    for label, args, needs in _backends(_accept_reject):
        cases.append(Case("accept_reject", label, args, needs))
    for mode in ("sampling", "typical", "block"):  # flat probabilities; typical; block + mask
        triton = ("triton",) if mode == "block" else ()  # typical has no Triton kernel
        for backend in ("reference", "native", *triton):
            needs = "extension" if backend == "native" else None
            label = f"{mode}-form-{backend}"
            cases.append(Case("verify_chain", label, _chain_form(backend, mode), needs))
        cases.append(_native("native_verify_ex", mode, _native_verify_ex(mode)))
    for label, args, needs in _backends(_emitted_logprobs):
        cases.append(Case("emitted_logprobs", label, args, needs))
    # the Triton one-pass kernels: tests/test_logprobs_fused_triton.py; opcheck's repeated calls
    # under the interpreter (~40 s) only with -m slow
    for label, args, needs in _backends(_chain_logprobs, True, triton="triton_slow"):
        cases.append(Case("verify_chain_logprobs", f"sampling-{label}", args, needs))
    for label, args, needs in _backends(_chain_logprobs, False, triton="triton_slow"):
        cases.append(Case("verify_chain_logprobs", f"greedy-{label}", args, needs))
    cases.append(_native("native_emitted_logprobs", "", _native_emitted_logprobs))
    cases.append(_native("native_verify_logprobs", "", _native_verify_logprobs))
    cases.append(_native("native_logit_edits", "", _native_logit_edits))
    cases.append(_native("native_verify_ex", "plain-greedy", _native_verify_ex_plain))
    cases.append(_native("native_accept_reject", "", _native_accept_reject))
    for label, args, needs in _backends(_accept_tests):
        cases.append(Case("accept_tests_passed", label, args, needs))
    cases.append(_native("native_accept_tests_passed", "", _native_accept_tests))
    cases.append(_native("native_expected_accepts", "", _native_expected_accepts))
    cases.append(_native("native_finish_ms", "", _native_finish_ms))
    for label, args, needs in _backends(_tree_greedy, triton="triton_slow"):
        cases.append(Case("verify_tree_greedy", label, args, needs))
    for label, args, needs in _backends(_tree_sampling, triton="triton_slow"):
        cases.append(Case("verify_tree_sampling", label, args, needs))
    for label, args, needs in _backends(_tree_sampling_probs, triton="triton_slow"):
        cases.append(Case("verify_tree_sampling", f"log_input-{label}", args, needs))
    cases.append(_native("native_verify_tree", "independent", _native_verify_tree))
    for name in ("kv_write_", "kv_compact_", "paged_kv_write_", "paged_kv_compact_"):
        devices = tuple(DEVICES)
        cases.append(Case(name, "native", _kv(name), "extension", devices))
        cases.append(Case(name, "fallback", _kv(name), None, devices, force_fallback))
        cases.append(_native("native_" + name, "", _kv(name)))
    cases.append(Case("rowinv_linear", "bias", _rowinv_linear, "extension"))
    cases.append(Case("rowinv_linear", "gelu", _rowinv_linear_gelu, "extension"))
    cases.append(Case("rowinv_attention", "causal", _rowinv_attention, "extension"))
    cases.append(Case("causal_lm_pass", "one_layer", _causal_lm_pass, "extension"))
    cases.append(Case("causal_lm_greedy_chain", "one_layer", _causal_lm_greedy_chain, "extension"))
    cases.append(
        Case(
            "causal_lm_draft_sample_chain", "one_layer", _causal_lm_draft_sample_chain, "extension"
        )
    )
    cases.append(Case("causal_lm_draft_chain", "one_layer", _causal_lm_greedy_chain, "extension"))
    cases.append(Case("causal_lm_draft_pass", "one_layer", _causal_lm_pass, "extension"))
    return cases


CASES = _cases()
#: The op names the registry covers.
REGISTERED = {c.op for c in CASES}
