"""The bundled pair's held-out acceptance rate: the figure ``docs/generation.md`` states and
``tests/test_cli.py`` and ``scripts/train_bundled.py`` measure. It lives here, above the loop,
so that :mod:`specdec_kernels.models.bundled` (a weights loader) does not depend on the loop.
"""

from __future__ import annotations

from specdec_kernels.generation import SpeculativeGenerator
from specdec_kernels.models.bundled import EOS_ID, encode, heldout_text, load_bundled


def evaluate_acceptance(
    target=None,
    draft=None,
    text: str | None = None,
    *,
    num_prompts: int = 8,
    prompt_len: int = 64,
    max_new_tokens: int = 64,
    num_speculative_tokens: int = 4,
):
    """Greedy speculative decoding on prompts cut from held-out text; returns the stats.

    ``num_prompts`` windows of ``prompt_len`` bytes, evenly spaced through ``text`` (default:
    :func:`heldout_text`), continued for ``max_new_tokens`` tokens with ``K =
    num_speculative_tokens``; the pair defaults to the bundled one.

    Returns
    -------
    GenerationStats
        ``acceptance_rate`` is the number ``tests/test_cli.py`` checks.
    """
    if target is None or draft is None:
        target, draft = load_bundled()
    ids = encode(text if text is not None else heldout_text())
    step = max(1, (len(ids) - prompt_len) // num_prompts)
    prompts = [ids[i * step : i * step + prompt_len] for i in range(num_prompts)]
    gen = SpeculativeGenerator(target, draft, num_speculative_tokens)
    return gen.generate(prompts, max_new_tokens=max_new_tokens, eos_token_id=EOS_ID).stats
