"""SSD on one GPU: correctness of the CUDA path with both ranks as two processes, and the draft rank's work per
round against the target pass (the window pre-speculation must fit in). No speed claim for SSD itself: the two
ranks share one GPU.

1. Correctness (two processes on one GPU; backend "nccl", which joins as "cpu:gloo,cuda:nccl": SSD's messages
   travel over gloo as CPU tensors, the models run on the GPU in bf16 with CUDA graphs, the captured draft
   loop and the Triton race kernel). The embedded SmolLM2-135M as the target, its first ``--draft-layers``
   layers as the draft, a ragged batch of 4 chat prompts. Per case, SSD's tokens against the engine's SD with
   ``DraftModel`` (same draft, same seeds; run on the target rank) and against plain decoding (greedy). Two cases
   run ``budget_mode="auto"``: one picking F from the committed calibration (``results/ssd_calibration.json``, host
   term from ``results/ssd_gpu_check.json``; the 8B/1B costs, so the pick is that pair's, not this small model's),
   one whose pick cycles F = 4, 0, 2, 1, 3 round by round (the branch rows move every round: admit_from, keep,
   smaller graph buckets, all on the GPU).
2. Per-round time, one process, nothing else on the GPU (random bf16 weights at the 8B / 1B shapes, K = 4,
   128-token contexts): the target pass of [B, K + 1] tokens, the draft rank's on-the-spot draft of B rows and
   its pre-speculation of B * F branch rows (``DraftServer._prespeculate``: the host's choice of outcomes, the
   redirect, the K/V copy from the row that drafted the round's drafts, the K + 1 passes of the captured loop,
   the one device read), median of ``--iters`` rounds each, after a miss (the spot row drafted) and after a hit
   (a branch row drafted); beside them its host time before the draft's passes begin, the catch-up passes and
   graph captures in the timed rounds (0 expected) and K + 1 bare draft steps.

    python benchmarks/ssd_gpu_check.py --out DIR [--write]     # GPU, ~3 minutes; --write: results/ssd_gpu_check.md
    python benchmarks/ssd_gpu_check.py --quick --out DIR       # CPU: tiny random models, checks the script
    python benchmarks/ssd_gpu_check.py --correctness-only --out DIR   # GPU, ~1 minute: part 1 only (no --write)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import environment, environment_line, markdown_table  # noqa: E402
from verispec.distributed.channel import NullChannel  # noqa: E402
from verispec.distributed.draft_rank import DraftServer  # noqa: E402
from verispec.distributed.group import run_local  # noqa: E402
from verispec.distributed.simulator import SSDCosts  # noqa: E402
from verispec.distributed.ssd import SSDConfig, SSDDrafter  # noqa: E402
from verispec.drafters import DraftModel  # noqa: E402
from verispec.engine.decoder import SpeculativeDecoder  # noqa: E402
from verispec.runtime import ModelConfig, load_model  # noqa: E402

PROMPTS = ["Repeat exactly: the quick brown fox jumps over the lazy dog, then count from 1 to 10.",
           "Write a haiku about the sea.", "List three prime numbers.",
           "Explain in two sentences why the sky is blue."]
QUICK_TARGET = ModelConfig(vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                           intermediate_size=48, max_position_embeddings=256)
QUICK_PROMPTS = [[3, 14, 15, 9, 26, 5], [2, 7], [31, 41, 59, 26], [1]]
K = 4
RESULTS = Path(__file__).resolve().parent / "results"


class CyclingBudget(DraftServer):
    """``budget_mode="auto"`` whose pick cycles through F = 4, 0, 2, 1, 3 round by round: the branch rows move every
    round (a stress of ``DraftServer._set_width`` on the CUDA path; no token may change)."""

    def _pick_width(self) -> int:
        return (4, 0, 2, 1, 3)[self.stats.rounds % 5]


def _models(args, rank: int):
    if args.quick:
        target = load_model(QUICK_TARGET, device="cpu", dtype=torch.float32, seed=1)
        return target, target.truncated(1)
    target = load_model(device=f"cuda:{rank % torch.cuda.device_count()}")
    return target, target.truncated(args.draft_layers)


def check_rank(rank: int, world_size: int, cases: list[dict], args) -> list:
    """Rank 0: SSD through the engine, then the engine's SD and plain decoding; rank 1: the draft server."""
    target, draft = _models(args, rank)
    prompts = QUICK_PROMPTS if args.quick else PROMPTS
    out = []
    for case in cases:
        cfg = case["config"]
        if rank == 1:
            server = CyclingBudget if case.get("server") == "cycling" else DraftServer
            out.append(server(draft, [0], cfg).serve().hits)
            continue
        kw = dict(max_new_tokens=args.max_new_tokens, temperature=case["temperature"], top_p=case.get("top_p"),
                  seed=7, chat=not args.quick)
        drafter = SSDDrafter(1, cfg, leader=True)
        t0 = time.perf_counter()
        ssd = SpeculativeDecoder(target, drafter, k=cfg.k, isolate_drafter=True).generate(prompts, **kw)
        ssd_s = time.perf_counter() - t0
        drafter.close()
        sd = SpeculativeDecoder(target, DraftModel(draft), k=cfg.k).generate(prompts, **kw)
        plain = SpeculativeDecoder(target, None).generate(prompts, **kw)
        out.append(dict(name=case["name"], ssd=[g.tokens for g in ssd], sd=[g.tokens for g in sd],
                        plain=[g.tokens for g in plain], stats=vars(drafter.stats), error=drafter.error,
                        seconds=ssd_s, text=ssd[0].text[:80]))
    return out


