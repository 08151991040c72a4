"""Compile every Triton kernel ahead of time for NVIDIA targets, without a GPU.

Triton's interpreter (how CPU CI runs the kernels) accepts code that the real compiler rejects
(non-constexpr globals, type-unstable loops, ...). This script runs the real front end and
back end (TTIR -> TTGIR -> LLVM -> PTX -> cubin with the bundled ptxas) for each kernel and each
combination of its mode flags. Run it in a process where TRITON_INTERPRET is unset:
``python tests/aot_compile.py 90 80``. Prints one line per kernel; exits non-zero on an error.

``--report PATH`` also writes the static resource usage of every variant (registers per thread,
spill stores / loads, shared memory), read from ``ptxas -v`` on the PTX that Triton produced
(the ptxas Triton itself picks for the target, so the same one that built the cubin; no GPU
needed). ``--fail-on-spills``
exits non-zero when any variant spills registers.
"""

import argparse
import datetime
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from specdec_kernels.ops import (  # noqa: E402
    accept_reject,
    accept_tests,
    logprobs,
    verify_sampling,
    verify_tree,
)

POINTER_TYPES = {
    "logits_ptr": "*bf16",
    "q_ptr": "*fp32",
    "draft_ptr": "*i64",
    "nd_ptr": "*i64",
    "topk_ptr": "*i64",
    "seed_ptr": "*i64",
    "tokens_ptr": "*i64",
    "nacc_ptr": "*i64",
    "kappa_ptr": "*i64",
    "temp_ptr": "*fp32",
    "topp_ptr": "*fp32",
    "part_m_ptr": "*fp32",
    "part_s_ptr": "*fp32",
    "z_ptr": "*fp32",
    "race_rb_ptr": "*fp32",
    "race_pb_ptr": "*fp32",
    "part_a_ptr": "*i32",
    "race_ri_ptr": "*i32",
    "race_pi_ptr": "*i32",
    "out_ptr": "*i64",
    "verifier_ptr": "*i32",
    "m_ptr": "*fp32",
    "lo_ptr": "*i64",
    "hi_ptr": "*i64",
    "lstart_ptr": "*i64",
    "qstart_ptr": "*i64",
    "tok_ptr": "*i64",
    "par_ptr": "*i64",
    "nn_ptr": "*i64",
    "ws_ptr": "*fp32",
    "nodes_ptr": "*i64",
    "bits_ptr": "*i32",
    "mass_ptr": "*fp32",
    "rows_ptr": "*i64",
    "mask_ptr": "*i32",
    "lp_ptr": "*fp32",
    "top_ptr": "*fp32",
    "ids_ptr": "*i64",
    "p_ptr": "*fp32",
    "after_ptr": "*i64",
    "pivot_ptr": "*i64",
    "cnt_ptr": "*i32",
    "cidx_ptr": "*i32",
    "cx_ptr": "*fp32",
    "mode_ptr": "*i32",
    "minp_ptr": "*fp32",
    "eids_ptr": "*i32",
    "evals_ptr": "*fp32",
    "etab_ptr": "*i32",
    "inv_ptr": "*i32",
    "state_ptr": "*i32",
    "rejws_ptr": "*i32",
    "raw_m_ptr": "*fp32",
    "raw_s_ptr": "*fp32",
    "key_ptr": "*i64",
}
FLAGS = ("GREEDY_ONLY", "HAS_Q", "HAS_TOPK", "HAS_TOPP", "HAS_FILTER", "HAS_MASK")
# Layout flags (issue 13): compiled off in every flag combination above, and on in one variant
# per kernel (flat rows and probability inputs with every other sampling flag on), not in the
# full product (that would quadruple the compile time).
LAYOUT_FLAGS = ("FLAT", "LOG_X")
# The token bitmask (issue 23) in the verification kernels: off in every variant of the product
# above (the logprobs kernel has it in its product); on in the richest variant of each kernel
# (with the layout flags where it has them) and in its greedy-only one.
MASK_FLAGS = ("HAS_MASK",)
# Sparse logit edits and min-p (issue 54): off in every variant above; on together in the richest
# variant of each kernel (with the layout and mask flags), and the edits in its greedy-only one.
EDIT_FLAGS = ("HAS_EDITS", "HAS_MINP")
# A reduced draft vocabulary (issue 54, q read through the [V] inverse index): off in every variant
# above; on in the kernels that read q, in each sampling variant of the product with draft
# probabilities (no layout, mask or edits; the filters, the method) and in the richest one.
MAP_FLAGS = ("HAS_DRAFT_MAP",)
# non-boolean mode constexprs and their values (NTOP: the logprobs' top-n off and at its largest;
# METHOD: block verification, issue 22, with every sampling flag combination of the chain kernels)
MODES = {"MODE": (0, 1, 2), "NTOP": (0, 20), "METHOD": (0, 1)}
# The statistics pass's extra work (issue 52), a mode of the split statistics kernel: 0 none,
# 1 gather filter candidates, 2 the fused one-hot race; elsewhere derived from the flags (the
# launchers' rules: :func:`_derived`).
PASS_MODES = {"GATHER": (False, True, False), "FUSED": (False, False, True)}
# Logprobs scored by the verifying pass (issue 52, ``LP``: ``RAW`` = log_softmax of the logits as
# given, else the processed distribution; ``NTOP`` the top-n at its largest): off in every variant
# above (the chain kernels' ``NTOP`` is not in their product), on in :data:`LP_VARIANTS` of the
# kernels that take it. ``--only-logprobs`` compiles those alone.
LP_OFF = {"LP": False, "RAW": False, "NTOP": 0, "NBLOCK": 1}
_ON = {"LP": True, "NTOP": 20, "NBLOCK": 32}
#: The one-pass logprobs variants: the serving cases (one-hot race, filters with the candidate
#: buffer, greedy with mask and edits, block verification), raw and processed.
LP_VARIANTS = [
    # sampling, one-hot drafts, no filter: the race and the lists ride on the statistics pass
    dict(_ON, RAW=True, GREEDY_ONLY=False, HAS_Q=False, HAS_TOPK=False, HAS_TOPP=False,
         HAS_FILTER=False, METHOD=0),
    # sampling with draft probabilities, every filter, mask, edits, min-p, flat rows: processed
    dict(_ON, RAW=False, GREEDY_ONLY=False, HAS_Q=True, HAS_TOPK=True, HAS_TOPP=True,
         HAS_FILTER=True, METHOD=0, HAS_MASK=True, HAS_EDITS=True, HAS_MINP=True, FLAT=True),
    # greedy-only with mask and edits: processed
    dict(_ON, RAW=False, GREEDY_ONLY=True, HAS_Q=False, HAS_TOPK=False, HAS_TOPP=False,
         HAS_FILTER=False, METHOD=0, HAS_MASK=True, HAS_EDITS=True),
    # block verification with draft probabilities and filters: raw
    dict(_ON, RAW=True, GREEDY_ONLY=False, HAS_Q=True, HAS_TOPK=True, HAS_TOPP=True,
         HAS_FILTER=True, METHOD=1),
]  # fmt: skip


