"""Where a round's wall time goes on the host: the wait for the outcome against the host's own work, function by
function (benchmarks/results/round_host.md).

    python benchmarks/round_host.py [--weights bf16,packed] [--configs plain,k2,2-2,auto,auto-k1] [--batch 1]
                                    [--new-tokens 128] [--repeats 3] [--out DIR] [--write]

On a GPU a round is launched by the host and read back once (``read_outcome``); what the host does between that
read and the next launch, the device waits for. This script times ``generate`` on the 8B shape (random weights,
``make_peaked``) with ``OracleDraft`` paid by the 1B shape's passes (``--weights packed``: the 8B in Q4_K_M and the 1B
in Q8_0, random packed blocks, issue 24's speculation setting), as is (``ms per round``) and without prelaunched
drafts (``Drafter.prelaunch``), then again with
``time.perf_counter`` around the functions a round runs (module attributes replaced for that call, restored after)
and the device synchronized before each ``read_outcome``, so that the wait shows apart: ``wait`` = ms a round the
host waited for the device; ``host`` = the rest of the instrumented call's round; the functions' ms a round are
inclusive (a caller's time includes its callees'), and the work launched before the wait overlapped the device's.
On a CPU (tests) the same code runs on tiny fp32 models, where nothing overlaps.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402

from benchmarks.common import environment, environment_line, markdown_table, write_page  # noqa: E402

NAME = "round_host.md"
WAIT = "wait for the outcome"
# (module, attribute path) of the functions timed: the round's phases, the scheduler's bookkeeping, the drafter's
# propose down to its graph launch, the target's passes
TIMED = (("verispec.engine.scheduler", "Scheduler._round"), ("verispec.engine.scheduler", "Scheduler._retire"),
         ("verispec.engine.scheduler", "Scheduler._admit"), ("verispec.engine.scheduler", "Scheduler._deliver"),
         ("verispec.engine.round", "verification"), ("verispec.engine.round", "read_outcome"),
         ("verispec.engine.round", "commit_outcome"), ("verispec.engine.tree_round", "tree_verification"),
         ("verispec.engine.tree_round", "read_outcome"), ("verispec.engine.tree_round", "commit_outcome"),
         ("verispec.drafters.oracle", "OracleDraft.propose"), ("verispec.drafters.oracle", "OracleDraft.propose_tree"),
         ("verispec.drafters.oracle", "OracleDraft.commit"), ("verispec.drafters.draft_model", "DraftModel._run"),
         ("verispec.drafters.draft_model", "DraftModel._tree_passes"),
         ("verispec.runtime.model", "Model.draft_loop"), ("verispec.runtime.model", "Model.append"),
         ("verispec.runtime.model", "Model.append_tree"), ("verispec.runtime.model", "Model.rollback"),
         ("verispec.runtime.graphs", "GraphCache.replay"), ("verispec.engine.auto_k", "AutoK.adopt"),
         ("verispec.engine.auto_k", "AutoK.decide"), ("verispec.engine.auto_k", "AutoK.plan"),
         ("verispec.engine.auto_k", "AutoK.observe_round"), ("verispec.engine.auto_k", "AutoK.observe_tree"))


def parse_config(text: str):
    """plain, kN (a chain of N drafts), W-W-... (a tree), auto (tree="auto": chains of up to 4 drafts and
    ``auto_k.AUTO_TREES``) or auto-k1 (auto's machinery with its choice fixed at chain k = 1: its planning, prelaunch,
    measuring and host work without its choices, beside k1) -> (k, tree); ValueError naming a bad one."""
    if text == "plain":
        return None, None
    if text in ("auto", "auto-k1"):
        return 4, "auto"
    if text.startswith("k") and text[1:].isdigit() and int(text[1:]) >= 1:
        return int(text[1:]), None
    widths = text.split("-")
    if all(w.isdigit() and int(w) >= 1 for w in widths):
        return None, tuple(int(w) for w in widths)
    raise ValueError(f"--configs: {text!r} is none of plain, kN (e.g. k2), W-W-... (a tree, e.g. 2-2), auto, auto-k1")


@contextlib.contextmanager
def timed_functions(clock: Counter, calls: Counter, synchronize):
    """Inside: every function of ``TIMED`` adds its seconds to ``clock`` (and its calls to ``calls``) under its
    name; ``synchronize()`` runs before each ``read_outcome``, its seconds counted as ``WAIT``. Each is put back
    after (``trees._setting``)."""
    import importlib

    from benchmarks.trees import _setting

    with contextlib.ExitStack() as stack:
        for module_name, path in TIMED:
            owner = importlib.import_module(module_name)
            *outer, attr = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            wrapped = _timed(owner.__dict__[attr], path, clock, calls,
                             synchronize if attr == "read_outcome" else None)
            stack.enter_context(_setting(owner, attr, wrapped))
        yield


def _timed(fn, name: str, clock: Counter, calls: Counter, wait_first):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        if wait_first is not None:
            t = time.perf_counter()
            wait_first()
            clock[WAIT] += time.perf_counter() - t
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock[name] += time.perf_counter() - t
            calls[name] += 1
    return timed


@contextlib.contextmanager
def choice_fixed(on: bool):
    """Inside (when ``on``): ``AutoK``'s greedy shape is chain k = 1 whatever its estimates say (``auto-k1``)."""
    from benchmarks.trees import _setting
    from verispec.engine.auto_k import AutoK

    if not on:
        yield
        return
    with _setting(AutoK, "_choose_greedy_shape", lambda self, greedy, k_max, round_s: 1):
        yield


