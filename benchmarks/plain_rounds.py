"""What a plain round (k = 0) of a drafting server runs, and what k=auto's measured round costs see.

Two parts, both CPU-only (no GPU needed):

* counts: a tiny target and draft model (random weights) through the ``Scheduler`` with a ``DraftModel`` and with an
  ``OracleDraft`` paying a draft model's passes (the 8B server's ``--draft oracle:A --oracle-draft-cost``), requests
  arriving over the run, each round's k from a script of plain stretches and drafting rounds. Per kind of step
  (admission + plain round, plain round, drafting round): the draft model's passes and prefill tokens, and whether
  the step's round is reported to k=auto (``observe_round``); once with the draft prefill at admission
  (``prefill_at_admission``) and once lazy (in the first round a row drafts).
* traces (``--trace FILE ...``, a server's ``VERISPEC_STEP_TRACE`` JSON lines, e.g. benchmarks/serve_http.py's
  trace_PORT.jsonl): per widest k and batch range, the median step of the steps that admitted and of those that
  did not.

    python benchmarks/plain_rounds.py --out DIR [--trace DIR/trace_*.jsonl] [--write]

Writes DIR/plain_rounds.md; benchmarks/results/plain_rounds.md only with --write.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import environment, environment_line, markdown_table  # noqa: E402
from verispec.drafters import DraftModel, OracleDraft  # noqa: E402
from verispec.engine import Request, Scheduler, SchedulerConfig  # noqa: E402
from verispec.runtime import ModelConfig, load_model  # noqa: E402

RESULTS = Path(__file__).parent / "results"
CFG = ModelConfig(vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=64)
K = 4
# k per round: long plain stretches (k=auto's hold) between short drafting runs
SCRIPT = ([0] * 9 + [1, 2, 4]) * 8
STEP_KINDS = ("plain round after an admission", "plain round", "drafting round (admissions included)")


class Recorder:
    """A scripted k policy (one k for every row) that records which rounds the scheduler reports to k=auto."""

    def __init__(self):
        self.script = itertools.chain(SCRIPT, itertools.repeat(0))
        self.observed = 0

    def __call__(self, running, k):
        return [next(self.script)] * len(running)

    def observe_round(self, batch, k, seconds):
        self.observed += 1


def count_passes(model) -> dict:
    """Wrap ``model``'s network so that every pass is counted: {"passes": n, "prefill_tokens": t}."""
    counts = dict(passes=0, prefill_tokens=0)
    net = model.net
    prefill, append = net.prefill, net.append

    def counted_prefill(tokens, *args, **kwargs):
        counts["passes"] += 1
        counts["prefill_tokens"] += int(tokens.shape[1])
        return prefill(tokens, *args, **kwargs)

    def counted_append(*args, **kwargs):
        counts["passes"] += 1
        return append(*args, **kwargs)

    net.prefill, net.append = counted_prefill, counted_append
    return counts


def one_run(kind: str, lazy: bool, num_requests: int = 12, max_new: int = 30) -> dict:
    """Per step kind: steps, draft passes, draft prefill tokens, rounds reported to k=auto."""
    torch.manual_seed(0)
    target = load_model(CFG, dtype=torch.float32, seed=0)
    draft = load_model(CFG, dtype=torch.float32, seed=5)
    counts = count_passes(draft)
    prompts = [[(7 * i + j) % CFG.vocab_size for j in range(6 + 3 * i)] for i in range(num_requests)]
    if kind == "draft model":
        drafter = DraftModel(draft)
        runner = drafter
    else:
        drafter = OracleDraft([[0] * (len(p) + max_new + 8) for p in prompts], 0.8, cost_model=draft)
        runner = drafter._runner
    drafter.attach(target)
    runner.prefill_at_admission = not lazy
    policy = Recorder()
    sched = Scheduler(target, drafter, SchedulerConfig(4, 128, K), k_policy=policy)
    sched.eos = set()
    pending = [Request(p, max_new, id=i) for i, p in enumerate(prompts)]
    table = {s: collections.Counter() for s in STEP_KINDS}
    step = 0
    while pending or not sched.idle:
        if pending and step % 6 == 0:                   # arrivals over the run: admissions between rounds
            sched.submit(pending.pop(0))
        before = (dict(counts), sched.totals.proposed, len(sched.running) + len(sched.waiting), policy.observed)
        admitting = bool(sched.waiting) and len(sched.running) < 4
        sched.step()
        step += 1
        if sched.totals.rounds == 0:
            continue
        what = STEP_KINDS[2] if sched.totals.proposed > before[1] else STEP_KINDS[0] if admitting else STEP_KINDS[1]
        row = table[what]
        row["steps"] += 1
        row["draft passes"] += counts["passes"] - before[0]["passes"]
        row["draft prefill tokens"] += counts["prefill_tokens"] - before[0]["prefill_tokens"]
        row["reported to k=auto"] += policy.observed - before[3]
    return table


