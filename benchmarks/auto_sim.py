"""tree="auto"'s choices alone, on the host: ``AutoK.decide`` round by round against measured round costs.

    python benchmarks/auto_sim.py benchmarks/results/trees_e2e_h200.json [--prior measured|table] [--rounds 160]
                                  [--seeds 8] [--write]

A GPU run of ``benchmarks/trees.py e2e`` measures what every fixed shape's round costs (its ``ms per round``) and
what auto reaches, but auto's result there mixes three things: its choices, its host time (``decide`` runs before
the round's first launch) and the run's one-time work. This script isolates the first: it runs the policy exactly
as the scheduler does (``decide``, then ``observe_tree`` / ``observe_round``) on simulated rounds whose acceptance
is the e2e run's oracle (the target's token among a node's w children with probability ``rates[w]``, depth by
depth, i.i.d.) and whose cost is that run's measured ``ms per round`` of the shape. Its candidates are the shapes
that run measured: the chains up to its largest measured k and its trees. Its prior (what it prices a shape by before
running it) is by default right, every candidate at its measured round, so that what is left is the choices; with
``--prior table`` it is the cost table the run's auto priced its shapes by (``measure_costs``' table, kept in the
auto cell by trees.py), so that the table's error shows.

Reported per batch size: each fixed shape's expected tok/s (B E(shape) / its round cost), auto's simulated tok/s
(the median over --seeds runs of --rounds rounds) against the best fixed shape and the best chain, the rounds by
shape of the first seed, ``decide``'s host time on this machine (us a round, median), and the same seeds planned
ahead (``AutoK.plan_ahead``: each shape chosen from evidence one round older). No GPU: seconds on a CPU.
Writes DIR/auto_sim.md (--out) and benchmarks/results/auto_sim.md with --write.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import environment, environment_line, markdown_table, write_page  # noqa: E402
from benchmarks.trees import config_shape  # noqa: E402
from verispec.analysis import expected_tokens_from_positions  # noqa: E402
from verispec.engine import Request, Sequence, Stats  # noqa: E402
from verispec.engine.auto_k import AutoK, CostTable  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "auto_sim.md"
PRIORS = ("measured", "table")


def measured_costs(e2e: dict) -> dict[int, dict]:
    """{B: {shape: seconds a round}} of a trees.py e2e result's fixed configs (cost-only cells left out)."""
    out: dict[int, dict] = {}
    for c in e2e["cells"]:
        shape = None if c.get("cost_only") else config_shape(str(c.get("config")))
        if shape is None:
            continue
        ms, B = c.get("ms_per_round"), c.get("B")
        if not isinstance(B, int) or B < 1 or not isinstance(ms, (int, float)) or not 0 < ms < float("inf"):
            raise ValueError(f"auto_sim: cell {c.get('config')!r} needs a batch size B >= 1 and a positive, finite "
                             f"ms_per_round, got B={B!r}, ms_per_round={ms!r}")
        out.setdefault(B, {})[shape] = ms / 1e3
    return out


def expected_tokens(shape, rates: dict[int, float]) -> float:
    """E(shape) per row under the oracle: 1 + r_1 + r_1 r_2 + ..., r_d the rate of depth d's width (a chain: w = 1)."""
    widths = shape if isinstance(shape, tuple) else (1,) * shape
    return expected_tokens_from_positions([rates[w] for w in widths])


def chain_table(costs: dict[int, dict]) -> CostTable:
    """The measured chain rounds as target passes of k + 1 tokens (draft and overhead zero), at each measured batch
    size: ``CostTable.round(B, k)`` is then the measured round of chain k."""
    sizes = sorted(costs)
    ks = sorted(set.intersection(*({s for s in costs[b] if isinstance(s, int)} for b in sizes)))
    if len(ks) < 2 or ks[0] != 0:
        raise ValueError(f"auto_sim: the e2e run needs plain and at least one chain at every batch size, got {ks}")
    return CostTable(tuple(sizes), tuple(k + 1 for k in ks), tuple(tuple(costs[b][k] for k in ks) for b in sizes),
                     (0.0,) * len(sizes))


def accepted(shape, rates: dict[int, float], rng: random.Random) -> int:
    """Nodes a row's round of ``shape`` accepts: depth by depth while the oracle covers the target's token."""
    widths = shape if isinstance(shape, tuple) else (1,) * shape
    a = 0
    while a < len(widths) and rng.random() < rates[widths[a]]:
        a += 1
    return a


class _MeasuredPrior(AutoK):
    """AutoK whose table prices each measured tree at its measured round (a real run's ``measure_costs`` table
    prices it from its pass, its draft steps and the overhead of a chain as wide): the choices with a right prior."""

    measured_table: dict = {}

    def table_round(self, batch: int, shape) -> float:
        if isinstance(shape, tuple) and shape in self.measured_table:
            return self.measured_table[shape]
        return super().table_round(batch, shape)


