"""``specdec demo`` end to end (short runs) and the bundled pair's stated acceptance rate."""

import os
import subprocess
import sys

import pytest

from specdec_kernels.cli import main, render
from specdec_kernels.models.bundled import (
    EOS_ID,
    decode,
    encode,
    evaluate_acceptance,
    heldout_text,
    load_bundled,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Stated in README.md (the bundled pair): greedy acceptance of the bundled pair on the shipped
# held-out text
# (8 prompts x 64 new tokens, K = 4). CPU float32 is deterministic, so the margin only absorbs
# BLAS differences between machines (a near-tie may flip a greedy token).
STATED_ACCEPTANCE = 0.65  # measured 0.697 (README.md); the issue asks for >= 0.6


pytestmark = pytest.mark.usefixtures("one_thread")


def test_bundled_pair_loads_offline():
    target, draft = load_bundled()
    assert target.config.n_layer >= 4 and target.config.vocab_size == draft.config.vocab_size
    from specdec_kernels.generation import cost_per_token

    assert cost_per_token(target) >= 5 * cost_per_token(draft)
    assert decode(encode("def f():\n")) == "def f():\n"
    assert EOS_ID == target.config.eos_token_id


def test_bundled_pair_reaches_stated_acceptance():
    stats = evaluate_acceptance(num_speculative_tokens=4)
    assert stats.acceptance_rate >= STATED_ACCEPTANCE
    assert len(heldout_text()) > 1000


def test_render_marks_accepted_tokens():
    ids = encode("ab") + encode("cde")
    assert render(ids, [True, False, True], 2, color=False) == "ab«c»d«e»"
    assert "\x1b[32m" in render(ids, [True, True, False], 2, color=True)


def test_demo_runs(capsys):
    assert main(["demo", "-n", "12", "--color", "never", "def add(a, b):\n"]) == 0
    out = capsys.readouterr().out
    assert "def add(a, b):" in out
    assert "acceptance rate" in out and "tokens/s" in out and "speedup" in out
    assert "identical to the target's own greedy decoding" in out


@pytest.mark.parametrize("args", [["-k", "auto", "--draft", "ngram"], ["-t", "0.8", "-k", "3"]])
def test_demo_options(capsys, args):
    assert main(["demo", "-n", "8", "--color", "never", *args]) == 0
    assert "acceptance rate" in capsys.readouterr().out


def test_demo_bad_arguments():
    with pytest.raises(SystemExit):
        main(["demo", "-k", "many"])
    with pytest.raises(SystemExit):
        main(["demo", "-n", "0"])


def test_python_m_entry_point():
    """``python -m specdec_kernels demo`` (what the ``specdec`` script runs) in a subprocess."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = subprocess.run(
        [sys.executable, "-m", "specdec_kernels", "demo", "-n", "6", "--color", "never"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "acceptance rate" in res.stdout


def test_demo_tensor_parallel(capfd):
    """``specdec demo --tp 2``: two gloo ranks, the target split over them; the output (printed
    by rank 0 from its own process) equals the single-process target's greedy decoding."""
    argv = ["demo", "--tp", "2", "-n", "8", "--repeats", "1", "--color", "never", "x = 1\n"]
    assert main([*argv, "--tp-timeout", "240"]) == 0
    out = capfd.readouterr().out
    assert "tensor parallel over 2 ranks" in out
    assert out.count("acceptance rate") == 1  # only the first rank prints
    assert "tensor-parallel output identical to the single-process target's" in out