def measure(target, draft, config: str, batch: int, new_tokens: int, alpha: float, rates: dict,
            synchronize, repeats: int = 3) -> dict:
    """One config's cell: ms per round as is and without prelaunched drafts (``repeats`` calls each, in turn; the
    median call's), then the instrumented call's wait, host and functions' ms a round."""
    from benchmarks.trees import _setting, _timed_call
    from verispec.drafters import OracleDraft
    from verispec.engine import SpeculativeDecoder, generate
    from verispec.engine import scheduler as scheduler_module
    from verispec.runtime.tree import MAX_TREE_TOKENS

    k, tree = parse_config(config)
    max_seq_len = 128 + new_tokens + MAX_TREE_TOKENS + 1
    gen = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, target.config.vocab_size, (128,), generator=gen).tolist() for _ in range(batch)]
    refs = [g.tokens for g in generate(target, prompts, drafter=None, max_new_tokens=new_tokens,
                                       max_seq_len=max_seq_len)]
    drafter = None if k is None and tree is None else OracleDraft(
        refs, rates.get(1, alpha) if tree else alpha, cost_model=draft, seed=0, tree_rates=rates)
    dec = SpeculativeDecoder(target, drafter, k=k or 4, tree=tree)
    with choice_fixed(config == "auto-k1"):
        dec.generate(prompts, max_new_tokens=new_tokens, max_seq_len=max_seq_len)                 # warm-up

    def call() -> dict:               # trees.py e2e's timed call: ms per round less the call's own warm-up
        with choice_fixed(config == "auto-k1"):
            return _timed_call(dec, prompts, refs, new_tokens, max_seq_len, [], synchronize, auto=False)

    runs: dict[bool, list[dict]] = {True: [], False: []}
    for r in range(repeats):
        for prelaunch in ((True, False) if r % 2 == 0 else (False, True)):
            taken = getattr(drafter, "prelaunches_taken", 0)
            with _setting(scheduler_module, "PRELAUNCH", prelaunch):
                runs[prelaunch].append(dict(call(), prelaunched=getattr(drafter, "prelaunches_taken", 0) - taken))
    plain, off = (sorted(runs[p], key=lambda c: c["ms_per_round"])[(repeats - 1) // 2] for p in (True, False))
    clock, calls = Counter(), Counter()
    with timed_functions(clock, calls, synchronize):
        timed = call()
    per_round = {name: 1e3 * s / timed["rounds"] for name, s in clock.items()}
    return dict(config=config, batch=batch, rounds=plain["rounds"], ms_per_round=plain["ms_per_round"],
                ms_range=[min(c["ms_per_round"] for c in runs[True]), max(c["ms_per_round"] for c in runs[True])],
                prelaunched_rounds=plain["prelaunched"], ms_per_round_without=off["ms_per_round"],
                tokens_per_round=plain["tokens_per_round"],
                exact=all(c["exact"] for c in runs[True] + runs[False]) and timed["exact"],
                instrumented_ms_per_round=timed["ms_per_round"], wait_ms=per_round.pop(WAIT, 0.0),
                functions={name: [ms, calls[name] / timed["rounds"]]
                           for name, ms in sorted(per_round.items(), key=lambda item: -item[1])})


def markdown(res: dict) -> str:
    lines = ["# Where a round's wall time goes on the host", "", environment_line(res["env"]), "",
             f"Command: `{res['command']}`. OracleDraft: acceptance {res['alpha']} for chains, coverage {res['rates']} "
             f"by width for trees and auto (its chains at width 1's); {res['batch']} row(s) of 128 prompt tokens, "
             f"{res['new_tokens']} new tokens. "
             f"`ms per round`: `generate` as is (after a warm-up call; median of {res['repeats']} calls, `range` "
             f"their slowest and fastest), `prelaunched`: its rounds whose drafts were launched in the round before "
             f"(`Drafter.prelaunch`); `without prelaunch`: the same with `PRELAUNCH` off ({res['repeats']} calls, the "
             f"two settings in turn); `vs plain`: tokens per ms over plain decoding's, same weights, same run; the "
             f"rest from one more call with the functions timed and the device synchronized before each outcome read "
             f"(`instrumented`): `wait` = the host waiting for the device, `host` = the rest; the functions' ms a "
             f"round are inclusive and partly overlap the device's work (launched before the wait).", ""]
    for part in res["parts"]:
        lines += [f"## {part['target']} target, {part['draft']} draft", ""]
        floor = part.get("floor_ms")
        if floor:
            lines += [f"`floor ms`: the target's weights + one draft pass's per tested position, read once at the "
                      f"measured copy bandwidth {floor['bandwidth'] / 1e12:.2f} TB/s ({floor['target']:.3f} + "
                      f"{floor['draft']:.3f} ms a position; the embedding table but one row not counted); "
                      f"`% floor` = it / ms per round.", ""]
        plain = next((c for c in part["cells"] if c["config"] == "plain"), None)

        def vs_plain(c: dict) -> str:
            if plain is None:
                return ""
            rate = c["tokens_per_round"] / c["ms_per_round"]
            return f"{rate / (plain['tokens_per_round'] / plain['ms_per_round']):.3f}"

        rows = [[c["config"], f"{c['ms_per_round']:.3f}", f"{c['ms_range'][0]:.3f}-{c['ms_range'][1]:.3f}",
                 f"{c['prelaunched_rounds']} / {c['rounds']}", f"{c['ms_per_round_without']:.3f}",
                 f"{c['ms_per_round_without'] / c['ms_per_round']:.3f}", f"{c['tokens_per_round']:.2f}", vs_plain(c),
                 f"{c['instrumented_ms_per_round']:.3f}", f"{c['wait_ms']:.3f}",
                 f"{c['instrumented_ms_per_round'] - c['wait_ms']:.3f}", "yes" if c["exact"] else "**no**"]
                + list(_floor_cells(c, floor)) for c in part["cells"]]
        lines += markdown_table(["config", "ms per round", "range", "prelaunched", "without prelaunch", "speedup",
                                 "tokens per round", "vs plain", "instrumented", "wait", "host", "exact"]
                                + (["floor ms", "% floor"] if floor else []), rows) + [""]
        for c in part["cells"]:
            lines += [f"{c['config']}: " + ", ".join(f"`{name}` {ms:.3f} ({n:.2f}/round)"
                                                     for name, (ms, n) in c["functions"].items()), ""]
    return "\n".join(lines)


def _floor_cells(cell: dict, floor: dict | None) -> tuple[str, ...]:
    """(floor ms, % floor) of a cell's round (none without a measured floor; blank for auto, whose shape varies)."""
    if not floor:
        return ()
    k, tree = parse_config(cell["config"])
    if tree == "auto":
        return "", ""
    ms = floor["target"] + (len(tree) if tree else k or 0) * floor["draft"]
    return f"{ms:.3f}", f"{ms / cell['ms_per_round']:.0%}"


WEIGHTS = {"bf16": ("llama-3.1-8b bf16", "llama-3.2-1b bf16"), "packed": ("llama-3.1-8b Q4_K_M", "llama-3.2-1b Q8_0")}


def load_pair(weights: str):
    """(target, draft) of ``WEIGHTS[weights]``: random bf16 weights, or random packed blocks (issue 24's setting)."""
    from verispec import load_model

    if weights == "packed":
        from benchmarks.quant import packed_random_model

        return (packed_random_model("llama-3.1-8b", "Q4_K_M"),
                packed_random_model("llama-3.2-1b", "Q8_0", seed=1 << 16))
    return (load_model("llama-3.1-8b", device="cuda", dtype=torch.bfloat16),
            load_model("llama-3.2-1b", device="cuda", dtype=torch.bfloat16))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="plain,k2,2-2", help="comma-separated plain, kN, W-W-..., auto, auto-k1")
    ap.add_argument("--weights", default="bf16",
                    help="comma-separated bf16 (8B + 1B, random) and packed (the 8B in Q4_K_M and the 1B in Q8_0)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--alpha", type=float, default=0.8, help="the oracle's chain acceptance")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per config and prelaunch setting")
    ap.add_argument("--out", default=None, help="folder for round_host.json / .md (default: a temp folder)")
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/round_host.md")
    args = ap.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    weights = [w.strip() for w in args.weights.split(",") if w.strip()]
    try:
        for c in configs:
            parse_config(c)                              # a bad name fails before any model loads
    except ValueError as e:
        ap.error(str(e))
    if not weights or any(w not in WEIGHTS for w in weights):
        ap.error(f"--weights: {args.weights!r}: use a comma-separated list of {', '.join(WEIGHTS)}")
    if args.batch < 1 or args.new_tokens < 2 or args.repeats < 1:
        ap.error("--batch and --repeats must be >= 1 and --new-tokens >= 2")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the 8B and 1B shapes); tests run measure() on tiny CPU models")
    from benchmarks.common import copy_bandwidth
    from benchmarks.quant import _decode_floor_bytes
    from benchmarks.trees import TREE_RATES
    from verispec.drafters import make_peaked

    bandwidth = copy_bandwidth()
    parts = []
    for w in weights:
        target, draft = load_pair(w)
        floor = dict(bandwidth=bandwidth, target=_decode_floor_bytes(target) / bandwidth * 1e3,
                     draft=_decode_floor_bytes(draft) / bandwidth * 1e3)     # before make_peaked's dense table
        make_peaked(target)
        cells = [measure(target, draft, c, args.batch, args.new_tokens, args.alpha, TREE_RATES,
                         torch.cuda.synchronize, args.repeats) for c in configs]
        parts.append(dict(weights=w, target=WEIGHTS[w][0], draft=WEIGHTS[w][1], cells=cells, floor_ms=floor))
        del target, draft
        torch.cuda.empty_cache()
    res = dict(env=environment(), command="python benchmarks/round_host.py " + " ".join(sys.argv[1:] if argv is None
                                                                                    else argv),
               alpha=args.alpha, rates=TREE_RATES, batch=args.batch, new_tokens=args.new_tokens,
               repeats=args.repeats, parts=parts)
    out = Path(args.out) if args.out else Path(os.environ.get("TMPDIR", "/tmp")) / "round_host"
    out.mkdir(parents=True, exist_ok=True)
    (out / "round_host.json").write_text(json.dumps(res, indent=1))
    write_page(markdown(res), out, NAME, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
