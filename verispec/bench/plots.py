"""The PNG plots of each study (matplotlib, Agg backend: no display needed). 800 x 500 px figures.

``plot(study, rows, out_dir) -> [file names]``; rows are those of ``DIR/<study>.jsonl`` (skipped points
are left out). Every axis names its unit.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from .. import analysis  # noqa: E402

SIZE, DPI = (8, 5), 100


def _save(fig, out_dir: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(Path(out_dir) / name, dpi=DPI)
    plt.close(fig)
    return name


def _live(rows):
    return [r for r in rows if not r.get("skipped")]


def _label_alpha(alpha) -> str:
    return "measured alpha" if alpha is None else f"alpha={alpha}"


# ------------------------------------------------------------------------------------------ kernels
def kernels(rows, out_dir) -> list[str]:
    rows = _live(rows)
    fig, ax = plt.subplots(figsize=SIZE)
    for backend in sorted({r["point"]["backend"] for r in rows}):
        for alpha in sorted({r["point"]["alpha"] for r in rows}):
            rs = sorted((r for r in rows if r["point"]["backend"] == backend and r["point"]["alpha"] == alpha),
                        key=lambda r: r["point"]["batch"])
            ax.plot([r["point"]["batch"] for r in rs], [r["us"] for r in rs], marker="o",
                    label=f"{backend}, alpha={alpha}")
    floor = sorted({(r["point"]["batch"], r["floor_us"]) for r in rows})
    ax.plot([b for b, _ in floor], [f for _, f in floor], "k--", label="byte floor (copy bandwidth)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (sequences)")
    ax.set_ylabel("verification latency (µs, median)")
    ax.set_title(f"verify_greedy latency, K={rows[0]['k']} drafts, V={rows[0]['vocab']}, {rows[0]['dtype']}")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    first = _save(fig, out_dir, "kernels_latency.png")
    fig, ax = plt.subplots(figsize=SIZE)
    for backend in sorted({r["point"]["backend"] for r in rows}):
        rs = [r for r in rows if r["point"]["backend"] == backend]
        ax.scatter([r["bytes"] / 1e6 for r in rs], [r["achieved_gbps"] for r in rs], label=backend)
    ax.axhline(rows[0]["copy_gbps"], color="k", ls="--", label="copy bandwidth (the floor's rate)")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("bytes moved per call (MB)")
    ax.set_ylabel("achieved bandwidth (GB/s)")
    ax.set_title("verification roofline: achieved bandwidth vs bytes moved")
    ax.legend(fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    return [first, _save(fig, out_dir, "kernels_roofline.png")]


# ------------------------------------------------------------------------------------------ speedup
def speedup(rows, out_dir) -> list[str]:
    sd = [r for r in _live(rows) if r["point"]["method"] == "sd"]
    auto = [r for r in _live(rows) if r["point"]["method"] == "auto"]
    if not sd:
        return []
    fig, ax = plt.subplots(figsize=SIZE)
    k_max = max(r["point"]["k"] for r in sd)
    ks = list(range(1, k_max + 1))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, alpha in enumerate(sorted({r["point"]["alpha"] for r in sd}, key=lambda a: -1 if a is None else a)):
        rs = sorted((r for r in sd if r["point"]["alpha"] == alpha), key=lambda r: r["point"]["k"])
        color = colors[i % len(colors)]
        a = sum(r["alpha_measured"] for r in rs) / len(rs)
        c = sum(r["cost_ratio"] for r in rs) / len(rs)
        ax.plot([r["point"]["k"] for r in rs], [r["speedup"] for r in rs], "o-", color=color,
                label=f"measured, {_label_alpha(alpha)} (measured {a:.2f})")
        ax.plot(ks, [analysis.speedup(a, k, c) for k in ks], "--", color=color,
                label=f"E_SD/(1+K·c), alpha={a:.2f}, c={c:.3g}")
        ax.plot([r["point"]["k"] for r in rs], [r["predicted_pass"] for r in rs], "x", color=color, ms=9,
                label="E_SD·T_target/(K·T_draft+T_verify), measured passes")
        for r in auto:
            if r["point"]["alpha"] == alpha:
                ax.axhline(r["speedup"], color=color, ls=":", label=f"k=auto (cap {r['point']['k']})")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("K (drafts per round)")
    ax.set_ylabel("speedup over AR (× tokens/s)")
    ax.set_title("SD speedup over AR: measured vs analytical (from measured step times)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return [_save(fig, out_dir, "speedup.png")]


# ------------------------------------------------------------------------------------------ breakdown
BREAKDOWN_PARTS = (("draft_ms", "draft steps"), ("target_ms", "target pass"), ("verification_ms", "verification"),
                   ("commit_ms", "commit"), ("link_ms", "communication (SSD)"),
                   ("waiting_ms", "waiting on the draft (SSD)"))


def breakdown(rows, out_dir) -> list[str]:
    rows = _live(rows)
    labels = [("AR" if r["point"]["method"] == "ar" else f"{r['point']['method'].upper()} K={r['point']['k']}")
              + (" (sim)" if r["point"]["method"] == "ssd" else "") for r in rows]
    fig, ax = plt.subplots(figsize=SIZE)
    bottom = [0.0] * len(rows)
    for key, name in BREAKDOWN_PARTS:
        values = [r.get(key, 0.0) or 0.0 for r in rows]
        if any(values):
            ax.bar(range(len(rows)), values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
    for i, r in enumerate(rows):
        ax.text(i, bottom[i], f"{r['tokens_per_round']:.2f} tok", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=9)
    ax.set_ylabel("time per round (ms)")
    ax.set_ylim(0, max(bottom) * 1.12)
    ax.set_title(f"time per round, batch {rows[0]['batch']} (labels: tokens per sequence per round)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return [_save(fig, out_dir, "breakdown.png")]


# ------------------------------------------------------------------------------------------ window
def window(rows, out_dir) -> list[str]:
    rows = sorted(_live(rows), key=lambda r: r["point"]["k"])
    ks = [r["point"]["k"] for r in rows]
    fig, ax = plt.subplots(figsize=SIZE)
    ax.bar([k - 0.2 for k in ks], [r["t_sd"] for r in rows], width=0.4, label="T_SD = K·T_draft / T_target")
    ax.bar([k + 0.2 for k in ks], [r["t_verify_ms"] / r["t_target_ms"] for r in rows], width=0.4,
           label="T_verify(K) / T_target")
    ax.axhline(1.0, color="k", ls="--", lw=0.8, label="one target step")
    ax.set_xticks(ks)
    ax.set_xlabel("K (drafts per round)")
    ax.set_ylabel("time (in target decode steps)")
    ax.set_title(f"drafting window: T_target = {rows[0]['t_target_ms']:.2f} ms, T_draft = "
                 f"{min(r['t_draft_ms'] for r in rows):.3g} ms per step")
    ax.legend(fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    return [_save(fig, out_dir, "window.png")]


# ------------------------------------------------------------------------------------------ batch
def batch(rows, out_dir) -> list[str]:
    rows = _live(rows)
    fig, ax = plt.subplots(figsize=SIZE)
    markers = {"ar": "o", "sd": "s", "auto": "^"}
    for method in ("ar", "sd", "auto"):
        rs = sorted((r for r in rows if r["point"]["method"] == method and r["point"]["mode"] == "static"),
                    key=lambda r: r["point"]["batch"])
        if rs:
            ax.plot([r["ms_per_token"] for r in rs], [r["tokens_per_s"] for r in rs], marker=markers[method],
                    label=f"{method.upper()} static batch" + (f" (K={rs[0]['k']})" if method == "sd" else ""))
            for r in rs:
                ax.annotate(f"B={r['point']['batch']}", (r["ms_per_token"], r["tokens_per_s"]), fontsize=8,
                            textcoords="offset points", xytext=(4, 4))
        arr = sorted((r for r in rows if r["point"]["method"] == method and r["point"]["mode"] == "arrivals"),
                     key=lambda r: r["point"]["rate"])
        if arr:
            ax.scatter([r["ms_per_token"] for r in arr], [r["tokens_per_s"] for r in arr], marker=markers[method],
                       facecolors="none", edgecolors="k" if method == "ar" else "tab:red",
                       label=f"{method.upper()} Poisson arrivals")
            for r in arr:
                ax.annotate(f"{r['point']['rate']:g}/s", (r["ms_per_token"], r["tokens_per_s"]), fontsize=8,
                            textcoords="offset points", xytext=(4, -10))
    ax.set_xlabel("per-sequence latency (ms per generated token, median request)")
    ax.set_ylabel("throughput (tokens/s, all sequences)")
    ax.set_title("throughput vs latency: AR and SD across batch sizes and arrival rates")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return [_save(fig, out_dir, "batch_pareto.png")]


# ------------------------------------------------------------------------------------------ ssd
def ssd(rows, out_dir) -> list[str]:
    rows = _live(rows)
    names = []
    for sweep, xlabel in (("hit_rate", "SSD hit rate (per sequence)"), ("fanout", "fan-out (candidates per position)")):
        rs = [r for r in rows if r["point"]["sweep"] == sweep]
        fig, ax = plt.subplots(figsize=SIZE)
        for method in ("ar", "sd", "ssd"):
            m = [r for r in rs if r["method"] == method]
            ax.plot([r["value"] for r in m], [r["tokens_per_s"] for r in m], marker="o", label=f"{method.upper()} (simulated)")
        measured = [r for r in rows if r["point"]["sweep"] == "measured" and r["tokens_per_s"] is not None]
        for r in measured:
            ax.axhline(r["tokens_per_s"], ls=":", color="k" if r["method"] == "ar" else "tab:orange",
                       label=f"{r['method'].upper()} measured (K={r['k']})")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("throughput (tokens/s)")
        ax.set_title(f"SSD simulator on measured pass times: {sweep.replace('_', ' ')} sweep")
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
        names.append(_save(fig, out_dir, f"ssd_{sweep}.png"))
    rs = [r for r in rows if r["point"]["sweep"] == "alpha_k"]
    fig, ax = plt.subplots(figsize=SIZE)
    for method, ls in (("sd", "--"), ("ssd", "-")):
        for k in sorted({r["k"] for r in rs}):
            m = [r for r in rs if r["method"] == method and r["k"] == k]
            ax.plot([r["value"] for r in m], [r["speedup_vs_ar"] for r in m], ls, marker=".",
                    label=f"{method.upper()} K={k}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("acceptance rate alpha")
    ax.set_ylabel("speedup over AR (×, simulated)")
    ax.set_title("SD vs SSD speedup over alpha and K (simulated)")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(True, alpha=0.3)
    names.append(_save(fig, out_dir, "ssd_alpha_k.png"))
    return names


# ------------------------------------------------------------------------------------------ trees
def trees(rows, out_dir) -> list[str]:
    from .studies.trees import groups, shape

    fig, ax = plt.subplots(figsize=SIZE)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (b, a, rs) in enumerate(groups(rows)):
        color = colors[i % len(colors)]
        label = f"B={b}" + (f", alpha={a}" if a is not None else "")
        chains = sorted((r for r in rs if r["point"]["method"] == "chain"), key=lambda r: r["nodes_per_round"])
        if chains:
            ax.plot([r["nodes_per_round"] for r in chains], [r["tokens_per_s"] for r in chains], "o-", color=color,
                    label=f"{label}: chains")
        shaped = [r for r in rs if r["point"]["method"] in ("tree", "tree-auto")]
        for j, r in enumerate(shaped):
            ax.plot(r["nodes_per_round"], r["tokens_per_s"], "^" if r["point"]["method"] == "tree-auto" else "s",
                    color=color, ms=8, label=f"{label}: trees" if j == 0 else None)
            ax.annotate(shape(r["point"]).removeprefix("tree "), (r["nodes_per_round"], r["tokens_per_s"]),
                        fontsize=7, textcoords="offset points", xytext=(4, 4))
        for r in rs:
            if r["point"]["method"] == "plain":
                ax.axhline(r["tokens_per_s"], color=color, ls=":", lw=1, label=f"{label}: plain decoding")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    if len({r["point"]["batch"] for r in _live(rows)}) > 1:
        ax.set_yscale("log")
    ax.set_xlabel("draft nodes per round (per sequence: K for a chain, the tree's nodes)")
    ax.set_ylabel("throughput (tokens/s, all sequences)")
    ax.set_title("chains vs trees: tokens/s vs the drafted tokens each target pass scores")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    return [_save(fig, out_dir, "trees.png")]


# ------------------------------------------------------------------------------------------ heads
def heads(rows, out_dir) -> list[str]:
    rows = _live(rows)
    plain = next((r for r in rows if r["point"]["method"] == "plain"), None)
    fig, (left, right) = plt.subplots(1, 2, figsize=SIZE)
    for method, label, marker in (("head", "feature head", "s"), ("lookup", "prompt lookup", "o")):
        rs = sorted((r for r in rows if r["point"]["method"] == method), key=lambda r: r["point"]["k"])
        if rs:
            ks = [r["point"]["k"] for r in rs]
            left.plot(ks, [r["tokens_per_round"] for r in rs], marker=marker, label=label)
            right.plot(ks, [r["tokens_per_s"] for r in rs], marker=marker, label=label)
    left.axhline(1.0, color="k", ls=":", lw=1, label="plain decoding")
    if plain is not None:
        right.axhline(plain["tokens_per_s"], color="k", ls=":", lw=1, label="plain decoding")
    left.set_xlabel("K (drafts per round)")
    left.set_ylabel("tokens per round (per sequence)")
    left.set_title("tokens per target pass")
    right.set_xlabel("K (drafts per round)")
    right.set_ylabel("throughput (tokens/s)")
    right.set_title("decode speed")
    ks = sorted({r["point"]["k"] for r in rows if "k" in r["point"]})
    for ax in (left, right):
        ax.set_xticks(ks)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.suptitle("feature head vs prompt lookup vs plain decoding (held-out prompts, greedy)")
    return [_save(fig, out_dir, "heads.png")]


PLOTS = {"kernels": kernels, "speedup": speedup, "breakdown": breakdown, "window": window, "batch": batch,
         "ssd": ssd, "trees": trees, "heads": heads}


def plot(study: str, rows: list[dict], out_dir) -> list[str]:
    if not _live(rows):
        return []
    return PLOTS[study](rows, out_dir)
