"""Train the bundled draft/target pair on the Python standard library's own source.

Byte-level tokens (256 byte values + ``<eos>`` = 256 between files). The split is by file name:
a file is held out when ``crc32(name) % 10 == 0``. The target (4 layers, d=192) learns from the
bytes; the draft (1 layer, d=128, ~8x cheaper per token) learns from the bytes and from the
target's distribution (distillation), which is what raises the acceptance rate.

A second phase (``--draft-steps``) trains the draft alone against the frozen target
(distillation, 0.8 KL + 0.2 cross-entropy); it is cheap, as the target only runs forward.
``--resume`` starts from the weights already in ``--out`` (phase 1 is then usually skipped with
``--steps 0``).

Usage (about 15 minutes on one CPU thread)::

    PYTHONPATH=. python scripts/train_bundled.py --steps 800 --draft-steps 1200

Writes ``specdec_kernels/assets/{target,draft}.safetensors`` (float16), ``heldout.txt`` (a fixed
held-out text for the tests) and ``train_log.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import sysconfig
import time
import zlib

import torch
import torch.nn.functional as F

from specdec_kernels.models.bundled import ASSETS, DRAFT_CONFIG, EOS_ID, TARGET_CONFIG, encode
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


def batches(stream: torch.Tensor, batch: int, seq: int, gen: torch.Generator):
    while True:
        start = torch.randint(0, len(stream) - seq - 1, (batch,), generator=gen)
        idx = start[:, None] + torch.arange(seq + 1)  # [batch, seq+1]
        yield stream[idx]


@torch.no_grad()
def evaluate(target, draft, stream, seq, n=32) -> dict:
    """Held-out loss (nats/byte) of both models and their greedy agreement (teacher forced)."""
    target.eval(), draft.eval()
    gen = torch.Generator().manual_seed(1234)
    x = next(batches(stream, n, seq, gen))
    lt, ld = target(x[:, :-1]), draft(x[:, :-1])  # [n, seq, V]
    out = dict(
        target_loss=F.cross_entropy(lt.flatten(0, 1), x[:, 1:].flatten()).item(),
        draft_loss=F.cross_entropy(ld.flatten(0, 1), x[:, 1:].flatten()).item(),
        greedy_agreement=(lt.argmax(-1) == ld.argmax(-1)).float().mean().item(),
    )
    target.train(), draft.train()
    return out


def distill_draft(target, draft, train, held, args, t0) -> list[dict]:
    """Phase 2: the draft alone learns the frozen target's distribution."""
    if args.draft_steps <= 0:
        return []
    target.requires_grad_(False)
    opt = torch.optim.AdamW(
        draft.parameters(), lr=args.draft_lr, betas=(0.9, 0.95), weight_decay=0.1
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.draft_steps)))
    )
    data = batches(train, args.batch, args.seq, torch.Generator().manual_seed(args.seed + 1))
    log = []
    for step in range(1, args.draft_steps + 1):
        x = next(data)
        with torch.no_grad():
            lt = target.eval()(x[:, :-1]).flatten(0, 1)  # [batch*seq, V]
        ld = draft(x[:, :-1]).flatten(0, 1)
        ce = F.cross_entropy(ld, x[:, 1:].flatten())
        kl = F.kl_div(
            F.log_softmax(ld, -1), F.log_softmax(lt, -1), log_target=True, reduction="batchmean"
        )
        loss = 0.8 * kl + 0.2 * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.draft_steps:
            row = dict(
                draft_step=step,
                seconds=round(time.time() - t0, 1),
                draft_loss=ce.item(),
                kl=kl.item(),
            )
            if step % 400 == 0 or step == args.draft_steps:
                row.update(
                    {f"heldout_{k}": v for k, v in evaluate(target, draft, held, args.seq).items()}
                )
            log.append(row)
            print(json.dumps(row), flush=True)
    return log


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=800, help="joint steps (target and draft)")
    p.add_argument("--draft-steps", type=int, default=1200, help="draft-only distillation steps")
    p.add_argument("--draft-lr", type=float, default=1e-3)
    p.add_argument("--resume", action="store_true", help="start from the weights in --out")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=ASSETS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_files, held_files = corpus_files()
    train, held = token_stream(train_files), token_stream(held_files)
    print(
        f"train {len(train_files)} files {len(train)} bytes, held-out {len(held_files)} files "
        f"{len(held)} bytes",
        flush=True,
    )
    if args.resume:
        target = CausalLM.load(os.path.join(args.out, "target.safetensors")).train()
        draft = CausalLM.load(os.path.join(args.out, "draft.safetensors")).train()
    else:
        target, draft = CausalLM(TARGET_CONFIG), CausalLM(DRAFT_CONFIG)
    params = list(target.parameters()) + list(draft.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1, (s + 1) / warmup)
            * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(args.steps, 1)))))
        ),
    )
    data = batches(train, args.batch, args.seq, torch.Generator().manual_seed(args.seed))
    t0, log = time.time(), []
    for step in range(1, args.steps + 1):  # phase 1: target and draft together
        x = next(data)
        inp, tgt = x[:, :-1], x[:, 1:].flatten()
        lt = target(inp).flatten(0, 1)  # [batch*seq, V]
        ld = draft(inp).flatten(0, 1)
        loss_t = F.cross_entropy(lt, tgt)
        ce_d = F.cross_entropy(ld, tgt)
        kl_d = F.kl_div(
            F.log_softmax(ld, -1),
            F.log_softmax(lt.detach(), -1),
            log_target=True,
            reduction="batchmean",
        )
        loss = loss_t + 0.5 * ce_d + 0.5 * kl_d
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == args.steps:
            row = dict(
                step=step,
                seconds=round(time.time() - t0, 1),
                target_loss=loss_t.item(),
                draft_loss=ce_d.item(),
                kl=kl_d.item(),
            )
            if step % 200 == 0 or step == args.steps:
                row.update(
                    {f"heldout_{k}": v for k, v in evaluate(target, draft, held, args.seq).items()}
                )
            log.append(row)
            print(json.dumps(row), flush=True)
    log += distill_draft(target, draft, train, held, args, t0)
    os.makedirs(args.out, exist_ok=True)
    target.save(os.path.join(args.out, "target.safetensors"), dtype=torch.float16)
    draft.save(os.path.join(args.out, "draft.safetensors"), dtype=torch.float16)
    with open(held_files[0], encoding="utf-8", errors="replace") as fh:
        heldout_text = fh.read()[:6000]
    with open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8") as fh:
        fh.write(heldout_text)
    summary = dict(
        command="PYTHONPATH=. python scripts/train_bundled.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        args=vars(args),
        python=sys.version.split()[0],
        torch=torch.__version__,
        train_files=len(train_files),
        train_bytes=len(train),
        heldout_files=[os.path.basename(f) for f in held_files],
        heldout_text=os.path.basename(held_files[0]),
        wall_seconds=round(time.time() - t0, 1),
        log=log,
    )
    with open(os.path.join(args.out, "train_log.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    print(f"done in {summary['wall_seconds']} s", flush=True)


if __name__ == "__main__":
    main()