def counts_section() -> list[str]:
    lines = ["## Draft passes per step (tiny models on the CPU)", "",
             f"Scheduler of 4 rows, {K} drafts at most, 12 requests of 30 tokens arriving every 6 steps, each "
             f"round's k "
             f"from a script of 9 plain rounds then k = 1, 2, 4 (k=auto's hold and slow start); per kind of step the "
             f"draft model's passes (prefill, steps, draft loops) and prefill tokens, summed over the run.", ""]
    rows = []
    for kind in ("draft model", "oracle + cost model"):
        for lazy in (False, True):
            table = one_run(kind, lazy)
            for what in STEP_KINDS:
                r = table[what]
                rows.append((kind, "lazy (first drafting round)" if lazy else "at admission", what, r["steps"],
                             r["draft passes"], r["draft prefill tokens"], r["reported to k=auto"]))
    lines += markdown_table(["drafter", "draft prefill", "step", "steps", "draft passes", "draft prefill tokens",
                             "rounds reported to k=auto"], rows)
    return lines


def trace_section(paths: list[Path]) -> list[str]:
    lines = ["## Step traces", "",
             "Median step (ms) by widest k and rows before the step; a step admitted when requests waited and a row "
             "was free (`waiting_before > 0` and `rows_before` below the most rows the trace shows).", ""]
    for path in paths:
        recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        top = max(r["rows_before"] for r in recs) or 1
        ks = collections.Counter(r["k"] for r in recs)
        lines += [f"`{path.name}`: {len(recs)} steps; widest k: " +
                  ", ".join(f"{k}: {n}" for k, n in sorted(ks.items())), ""]
        rows = []
        for k in sorted(ks):
            for lo, hi in ((1, 8), (9, 16), (17, top)):
                sel = [r for r in recs if r["k"] == k and lo <= r["rows_before"] <= hi]
                adm = [r["seconds"] * 1e3 for r in sel if r["waiting_before"] > 0 and r["rows_before"] < top]
                rest = [r["seconds"] * 1e3 for r in sel if not (r["waiting_before"] > 0 and r["rows_before"] < top)]
                if sel:
                    rows.append((k, f"{lo}-{hi}", len(adm), f"{statistics.median(adm):.2f}" if adm else "-",
                                 len(rest), f"{statistics.median(rest):.2f}" if rest else "-"))
        lines += markdown_table(["k", "rows", "admitting steps", "median ms", "other steps", "median ms"], rows)
        lines.append("")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/plain_rounds")))
    p.add_argument("--trace", type=Path, nargs="*", default=[], help="VERISPEC_STEP_TRACE files to summarize")
    p.add_argument("--write", action="store_true", help="also write benchmarks/results/plain_rounds.md")
    args = p.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    shown, skip = [], False
    for a in sys.argv[1:]:                    # the command without --write and --out DIR
        if skip or a == "--write":
            skip = False
            continue
        skip = a == "--out"
        if not skip and not a.startswith("--out="):
            shown.append(a)
    command = " ".join(["python benchmarks/plain_rounds.py", *shown])
    lines = ["# What a plain round of a drafting server runs", "", environment_line(environment()), "",
             f"Command: `{command.strip()}`", ""]
    lines += counts_section() + [""]
    if args.trace:
        lines += trace_section(args.trace)
    text = "\n".join(lines) + "\n"
    (args.out / "plain_rounds.md").write_text(text)
    print(text)
    if args.write:
        (RESULTS / "plain_rounds.md").write_text(text)


if __name__ == "__main__":
    main()
