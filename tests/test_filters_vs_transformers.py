"""The top-k / top-p kept set equals transformers' TopK/TopP warpers' on rows without ties, and
the documented tie rule (all tokens tied at the top-p threshold kept) holds where they differ."""

import zlib

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.generation.logits_process import (  # noqa: E402
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specdec_kernels.reference.verify_sampling import filtered_probs  # noqa: E402

ROWS, V = 4000, 101


def _warped(logits, temperature, top_k, top_p):
    x = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        x = TopKLogitsWarper(top_k)(None, x)
    if top_p is not None:
        x = TopPLogitsWarper(top_p)(None, x)
    return torch.isfinite(x)


def _ours(logits, temperature, top_k, top_p):
    n = logits.shape[0]
    p = filtered_probs(
        logits[:, None],
        torch.full((n,), temperature),
        None if top_k is None else torch.full((n,), top_k),
        None if top_p is None else torch.full((n,), top_p),
    )[:, 0]
    return p > 0


def _near_boundary(logits, temperature, top_k, top_p, margin=1e-5):
    """Rows where some token's strictly-larger mass is within ``margin`` of ``top_p``: there the
    two float summation orders may round the boundary differently (a near-tie, not a rule)."""
    if top_p is None:
        return torch.zeros(logits.shape[0], dtype=torch.bool)
    x = logits.double() / temperature
    if top_k:
        kth = x.topk(top_k, -1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    p = x.softmax(-1).sort(-1, descending=True).values
    above = p.cumsum(-1) - p
    return ((above - top_p).abs() < margin).any(-1)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.6])
@pytest.mark.parametrize(
    "top_k, top_p",
    [
        (1, None),
        (7, None),
        (50, None),
        (None, 0.05),
        (None, 0.5),
        (None, 0.95),
        (10, 0.5),
        (40, 0.9),
    ],
)
def test_kept_set_equals_transformers_without_ties(temperature, top_k, top_p):
    # a fixed per-case seed (str/None hashes change per process)
    g = torch.Generator().manual_seed(zlib.crc32(repr((temperature, top_k, top_p)).encode()))
    logits = torch.randn(ROWS, V, generator=g, dtype=torch.float64).float() * 3  # no exact ties
    assert all(row.unique().numel() == V for row in logits[:50])
    ours, theirs = (
        _ours(logits, temperature, top_k, top_p),
        _warped(logits, temperature, top_k, top_p),
    )
    rows = ~_near_boundary(logits, temperature, top_k, top_p)
    assert int(rows.sum()) > 0.9 * ROWS  # the check covers most rows
    differ = (ours != theirs).any(-1) & rows
    assert not bool(differ.any()), (
        f"{int(differ.sum())} rows differ; first {differ.nonzero()[:3, 0].tolist()}"
    )


def test_top_p_ties_keep_every_tied_token():
    """Logits [1, 1, 0], top_p = 0.3: both tied tokens are kept here; transformers keeps one."""
    logits = torch.tensor([[1.0, 1.0, 0.0]])
    assert _ours(logits, 1.0, None, 0.3).tolist() == [[True, True, False]]
    assert int(_warped(logits, 1.0, None, 0.3).sum()) == 1
    # top-k ties at the k-th value are kept by both
    assert (
        _ours(logits, 1.0, 1, None).tolist()
        == _warped(logits, 1.0, 1, None).tolist()
        == [[True, True, False]]
    )
