"""Train a bundled draft/target pair on the Python standard library's own source, resumably.

Byte-level tokens (256 byte values + ``<eos>`` = 256 between files). The split is by file name:
a file is held out when ``crc32(name) % 10 == 0``. Two phases, one step counter:

1. ``--steps`` joint steps: the target learns from the bytes (cross-entropy); the draft learns
   from the bytes and from the target's distribution (0.5 CE + 0.5 KL, the target detached).
2. ``--draft-steps`` distillation steps: the draft alone against the frozen target
   (0.8 KL + 0.2 CE); cheap, as the target only runs forward.

Resumable: every ``--ckpt-every`` steps (and on SIGINT / SIGTERM) the whole training state is
written atomically to ``--ckpt``: both models, the optimiser and schedule, the step, the data
order's generator state, torch's global RNG state, the log so far and the wall time spent. Run the
same command again and it continues from there, drawing exactly the batches it would have drawn;
the log and the final weights are those of one uninterrupted run (up to float non-determinism of
multithreaded kernels; with ``--threads 1`` the losses repeat to the bit).

Every step's losses go to the log; a held-out evaluation (loss, teacher-forced greedy agreement)
runs every ``--eval-every`` steps, and the greedy acceptance table (K = 1, 2, 4, 8) at the end.

Usage::

    # the default pair (6 layers d=384 target, 2 layers d=128 draft); about 2 hours, one thread
    PYTHONPATH=. python scripts/train_bundled.py --pair default
    # the tiny pair (4 layers d=192 target) used by the fast tests
    PYTHONPATH=. python scripts/train_bundled.py --pair tiny --steps 800 --draft-steps 1200 \
        --lr 2e-3

Writes ``specdec_kernels/assets/<pair>/{target,draft}.safetensors`` (float16), ``heldout.txt`` (a
fixed held-out text for the tests) and ``train_log.json``. ``--export-only`` writes those from the
latest checkpoint without training further.

``--init-from DIR`` starts both models from the float16 weights in ``DIR`` (a pair's asset folder)
instead of a fresh initialisation: with ``--steps 0`` it only distils the draft further against
that frozen target, whose shipped weights come out bit for bit the same (float16 -> float32 ->
float16 is exact)::

    # a longer distillation of the default draft against the shipped default target
    PYTHONPATH=. python scripts/train_bundled.py --pair default --init-from \
        specdec_kernels/assets/default --steps 0 --draft-steps 6000 --draft-warmup 300 \
        --teacher-dtype bfloat16 --threads 2 --eval-every 250 --ckpt runs/default_distill.pt

``--on-policy F`` (phase 2) makes a fraction ``F`` of each batch's rows windows that end in the
frozen target's own greedy continuation: a pool of ``--policy-pool`` windows (``--policy-gen``
generated tokens after a prompt from the training files, the target in ``--teacher-dtype``), made
once at the start of phase 2 and kept in the checkpoint. A draft in speculative decoding predicts
the target's own output, not the corpus: this trains it on that distribution (on-policy
distillation, as DistillSpec, Zhou et al. 2023, https://arxiv.org/abs/2310.08461).

A shipped draft with fewer layers than the pair's (or than ``--draft-config``'s) of the same width
is grown: its layers first, each new layer's output projections at zero, so the distillation
starts from the shipped draft's exact logits. ``--draft-config N_EMBD,N_LAYER,N_HEAD`` trains a
draft of another shape (the shipped default's first two runs had ``--draft-config 128,1,2``).
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import math
import os
import signal
import sys
import sysconfig
import time
import zlib

import torch
import torch.nn.functional as F

from specdec_kernels.models.bundled import EOS_ID, PAIRS, _config, encode, pair_dir
from specdec_kernels.models.causal_lm import CausalLM


def corpus_files() -> tuple[list[str], list[str]]:
    """(train, held-out) paths of the stdlib's top-level ``*.py`` files, split by file name."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    held = [f for f in files if zlib.crc32(os.path.basename(f).encode()) % 10 == 0]
    return [f for f in files if f not in held], held


