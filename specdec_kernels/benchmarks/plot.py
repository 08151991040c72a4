"""Plots drawn from the benchmarks' JSON rows (matplotlib, imported only here)."""

from __future__ import annotations

K_ORDER = (1, 2, 4, 8, "auto")
PROVIDER_COLORS = {
    "triton": "tab:blue",
    "extension": "tab:blue",
    "reference": "tab:orange",
    "torch_compile": "tab:green",
    "hf": "tab:red",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _machine_label(rows: list[dict]) -> str:
    r = rows[0]
    m = r.get("machine", {})
    where = m.get("gpu") or f"{m.get('cpu', '?')} ({m.get('torch_threads', '?')} threads)"
    return f"{where}, commit {r.get('commit', '?')}, {r.get('date', '?')[:10]}"


def plot_e2e(rows: list[dict], path: str) -> None:
    """Speedup over ``target_only`` against K, one panel per batch size: ``specdec`` greedy and
    temperature 1 (solid), Leviathan's ideal from the measured acceptance and cost ratio
    (dotted), and ``hf_assisted`` (batch 1, markers)."""
    plt = _plt()
    sizes = sorted({r["batch_size"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 3.6), squeeze=False)
    colors = {0.0: "tab:blue", 1.0: "tab:orange"}
    for ax, b in zip(axes[0], sizes):
        ks = [k for k in K_ORDER if any(r["num_speculative_tokens"] == k for r in rows)]
        x = {k: i for i, k in enumerate(ks)}
        for t in sorted({r["temperature"] for r in rows}):
            c = colors.get(t, None)
            spec = [
                r
                for r in rows
                if r["system"] == "specdec"
                and r["batch_size"] == b
                and r["temperature"] == t
                and r["speedup_vs_target_only"] is not None
            ]
            spec.sort(key=lambda r: x[r["num_speculative_tokens"]])
            if spec:
                xs = [x[r["num_speculative_tokens"]] for r in spec]
                ax.plot(
                    xs,
                    [r["speedup_vs_target_only"] for r in spec],
                    "o-",
                    color=c,
                    label=f"specdec T={t:g}",
                )
                ax.plot(
                    xs, [r["ideal_speedup"] for r in spec], ":", color=c, label=f"ideal T={t:g}"
                )
            hf = [
                r
                for r in rows
                if r["system"] == "hf_assisted"
                and r["batch_size"] == b
                and r["temperature"] == t
                and r["speedup_vs_target_only"] is not None
            ]
            if hf:
                ax.plot(
                    [x[r["num_speculative_tokens"]] for r in hf],
                    [r["speedup_vs_target_only"] for r in hf],
                    "s--",
                    color=c,
                    alpha=0.6,
                    label=f"hf_assisted T={t:g}",
                )
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(range(len(ks)), [str(k) for k in ks])
        ax.set_xlabel("K (draft tokens per pass)")
        ax.set_title(f"batch {b}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("speedup vs target alone")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("End to end, bundled pair: " + _machine_label(rows), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ops(rows: list[dict], path: str) -> None:
    """Effective bandwidth (bytes needed / median time) against B, one panel per op variant,
    one line per provider, at the run's largest V, first dtype and the acceptance nearest 0.5."""
    plt = _plt()
    rows = [r for r in rows if "median_ms" in r]
    if not rows:
        return

    def variant(r):
        if r["op"] != "verify_sampling":
            return r["op"]
        return (
            "verify_sampling"
            + (" +q" if r["draft_probs"] else "")
            + (" +topk/p" if r["top_k_top_p"] else "")
        )

    names = sorted({variant(r) for r in rows})
    ncols = min(4, len(names))
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.8 * ncols, 3.3 * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(names) :]:
        ax.axis("off")
    copy = rows[0].get("copy_bandwidth_gbs")
    for ax, name in zip(flat, names):
        sel = [r for r in rows if variant(r) == name]
        v = max(r["V"] for r in sel)
        dt = sel[0]["dtype"]
        acc = min({r["acceptance"] for r in sel}, key=lambda a: abs(a - 0.5))
        sel = [r for r in sel if r["V"] == v and r["dtype"] == dt and r["acceptance"] == acc]
        for prov in dict.fromkeys(r["provider"] for r in sel):
            pts = sorted((r["B"], r["bandwidth_gbs"]) for r in sel if r["provider"] == prov)
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                "o-",
                label=prov,
                color=PROVIDER_COLORS.get(prov),
            )
        if copy:
            ax.axhline(copy, color="gray", ls=":", lw=0.8, label="copy bandwidth")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch B")
        ax.set_ylabel("effective GB/s (bytes needed)", fontsize=8)
        ax.legend(fontsize=6)
        ax.set_title(
            f"{name}\nV={v} {dt} acc={acc}" if v else f"{name}\n{dt} acc={acc}", fontsize=8
        )
        ax.grid(alpha=0.3)
    fig.suptitle("Kernels: " + _machine_label(rows), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_trees(rows: list[dict], path: str) -> None:
    """Token trees against chains (``specdec bench e2e --trees``, one temperature): an
    ``accepted per pass``
    panel (mean accepted drafts per row and target pass; the ``"all"`` group is the many-prompt
    measurement) and a tokens/s panel, one bar per shape, grouped by batch size."""
    plt = _plt()
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    groups = list(dict.fromkeys(r["batch_size"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13.5, 3.8))
    width = 0.8 / max(len(shapes), 1)
    cmap = plt.get_cmap("tab20")
    for ax, key, title in (
        (axes[0], "mean_accepted", "accepted per pass"),
        (axes[1], "tokens_per_second", "tokens/s"),
    ):
        for i, shape in enumerate(shapes):
            pts = [
                (j, r[key])
                for j, g in enumerate(groups)
                if key == "mean_accepted" or g != "all"
                for r in rows
                if r["shape"] == shape and r["batch_size"] == g and r.get(key) is not None
            ]
            ax.bar(
                [j + (i - (len(shapes) - 1) / 2) * width for j, _ in pts],
                [v for _, v in pts],
                width,
                label=shape,
                color=cmap(i % 20),
                hatch="" if shape.startswith("chain") else "//",
            )
        ticks = [g for g in groups if key == "mean_accepted" or g != "all"]
        ax.set_xticks(range(len(ticks)), [f"B={g}" if g != "all" else "all prompts" for g in ticks])
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="center right", fontsize=7)
    t = rows[0].get("temperature", 0.0)
    how = "greedy" if t == 0 else f"temperature {t:g}"
    fig.suptitle(f"Trees vs chains, bundled pair, {how}: " + _machine_label(rows), fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.87, 1))  # the legend to the right of the panels
    fig.savefig(path, dpi=110)
    plt.close(fig)