def correctness(args, log) -> list[dict]:
    base = SSDConfig(k=K, budget=4, recv_timeout_s=120)
    cases = [dict(name="greedy, cache on", config=base, temperature=0.0),
             dict(name="greedy, cache off", config=replace(base, budget=0), temperature=0.0),
             dict(name="sampled T=0.7 top-p 0.9, cache on", config=base, temperature=0.7, top_p=0.9)]
    costs = SSDCosts.from_results(json.loads((RESULTS / "ssd_calibration.json").read_text()),
                                  json.loads((RESULTS / "ssd_gpu_check.json").read_text()), link_latency_s=20e-6)
    auto = replace(base, budget=8, budget_mode="auto", costs=costs)
    cases += [dict(name="greedy, budget auto (calibrated 8B/1B costs)", config=auto, temperature=0.0),
              dict(name="sampled T=0.7 top-p 0.9, budget moved every round (F = 4, 0, 2, 1, 3)",
                   config=replace(auto, budget=4), temperature=0.7, top_p=0.9, server="cycling")]
    backend = "gloo" if args.quick else "nccl"
    results, _ = run_local(check_rank, 2, cases, args, backend=backend, timeout_s=480, collective_timeout_s=120)
    rows = []
    for r, case in zip(results, cases):
        row = dict(case=r["name"], ssd_equals_sd=r["ssd"] == r["sd"],
                   ssd_equals_plain=(r["ssd"] == r["plain"]) if case["temperature"] == 0 else None,
                   hits=r["stats"]["hits"], misses=r["stats"]["misses"], error=r["error"], text=r["text"],
                   budget=r["stats"]["budget"], budget_changes=r["stats"]["budget_changes"])
        rows.append(row)
        log(f"{row['case']}: SSD == engine SD {row['ssd_equals_sd']}, == plain {row['ssd_equals_plain']}, "
            f"hits {row['hits']} misses {row['misses']}, last F {row['budget']} (changed {row['budget_changes']} "
            f"times), error {row['error']}")
    return rows


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _median_s(fn, iters: int) -> float:
    times = []
    for _ in range(iters):
        _sync()
        t = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def per_round(args, log) -> list[dict]:
    """Target pass [B, K+1] vs the draft rank's spot draft (B rows) and pre-speculation (B*F rows)."""
    from benchmarks.ssd_calibrate import pass_seconds

    if args.quick:
        target = load_model(QUICK_TARGET, device="cpu", dtype=torch.float32, seed=1)
        draft = load_model(QUICK_TARGET.replace(num_layers=1), device="cpu", dtype=torch.float32, seed=2)
        batches, fanouts, prompt_len = (1, 2), (2,), 8
    else:
        target, draft = load_model(args.target), load_model(args.draft)
        batches, fanouts, prompt_len = (1, 8), (2, 4, 8), 128
    target_s = {B: pass_seconds(target, B, (K + 1,), prompt_len, args.iters)[K + 1] for B in batches}
    del target
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    g = torch.Generator().manual_seed(0)
    rows = []
    for B in batches:
        for F in fanouts:
            # what the simulator charges for pre-speculation (``simulator.ssd_round``): K bare draft steps of B * F
            # rows, timed as the calibration times them
            step_s = pass_seconds(draft, B * F, (1,), prompt_len, args.iters)[1]
            server = DraftServer(draft, [0], SSDConfig(k=K, budget=F))
            server.channels = [NullChannel()]
            server._reserve(B, prompt_len + 64 * (3 * args.iters + 8))
            server._warm_up(B, K, [(0.0, 0, 1.0)], prompt_len)
            warmed = set(server.branches.model._graphs._graphs) | set(server.spot.model._graphs._graphs)
            prompts = torch.randint(0, draft.config.vocab_size, (B, prompt_len), generator=g).tolist()
            server._admit(list(range(B)), prompts, [1] * B, [(0.0, 0, 1.0, b) for b in range(B)])
            catch_ups = []                                   # the passes the branches' catch-ups ran

            def counted_catch_up(lengths, catch_up=server.branches._catch_up, model=server.branches.model):
                model.append = lambda tokens: catch_ups.append(tokens.shape) or type(model).append(model, tokens)
                try:
                    catch_up(lengths)
                finally:
                    del model.append

            server.branches._catch_up = counted_catch_up
            launched = []                                    # when each pre-speculation's passes began

            def timed_run(*a, run=server.branches._run):
                launched.append(time.perf_counter())
                return run(*a)

            server.branches._run = timed_run

            def spot():
                for seq in server.seqs:
                    seq.ready = None
                server._drafts([K] * B)

            def commit(hit: bool):
                # a hit: the deepest pre-speculated outcome becomes the round's; a miss: one nobody drafted
                outcomes = [max(seq.branches) if hit else (2, 7 if 7 != seq.drafts[2] else 8) for seq in server.seqs]
                server._commit([j for j, _ in outcomes], [seq.drafts[:j] + [t] for seq, (j, t) in
                                                           zip(server.seqs, outcomes)])

            def prespec_s(hit: bool) -> float:
                """Median pre-speculation time after a round whose drafts the spot (miss) or a branch (hit) drafted;
                appends the median host time before its draft's passes were called to ``host_s``."""
                times, before_loop = [], []
                for _ in range(args.iters):
                    spot()                                   # a round whose drafts the spot rows drafted
                    if hit:
                        server._prespeculate()
                        commit(True)
                        server._drafts([K] * B)              # the next round's, from a branch row (the hit)
                    _sync()
                    t = time.perf_counter()
                    server._prespeculate()
                    _sync()
                    times.append(time.perf_counter() - t)
                    before_loop.append(launched[-1] - t)
                    commit(False)
                host_s.append(statistics.median(before_loop))
                return statistics.median(times)

            host_s = []

            spot()
            server._prespeculate()                           # nothing captured here (checked below)
            commit(False)
            spot_s = _median_s(spot, args.iters)
            catch_ups.clear()
            miss_s, hit_s = prespec_s(False), prespec_s(True)
            captured = (set(server.branches.model._graphs._graphs) | set(server.spot.model._graphs._graphs)) - warmed
            row = dict(B=B, F=F, rows=B * F, target_ms=target_s[B] * 1e3, spot_ms=spot_s * 1e3,
                       prespec_ms=miss_s * 1e3, prespec_hit_ms=hit_s * 1e3, catch_up_passes=len(catch_ups),
                       host_before_loop_ms=[x * 1e3 for x in host_s],
                       graphs_after_warm_up=len(captured), step_ms=step_s * 1e3, model_ms=K * step_s * 1e3,
                       steps_k1_ms=(K + 1) * step_s * 1e3)
            row["fits"] = row["prespec_ms"] <= row["target_ms"]
            rows.append(row)
            log(f"B={B} F={F}: target pass {row['target_ms']:.2f} ms, spot draft {row['spot_ms']:.2f} ms, "
                f"pre-speculation of {B * F} rows {row['prespec_ms']:.2f} ms after a miss, {row['prespec_hit_ms']:.2f} "
                f"ms after a hit (host work before the passes: {row['host_before_loop_ms'][0]:.2f} / "
                f"{row['host_before_loop_ms'][1]:.2f} ms; the simulator's K bare steps: {row['model_ms']:.2f} ms, K + 1: "
                f"{row['steps_k1_ms']:.2f} ms); catch-up passes {len(catch_ups)}, graphs captured after the warm-up "
                f"{len(captured)}")
    return rows