def token_stream(files: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            ids += encode(fh.read()) + [EOS_ID]
    return torch.tensor(ids, dtype=torch.int64)


def draw_batch(stream: torch.Tensor, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """``[batch, seq + 1]`` windows at random offsets of ``stream`` (``gen`` is the data order)."""
    start = torch.randint(0, len(stream) - seq - 1, (batch,), generator=gen)
    return stream[start[:, None] + torch.arange(seq + 1)]


@torch.no_grad()
def evaluate(target, draft, stream, seq, n=32) -> dict:
    """Held-out loss (nats/byte) of both models and their greedy agreement (teacher forced)."""
    target.eval(), draft.eval()
    x = draw_batch(stream, n, seq, torch.Generator().manual_seed(1234))
    lt, ld = target(x[:, :-1]), draft(x[:, :-1])  # [n, seq, V]
    out = dict(
        target_loss=F.cross_entropy(lt.flatten(0, 1), x[:, 1:].flatten()).item(),
        draft_loss=F.cross_entropy(ld.flatten(0, 1), x[:, 1:].flatten()).item(),
        greedy_agreement=(lt.argmax(-1) == ld.argmax(-1)).float().mean().item(),
    )
    target.train(), draft.train()
    return out


def cosine(step: int, total: int, warmup: int) -> float:
    """Learning-rate factor: linear warm-up, then cosine from 1 down to 0.1."""
    return min(1.0, (step + 1) / max(warmup, 1)) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(total, 1))))
    )


def _grow(draft: CausalLM, shipped: CausalLM) -> bool:
    """Start ``draft`` from a shipped draft with fewer layers of the same width; ``False``
    (nothing done) for any other shape. The shipped layers become its first ones and each added
    layer's output projections start at zero, so the grown draft computes exactly the shipped
    one's logits at step 0 and distillation only has to teach the new layers (a second layer
    can attend by what the first found, copying from the context, which one layer cannot learn
    well: the default draft's held-out greedy agreement went from 0.758 to 0.838)."""
    a, b = draft.config, shipped.config
    same = ("n_embd", "n_head", "vocab_size", "n_positions", "n_inner", "activation_function")
    if any(getattr(a, k) != getattr(b, k) for k in same) or a.n_layer <= b.n_layer:
        print(f"draft {a} starts fresh (shipped {b})", flush=True)
        return False
    missing = draft.load_state_dict(shipped.state_dict(), strict=False).missing_keys
    with torch.no_grad():
        for block in draft.transformer.h[b.n_layer :]:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                proj.weight.zero_()
                proj.bias.zero_()
    print(f"draft grown from {b.n_layer} to {a.n_layer} layers ({len(missing)} new tensors)")
    return True


