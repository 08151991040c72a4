"""Compile every Triton kernel ahead of time for NVIDIA targets, without a GPU.

Triton's interpreter (how CPU CI runs the kernels) accepts code that the real compiler rejects
(non-constexpr globals, type-unstable loops, ...). This script runs the real front end and
back end (TTIR -> TTGIR -> LLVM -> PTX -> cubin with the bundled ptxas) for each kernel and each
combination of its mode flags. Run it in a process where TRITON_INTERPRET is unset:
``python tests/aot_compile.py 90 80``. Prints one line per kernel; exits non-zero on an error.
"""

import itertools
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from specdec_kernels.ops import accept_reject, verify_sampling  # noqa: E402

POINTER_TYPES = {
    "logits_ptr": "*bf16", "q_ptr": "*fp32", "draft_ptr": "*i64", "nd_ptr": "*i64",
    "topk_ptr": "*i64", "seed_ptr": "*i64", "tokens_ptr": "*i64", "nacc_ptr": "*i64",
    "kappa_ptr": "*i64", "temp_ptr": "*fp32", "topp_ptr": "*fp32", "part_m_ptr": "*fp32",
    "part_s_ptr": "*fp32", "z_ptr": "*fp32", "race_rb_ptr": "*fp32", "race_pb_ptr": "*fp32",
    "part_a_ptr": "*i32", "race_ri_ptr": "*i32", "race_pi_ptr": "*i32", "out_ptr": "*i64",
    "verifier_ptr": "*i32", "m_ptr": "*fp32", "lo_ptr": "*i64", "hi_ptr": "*i64",
    "floor_ptr": "*i64", "mass_ptr": "*fp32", "target_ptr": "*fp32", "active_ptr": "*i32",
    "pcount_ptr": "*i64", "pmass_ptr": "*fp32",
}
FLAGS = ("GREEDY_ONLY", "HAS_Q", "HAS_TOPK", "HAS_TOPP", "HAS_FILTER", "USE_MASS")
MODES = {"PHASE": (0, 1, 2)}  # non-boolean mode constexprs and their values


def _signature(fn, constexprs):
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = POINTER_TYPES[name]
        elif name.startswith("stride"):
            sig[name] = "i64"
        else:
            sig[name] = "i32"
    return sig


def _compile(fn, constexprs, target):
    src = ASTSource(fn, _signature(fn, constexprs),
                    constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=target, options={"enable_fp_fusion": False})


def kernels():
    cfg = verify_sampling.launch_config(128256)
    sizes = {"CHUNK": cfg["CHUNK"], "BLOCK": cfg["BLOCK"], "TBLOCK": cfg["TBLOCK"],
             "NPIV": cfg["NPIV"], "BLOCK_K": 16}
    for fn in (verify_sampling._verify_row_kernel, verify_sampling._split_stats_kernel,
               verify_sampling._split_search_phase_kernel,
               verify_sampling._split_search_partial_kernel,
               verify_sampling._split_search_update_kernel, verify_sampling._split_race_kernel,
               verify_sampling._split_decide_kernel, accept_reject._accept_reject_kernel):
        flags = [f for f in FLAGS if f in fn.arg_names]
        modes = [m for m in MODES if m in fn.arg_names]
        fixed = {k: v for k, v in sizes.items() if k in fn.arg_names}
        if "BLOCK_K" in fn.arg_names and fn is accept_reject._accept_reject_kernel:
            fixed["BLOCK_K"] = 64
        choices = [(False, True)] * len(flags) + [MODES[m] for m in modes]
        for values in itertools.product(*choices):
            yield fn, {**fixed, **dict(zip(flags + modes, values))}


def main(archs):
    failures = 0
    for arch in archs:
        target = GPUTarget("cuda", int(arch), 32)
        for fn, constexprs in kernels():
            flags = {k: v for k, v in constexprs.items() if k in FLAGS or k in MODES}
            try:
                compiled = _compile(fn, constexprs, target)
                ok = "cubin" in compiled.asm
                print(f"sm_{arch} {fn.__name__} {flags}: {'ok' if ok else 'NO CUBIN'}")
                failures += not ok
            except Exception as exc:  # report every failure, then fail
                print(f"sm_{arch} {fn.__name__} {flags}: FAILED {type(exc).__name__}: {exc}")
                failures += 1
    return failures


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1:] or ["90", "80"]) else 0)