def write_markdown(path: Path, res: dict) -> None:
    lines = ["# SSD on one GPU: the CUDA path's correctness and the draft rank's time per round", "",
             environment_line(res["env"]), f"Command: `{res['command']}`.", "",
             "## Correctness: two processes on one GPU (SSD messages over gloo, models in bf16 with CUDA graphs)", "",
             f"Target: the embedded SmolLM2-135M-Instruct; draft: its first {res['args']['draft_layers']} layers; "
             f"4 chat prompts, {res['args']['max_new_tokens']} new tokens, K = {K}, budget 4 branches per sequence "
             "(the auto cases: F picked per round, `last F` the one its last pre-speculation ran). The engine's SD "
             "(`DraftModel`, same seeds) and plain decoding ran on the target rank.", ""]
    lines += markdown_table(["case", "SSD == engine SD", "SSD == plain (greedy)", "hits", "misses", "last F",
                             "F changes", "error"],
                            [[r["case"], r["ssd_equals_sd"], "–" if r["ssd_equals_plain"] is None else
                              r["ssd_equals_plain"], r["hits"], r["misses"], r.get("budget", "–"),
                              r.get("budget_changes", "–"), r["error"] or "none"]
                             for r in res["correctness"]])
    lines += ["", "## The draft rank's work per round vs the target pass (one process, medians)", "",
              f"Target {res['args']['target']}, draft {res['args']['draft']} (random weights), K = {K}: the target "
              "pass verifies [B, K + 1] tokens; on a miss the draft rank drafts B rows on the spot (K + 1 passes); "
              "after answering it pre-speculates F branches per sequence, B * F rows drafted together. Pre-speculation "
              "is hidden when it takes no longer than the target pass; it is timed after a miss (the branches copy "
              "their K/V from the spot rows) and after a hit (from the hit branch's row). The draft rank runs K + 1 "
              "passes (the last ranks the bonus outcomes), copies K/V and chooses the outcomes on the host (`host ms "
              "before the passes`: from the start until its draft's passes are called, after a miss / a hit); "
              "`simulator.ssd_round` charges K + 1 one-token draft steps of B * F rows (`K + 1 bare steps`, timed like "
              "the calibration) plus that host time, fitted over rows (`benchmarks/ssd_sim.py --measured`); `K bare "
              "steps` is what it charged before. `catch-up passes` and `graphs after warm-up` count what the timed "
              "rounds ran beyond that (0 expected).", ""]
    lines += markdown_table(["B", "F", "branch rows", "target pass ms", "spot draft ms", "pre-speculation ms (miss)",
                             "pre-speculation ms (hit)", "host ms before the passes", "simulator: K bare steps ms",
                             "K + 1 bare steps ms",
                             "catch-up passes", "graphs after warm-up", "fits the target pass"],
                            [[r["B"], r["F"], r["rows"], f"{r['target_ms']:.2f}", f"{r['spot_ms']:.2f}",
                              f"{r['prespec_ms']:.2f}", f"{r['prespec_hit_ms']:.2f}",
                              " / ".join(f"{x:.2f}" for x in r["host_before_loop_ms"]), f"{r['model_ms']:.2f}",
                              f"{r['steps_k1_ms']:.2f}", r["catch_up_passes"], r["graphs_after_warm_up"],
                              "yes" if r["fits"] else "no"] for r in res["per_round"]])
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny random models on the CPU (checks the script)")
    p.add_argument("--draft-layers", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--target", default="llama-3.1-8b")
    p.add_argument("--draft", default="llama-3.2-1b")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default=None, help="folder for ssd_gpu_check.md + .json (default: write nothing)")
    p.add_argument("--write", action="store_true", help="also replace the committed results/ssd_gpu_check.md")
    p.add_argument("--correctness-only", action="store_true", help="part 1 only (the per-round timing is skipped)")
    args = p.parse_args(argv)
    if not args.quick and not torch.cuda.is_available():
        p.error("needs a CUDA GPU; use --quick on the CPU")
    if args.write and args.quick:
        p.error("--write keeps a GPU run; --quick runs tiny CPU models")
    if args.write and args.correctness_only:
        p.error("--write keeps a whole run; --correctness-only skips the per-round timing")
    if args.quick:
        args.max_new_tokens, args.iters = 16, 3
        args.target, args.draft, args.draft_layers = "tiny random (--quick)", "its first layer (--quick)", 1
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    res = {"env": environment(), "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
           "args": {k: v for k, v in vars(args).items() if k not in ("out", "write")}}
    res["correctness"] = correctness(args, log)
    res["per_round"] = [] if args.correctness_only else per_round(args, log)
    outs = [Path(args.out)] if args.out else []
    if args.write:
        outs.append(Path(__file__).resolve().parent / "results")
    for out in outs:
        out.mkdir(parents=True, exist_ok=True)
        (out / "ssd_gpu_check.json").write_text(json.dumps(res, indent=1))
        write_markdown(out / "ssd_gpu_check.md", res)
        log(f"wrote {out / 'ssd_gpu_check.md'}")
    return res


if __name__ == "__main__":
    main()
