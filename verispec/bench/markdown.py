"""The markdown of each study (``DIR/<study>.md``) and the gathered report (``DIR/report.md``).

A study's page: the header (device, versions, date, command, the model pair), what was measured (the study
module's docstring), its tables, its plots. Numbers are printed from the rows as written; analytical
values are the rows' own (computed with ``verispec.analysis`` when measured) or computed here with it.
"""
from __future__ import annotations

import inspect
from pathlib import Path

from .options import STUDIES
from .studies import MODULES
from .studies.speedup import recommendations


def _table(columns: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows)]


def _f(x, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _alpha(a) -> str:
    return "measured" if a is None else _f(a)


def header(env: dict, pair: str) -> list[str]:
    return [f"- device: {env['device']}", f"- date: {env['date']}",
            f"- versions: verispec {env.get('verispec', '?')}, torch {env['torch']}"
            + (f" (CUDA {env['cuda']})" if env.get("cuda") else "")
            + f", triton {env['triton']}, matplotlib {env['matplotlib']}, python {env['python']}",
            f"- command: `{env['command']}`", f"- models: {pair}"]


def _live(rows):
    return [r for r in rows if not r.get("skipped")]


# ------------------------------------------------------------------------------------------ tables
def kernels(rows) -> list[str]:
    rows = sorted(_live(rows), key=lambda r: (r["point"]["backend"], r["point"]["alpha"], r["point"]["batch"]))
    return _table(["backend", "batch", "alpha", "K", "latency µs", "floor µs", "% of floor", "GB/s", "MB moved"],
                  [[r["point"]["backend"], r["point"]["batch"], r["point"]["alpha"], r["k"], _f(r["us"], 1),
                    _f(r["floor_us"], 2), _f(100 * r["floor_us"] / r["us"], 1), _f(r["achieved_gbps"], 1),
                    _f(r["bytes"] / 1e6, 3)] for r in rows])


def speedup(rows) -> list[str]:
    live = _live(rows)
    ar = [r for r in live if r["point"]["method"] == "ar"]
    sd = [r for r in live if r["point"]["method"] != "ar"]
    lines = []
    if ar:
        lines += [f"AR: {_f(ar[0]['tokens_per_s'], 1)} tokens/s at batch {ar[0]['batch']}, "
                  f"{_f(ar[0]['t_target_ms'], 3)} ms per target step.", ""]
    lines += _table(["method", "alpha", "K", "measured alpha", "tokens/round", "E_SD", "T_draft ms", "T_verify ms",
                     "tok/s", "measured speedup", "predicted E_SD/(1+Kc)", "predicted from passes"],
                    [[r["point"]["method"], _alpha(r["point"]["alpha"]), r["point"]["k"], _f(r["alpha_measured"], 3),
                      _f(r["tokens_per_round"]), _f(r["e_sd"]), _f(r["t_draft_ms"], 4), _f(r["t_verify_ms"], 3),
                      _f(r["tokens_per_s"], 1), _f(r["speedup"]), _f(r["predicted"]), _f(r["predicted_pass"])]
                     for r in sd])
    if sd:
        k_max = max(r["point"]["k"] for r in sd if r["point"]["method"] == "sd")
        lines += ["", "Recommendation (``verispec.analysis.optimal_k`` at the measured alpha and cost ratio "
                  "c = T_draft / T_target, K <= the largest swept K):", ""]
        lines += _table(["alpha", "measured alpha", "c", "recommended K", "its predicted speedup", "best measured K",
                         "its measured speedup", "k=auto measured speedup"],
                        [[_alpha(g["alpha"]), _f(g["alpha_measured"], 3), _f(g["cost_ratio"], 4), g["optimal_k"],
                          _f(g["optimal_speedup"]), g["best_k"], _f(g["best_speedup"]),
                          _f(g["auto_speedup"]) if g["auto_speedup"] is not None else "not run"]
                         for g in recommendations(rows, k_max)])
    if any(r.get("skipped") for r in rows) or not any(r["point"]["method"] == "auto" for r in rows):
        lines += ["", "k=auto: not measured (this engine has no k policy, verispec/engine/auto_k.py)."]
    return lines


def breakdown(rows) -> list[str]:
    def name(r):
        p = r["point"]
        return "AR" if p["method"] == "ar" else f"{p['method'].upper()} K={p['k']}" + (" (sim)" if p["method"] == "ssd" else "")

    return _table(["method", "draft ms", "target ms", "verification ms", "commit ms", "communication ms",
                   "waiting on draft ms", "round ms", "tokens/round (per sequence)", "ms per token"],
                  [[name(r), _f(r.get("draft_ms"), 3), _f(r.get("target_ms"), 3), _f(r.get("verification_ms"), 3),
                    _f(r.get("commit_ms"), 3), _f(r.get("link_ms"), 3), _f(r.get("waiting_ms"), 3),
                    _f(r["round_ms"], 3), _f(r["tokens_per_round"]), _f(r["round_ms"] / r["tokens_per_round"], 3)]
                   for r in _live(rows)])


def window(rows) -> list[str]:
    rows = sorted(_live(rows), key=lambda r: r["point"]["k"])
    return _table(["K", "T_target ms", "T_draft ms", "T_verify(K) ms", "T_SD (target steps)", "draft steps per pass",
                   "measured alpha", "E_SD", "predicted speedup"],
                  [[r["point"]["k"], _f(r["t_target_ms"], 3), _f(r["t_draft_ms"], 4), _f(r["t_verify_ms"], 3),
                    _f(r["t_sd"], 3), _f(r["steps_per_pass"], 1), _f(r["alpha_measured"], 3), _f(r["e_sd"]),
                    _f(r["predicted"])] for r in rows])


def batch(rows) -> list[str]:
    live = _live(rows)
    static = sorted((r for r in live if r["point"]["mode"] == "static"),
                    key=lambda r: (r["point"]["batch"], r["point"]["method"]))
    ar = {r["point"]["batch"]: r["tokens_per_s"] for r in static if r["point"]["method"] == "ar"}
    lines = ["Static batches:", ""]
    lines += _table(["batch", "method", "K", "measured alpha", "drafts/row/round", "tokens/s", "ms per token",
                     "vs AR"],
                    [[r["point"]["batch"], r["point"]["method"], r["k"], _f(r["alpha_measured"], 3), _f(r["mean_k"]),
                      _f(r["tokens_per_s"], 1), _f(r["ms_per_token"], 2),
                      _f(r["tokens_per_s"] / ar[r["point"]["batch"]]) if r["point"]["batch"] in ar else "-"]
                     for r in static])
    lost = sorted(b for b in ar for r in static if r["point"]["batch"] == b and r["point"]["method"] == "sd"
                  and r["tokens_per_s"] < ar[b])
    lines += ["", f"SD stops paying (slower than AR) at batch sizes: {', '.join(map(str, lost)) or 'none measured'}."]
    arrivals = sorted((r for r in live if r["point"]["mode"] == "arrivals"),
                      key=lambda r: (r["point"]["rate"], r["point"]["method"]))
    if arrivals:
        lines += ["", f"Poisson arrivals ({arrivals[0]['requests']} requests into {arrivals[0]['batch']} rows):", ""]
        lines += _table(["rate (req/s)", "method", "K", "tokens/s", "ms per token (median request)"],
                        [[r["point"]["rate"], r["point"]["method"], r["k"], _f(r["tokens_per_s"], 1),
                          _f(r["ms_per_token"], 2)] for r in arrivals])
    return lines


def ssd(rows) -> list[str]:
    live = _live(rows)
    measured = [r for r in live if r["point"]["sweep"] == "measured"]
    lines = ["Measured vs simulated (the simulator's inputs are this run's pass times):", ""]
    lines += _table(["method", "K", "alpha (measured)", "measured tok/s", "simulated tok/s"],
                    [[r["method"].upper(), r["k"], _f(r["alpha"], 3), _f(r["tokens_per_s"], 1),
                      _f(r["predicted_tokens_per_s"], 1)] for r in measured])
    for sweep, what in (("hit_rate", "hit rate"), ("fanout", "fan-out")):
        rs = [r for r in live if r["point"]["sweep"] == sweep and r["method"] == "ssd"]
        lines += ["", f"SSD over the {what} (simulated):", ""]
        lines += _table([what, "tok/s", "speedup vs AR", "hit rate"],
                        [[r["value"], _f(r["tokens_per_s"], 1), _f(r["speedup_vs_ar"]), _f(r["hit_rate"], 3)]
                         for r in rs])
    return lines


def _skip_reasons(rows) -> list[str]:
    """One line per distinct reason a point was skipped (rows that give one)."""
    reasons = sorted({r["reason"] for r in rows if r.get("skipped") and r.get("reason")})
    return [f"Not measured: {why.rstrip('.')}." for why in reasons]


def _exact(r) -> str:
    return "yes" if r["exact"] else "**NO**"


def trees(rows) -> list[str]:
    from .studies.trees import best_chain, groups, shape

    order = {"plain": 0, "chain": 1, "tree": 2, "tree-auto": 3}
    lines = []
    for b, a, rs in groups(rows):
        best = best_chain(rs)
        plain = next((r for r in rs if r["point"]["method"] == "plain"), None)
        rs = sorted(rs, key=lambda r: (order[r["point"]["method"]], r["point"].get("k", 0)))
        title = f"Batch {b}" + (f", oracle alpha {a}" if a is not None else "")
        lines += [f"{title}" + (f" (best chain: {shape(best['point'])})" if best else "") + ":", ""]
        lines += _table(["drafting", "nodes/round", "tokens/round", "measured alpha", "target pass ms", "tok/s",
                         "vs plain", "vs best chain", "== plain"],
                        [[shape(r["point"]), _f(r["nodes_per_round"]), _f(r["tokens_per_round"]),
                          _f(r["alpha_measured"], 3) if r["point"]["method"] != "plain" else "-",
                          _f(r["t_target_ms"], 3), _f(r["tokens_per_s"], 1),
                          _f(r["tokens_per_s"] / plain["tokens_per_s"]) if plain else "-",
                          _f(r["tokens_per_s"] / best["tokens_per_s"]) if best and r["point"]["method"] != "plain"
                          else "-", _exact(r)] for r in rs])
        tree_rows = [r for r in rs if r["point"]["method"] in ("tree", "tree-auto")]
        if best and tree_rows:
            top = max(tree_rows, key=lambda r: r["tokens_per_s"])
            lines += ["", f"Best tree: {shape(top['point'])}, {_f(top['tokens_per_s'] / best['tokens_per_s'])}x the "
                      f"best chain's tok/s with {_f(top['tokens_per_round'] / best['tokens_per_round'])}x its tokens "
                      f"per round ({_f(top['nodes_per_round'], 1)} nodes per round vs "
                      f"{_f(best['nodes_per_round'], 1)})."]
        lines.append("")
    wrong = [r for r in _live(rows) if not r["exact"]]
    if wrong:
        lines += [f"**{len(wrong)} run(s) differ from plain decoding** (greedy output must be identical): "
                  + ", ".join(f"batch {r['point']['batch']} {shape(r['point'])}" for r in wrong) + ".", ""]
    return lines + _skip_reasons(rows)


def heads(rows) -> list[str]:
    live = _live(rows)
    if not live:
        return _skip_reasons(rows) or ["Not measured."]
    names = {"plain": "plain decoding", "lookup": "prompt lookup", "head": "feature head"}
    order = {"plain": 0, "lookup": 1, "head": 2}
    live = sorted(live, key=lambda r: (order[r["point"]["method"]], r["point"].get("k", 0)))
    lines = [f"{live[0]['prompts']} held-out prompts, static batches of {live[0]['batch']}.", ""]
    lines += _table(["drafter", "K", "tokens/round", "measured alpha", "acceptance per position (- untested)", "tok/s",
                     "vs plain", "== plain"],
                    [[names[r["point"]["method"]], r["point"].get("k", "-"), _f(r["tokens_per_round"]),
                      _f(r["alpha_measured"], 3) if r["point"]["method"] != "plain" else "-",
                      " ".join("-" if x is None else f"{x:.2f}" for x in r["alpha_per_position"]) or "-",
                      _f(r["tokens_per_s"], 1),
                      _f(r["tokens_per_s"] / r["plain_tokens_per_s"]) if r["plain_tokens_per_s"] else "-",
                      _exact(r)] for r in live])
    best = {m: max((r for r in live if r["point"]["method"] == m), key=lambda r: r["tokens_per_s"], default=None)
            for m in ("lookup", "head")}
    if best["head"] is not None:
        h = best["head"]
        lines += ["", f"Fastest head: K={h['point']['k']}, {_f(h['tokens_per_round'])} tokens per round, "
                  f"{_f(h['tokens_per_s'] / h['plain_tokens_per_s'])}x plain"
                  + (f"; fastest prompt lookup: K={best['lookup']['point']['k']}, "
                     f"{_f(best['lookup']['tokens_per_round'])} tokens per round, "
                     f"{_f(best['lookup']['tokens_per_s'] / best['lookup']['plain_tokens_per_s'])}x plain"
                     if best["lookup"] is not None else "") + "."]
    return lines + [""] + _skip_reasons(rows)


TABLES = {"kernels": kernels, "speedup": speedup, "breakdown": breakdown, "window": window, "batch": batch,
          "ssd": ssd, "trees": trees, "heads": heads}


def study_page(study: str, rows: list[dict], env: dict, pair: str, images: list[str], resumed: int) -> str:
    doc = inspect.getdoc(MODULES[study]) or ""
    lines = [f"# verispec bench: {study}", "", *header(env, pair)]
    if resumed:
        lines.append(f"- {resumed} point(s) were measured by an earlier run in this directory (resumed)")
    lines += ["", doc, "", *TABLES[study](rows), ""]
    lines += [f"![{study}]({name})" for name in images]
    return "\n".join(lines) + "\n"


def gather(out_dir: Path) -> Path:
    """``DIR/report.md``: every study page found in DIR, in study order, under one table of contents."""
    out_dir = Path(out_dir)
    found = [s for s in STUDIES if (out_dir / f"{s}.md").exists()]
    if not found:
        raise FileNotFoundError(f"{out_dir} holds no study report (<study>.md): run `verispec bench <study> "
                                f"--out {out_dir}` first")
    lines = ["# verispec bench report", "", "Studies: " + ", ".join(f"[{s}](#{s})" for s in found), ""]
    for s in found:
        body = (out_dir / f"{s}.md").read_text().splitlines()
        lines += [f'<a id="{s}"></a>', "", f"## {s}", *body[1:], ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
