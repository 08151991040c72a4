"""Every ``torch.ops.specdec`` op is a real torch.library custom op: opcheck on each case of the
one registry (``op_registry.py``), which must name every op of the namespace; torch.compile
traces the verification ops."""

import pytest
import torch

import specdec_kernels as sk  # noqa: F401  (registers torch.ops.specdec.*)
from specdec_kernels._dispatch import native_available

from helpers import DEVICES, make_draft_probs, make_inputs
from op_registry import CASES, REGISTERED


def _param(case):
    marks = []
    if case.needs == "extension":
        marks.append(pytest.mark.skipif(not native_available(), reason="_C is not built"))
    elif case.needs == "triton_slow":
        marks.append(pytest.mark.slow)
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_opcheck(case, device):
    """``torch.library.opcheck`` (schema, fake, autograd registration, dispatch) on every op."""
    if device not in case.devices:
        pytest.skip(f"{case.op} runs on {case.devices}")
    with case.context():
        op = getattr(torch.ops.specdec, case.op).default
        args = case.args(torch.device(device))
        if case.utils is None:
            torch.library.opcheck(op, args)
        else:
            torch.library.opcheck(op, args, test_utils=case.utils)


def _namespace() -> set[str]:
    prefix = "specdec::"
    names = torch._C._dispatch_get_all_op_names()
    return {n[len(prefix) :].split(".")[0] for n in names if n.startswith(prefix)}


def test_every_registered_op_is_in_the_registry():
    """A new ``torch.ops.specdec`` op fails here until ``op_registry.py`` has a case for it."""
    missing = _namespace() - REGISTERED
    assert not missing, f"ops without an opcheck case in tests/op_registry.py: {sorted(missing)}"


def test_the_registry_names_only_registered_ops():
    stale = REGISTERED - _namespace()
    if not native_available():  # the native entries exist only where _C is loaded
        stale -= {c.op for c in CASES if c.needs == "extension"}
    assert not stale, f"tests/op_registry.py names ops that are not registered: {sorted(stale)}"


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
