"""scripts/train_bundled.py --init-from: distilling a shipped draft further leaves its target's
weights bit for bit as shipped, and the run resumes and refuses other arguments."""

import importlib.util
import os

import pytest
import torch

from specdec_kernels.models.bundled import pair_dir
from specdec_kernels.models.causal_lm import CausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script():
    spec = importlib.util.spec_from_file_location(
        "train_bundled", os.path.join(ROOT, "scripts", "train_bundled.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tensors(path):
    m = CausalLM.load(path, torch.float16)
    return {k: v.clone() for k, v in m.state_dict().items()}


def test_init_from_distils_the_draft_only_and_resumes(tmp_path, capsys):
    train = _script()
    ship = pair_dir("tiny")
    out, ckpt = tmp_path / "out", tmp_path / "run.pt"
    argv = ["--pair", "tiny", "--init-from", ship, "--steps", "0", "--draft-steps", "3"]
    argv += ["--draft-warmup", "2", "--teacher-dtype", "bfloat16", "--batch", "2", "--seq", "32"]
    argv += ["--eval-every", "1000", "--ckpt", str(ckpt), "--out", str(out)]
    train.main(argv)
    shipped_t, shipped_d = (
        _tensors(os.path.join(ship, f"{n}.safetensors")) for n in ("target", "draft")
    )
    new_t, new_d = (_tensors(out / f"{n}.safetensors") for n in ("target", "draft"))
    assert all(torch.equal(new_t[k], shipped_t[k]) for k in shipped_t)  # the target as shipped
    assert any(not torch.equal(new_d[k], shipped_d[k]) for k in shipped_d)  # the draft learnt
    capsys.readouterr()
    train.main(argv)  # done already: resumes at the end and only exports again
    assert "resumed from" in capsys.readouterr().out
    assert all(torch.equal(_tensors(out / "draft.safetensors")[k], new_d[k]) for k in new_d)
    with pytest.raises(SystemExit, match="was written with other arguments"):
        train.main([*argv[:-4], "--draft-warmup", "1", "--ckpt", str(ckpt), "--out", str(out)])


def test_grow_starts_from_the_shallower_drafts_exact_logits():
    """A draft grown from a shipped one of the same width computes the shipped draft's logits
    bit for bit before any step (its new layer's output projections start at zero), keeps the
    shipped tensors, and the new layer's projections still learn (they get gradients); a
    draft of another width is not grown."""
    from specdec_kernels.models.bundled import _config

    train = _script()
    shipped = CausalLM.load(os.path.join(pair_dir("tiny"), "draft.safetensors"))
    grown = CausalLM(_config(128, 3, 2))
    assert train._grow(grown, shipped)
    x = torch.randint(0, 256, (2, 40))
    assert torch.equal(grown(x), shipped(x))
    kept = shipped.state_dict()
    assert all(torch.equal(grown.state_dict()[k], v) for k, v in kept.items())
    grown(x).logsumexp(-1).sum().backward()
    for block in grown.transformer.h[1:]:
        assert block.mlp.c_proj.weight.grad.abs().sum() > 0
    assert not train._grow(CausalLM(_config(192, 2, 3)), shipped)
    assert not train._grow(CausalLM(_config(128, 1, 2)), shipped)  # not deeper


def test_on_policy_rows_end_in_the_targets_own_greedy_continuation(tmp_path):
    """``--on-policy``: the pool's windows are a training-file prompt and the frozen target's
    greedy continuation of it (checked against ``sk.autoregressive_generate``), kept in the
    checkpoint; phase 2's batches take that fraction of their rows from the pool, and the
    corpus rows are the ones a run without it draws; bad values are refused by name."""
    import specdec_kernels as sk

    train = _script()
    ship = pair_dir("tiny")
    ckpt = tmp_path / "run.pt"
    argv = ["--pair", "tiny", "--init-from", ship, "--steps", "0", "--draft-steps", "2"]
    argv += ["--teacher-dtype", "float32", "--batch", "4", "--seq", "32", "--eval-every", "1000"]
    argv += ["--on-policy", "0.5", "--policy-pool", "3", "--policy-gen", "8"]
    argv += ["--ckpt", str(ckpt), "--out", str(tmp_path / "out")]
    train.main(argv)
    pool = torch.load(ckpt, weights_only=False)["policy"]
    assert pool.shape == (3, 33)
    target = CausalLM.load(os.path.join(ship, "target.safetensors")).eval()
    want = sk.autoregressive_generate(target, pool[:, :25].tolist(), 8).sequences
    assert pool.tolist() == want
    # the batches: half the rows from the pool, the rest those of a run without --on-policy
    trainer = train.Trainer(_namespace(torch.load(ckpt, weights_only=False)["args"]))
    trainer.policy = pool
    stream = torch.arange(1000) % 251
    x = trainer.batch(stream)
    plain = train.draw_batch(stream, 4, 32, torch.Generator().manual_seed(trainer.args.seed))
    assert torch.equal(x[2:], plain[2:])
    assert all(any(torch.equal(r, p) for p in pool) for r in x[:2])
    for bad in (["--on-policy", "1.5"], ["--policy-gen", "32"]):
        with pytest.raises(SystemExit, match="--on-policy must be in"):
            train.main([*argv, *bad])
    limit = target.config.n_positions  # the target generates within its context
    over = [*argv[:-4], "--seq", str(limit), "--ckpt", str(tmp_path / "b.pt"), "--out", "x"]
    with pytest.raises(SystemExit, match=rf"--seq \+ 1 <= the target's context \({limit}\)"):
        train.main(over)


def _namespace(d):
    import argparse

    return argparse.Namespace(**d)