def simulate(costs: dict, rates: dict[int, float], batch: int, rounds: int, seed: int,
             table: CostTable | None = None, plan_ahead: bool = False) -> dict:
    """``rounds`` rounds of ``batch`` greedy rows under ``AutoK.decide`` (the candidates: ``costs[batch]``'s shapes)
    -> tok/s, rounds by shape, decide's median host seconds. ``table``: the prior the policy prices a shape by
    until it has run it (None: each candidate at its measured round). ``plan_ahead``: each round's shape chosen
    during the round before, as ``Scheduler._launched_and_plan`` does (``AutoK.plan`` / ``adopt``: the evidence one
    round older), so that what that lag costs the choices shows."""
    here = costs[batch]
    trees = tuple(s for s in here if isinstance(s, tuple))
    if table is None:
        policy = _MeasuredPrior(chain_table(costs), trees=trees, plan_ahead=plan_ahead)
        policy.measured_table = here
    else:
        policy = AutoK(table, trees=trees, plan_ahead=plan_ahead)

    def cost(shape) -> float:
        if shape not in here:
            raise ValueError(f"auto_sim: the policy chose {shape}, which the e2e run did not measure at B = {batch}")
        return here[shape]

    return run_policy(policy, rates, batch, max(s for s in here if isinstance(s, int)), rounds, seed, cost)


def run_policy(policy: AutoK, rates: dict[int, float], batch: int, k_max: int, rounds: int, seed: int,
               cost) -> dict:
    """``rounds`` rounds of ``batch`` greedy rows under ``policy`` as the scheduler runs it (``adopt`` a plan or
    ``decide``; ``plan`` the next; ``observe_tree`` / ``observe_round``), each row's acceptance the oracle's
    (``accepted``), each round ``cost(shape)`` seconds -> tok/s, rounds by shape, decide's median host seconds."""
    rng = random.Random(seed)
    rows = []
    for i in range(batch):
        seq = Sequence(Request([1, 2], 10 ** 9, id=i), Stats())
        seq.generated = [0]
        rows.append(seq)
    tokens = seconds = 0.0
    host, plan = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        ks, tree = (plan is not None and policy.adopt(plan, rows, k_max)) or policy.decide(rows, k_max)
        host.append(time.perf_counter() - t0)
        plan = policy.plan(rows, k_max)          # None unless plan_ahead: made before this round's evidence is in
        shape = tree if tree is not None else max(ks)
        round_s = cost(shape)
        got = []
        for seq, k in zip(rows, ks):
            a = accepted(tree if tree is not None else k, rates, rng)
            got.append(a)
            seq.stats.add_round(k, a)
            seq.generated += [0] * (a + 1)
            tokens += a + 1
        if tree is not None:
            policy.observe_tree(rows, tree, ks, got)
        seconds += round_s
        policy.observe_round(batch, shape, round_s)
    if plan is not None:                         # planned for a round that never ran
        policy.drop(plan)
    return dict(tok_s=tokens / seconds, chosen=dict(policy.chosen), host_s=statistics.median(host))


def shape_name(shape) -> str:
    return f"tree {list(shape)}" if isinstance(shape, tuple) else ("plain" if shape == 0 else f"chain k={shape}")


def run_table(e2e: dict, batch: int) -> CostTable:
    """The cost table the e2e run's auto cell at ``batch`` priced its shapes by (ValueError if it kept none)."""
    cell = next((c for c in e2e["cells"] if c["B"] == batch and c["config"] == "auto" and "cost_table" in c), None)
    if cell is None:
        raise ValueError(f"auto_sim: --prior table needs the auto cell's cost table at B = {batch}; this e2e result "
                         "has none (run benchmarks/trees.py e2e with auto among its --configs)")
    return CostTable.from_json(json.dumps(cell["cost_table"]))


def run(e2e: dict, rounds: int, seeds: int, prior: str = "measured") -> dict:
    """Every batch size of ``e2e``: the fixed shapes' expected tok/s and ``seeds`` simulated runs of auto. ``prior``:
    "measured" (each candidate priced at its measured round) or "table" (the run's own cost table)."""
    if prior not in PRIORS:
        raise ValueError(f"auto_sim: prior must be one of {PRIORS}, got {prior!r}")
    rates = {int(w): r for w, r in e2e["rates"].items()}
    costs = measured_costs(e2e)
    cells = []
    for B in sorted(costs):
        fixed = {shape_name(s): B * expected_tokens(s, rates) / c for s, c in costs[B].items()}
        table = run_table(e2e, B) if prior == "table" else None
        sims = [simulate(costs, rates, B, rounds, seed, table) for seed in range(seeds)]
        ahead = [simulate(costs, rates, B, rounds, seed, table, plan_ahead=True)["tok_s"] for seed in range(seeds)]
        measured_auto = next((c["tok_s"] for c in e2e["cells"] if c["B"] == B and c["config"] == "auto"), None)
        measured_chain = max((c["tok_s"] for c in e2e["cells"] if c["B"] == B and c["config"].startswith("chain")),
                             default=None)
        cells.append(dict(B=B, fixed=fixed, auto=[s["tok_s"] for s in sims], ahead=ahead, chosen=sims[0]["chosen"],
                          host_us=1e6 * statistics.median(s["host_s"] for s in sims),
                          measured_auto_vs_chain=measured_auto / measured_chain if measured_auto and measured_chain
                          else None))
    return dict(env=environment(), source=e2e.get("command", ""), source_env=e2e.get("env"), rates=rates,
                rounds=rounds, seeds=seeds, prior=prior, cells=cells)