def _derived(fn, constexprs):
    """The constexprs a launcher computes from the others (``_Args.gather`` / ``fused_race``)."""
    names = fn.arg_names
    sampling = not constexprs.get("GREEDY_ONLY", False)
    filtered = constexprs.get("HAS_TOPK", False) or constexprs.get("HAS_TOPP", False)
    filtered = filtered or constexprs.get("HAS_MINP", False)
    filtered = filtered or constexprs.get("HAS_FILTER", False)
    one_hot = sampling and not constexprs.get("HAS_Q", False) and not filtered
    out = {}
    if fn is verify_tree._verify_tree_kernel:  # the walk gathers unless the split stats did
        topkp = constexprs.get("HAS_TOPK", False) or constexprs.get("HAS_TOPP", False)
        out["HAS_FILTER"] = topkp
        out["GATHER"] = sampling and topkp and not constexprs.get("PRE", False)
        out["GATHER"] = out["GATHER"] and not constexprs.get("HAS_MASK", False)  # as launched
        out["PRE"] = constexprs.get("PRE", False)
        out["SPLIT_RACE"] = out["PRE"] and sampling
        return out
    if "GATHER" in names and "HAS_TOPK" in names:  # the row kernel
        out["GATHER"] = sampling and filtered
        out["FUSED"] = one_hot and constexprs.get("METHOD", 0) == 0
    if "FUSED" in names and "GATHER" not in names:  # the split decide kernel
        out["FUSED"] = one_hot
    return out


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
    src = ASTSource(
        fn,
        _signature(fn, constexprs),
        constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
    )
    own = {
        verify_tree._verify_tree_kernel: verify_tree,
        verify_tree._tree_race_kernel: verify_tree,
        verify_tree._tree_finish_kernel: verify_tree,
        logprobs._emitted_logprobs_kernel: logprobs,
    }
    module = own.get(fn, verify_sampling)  # whose compile_options the kernel is launched with
    return triton.compile(src, target=target, options=module.compile_options(fn))