class Trainer:
    """The whole training state; :meth:`state` / :meth:`load` are what a checkpoint holds."""

    def __init__(self, args):
        self.args = args
        target_cfg, draft_cfg = PAIRS[args.pair]
        if args.draft_config:
            draft_cfg = _config(*args.draft_config)
        torch.manual_seed(args.seed)
        self.target, self.draft = CausalLM(target_cfg).train(), CausalLM(draft_cfg).train()
        if args.init_from:
            for model, name in ((self.target, "target"), (self.draft, "draft")):
                shipped = CausalLM.load(os.path.join(args.init_from, f"{name}.safetensors"))
                if name == "draft" and shipped.config != model.config:
                    if _grow(model, shipped) or args.draft_config:
                        continue  # grown, or another shape asked for: starts fresh
                if shipped.config != model.config:
                    raise SystemExit(
                        f"--init-from {args.init_from}: its {name} is {shipped.config}, "
                        f"pair {args.pair} needs {model.config}"
                    )
                model.load_state_dict(shipped.state_dict())
        params = list(self.target.parameters()) + list(self.draft.parameters())
        self.opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        self.draft_opt = torch.optim.AdamW(
            self.draft.parameters(), lr=args.draft_lr, betas=(0.9, 0.95), weight_decay=0.1
        )
        self.data = torch.Generator().manual_seed(args.seed)
        self.policy: torch.Tensor | None = None  # [pool, seq + 1] (--on-policy)
        self.step = 0  # steps done, phase 1 then phase 2
        self.log: list[dict] = []
        self.sessions: list[dict] = []  # one entry per invocation: steps and wall seconds

    def state(self) -> dict:
        return dict(
            target=self.target.state_dict(),
            draft=self.draft.state_dict(),
            opt=self.opt.state_dict(),
            draft_opt=self.draft_opt.state_dict(),
            data=self.data.get_state(),
            torch_rng=torch.get_rng_state(),
            step=self.step,
            log=self.log,
            sessions=self.sessions,
            args=vars(self.args),
            policy=self.policy,
        )

    def load(self, ckpt: dict) -> None:
        self.target.load_state_dict(ckpt["target"])
        self.draft.load_state_dict(ckpt["draft"])
        self.opt.load_state_dict(ckpt["opt"])
        self.draft_opt.load_state_dict(ckpt["draft_opt"])
        self.data.set_state(ckpt["data"])
        torch.set_rng_state(ckpt["torch_rng"])
        self.step, self.log, self.sessions = ckpt["step"], ckpt["log"], ckpt["sessions"]
        self.policy = ckpt.get("policy")

    def save(self, path: str) -> None:
        tmp = path + ".tmp"
        torch.save(self.state(), tmp)
        os.replace(tmp, path)  # atomic: a kill mid-write leaves the previous checkpoint

    def teacher(self) -> CausalLM:
        """The frozen target of phase 2 in ``--teacher-dtype`` (a copy unless that is float32)."""
        dtype = getattr(torch, self.args.teacher_dtype)
        if dtype == torch.float32:
            return self.target.eval()
        if getattr(self, "_teacher", None) is None:
            self._teacher = copy.deepcopy(self.target).to(dtype).eval()
        return self._teacher

    def policy_pool(self, stream: torch.Tensor) -> torch.Tensor:
        """``[--policy-pool, seq + 1]``: prompts of ``seq + 1 - --policy-gen`` tokens from
        ``stream`` and the frozen target's greedy continuation of each (made once, then kept)."""
        if self.policy is None:
            import specdec_kernels as sk

            a = self.args
            gen = torch.Generator().manual_seed(a.seed + 1)  # not the batches' data order
            prompts = draw_batch(stream, a.policy_pool, a.seq - a.policy_gen, gen)
            rows, t0 = [], time.time()
            for chunk in prompts.split(32):
                out = sk.autoregressive_generate(self.teacher(), chunk.tolist(), a.policy_gen)
                rows += out.sequences
            self.policy = torch.tensor(rows, dtype=torch.int64)
            print(
                f"on-policy pool: {len(rows)} windows, {a.policy_gen} generated tokens each, "
                f"{time.time() - t0:.0f} s",
                flush=True,
            )
        return self.policy

    def batch(self, stream: torch.Tensor) -> torch.Tensor:
        """The next step's ``[batch, seq + 1]`` windows: from ``stream``, and in phase 2 with
        ``--on-policy`` that fraction of the rows from :meth:`policy_pool`."""
        a = self.args
        x = draw_batch(stream, a.batch, a.seq, self.data)
        n = round(a.batch * a.on_policy) if self.step >= a.steps else 0
        if n:
            pool = self.policy_pool(stream)
            x[:n] = pool[torch.randint(0, len(pool), (n,), generator=self.data)]
        return x

    def train_step(self, x: torch.Tensor) -> dict:
        a = self.args
        inp, tgt = x[:, :-1], x[:, 1:].flatten()
        if self.step < a.steps:  # phase 1: target and draft together
            for g in self.opt.param_groups:
                g["lr"] = a.lr * cosine(self.step, a.steps, max(1, a.steps // 20))
            lt = self.target(inp).flatten(0, 1)  # [batch*seq, V]
            ld = self.draft(inp).flatten(0, 1)
            loss_t = F.cross_entropy(lt, tgt)
            ce = F.cross_entropy(ld, tgt)
            kl = F.kl_div(
                F.log_softmax(ld, -1),
                F.log_softmax(lt.detach(), -1),
                log_target=True,
                reduction="batchmean",
            )
            loss, opt = loss_t + 0.5 * ce + 0.5 * kl, self.opt
            params = list(self.target.parameters()) + list(self.draft.parameters())
            row = dict(step=self.step + 1, phase=1, target_loss=loss_t.item())
        else:  # phase 2: the draft alone against the frozen target
            s = self.step - a.steps
            for g in self.draft_opt.param_groups:
                g["lr"] = a.draft_lr * cosine(s, a.draft_steps, a.draft_warmup)
            with torch.no_grad():
                lt = self.teacher()(inp).flatten(0, 1).float()
            ld = self.draft(inp).flatten(0, 1)
            ce = F.cross_entropy(ld, tgt)
            kl = F.kl_div(
                F.log_softmax(ld, -1), F.log_softmax(lt, -1), log_target=True, reduction="batchmean"
            )
            loss, opt, params = 0.8 * kl + 0.2 * ce, self.draft_opt, list(self.draft.parameters())
            row = dict(step=self.step + 1, phase=2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        self.step += 1
        row.update(draft_loss=ce.item(), kl=kl.item())
        return row


def acceptance_table(target, draft, text: str) -> dict:
    """Held-out greedy acceptance rate and mean accepted per pass at K = 1, 2, 4, 8."""
    from specdec_kernels.benchmarks.acceptance import evaluate_acceptance

    table = {}
    for k in (1, 2, 4, 8):
        st = evaluate_acceptance(
            target.eval(), draft.eval(), text, num_prompts=16, num_speculative_tokens=k
        )
        table[str(k)] = dict(acceptance_rate=st.acceptance_rate, mean_accepted=st.mean_accepted)
    return table


def export(trainer: Trainer, held_files: list[str], train_files, train_len, out: str) -> dict:
    """Float16 weights, the held-out text, ``train_log.json`` and its acceptance table alone,
    ``acceptance.json`` (what the wheel ships: the logs stay in the repository), into ``out``."""
    os.makedirs(out, exist_ok=True)
    trainer.target.save(os.path.join(out, "target.safetensors"), dtype=torch.float16)
    trainer.draft.save(os.path.join(out, "draft.safetensors"), dtype=torch.float16)
    with open(held_files[0], encoding="utf-8", errors="replace") as fh:
        heldout_text = fh.read()[:6000]
    with open(os.path.join(out, "heldout.txt"), "w", encoding="utf-8") as fh:
        fh.write(heldout_text)
    # the acceptance table is measured on the float16 weights that ship
    target = CausalLM.load(os.path.join(out, "target.safetensors"))
    draft = CausalLM.load(os.path.join(out, "draft.safetensors"))
    wall = sum(s["wall_seconds"] for s in trainer.sessions)
    summary = dict(
        command="PYTHONPATH=. python scripts/train_bundled.py "
        + " ".join(
            f"--{k.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, tuple) else v}"
            for k, v in trainer.args_for_log.items()
            if v != DEFAULTS.get(k, object())
        ),
        args=trainer.args_for_log,
        python=sys.version.split()[0],
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        target_params=sum(p.numel() for p in target.parameters()),
        draft_params=sum(p.numel() for p in draft.parameters()),
        train_files=len(train_files),
        train_bytes=train_len,
        heldout_files=[os.path.basename(f) for f in held_files],
        heldout_text=os.path.basename(held_files[0]),
        steps_done=trainer.step,
        wall_seconds=round(wall, 1),
        wall_hours=round(wall / 3600, 2),
        sessions=trainer.sessions,
        acceptance_heldout_greedy=acceptance_table(target, draft, heldout_text),
        log=trainer.log,
    )
    with open(os.path.join(out, "train_log.json"), "w") as fh:
        json.dump(summary, fh, indent=None, separators=(",", ":"))
    with open(os.path.join(out, "acceptance.json"), "w") as fh:
        json.dump({"acceptance_heldout_greedy": summary["acceptance_heldout_greedy"]}, fh, indent=1)
        fh.write("\n")
    return summary


DEFAULTS: dict = {}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pair", default="default", choices=sorted(PAIRS))
    p.add_argument("--steps", type=int, default=1800, help="joint steps (target and draft)")
    p.add_argument("--draft-steps", type=int, default=400, help="draft-only distillation steps")
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--draft-lr", type=float, default=1e-3)
    p.add_argument(
        "--draft-warmup", type=int, default=1, help="warm-up steps of the distillation phase"
    )
    p.add_argument(
        "--teacher-dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="the frozen target's dtype in phase 2 (bfloat16: about twice as fast on CPUs with "
        "bfloat16 units)",
    )
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--ckpt-every", type=int, default=25)
    p.add_argument("--ckpt", default=None, help="checkpoint file (default runs/<pair>.pt)")
    p.add_argument("--out", default=None, help="output folder (default the pair's asset folder)")
    p.add_argument(
        "--init-from", default="", help="start from the float16 weights of this asset folder"
    )
    p.add_argument(
        "--on-policy",
        type=float,
        default=0.0,
        help="phase 2: the fraction of each batch's rows that end in the target's own greedy "
        "continuation (see the module's docstring)",
    )
    p.add_argument("--policy-pool", type=int, default=1024, help="windows of the on-policy pool")
    p.add_argument("--policy-gen", type=int, default=128, help="generated tokens a pool window")
    p.add_argument("--export-only", action="store_true", help="export the latest checkpoint")
    p.add_argument(
        "--draft-config",
        default="",
        type=lambda v: tuple(int(x) for x in v.split(",")) if v else (),
        help="the draft's N_EMBD,N_LAYER,N_HEAD instead of the pair's (with --init-from a "
        "shallower shipped draft of the same width is grown, any other shape starts fresh; the "
        "target is loaded either way)",
    )
    args = p.parse_args(argv)
    # older checkpoints
    DEFAULTS.update(init_from="", draft_warmup=1, teacher_dtype="float32", draft_config=())
    DEFAULTS.update(on_policy=0.0, policy_pool=1024, policy_gen=128)
    if not 0.0 <= args.on_policy <= 1.0 or (args.on_policy and not 0 < args.policy_gen < args.seq):
        raise SystemExit(
            f"--on-policy must be in [0, 1] and --policy-gen in (0, --seq = {args.seq}), got "
            f"{args.on_policy} and {args.policy_gen}"
        )
    limit = PAIRS[args.pair][0].n_positions  # the target generates the pool within its context
    if args.on_policy and args.seq + 1 > limit:
        raise SystemExit(
            f"--on-policy needs --seq + 1 <= the target's context ({limit}), got --seq {args.seq}"
        )
    ckpt = args.ckpt or os.path.join("runs", f"{args.pair}.pt")
    out = args.out or pair_dir(args.pair)
    torch.set_num_threads(args.threads)
    train_files, held_files = corpus_files()
    train, held = token_stream(train_files), token_stream(held_files)
    print(
        f"train {len(train_files)} files {len(train)} bytes, held-out {len(held_files)} files "
        f"{len(held)} bytes",
        flush=True,
    )
    trainer = Trainer(args)
    keys = ("pair", "init_from", "steps", "draft_steps", "lr", "draft_lr", "draft_warmup")
    keys += ("teacher_dtype", "batch", "seq", "seed", "threads", "draft_config")
    keys += ("on_policy", "policy_pool", "policy_gen")
    trainer.args_for_log = {k: getattr(args, k) for k in keys}
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=False)
        if {k: state["args"].get(k, DEFAULTS.get(k)) for k in keys if k != "threads"} != {
            k: v for k, v in trainer.args_for_log.items() if k != "threads"
        }:
            raise SystemExit(f"{ckpt} was written with other arguments: {state['args']}")
        trainer.load(state)
        print(f"resumed from {ckpt} at step {trainer.step}", flush=True)
    total = args.steps + args.draft_steps
    if not args.export_only:
        os.makedirs(os.path.dirname(os.path.abspath(ckpt)), exist_ok=True)
        stop = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.append(1))
        session = dict(start_step=trainer.step, wall_seconds=0.0)
        trainer.sessions.append(session)
        t0 = time.time()
        while trainer.step < total and not stop:
            row = trainer.train_step(trainer.batch(train))
            session["wall_seconds"] = round(time.time() - t0, 1)
            row["seconds"] = round(sum(s["wall_seconds"] for s in trainer.sessions), 1)
            if trainer.step % args.eval_every == 0 or trainer.step in (args.steps, total):
                row.update(
                    {
                        f"heldout_{k}": v
                        for k, v in evaluate(trainer.target, trainer.draft, held, args.seq).items()
                    }
                )
                print(json.dumps(row), flush=True)
            trainer.log.append(row)
            session["end_step"] = trainer.step
            if trainer.step % args.ckpt_every == 0 or trainer.step == total or stop:
                trainer.save(ckpt)
        if stop:
            print(f"stopped at step {trainer.step}; checkpoint in {ckpt}", flush=True)
            return
    summary = export(trainer, held_files, train_files, len(train), out)
    print(
        f"wrote {out}: {trainer.step}/{total} steps, {summary['wall_hours']} h, acceptance "
        f"{json.dumps(summary['acceptance_heldout_greedy'])}",
        flush=True,
    )


if __name__ == "__main__":
    main()
