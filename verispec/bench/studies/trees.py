"""``trees``: draft trees vs the best chain, at each batch size.

Points, at every swept batch size B (oracle drafts: at every alpha too): plain decoding, a chain of every swept K,
every tree shape of ``--trees`` (children per node at each depth), and ``tree="auto"`` (the engine's own choice
of shape per round, capped at the largest K; written as skipped, with the reason, when this engine's Scheduler
refuses it). One drafter throughout, the ``--draft`` kind: prompt lookup proposes its trie of continuations,
self-speculation and a draft model their top-w children; oracle drafts put the target's token among a node's w
children with probability ``coverage(alpha, w)`` = 1 - (1 - alpha) w^-0.7 (an assumed top-w coverage, shaped like
the table of benchmarks/trees.py; w = 1, a chain, is alpha itself), so a wider node buys a higher rate.

Per row: ``tokens_per_s``; ``tokens_per_round``, the tokens a sequence emits per target pass (every request's
tokens after its first / its rounds); ``nodes_per_round``, the drafted tokens the target pass scores per sequence
(K for a chain, the tree's nodes; counted from the drafter's proposals); ``alpha_measured``, accepted / tested
along the accepted path's depths; ``t_target_ms``, the target pass per round; ``exact``: every output equals plain
decoding's (greedy, token for token). The page adds each row's speed over plain decoding and over the best chain of
the same batch (and alpha).
"""
from __future__ import annotations

from ...runtime.tree import MAX_TREE_TOKENS
from ..measure import run_engine, timed_runs
from .shared import ar_runs, sd_runs

STUDY = "trees"
COVERAGE_EXPONENT = 0.7      # oracle trees: a node of w children misses the target's token w^-0.7 times as often


def coverage(alpha: float, width: int, exponent: float = COVERAGE_EXPONENT) -> float:
    """The oracle's rate for a node of ``width`` children: 1 - (1 - alpha) * width^-exponent (alpha at width 1).

    >>> coverage(0.6, 1), round(coverage(0.6, 4), 3), round(coverage(0.6, 4, 0.4), 4)
    (0.6, 0.848, 0.7703)
    """
    return 1.0 - (1.0 - alpha) * width ** -exponent


def tree_rates(alpha: float | None) -> dict[int, float] | None:
    """{w: coverage(alpha, w)} for every width a tree pass can hold; None for drafters other than the oracle."""
    if alpha is None:
        return None
    return {w: coverage(alpha, w) for w in range(1, MAX_TREE_TOKENS)}


def points(bench) -> list[dict]:
    o = bench.options
    alphas = list(o.alphas) if bench.uses_oracle else [None]
    pts = []
    for b in o.batches:
        pts.append({"batch": b, "method": "plain"})
        for a in alphas:
            pts += [{"batch": b, "alpha": a, "method": "chain", "k": k} for k in o.ks]
            pts += [{"batch": b, "alpha": a, "method": "tree", "tree": list(t)} for t in o.trees]
            pts.append({"batch": b, "alpha": a, "method": "tree-auto", "k": max(o.ks)})
    return pts


class _NodeCounter:
    """Counts the draft tokens a drafter proposes (chains and trees) by wrapping its two propose methods on the
    instance; the engine sees the same drafter object and the same proposals."""

    def __init__(self, drafter):
        self.nodes = 0
        propose, propose_tree = drafter.propose, drafter.propose_tree

        def counted(max_num_draft):
            p = propose(max_num_draft)
            self.nodes += sum(p.num_draft)
            return p

        def counted_tree(widths):
            p = propose_tree(widths)
            self.nodes += sum(p.num_nodes)
            return p

        drafter.propose, drafter.propose_tree = counted, counted_tree


def _counted_factory(bench, batch: int, alpha: float | None, rates):
    """(factory of fresh drafters, the counters of the drafters it made, in order)."""
    conts = [list(p) for p in ar_runs(bench, batch)[0].outputs] if bench.uses_oracle else None
    counters: list[_NodeCounter] = []

    def make():
        drafter = bench.drafter(alpha, conts, tree_rates=rates)
        counters.append(_NodeCounter(drafter))
        return drafter

    return make, counters


def _rounds(run) -> int:
    """Every request's rounds (target passes it took part in), summed."""
    return sum(s.rounds for s in run.stats)