def kernels():
    """Every variant of :func:`_variants` with the draft map off, then the map's variants."""
    for fn, constexprs in _variants():
        if not any(k in fn.arg_names for k in MAP_FLAGS):
            yield fn, constexprs
            continue
        yield fn, {**constexprs, **{k: False for k in MAP_FLAGS}}
        plain = not any(constexprs.get(k) for k in LAYOUT_FLAGS + MASK_FLAGS + EDIT_FLAGS)
        richest = constexprs.get("HAS_EDITS")
        sampling = constexprs.get("HAS_Q") and not constexprs.get("GREEDY_ONLY")
        if sampling and (plain or richest):
            yield fn, {**constexprs, **{k: True for k in MAP_FLAGS}}


def _variants():
    cfg = verify_sampling.launch_config(128256)
    sizes = {
        "CHUNK": cfg["CHUNK"],
        "BLOCK": cfg["BLOCK"],
        "TBLOCK": cfg["TBLOCK"],
        "NPIV": cfg["NPIV"],
        "BLOCK_K": 16,
        "BLOCK_N": 16,
        "CAP": cfg["CAP"],
        "SB": cfg["SB"],
        "SW": cfg["SW"],
    }
    for fn in (
        verify_sampling._verify_row_kernel,
        verify_sampling._split_pivot_kernel,
        verify_sampling._split_stats_kernel,
        verify_sampling._split_threshold_kernel,
        verify_sampling._split_race_kernel,
        verify_sampling._split_decide_kernel,
        accept_reject._accept_reject_kernel,
        accept_tests._accept_tests_kernel,
        verify_tree._verify_tree_kernel,
        verify_tree._tree_race_kernel,
        verify_tree._tree_finish_kernel,
        logprobs._emitted_logprobs_kernel,
    ):
        sampled = fn is not logprobs._emitted_logprobs_kernel  # HAS_MASK outside the product
        masks = {k: False for k in MASK_FLAGS if k in fn.arg_names and sampled}
        edits = {k: False for k in EDIT_FLAGS if k in fn.arg_names}
        tree = fn is verify_tree._verify_tree_kernel
        derived = ("HAS_FILTER",) if tree else ()  # the tree's: from HAS_TOPK / HAS_TOPP
        flags = [f for f in FLAGS if f in fn.arg_names and f not in masks and f not in derived]
        lp_off = {k: v for k, v in LP_OFF.items() if k in fn.arg_names and "LP" in fn.arg_names}
        modes = [m for m in MODES if m in fn.arg_names and m not in lp_off]
        fixed = {k: v for k, v in sizes.items() if k in fn.arg_names}
        fixed.update(lp_off)
        if "BLOCK_K" in fn.arg_names and fn is accept_reject._accept_reject_kernel:
            fixed["BLOCK_K"] = 64
        choices = [(False, True)] * len(flags) + [MODES[m] for m in modes]
        passes = [{}]
        if fn is verify_sampling._split_stats_kernel:
            passes = [{k: v[i] for k, v in PASS_MODES.items()} for i in range(3)]
        layout = {k: False for k in LAYOUT_FLAGS if k in fn.arg_names}
        for values, extra in itertools.product(itertools.product(*choices), passes):
            constexprs = dict(zip(flags + modes, values))
            if extra and constexprs.get("GREEDY_ONLY") and any(extra.values()):
                continue  # greedy-only calls neither gather nor race
            constexprs.update(extra)
            constexprs.update(_derived(fn, constexprs))
            if (
                fn is verify_sampling._verify_row_kernel
                and constexprs["GATHER"]
                and constexprs["HAS_TOPK"] != constexprs["HAS_TOPP"]
            ):
                # one filter alone is a branch of select_filter and thresholds, compiled in every
                # combination by the split threshold kernel; the walk with a filter (40-70 s a
                # variant) is compiled with both
                continue
            if constexprs.get("GREEDY_ONLY") and (
                constexprs.get("MODE", 0)
                or constexprs.get("HAS_TOPK")
                or constexprs.get("HAS_TOPP")
            ):
                continue  # the launchers never combine greedy_only with sampling flags
            if constexprs.get("GREEDY_ONLY") and constexprs.get("METHOD", 0):
                continue  # greedy-only calls use the token rule
            if fn is verify_tree._verify_tree_kernel and (
                constexprs["HAS_TOPK"] != constexprs["HAS_TOPP"]
                or (constexprs["HAS_TOPK"] and constexprs["MODE"] != 1)
            ):
                continue  # the filters' code is the chain kernels' (compiled above): one mode
            if "NTOP" in constexprs:  # the top-n list: the power of two >= n
                constexprs["NBLOCK"] = triton.next_power_of_2(max(constexprs["NTOP"], 1))
            yield fn, {**fixed, **layout, **masks, **edits, **constexprs}
        richest = {f: f != "GREEDY_ONLY" for f in flags}
        richest.update({m: MODES[m][1] for m in modes})  # tree: the mode compiled with filters
        if fn is verify_sampling._split_stats_kernel:
            richest.update({"GATHER": True, "FUSED": False})
        richest.update(_derived(fn, richest))
        if layout:  # vLLM's flat rows + probability inputs: the sampling variant with everything on
            yield fn, {**fixed, **richest, **masks, **edits, **{k: True for k in layout}}
        on = {k: True for k in layout}  # the layout flags of the richest variants below
        on.update({k: True for k in masks})
        if masks:  # grammar masks: the richest sampling variant, and greedy-only
            masked = {**fixed, **richest, **edits, **on}
            if tree:  # its walk gathers only without a mask
                masked.update(_derived(fn, masked))
            yield fn, masked
            if "GREEDY_ONLY" in flags:
                greedy = {f: f == "GREEDY_ONLY" for f in flags}
                greedy.update({m: MODES[m][0] for m in modes})
                if fn is verify_sampling._split_stats_kernel:
                    greedy.update({"GATHER": False, "FUSED": False})
                greedy.update(_derived(fn, greedy))
                yield fn, {**fixed, **greedy, **layout, **edits, **{k: True for k in masks}}
        if tree:  # the split strategy's walk (statistics read, not computed): richest, greedy
            greedy = {f: f == "GREEDY_ONLY" for f in flags}
            greedy.update({m: MODES[m][0] for m in modes})
            for base in (richest, greedy):
                pre = {**base, "PRE": True}
                pre.update(_derived(fn, pre))
                yield fn, {**fixed, **pre, **{k: True for k in masks}}
        if edits:  # edits and min-p: the richest sampling variant (no log inputs), and greedy-only
            rich = {**richest, **{k: True for k in edits}}
            rich.update(_derived(fn, rich))
            if "NTOP" in rich:  # the logprobs' top-n list at its largest
                rich["NBLOCK"] = triton.next_power_of_2(rich["NTOP"])
            yield fn, {**fixed, **rich, **on, **({"LOG_X": False} if "LOG_X" in on else {})}
            if "GREEDY_ONLY" in flags:
                greedy = {f: f == "GREEDY_ONLY" for f in flags}
                greedy.update({m: MODES[m][0] for m in modes})
                if fn is verify_sampling._split_stats_kernel:
                    greedy.update({"GATHER": False, "FUSED": False})
                greedy.update(_derived(fn, greedy))
                greedy_edits = {k: k == "HAS_EDITS" for k in edits}
                if "NTOP" in greedy:
                    greedy_edits["NBLOCK"] = 1
                yield fn, {**fixed, **greedy, **on, **greedy_edits}
            if "FUSED" in fn.arg_names:  # the one-hot race fused into the statistics pass
                fused = {f: False for f in flags}
                fused.update({m: MODES[m][0] for m in modes})
                if fn is verify_sampling._split_stats_kernel:
                    fused.update({"GATHER": False, "FUSED": True})
                fused.update(_derived(fn, fused))
                yield fn, {**fixed, **fused, **layout, **masks, "HAS_EDITS": True}
        if lp_off:  # the one-pass logprobs
            for variant in LP_VARIANTS:
                on = {k: v for k, v in variant.items() if k in fn.arg_names}
                base = {**fixed, **layout, **masks, **edits}
                base.update({f: False for f in flags})
                base.update({m: MODES[m][0] for m in modes})
                base.update(on)
                if fn is verify_sampling._split_stats_kernel:
                    base.update({"GATHER": False, "FUSED": False})
                    filtered = any(variant.get(k) for k in ("HAS_TOPK", "HAS_TOPP", "HAS_MINP"))
                    sampling = not variant["GREEDY_ONLY"]
                    base["GATHER"] = sampling and filtered
                    base["FUSED"] = sampling and not filtered and not variant["HAS_Q"]
                base.update(_derived(fn, base))
                yield fn, base


