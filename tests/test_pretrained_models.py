"""The real Qwen2.5-Coder pair (``specdec models fetch qwen2.5-coder``), where it has been
fetched; CI does not download it, so these skip there, naming the command. Slow: minutes."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specdec_kernels.models import pretrained  # noqa: E402

CACHE = pretrained.cache_dir()  # read before the tests' own SPECDEC_CACHE_DIR is set

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        not (
            pretrained.is_fetched("qwen2.5-coder-1.5b")
            and pretrained.is_fetched("qwen2.5-coder-0.5b")
        ),
        reason="the Qwen2.5-Coder pair is not in the cache: specdec models fetch qwen2.5-coder",
    ),  # fmt: skip
]


@pytest.fixture(scope="module")
def pair():
    from specdec_kernels.benchmarks.e2e_hf import load_models

    target, tok = load_models("qwen2.5-coder-1.5b", "bfloat16", cache=CACHE)
    draft, _ = load_models("qwen2.5-coder-0.5b", "bfloat16", cache=CACHE)
    tok.padding_side = "left"
    return target, draft, tok


def test_greedy_equals_the_target_alone_batch_1_and_2(pair):
    from specdec_kernels.integrations.transformers import speculative_generate

    target, draft, tok = pair
    prompts = ["def quicksort(arr):", "The history of the Roman Empire"]
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        for rows in ([0], [1], [0, 1]):
            ids, mask = enc.input_ids[rows], enc.attention_mask[rows]
            if len(rows) == 1:  # no padding alone
                ids, mask = ids[:, mask[0].argmax() :], mask[:, mask[0].argmax() :]
            want = target.generate(ids, attention_mask=mask, max_new_tokens=24,
                                   min_new_tokens=24, do_sample=False)  # fmt: skip
            got = speculative_generate(target, draft, ids, mask, max_new_tokens=24,
                                       num_speculative_tokens=4)  # fmt: skip
            assert torch.equal(got, want), rows


def test_sampling_is_lossless_on_the_first_tokens(pair):
    """T = 0.7: the first new token of 400 seeded speculative calls (K = 3) against the
    target's own distribution, chi-square over the tokens expected >= 5 times plus one pooled
    cell; false-failure probability 1e-3."""
    from scipy.stats import chi2 as dist

    from specdec_kernels.integrations.transformers import speculative_generate

    target, draft, tok = pair
    ids = tok(["def add(a, b):\n    "], return_tensors="pt").input_ids
    with torch.inference_mode():
        p = torch.softmax(target(ids).logits[0, -1].double() / 0.7, -1)
        counts = torch.zeros_like(p)
        for seed in range(400):
            kw = dict(do_sample=True, temperature=0.7, num_speculative_tokens=3, seed=seed)
            out = speculative_generate(target, draft, ids, max_new_tokens=3, **kw)
            counts[out[0, ids.shape[1]]] += 1
    expected = p * counts.sum()
    keep = expected >= 5
    chi2 = (((counts - expected) ** 2 / expected)[keep]).sum().item()
    rest = expected[~keep].sum().item()
    chi2 += (counts[~keep].sum().item() - rest) ** 2 / max(rest, 1e-9)
    assert chi2 < dist.ppf(1 - 1e-3, int(keep.sum())), (chi2, int(keep.sum()))