def _tree_runs(bench, batch: int, tree, alpha: float | None):
    """(phase run, throughput run, drafted tokens per sequence per round) of draft trees ``tree`` (a tuple of
    widths, or "auto") at ``batch``; memoized."""
    key = ("tree", batch, tree, alpha)
    if key not in bench.memo:
        o = bench.options
        make, counters = _counted_factory(bench, batch, alpha, tree_rates(alpha))
        k = max(o.ks)
        phase, fast = timed_runs(bench.target, make, bench.prompts(batch), k=k, max_new_tokens=o.max_new_tokens,
                                 tree=tree, policy_factory=_tree_auto_policy(bench, batch, alpha, make)
                                 if tree == "auto" else None)
        # the last drafter made drafted the throughput run (the only run on a CPU)
        bench.memo[key] = (phase, fast, counters[-1].nodes / max(_rounds(fast), 1))
    return bench.memo[key]


def _tree_auto_policy(bench, batch: int, alpha: float | None, make):
    """A factory of fresh ``AutoK(costs, trees=AUTO_TREES)``: its cost table (chains up to the largest K and
    every candidate tree's pass) measured once per (batch, alpha), outside the timed runs."""
    from ...engine import auto_k

    key = ("tree-auto-costs", batch, alpha)
    if key not in bench.memo:
        bench.memo[key] = auto_k.measure_costs(bench.target, make(), max(bench.options.ks),
                                               auto_k.default_batch_sizes(batch), trees=auto_k.AUTO_TREES)
    costs = bench.memo[key]
    return lambda: auto_k.AutoK(costs, trees=auto_k.AUTO_TREES)


def _row(phase, fast, plain: list[list[int]], nodes: float) -> dict:
    return {"tokens_per_s": fast.tokens_per_s,
            "tokens_per_round": sum(s.new_tokens - 1 for s in fast.stats) / max(_rounds(fast), 1),
            "nodes_per_round": nodes, "alpha_measured": phase.alpha,
            "t_target_ms": 1e3 * phase.per_round("target"), "t_draft_ms": 1e3 * phase.per_round("draft"),
            "exact": phase.outputs == plain and fast.outputs == plain}


def measure(bench, point: dict) -> list[dict]:
    batch, alpha, method = point["batch"], point.get("alpha"), point["method"]
    ar_phase, ar_fast = ar_runs(bench, batch)
    plain = ar_phase.outputs
    if method == "plain":
        return [_row(ar_phase, ar_fast, plain, 0.0)]
    if method == "chain":
        phase, fast = sd_runs(bench, batch, point["k"], alpha)
        return [{"k": point["k"], **_row(phase, fast, plain, sum(s.proposed for s in fast.stats) /
                                         max(_rounds(fast), 1))}]
    if method == "tree-auto":
        phase, fast, nodes = _tree_runs(bench, batch, "auto", alpha)
        return [{"k": point["k"], **_row(phase, fast, plain, nodes)}]
    tree = tuple(point["tree"])
    phase, fast, nodes = _tree_runs(bench, batch, tree, alpha)
    return [{"tree": list(tree), **_row(phase, fast, plain, nodes)}]


def groups(rows: list[dict]) -> list[tuple[int, float | None, list[dict]]]:
    """(batch, alpha, rows) per batch and alpha, each with that batch's plain row; measured rows only."""
    live = [r for r in rows if not r.get("skipped")]
    out = []
    for b in sorted({r["point"]["batch"] for r in live}):
        plain = [r for r in live if r["point"]["batch"] == b and r["point"]["method"] == "plain"]
        alphas = sorted({r["point"].get("alpha") for r in live if r["point"]["batch"] == b
                         and r["point"]["method"] != "plain"}, key=lambda a: -1 if a is None else a)
        for a in alphas or [None]:
            out.append((b, a, plain + [r for r in live if r["point"]["batch"] == b and r["point"]["method"] != "plain"
                                       and r["point"].get("alpha") == a]))
    return out


def best_chain(rows: list[dict]) -> dict | None:
    chains = [r for r in rows if r["point"]["method"] == "chain"]
    return max(chains, key=lambda r: r["tokens_per_s"]) if chains else None


def shape(point: dict) -> str:
    """A row's drafting shape in words: "plain", "chain K=4", "tree 4-2-2-1", "tree auto (K<=8)"."""
    m = point["method"]
    if m == "plain":
        return "plain"
    if m == "chain":
        return f"chain K={point['k']}"
    if m == "tree":
        return "tree " + "-".join(map(str, point["tree"]))
    return f"tree auto (K<={point['k']})"
