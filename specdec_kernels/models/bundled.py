"""The bundled draft/target pair: byte-level models trained on the Python standard library.

Trained by ``scripts/train_bundled.py``; the weights ship in ``specdec_kernels/assets`` as
float16 safetensors (loaded as float32). Token ids are byte values, ``256`` is ``<eos>``.
"""

from __future__ import annotations

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
#: speculation pays on a CPU (a 10.8M-parameter target, its draft ~1/47 of its multiply-adds);
#: ``"tiny"`` is the first pair (1.9M-parameter target), kept because it makes tests fast.
PAIRS: dict[str, tuple[CausalLMConfig, CausalLMConfig]] = {
    "default": (_config(384, 6, 6), _config(128, 1, 2)),
    "tiny": (_config(192, 4, 3), _config(128, 1, 2)),
}
TARGET_CONFIG, DRAFT_CONFIG = PAIRS["default"]


def pair_dir(name: str = "default") -> str:
    """The folder that holds pair ``name``'s weights, ``heldout.txt`` and ``train_log.json``."""
    if name not in PAIRS:
        raise ValueError(f"name must be one of {sorted(PAIRS)}, got {name!r}")
    return os.path.join(ASSETS, name)


def encode(text: str) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids (no ``<eos>``)."""
    return list(text.encode("utf-8"))


def decode(ids) -> str:
    """Text of token ids; ``<eos>`` and invalid UTF-8 are replaced, not raised on."""
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def load_bundled(
    name: str = "default", dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[CausalLM, CausalLM]:
    """``(target, draft)``: bundled pair ``name`` (``"default"`` or ``"tiny"``), in eval mode.

    Examples
    --------
    >>> target, draft = load_bundled()
    >>> target.config.n_layer, target.config.n_embd, draft.config.n_layer
    (6, 384, 1)
    >>> load_bundled("tiny")[0].config.n_layer
    4
    """
    folder = pair_dir(name)
    return (
        CausalLM.load(os.path.join(folder, "target.safetensors"), dtype, device),
        CausalLM.load(os.path.join(folder, "draft.safetensors"), dtype, device),
    )


def heldout_text(name: str = "default") -> str:
    """The fixed held-out text (a stdlib file the pair was not trained on) shipped with it."""
    with open(os.path.join(pair_dir(name), "heldout.txt"), encoding="utf-8") as fh:
        return fh.read()


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
    from specdec_kernels.generation import SpeculativeGenerator

    if target is None or draft is None:
        target, draft = load_bundled()
    ids = encode(text if text is not None else heldout_text())
    step = max(1, (len(ids) - prompt_len) // num_prompts)
    prompts = [ids[i * step : i * step + prompt_len] for i in range(num_prompts)]
    gen = SpeculativeGenerator(target, draft, num_speculative_tokens)
    return gen.generate(prompts, max_new_tokens=max_new_tokens, eos_token_id=EOS_ID).stats
