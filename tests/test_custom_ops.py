"""The verification ops are real torch.library custom ops: opcheck, and torch.compile traces
them."""

import pytest
import torch

import specdec_kernels as sk  # noqa: F401  (registers torch.ops.specdec.*)

from conftest import ALL_BACKENDS
from helpers import make_draft_probs, make_inputs


def _greedy_args(backend):
    logits, drafts, _ = make_inputs(3, 4, 40, strided=True)
    return (logits, drafts, torch.tensor([4, 2, 0]), backend)


def _sampling_args(backend, filters):
    logits, _, _ = make_inputs(3, 4, 40)
    q, drafts = make_draft_probs(3, 4, 40)
    top_k = torch.tensor([0, 5, 40]) if filters else None
    top_p = torch.tensor([0.9, 1.0, 0.5]) if filters else None
    return (
        logits,
        drafts,
        q,
        torch.tensor([4, 3, 1]),
        torch.tensor([1.0, 0.0, 0.7]),
        top_k,
        top_p,
        torch.tensor([1, 2, 3]),
        backend,
    )


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_opcheck_verify_greedy(backend):
    torch.library.opcheck(torch.ops.specdec.verify_greedy.default, _greedy_args(backend))


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("filters", [False, True])
def test_opcheck_verify_sampling(backend, filters):
    torch.library.opcheck(
        torch.ops.specdec.verify_sampling.default, _sampling_args(backend, filters)
    )


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_opcheck_accept_reject(backend):
    a = torch.tensor([[1, 2, 3], [4, 5, 6]])
    torch.library.opcheck(
        torch.ops.specdec.accept_reject.default, (a, a.flip(1).contiguous(), backend)
    )


def test_torch_compile_fullgraph_traces_through():
    logits, _, _ = make_inputs(3, 4, 40)
    q, drafts = make_draft_probs(3, 4, 40)
    seeds = torch.tensor([5, 6, 7])

    def step(logits, drafts, q, seeds):
        g = sk.verify_greedy(logits, drafts, backend="reference", validate=False)
        s = sk.verify_sampling(
            logits,
            drafts,
            q,
            temperature=0.8,
            top_k=10,
            top_p=0.9,
            seed=seeds,
            backend="reference",
            validate=False,
        )
        n = sk.accept_reject(drafts, g.tokens[:, :4], backend="reference")
        return g.tokens, s.tokens, s.num_emitted + n

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for eager, traced in zip(step(logits, drafts, q, seeds), compiled(logits, drafts, q, seeds)):
        assert torch.equal(eager, traced)