def ptxas_resources(ptx: str, arch: str) -> dict:
    """Registers, spills and shared memory of the kernel in ``ptx`` from ``ptxas -v``."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(int(arch)).path  # the ptxas Triton itself uses for this target
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        target = re.search(r"\.target\s+(sm_\w+)", ptx)  # e.g. sm_90a: as Triton built it
        arch = target.group(1) if target else f"sm_{arch}"
        out = subprocess.run(
            [ptxas, f"-arch={arch}", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr

    def number(pattern):
        m = re.search(pattern, out)
        return int(m.group(1)) if m else 0

    return {
        "registers": number(r"Used (\d+) registers"),
        "spill_stores_bytes": number(r"(\d+) bytes spill stores"),
        "spill_loads_bytes": number(r"(\d+) bytes spill loads"),
        "stack_frame_bytes": number(r"(\d+) bytes stack frame"),
        "shared_bytes_ptxas": number(r"(\d+) bytes smem"),
    }


def main(archs, report=None, fail_on_spills=False, command=None, only_logprobs=False):
    failures = 0
    rows = []
    for arch in archs:
        target = GPUTarget("cuda", int(arch), 32)
        for fn, constexprs in kernels():
            if only_logprobs and not constexprs.get("LP"):
                continue
            flags = {
                k: v
                for k, v in constexprs.items()
                if k in FLAGS
                or k in MODES
                or k in LAYOUT_FLAGS
                or k in MASK_FLAGS
                or k in EDIT_FLAGS
                or k in MAP_FLAGS
                or k in ("LP", "RAW", "NTOP", "GATHER", "FUSED")
            }
            try:
                compiled = _compile(fn, constexprs, target)
                ok = "cubin" in compiled.asm
                line = f"sm_{arch} {fn.__name__} {flags}: {'ok' if ok else 'NO CUBIN'}"
                failures += not ok
                if report is not None or fail_on_spills:
                    res = ptxas_resources(compiled.asm["ptx"], arch)
                    res.update(
                        kernel=fn.__name__,
                        arch=f"sm_{arch}",
                        flags=flags,
                        num_warps=compiled.metadata.num_warps,
                        shared_bytes=compiled.metadata.shared,
                    )
                    rows.append(res)
                    spills = res["spill_stores_bytes"] + res["spill_loads_bytes"]
                    line += f" ({res['registers']} regs, {spills} spill bytes)"
                    if fail_on_spills and spills:
                        line += " SPILLS"
                        failures += 1
                print(line)
            except Exception as exc:  # report every failure, then fail
                print(f"sm_{arch} {fn.__name__} {flags}: FAILED {type(exc).__name__}: {exc}")
                failures += 1
    if report is not None:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        ).stdout
        with open(report, "w") as f:
            json.dump(
                {
                    "date": datetime.date.today().isoformat(),
                    "commit": commit.strip(),
                    "triton": triton.__version__,
                    "vocab_size": 128256,
                    "kernels": rows,
                    "command": command,
                },
                f,
                indent=1,
            )
            f.write("\n")
    return failures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archs", nargs="*", default=["90", "80"])
    parser.add_argument("--report", help="write the resource report (JSON) here")
    parser.add_argument("--fail-on-spills", action="store_true")
    parser.add_argument(
        "--only-logprobs", action="store_true", help="only the one-pass logprobs variants (LP)"
    )
    args = parser.parse_args()
    command = "python tests/aot_compile.py " + " ".join(sys.argv[1:])
    failures = main(args.archs, args.report, args.fail_on_spills, command, args.only_logprobs)
    sys.exit(1 if failures else 0)