def markdown(res: dict, source_name: str) -> list[str]:
    lines = ["# tree=\"auto\"'s choices alone: the policy simulated on measured round costs", "",
             "Written by `benchmarks/auto_sim.py` (docs/engine.md, \"tree=auto\"). The host: " +
             environment_line(res["env"]), "",
             f"Round costs: `{source_name}` (the `ms per round` of each fixed config of `{res['source']}`"
             + (f", {res['source_env'].get('device', '?')}, {res['source_env'].get('date', '?')}" if res.get(
                 "source_env") else "") + f"); the oracle's rates {res['rates']}. Each batch size: {res['seeds']} "
             f"seeds of {res['rounds']} rounds of `AutoK.decide` (its candidates the measured shapes), each round "
             "costing its shape's measured round; `expected tok/s` of a fixed shape = B E(shape) / its round. "
             + ("Its prior: each candidate at its measured round (`--prior measured`)."
                if res.get("prior", "measured") == "measured" else
                "Its prior: the run's own cost table (`--prior table`), as the product prices an unmeasured shape."),
             ""]
    for c in res["cells"]:
        fixed = sorted(c["fixed"].items(), key=lambda kv: -kv[1])
        best_name, best = fixed[0]
        chains = [v for n, v in fixed if n.startswith("chain")]
        auto = statistics.median(c["auto"])
        lines += [f"## B = {c['B']}", ""]
        lines += markdown_table(["shape", "expected tok/s", "vs best"],
                                [(n, f"{v:.1f}", f"{v / best:.3f}") for n, v in fixed]) + [""]
        shapes = ", ".join(f"{shape_name(s)}: {n}" for s, n in sorted(c["chosen"].items(), key=lambda kv: -kv[1]))
        lines += [f"auto, simulated: **{auto:.1f}** tok/s (seeds {min(c['auto']):.1f}-{max(c['auto']):.1f}) = "
                  f"{auto / best:.3f}x the best fixed shape ({best_name}) and "
                  f"{auto / max(chains):.3f}x the best chain; rounds by shape (seed 0): {shapes}; `decide` "
                  f"{c['host_us']:.0f} us a round on this host."
                  + (f" The GPU run measured auto at {c['measured_auto_vs_chain']:.3f}x its best chain."
                     if c["measured_auto_vs_chain"] else ""), ""]
        if c.get("ahead"):
            ahead = statistics.median(c["ahead"])
            lines += [f"Planned ahead (each shape chosen a round earlier, `AutoK.plan_ahead`): {ahead:.1f} tok/s, "
                      f"{ahead / auto:.3f}x the same seeds decided at the round's start (the lag's cost to the "
                      f"choices; its gain, the host time off the device's path, is not simulated).", ""]
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("e2e", help="a trees_e2e.json written by `benchmarks/trees.py e2e --out DIR`")
    ap.add_argument("--rounds", type=int, default=160, help="rounds a simulated run (the e2e runs' 256 tokens: ~160)")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--prior", choices=PRIORS, default="measured", help="what the policy prices a shape by before "
                    "running it: its measured round, or the e2e run's own cost table (the product's prior)")
    ap.add_argument("--out", default=None, help="folder for auto_sim.md (default: a temp folder)")
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/auto_sim.md")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.seeds < 1:
        ap.error(f"--rounds and --seeds must be >= 1, got {args.rounds}, {args.seeds}")
    path = Path(args.e2e)
    try:
        e2e = json.loads(path.read_text())
        if not isinstance(e2e["cells"], list) or not isinstance(e2e["rates"], dict):
            raise TypeError("cells must be a list and rates a dict")
    except (OSError, ValueError, KeyError, TypeError) as e:
        ap.error(f"{path}: not a trees.py e2e result ({type(e).__name__}: {e})")
    try:
        res = run(e2e, args.rounds, args.seeds, args.prior)
    except ValueError as e:
        ap.error(str(e))
    folder = Path(args.out or tempfile.mkdtemp(prefix="auto_sim_"))
    write_page("\n".join(markdown(res, path.name)) + "\n", folder, NAME, args.write)
    print(f"wrote {folder / NAME}" + (f" and {RESULTS / NAME}" if args.write else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
