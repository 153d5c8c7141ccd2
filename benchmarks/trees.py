"""Token trees on a GPU (issue 22): what a tree pass costs, what tree verification costs, and what trees buy.

Five parts, each one device call that writes ``<out>/trees_<part>.json`` and a markdown section; ``report`` joins
the sections present; ``--write`` (on ``report``) writes ``benchmarks/results/trees.md``:

    python benchmarks/trees.py pass --out DIR      8B shape (random bf16 weights), context 512: ms of a captured
                                                   chain pass (Transformer.append) and tree pass (tree.tree_pass) of
                                                   T tokens per sequence, T = 1..64, B = 1, 8, 32; the tree mask's
                                                   overhead (tree / chain); bit checks: each node vs its path as a chain
    python benchmarks/trees.py attention --out DIR the tree attention alone (8B heads, bf16): packed vs padded
                                                   tiles vs the chain kernel, B = 1, 8, cached 200 / 512 / 1500 tokens
    python benchmarks/trees.py verify --out DIR    verify_tree_greedy (Triton) vs verify_greedy at the same node count,
                                                   V = 128256, B = 1, 8, 32: device us per call (CUDA-graph replay)
                                                   and eager us (host work included), the logits' byte floor
    python benchmarks/trees.py e2e --out DIR       8B target (random weights, make_peaked) + OracleDraft with a 1B cost
                                                   model: the best chain k vs trees, B = 1 and 8, tok/s and tokens per
                                                   round; greedy output checked against plain decoding; the graphs
                                                   each timed call captured (0: see ``e2e_cells``).
                                                   ``--configs auto,plain,k2,k4,2-2-1,3-2-2-1``: just those (kN: a
                                                   chain of N; W-W-...: a tree; auto: ``tree="auto"`` with chains of up
                                                   to 8, its cost table measured in the warm-up call; the rounds of
                                                   each shape it ran are reported; auto-ahead / auto-start: the
                                                   same planned ahead / decided at each round's start;
                                                   auto+2-2+4-2: with those trees among its choices;
                                                   dyn-D-K-N: a dynamic tree and dm-W-W-...: a static tree, both
                                                   drafted by the draft model itself
                                                   (the oracle drafts no dynamic tree): cost only on random weights,
                                                   ``ms per round`` is their number)
    python benchmarks/trees.py accept --out DIR    the embedded SmolLM2 (bf16 on a GPU, fp32 on a CPU): mean accepted
                                                   tokens per round, chain vs tree of the same depth (and dynamic
                                                   trees for SelfSpeculative), SelfSpeculative and PromptLookup on a
                                                   few prompts
    python benchmarks/trees.py report DIR [--write]

Timings: median over CUDA-graph replays (``benchmarks/common.py``) for passes and verification (the latter also
eager, under CUDA events); for end to end the wall time of ``generate`` after a warm-up call of the same shapes and
cache size, less the timed call's own warm-up (``e2e_cells``).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import (capture_graph, copy_bandwidth, environment, environment_line,  # noqa: E402
                               markdown_table, time_calls)

RESULTS = Path(__file__).resolve().parent / "results"
PARTS = ("pass", "attention", "verify", "e2e", "accept")


def bushy_tree(T: int) -> tuple[int, ...]:
    """A tree of T nodes (the root included) that fills depth by depth with up to 4 children per node: the shape
    draft trees have (wide near the root). e.g. T = 7 -> (-1, 0, 0, 0, 0, 1, 1)."""
    parents, frontier, nxt = [-1], [0], []
    while len(parents) < T:
        for p in frontier:
            for _ in range(4):
                if len(parents) == T:
                    break
                nxt.append(len(parents))
                parents.append(p)
        frontier, nxt = nxt, []
    return tuple(parents)


# -------------------------------------------------------------------------------------------------- pass
def pass_part(args) -> dict:
    from verispec import load_model
    from verispec.runtime import tree as trees
    from verispec.runtime import tree_attention

    model = load_model(args.model, device="cuda", dtype=torch.bfloat16)
    KV = model.config.num_kv_heads
    G = model.config.num_heads // KV
    out = dict(env=environment(), model=args.model, cells=[], bits=[], bandwidth=copy_bandwidth())
    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    model.setup_cache(32, 512 + 80, empty=True)
    model.admit([torch.randint(0, V, (512,), generator=gen).tolist() for _ in range(32)])
    cache = model.cache
    for B in (1, 8, 32):
        for T in [int(t) for t in args.tokens.split(",")]:
            if B * T > args.max_rows:
                continue
            tokens = torch.randint(0, V, (B, T), device="cuda")
            lengths = cache.lengths_for(B)
            lay = trees.tree_layout((bushy_tree(T),) * B, T)
            depth, path = lay.depth.cuda(), lay.path.cuda()
            chain = capture_graph(lambda: model.net.append(tokens, lengths, model._rope, cache,
                                                           model.num_active_layers), 2)
            chain_ms = time_calls(chain.replay, iters=20, warmup=3) * 1e3
            del chain
            tree = capture_graph(lambda: trees.tree_pass(model.net, tokens, depth, path, lengths, lengths, model._rope,
                                                         cache, model.num_active_layers), 2)
            tree_ms = time_calls(tree.replay, iters=20, warmup=3) * 1e3
            del tree
            padded = tree_attention.tree_tile_rows(G, B * KV * T, tokens.device) != G
            cell = dict(B=B, T=T, chain_ms=chain_ms, tree_ms=tree_ms, tiles="padded" if padded else "packed")
            with _setting(tree_attention, "TILES", "packed" if padded else "padded"):   # the other layout
                other = capture_graph(lambda: trees.tree_pass(model.net, tokens, depth, path, lengths, lengths,
                                                              model._rope, cache, model.num_active_layers), 2)
            cell["other_ms"] = time_calls(other.replay, iters=20, warmup=3) * 1e3
            del other
            out["cells"].append(cell)
            print("pass", json.dumps(cell), flush=True)
    out["bits"] = _bit_checks(model)
    return out


def _bit_checks(model) -> list[dict]:
    """Model.append_tree (graphs on) vs Model.append of each node's root-to-node path, 3 ragged sequences."""
    import copy

    from verispec.runtime import tree as trees

    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    checks = []
    for T in (5, 17, 45, 64):
        parents = bushy_tree(T)
        model.setup_cache(3, 1200, empty=True)
        model.admit([torch.randint(0, V, (n,), generator=gen).tolist() for n in (900, 41, 260)])
        base = copy.deepcopy(model.cache)
        tokens = torch.randint(0, V, (3, T), generator=gen)
        logits = model.append_tree(tokens, [parents] * 3)
        paths = trees.depths_and_paths(parents)
        equal, worst = 0, 0.0
        for n, path in enumerate(paths):
            _restore(model.cache, base)      # in place: the captured graphs hold the cache's buffers
            chain = model.append(tokens[:, path])[:, -1]
            equal += bool(torch.equal(chain, logits[:, n]))
            worst = max(worst, (chain.float() - logits[:, n].float()).abs().max().item())
        checks.append(dict(T=T, nodes_equal=equal, nodes=len(paths), max_abs_diff=worst))
        print("bits", json.dumps(checks[-1]), flush=True)
    return checks


def _restore(cache, base) -> None:
    """Copy the cache state ``base`` (a deep copy) back into ``cache``'s own buffers."""
    for dst, src in zip(cache.k + cache.v, base.k + base.v):
        dst.copy_(src)
    cache._lengths.copy_(base._lengths)
    cache.live.copy_(base.live)
    cache.batch_size, cache.max_len_bound = base.batch_size, base.max_len_bound


def pass_markdown(res: dict) -> list[str]:
    lines = [f"## The tree pass ({res['model']} shape, random bf16 weights, context 512)", "",
             environment_line(res["env"]), "",
             "ms of one captured pass of T tokens for each of B sequences (median of 20 replays): `chain` = "
             "`Transformer.append` (causal), `tree` = `tree.tree_pass` over a bushy tree of T nodes (<= 4 children per "
             "node). `tree / chain` is the tree attention's overhead; `vs 1 token` the tree pass over the 1-token "
             "chain pass (a decode step). `tiles`: the tree attention's layout that `tree_tile_rows` picks (padded: "
             "a tile per token; packed: 16 / G tokens a tile), `other tiles ms` the same pass with the other one "
             "(the same bits).", ""]
    one = {c["B"]: c["chain_ms"] for c in res["cells"] if c["T"] == 1}
    rows = [(c["B"], c["T"], f"{c['chain_ms']:.2f}", f"{c['tree_ms']:.2f}", f"{c['tree_ms'] / c['chain_ms']:.2f}",
             f"{c['tree_ms'] / one[c['B']]:.2f}" if c["B"] in one else "", c.get("tiles", ""),
             f"{c['other_ms']:.2f}" if "other_ms" in c else "") for c in res["cells"]]
    lines += markdown_table(["B", "T", "chain ms", "tree ms", "tree / chain", "vs 1 token", "tiles", "other tiles ms"],
                            rows)
    if "bandwidth" in res:
        from benchmarks.invariant_cluster import weights_floor_ms

        lines += ["", f"Floor: the weights' bytes / the measured copy bandwidth ({res['bandwidth'] / 1e12:.2f} TB/s) = "
                  f"{weights_floor_ms(res['model'], res['bandwidth']):.2f} ms a pass at any T (the KV cache's bytes "
                  "not counted)."]
    lines += ["", "Bit checks (`Model.append_tree` with graphs vs `Model.append` of each root-to-node path, 3 ragged "
              "sequences of 900, 41, 260 tokens):", ""]
    lines += markdown_table(["T", "nodes bit-equal", "max abs diff"],
                            [(c["T"], f"{c['nodes_equal']}/{c['nodes']}", f"{c['max_abs_diff']:.3g}")
                             for c in res["bits"]])
    return lines + [""]


# --------------------------------------------------------------------------------------------- attention
def attention_part(args) -> dict:
    """The tree attention alone (bf16, the 8B model's heads): packed vs padded tiles vs the chain kernel over the same
    T tokens, per (B, cached tokens R, T); which layout ``tree_tile_rows`` picks."""
    from benchmarks.common import graph_us_per_call
    from verispec.runtime import named_shape, ops
    from verispec.runtime import tree as trees
    from verispec.runtime.tree_attention import padded_token_rows, tree_attention, tree_tile_rows

    cfg = named_shape(args.model)
    KV, G, D = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
    out = dict(env=environment(), model=args.model, head_dim=D, kv_heads=KV, cells=[], bandwidth=copy_bandwidth())
    torch.manual_seed(0)
    for B in (1, 8):
        k = torch.randn(B, KV, 2048, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        for R in (200, 512, 1500):
            root = torch.full((B,), R, device="cuda")
            for T in (1, 3, 7, 13, 17, 33):
                lay = trees.tree_layout((bushy_tree(T),) * B, T)
                depth, path = lay.depth.cuda(), lay.path.cuda()
                q = torch.randn(B * T, KV * G, D, device="cuda", dtype=torch.bfloat16)
                cell = dict(B=B, R=R, T=T, picks="padded" if tree_tile_rows(G, B * KV * T, q.device) != G else "packed")
                for name, rows in (("packed", G), ("padded", padded_token_rows(G))):
                    cell[name + "_us"] = graph_us_per_call(
                        lambda i: tree_attention(q, k, v, root, depth, path, D ** -0.5, token_rows=rows), 20, 10)
                cell["chain_us"] = graph_us_per_call(
                    lambda i: ops.decode_attention(q, k, v, root, T, D ** -0.5), 20, 10)
                out["cells"].append(cell)
                print("attention", json.dumps(cell), flush=True)
    return out


def attention_markdown(res: dict) -> list[str]:
    lines = [f"## The tree attention ({res['model']} heads, bf16)", "", environment_line(res["env"]), "",
             "us per call of `tree_attention` over a bushy tree of T nodes for each of B sequences whose root sits "
             "at cached slot R (CUDA graph of 20 calls, median), with packed tiles (16 / G tokens a tile of query "
             "rows) and padded ones (a tile per token), beside `ops.decode_attention` of T chain tokens at the same "
             "R (the causal kernel a chain pass runs). `picks`: `tree_tile_rows`'s choice. floor = the K and V bytes "
             "of the R + T slots each sequence reads, bf16, / the measured copy bandwidth.", ""]

    def floor_us(c) -> str:
        if "bandwidth" not in res:
            return ""
        kv_bytes = 2 * 2 * c["B"] * res["kv_heads"] * (c["R"] + c["T"]) * res["head_dim"]
        return f"{kv_bytes / res['bandwidth'] * 1e6:.2f}"

    rows = [(c["B"], c["R"], c["T"], floor_us(c), f"{c['packed_us']:.1f}", f"{c['padded_us']:.1f}",
             f"{c['chain_us']:.1f}", c["picks"], f"{min(c['packed_us'], c['padded_us']) / c[c['picks'] + '_us']:.2f}")
            for c in res["cells"]]
    return lines + markdown_table(["B", "R", "T", "floor us", "packed us", "padded us", "chain us", "picks",
                                   "best / picked"], rows) + [""]


# ------------------------------------------------------------------------------------------------ verify
def verify_part(args) -> dict:
    """Each cell twice: eager calls of the public functions under CUDA events (what a caller outside a graph pays, the
    host's checks and layout included) and the kernels alone, 20 calls captured back to back in one CUDA graph from
    a batch validated once outside it (device time: what a round pays on the device, whose tree layout the host
    checks once per shape; inside a capture the API would write the parents with one fill kernel per run of equal
    values, not what a round runs). The chain runs with its default backend (eager) and Triton (graph), the
    backend of the tree kernels."""
    from verispec import verify_greedy, verify_tree_greedy
    from verispec.verify.api import canonical_batch
    from verispec.verify.tree_api import canonical_tree
    from verispec.verify.triton.greedy import verify_greedy_triton
    from verispec.verify.triton.tree import verify_tree_greedy_triton
    from benchmarks.common import copy_bandwidth, graph_us_per_call

    bandwidth = copy_bandwidth()
    out = dict(env=environment(), bandwidth=bandwidth, cells=[])
    V = 128256
    for B in (1, 8, 32):
        for n in (4, 8, 16, 32, 63):
            logits = torch.randn(B * (n + 1), V, device="cuda", dtype=torch.bfloat16)
            drafts = torch.randint(0, V, (B * n,), device="cuda")
            bushy = [p - 1 for p in bushy_tree(n + 1)[1:]] * B
            chain = list(range(-1, n - 1)) * B
            eager = dict(chain=lambda: verify_greedy(logits, drafts, [n] * B, check_values=False),
                         tree=lambda: verify_tree_greedy(logits, drafts, bushy, [n] * B, check_values=False),
                         chain_tree=lambda: verify_tree_greedy(logits, drafts, chain, [n] * B, check_values=False))
            batch = canonical_batch(logits, drafts, [n] * B, n)
            layouts = dict(tree=canonical_tree(logits, drafts, bushy, [n] * B),
                           chain_tree=canonical_tree(logits, drafts, chain, [n] * B))
            kernels = dict(chain=lambda: verify_greedy_triton(batch),
                           tree=lambda: verify_tree_greedy_triton(layouts["tree"]),
                           chain_tree=lambda: verify_tree_greedy_triton(layouts["chain_tree"]))
            cell = dict(B=B, nodes=n, floor_us=1e6 * logits.numel() * logits.element_size() / bandwidth)
            for name, call in eager.items():
                cell[f"{name}_us"] = 1e6 * time_calls(call, iters=50)
            for name, call in kernels.items():
                cell[f"{name}_graph_us"] = graph_us_per_call(lambda i: call(), calls=20, reps=20)
            out["cells"].append(cell)
            print("verify", json.dumps(cell), flush=True)
            del logits
    return out


def verify_markdown(res: dict) -> list[str]:
    lines = ["## Tree verification vs chain verification (greedy, V = 128256, bf16 logits)", "",
             environment_line(res["env"], res.get("bandwidth")), "",
             "us per call. *graph*: the kernels alone, device time: 20 calls captured back to back in one CUDA "
             "graph from a batch validated once outside it, median of 20 replays / 20 (what a round pays on the "
             "device; the logits of the small cells stay in L2 between calls). *eager*: the public functions, median "
             "of 50 calls under CUDA events, the host's checks and layout included (what a caller outside a graph "
             "pays). `chain` = `verify_greedy` with `nodes` drafts per sequence (graph: its Triton kernels, the "
             "backend of the tree kernels; eager: the default backend); `tree` = `verify_tree_greedy` (Triton) over "
             "a bushy tree of the same node count; `tree (chain shape)` = the tree kernels on a chain. floor = the "
             "logits' bytes / the measured copy bandwidth.", ""]
    rows = [(c["B"], c["nodes"], f"{c['floor_us']:.1f}", f"{c['chain_graph_us']:.1f}",
             f"{c['tree_graph_us']:.1f}", f"{c['chain_tree_graph_us']:.1f}",
             f"{c['tree_graph_us'] / c['chain_graph_us']:.2f}", f"{c['chain_us']:.1f}", f"{c['tree_us']:.1f}",
             f"{c['tree_us'] / c['chain_us']:.2f}") for c in res["cells"]]
    return lines + markdown_table(["B", "nodes", "floor us", "chain graph us", "tree graph us",
                                   "tree (chain shape) graph us", "tree / chain (graph)", "chain eager us",
                                   "tree eager us", "tree / chain (eager)"], rows) + [""]


# --------------------------------------------------------------------------------------------------- e2e
# The oracle's coverage: the target's token is among a node's w children with this probability (an assumption
# shaped like a real draft's top-w coverage; the chain is w = 1).
TREE_RATES = {1: 0.6, 2: 0.75, 3: 0.82, 4: 0.87}
TREES = ((2, 2, 1), (2, 2, 2, 1), (3, 2, 2, 1), (4, 2, 2, 1), (4, 2, 1, 1, 1), (2, 2, 2, 2, 1))


# The chains compared with the trees; the warm-up call's new tokens (more than any chain k: ``check_k`` caps k at
# max_new_tokens - 1, and a warm-up of a capped k would leave the timed run's draft loop to be captured in it).
CHAIN_KS = (2, 3, 4, 6, 8)
WARM_TOKENS = 16


# tree="auto"'s longest chain (its trees: verispec.engine.auto_k.AUTO_TREES)
AUTO_K = 8


def e2e_configs(trees=TREES, chain_ks=CHAIN_KS) -> list[tuple[str, int | None, tuple[int, ...] | str | None]]:
    """(name, k, tree) of every e2e run: plain decoding, the chains, the trees."""
    return [("plain", None, None)] + [(f"chain k={k}", k, None) for k in chain_ks] + \
           [(f"tree {list(t)}", None, t) for t in trees]


# The configs drafted by ``DraftModel(draft)`` instead of the oracle (``e2e_cells``' fourth entry): on random weights
# the draft's acceptance means nothing, so their cells are cost-only (``cost_only``: the round's cost, not its tokens)
DRAFT_MODEL = "draft model"
# tree="auto" with its next shape planned during each round's pass (``AutoK.plan_ahead``: ``auto-ahead``) or decided
# at each round's start (``auto-start``); plain ``auto`` takes ``auto_k.PLAN_AHEAD``, the product's default
PLANNED_AHEAD, DECIDED_AT_START = "planned ahead", "decided at the round's start"


@dataclasses.dataclass(frozen=True)
class AutoRun:
    """A tree="auto" config's settings (``e2e_cells``' fourth entry): planned ahead or not (None: the default,
    ``auto_k.PLAN_AHEAD``), and the trees it may choose besides ``auto_k.AUTO_TREES`` (``auto+2-2+4-2``)."""
    plan_ahead: bool | None = None
    extra_trees: tuple[tuple[int, ...], ...] = ()

    def name(self) -> str:
        how = {None: [], True: [f"({PLANNED_AHEAD})"], False: [f"({DECIDED_AT_START})"]}[self.plan_ahead]
        return " ".join(["auto"] + [f"+{list(t)}" for t in self.extra_trees] + how)

    @contextlib.contextmanager
    def applied(self):
        """The process-wide settings the ``AutoK`` and candidate trees of each ``generate`` inside read."""
        from verispec.engine import auto_k

        trees = auto_k.AUTO_TREES + tuple(t for t in self.extra_trees if t not in auto_k.AUTO_TREES)
        ahead = auto_k.PLAN_AHEAD if self.plan_ahead is None else self.plan_ahead
        with _setting(auto_k, "PLAN_AHEAD", ahead), _setting(auto_k, "AUTO_TREES", trees):
            yield


AUTO_RUNS = {"auto": None, "auto-ahead": True, "auto-start": False}   # --configs name -> AutoRun.plan_ahead


def parse_configs(text: str) -> list[tuple]:
    """``--configs``: comma-separated plain, kN (a chain of N drafts), W-W-... (a tree, e.g. 2-2-1), auto,
    auto-ahead (planned ahead) or auto-start (decided at each round's start), each optionally followed by +W-W...
    (trees it may choose besides ``AUTO_TREES``), dyn-D-K-N (a dynamic tree, drafted by the draft model) or
    dm-W-W-... (a static tree drafted by the draft model: the dynamic tree's cost peer) -> ``e2e_configs``' (name,
    k, tree) entries, with a fourth, ``DRAFT_MODEL`` for the draft model's, an ``AutoRun`` for auto's. ValueError
    naming a bad entry."""
    from verispec.drafters.dynamic_tree import DynamicTree

    def widths(text: str) -> tuple[int, ...] | None:
        return tuple(int(w) for w in text.split("-")) if text and all(
            w.isdigit() and int(w) >= 1 for w in text.split("-")) else None

    out = []
    for item in (x.strip() for x in text.split(",")):
        if item == "plain":
            out.append(("plain", None, None))
        elif item.split("+")[0] in AUTO_RUNS and all(widths(t) for t in item.split("+")[1:]):
            run = AutoRun(AUTO_RUNS[item.split("+")[0]], tuple(widths(t) for t in item.split("+")[1:]))
            out.append((run.name(), AUTO_K, "auto", run))
        elif item.startswith("k") and item[1:].isdigit() and int(item[1:]) >= 1:
            out.append((f"chain k={int(item[1:])}", int(item[1:]), None))
        elif item.startswith("dyn-") and widths(item[4:]) is not None and len(widths(item[4:])) == 3:
            tree = DynamicTree(*widths(item[4:]))
            out.append((f"{tree} ({DRAFT_MODEL})", None, tree, DRAFT_MODEL))
        elif item.startswith("dm-") and widths(item[3:]) is not None:
            tree = widths(item[3:])
            out.append((f"tree {list(tree)} ({DRAFT_MODEL})", None, tree, DRAFT_MODEL))
        elif widths(item) is not None:
            tree = widths(item)
            out.append((f"tree {list(tree)}", None, tree))
        else:
            raise ValueError(f"--configs: {item!r} is none of plain, kN (e.g. k4), W-W-... (a tree, e.g. 2-2-1), auto, "
                             f"auto-ahead, auto-start, each with +W-W... (more trees to choose from, e.g. "
                             f"auto+2-2+4-2), dyn-D-K-N (a dynamic tree, e.g. dyn-4-2-8), dm-W-W-... (a tree "
                             f"drafted by the draft model)")
    if not out:
        raise ValueError("--configs names no config")
    return out


def config_shape(config: str):
    """An e2e cell's config name -> its shape (0 = plain, k = a chain, widths = a tree), or None (auto, a dynamic
    tree, a draft model's): the inverse of the names ``parse_configs`` gives."""
    if config == "plain":
        return 0
    if config.startswith("chain k="):
        return int(config[len("chain k="):])
    if config.startswith("tree [") and config.endswith("]"):
        return tuple(int(w) for w in config[len("tree ["):-1].split(","))
    return None


def shape_name(shape) -> str:
    return f"tree {list(shape)}" if isinstance(shape, tuple) else f"k={shape}"


def round_costs(policy) -> dict:
    """{shape: [rounds, median measured ms, median table ms]} of an AutoK's measured rounds (``rounds_log``)."""
    by_shape: dict = {}
    for batch, shape, seconds in policy.rounds_log:
        by_shape.setdefault(shape_name(shape), []).append((seconds, policy.table_round(batch, shape)))
    return {name: [len(v), 1e3 * statistics.median(m for m, _ in v), 1e3 * statistics.median(t for _, t in v)]
            for name, v in sorted(by_shape.items(), key=lambda item: -len(item[1]))}


def e2e_cells(target, draft, batch_sizes, prompt_tokens: int, new_tokens: int, configs,
              synchronize=lambda: None, rates: dict[int, float] = TREE_RATES, repeats: int = 1) -> list[dict]:
    """Each config of ``configs`` (``e2e_configs``) at each batch size: a warm-up call, then ``repeats`` timed calls.
    The oracle's rates: ``rates`` {width: rate}, the chain's alpha at width 1 (``OracleDraft``'s ``tree_rates``).

    Every config is warmed up first, then the timed calls go round the configs ``repeats`` times, each time in a
    rotated order: a drift of the machine's speed (clocks, another tenant) spreads over every config instead of
    landing on the ones timed last. A cell's ``tok_s`` is its median over the repeats (``tok_s_runs``: each one, in
    repeat order, so that cells compare repeat by repeat); its other figures are the median call's.

    Every call (the references too) gets one max_seq_len, the longest any config needs (a tree pass holds at most
    MAX_TREE_TOKENS tokens): a call that needs a larger cache than the one before re-allocates it, and with it
    re-captures every graph of the target and the draft. ``captured`` counts the graphs the timed calls captured
    (0: the warm-ups covered every shape they ran); ``tok_s`` excludes a timed call's own warm-up
    (``Stats.warmup_s``: with nothing to capture, the verification kernels' warm-up runs), ``wall_tok_s`` does not.
    """
    from verispec.drafters import DraftModel, OracleDraft
    from verispec.engine import SpeculativeDecoder, generate
    from verispec.runtime.tree import MAX_TREE_TOKENS

    if repeats < 1:
        raise ValueError(f"e2e_cells: repeats must be >= 1, got {repeats}")
    V = target.config.vocab_size
    max_seq_len = prompt_tokens + new_tokens + MAX_TREE_TOKENS + 1
    models = [m for m in (target, draft) if m is not None]
    cells = []
    for B in batch_sizes:
        gen = torch.Generator().manual_seed(B)
        prompts = [torch.randint(0, V, (prompt_tokens,), generator=gen).tolist() for _ in range(B)]
        refs = [g.tokens for g in generate(target, prompts, drafter=None, max_new_tokens=new_tokens,
                                           max_seq_len=max_seq_len)]
        runs = []
        for name, k, tree, *by in configs:
            if by == [DRAFT_MODEL]:        # the draft model itself drafts (its passes, its acceptance)
                drafter = DraftModel(draft)
            else:
                drafter = None if k is None and tree is None else OracleDraft(
                    refs, rates[1], cost_model=draft, seed=0, tree_rates=rates)
            dec = SpeculativeDecoder(target, drafter, k=k or 4, tree=tree)
            run = by[0] if by and isinstance(by[0], AutoRun) else AutoRun()
            with run.applied():
                dec.generate(prompts, max_new_tokens=min(new_tokens, WARM_TOKENS), max_seq_len=max_seq_len)  # warm-up
            runs.append((name, tree, by == [DRAFT_MODEL], run, dec, []))
        for r in range(repeats):
            for name, tree, cost_only, run, dec, samples in runs[r % len(runs):] + runs[:r % len(runs)]:
                with run.applied():
                    samples.append(_timed_call(dec, prompts, refs, new_tokens, max_seq_len, models, synchronize,
                                               tree == "auto"))
                print("e2e", json.dumps(dict(B=B, config=name, repeat=r, **samples[-1])), flush=True)
        for name, tree, cost_only, run, dec, samples in runs:
            cells.append(_cell(B, name, cost_only, samples))
    return cells


@contextlib.contextmanager
def _setting(module, name: str, value):
    """``module.name = value`` inside, its value before restored after: a process-wide setting a part varies
    (``tree_attention.TILES``; ``auto_k.PLAN_AHEAD`` and ``AUTO_TREES``, read at each ``generate`` call)."""
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def _timed_call(dec, prompts, refs, new_tokens: int, max_seq_len: int, models, synchronize, auto: bool) -> dict:
    """One timed ``generate`` of ``dec`` (see ``e2e_cells``) -> its figures."""
    captures = sum(m.graph_captures for m in models)
    synchronize()
    t0 = time.perf_counter()
    gens = dec.generate(prompts, max_new_tokens=new_tokens, max_seq_len=max_seq_len)
    synchronize()
    seconds = time.perf_counter() - t0
    stats, B = dec.last_stats, len(prompts)
    out = dict(tok_s=B * new_tokens / (seconds - stats.warmup_s), wall_tok_s=B * new_tokens / seconds,
               warmup_s=stats.warmup_s, captured=sum(m.graph_captures for m in models) - captures,
               rounds=stats.rounds, tokens_per_round=sum(len(g.tokens) for g in gens) / max(stats.rounds, 1) / B,
               ms_per_round=1e3 * (seconds - stats.warmup_s) / max(stats.rounds, 1),
               exact=[g.tokens for g in gens] == refs)
    chosen = dec.last_policy.chosen if auto else {}
    if chosen:        # the call's rounds of each shape (a tree's widths, or a chain's k; 0 = plain)
        out["shapes"] = {shape_name(s): n for s, n in sorted(chosen.items(), key=lambda item: -item[1])}
        out["round_ms"] = round_costs(dec.last_policy)
    if auto:          # the table auto priced its shapes by (benchmarks/auto_sim.py --prior table replays it)
        policy = dec.last_policy
        out["cost_table"] = json.loads(policy.costs.to_json())
        # how it explored: probes of drafting taken / declined, the draft debt's price scale, plans made ahead
        out["policy"] = {name: getattr(policy, name) for name in (
            "probes", "probes_declined", "debt_scale", "plans_adopted", "plans_dropped")}
    return out


def _cell(B: int, config: str, cost_only: bool, samples: list[dict]) -> dict:
    """A config's cell from its timed calls: the median call's figures, ``tok_s_runs`` every call's tok/s (repeat
    order), ``captured`` summed, ``exact`` only if every call was."""
    median = sorted(samples, key=lambda s: s["tok_s"])[(len(samples) - 1) // 2]
    return dict(median, B=B, config=config, cost_only=cost_only, tok_s_runs=[s["tok_s"] for s in samples],
                captured=sum(s["captured"] for s in samples), exact=all(s["exact"] for s in samples))


def draft_shape(name: str, layers: int | None):
    """The oracle's cost model: the named shape, or its first ``layers`` decoder layers with its full LM head (one
    layer of the target's own shape is the cost of an EAGLE-style head: a decoder layer and the LM head; the head's
    fc fusion layer, 3h x h, is not counted)."""
    if not layers:
        return name
    from verispec.runtime import named_shape

    cfg = named_shape(name)
    if not 1 <= layers <= cfg.num_layers:
        raise SystemExit(f"--draft-layers must be in 1..{cfg.num_layers} for {name}, got {layers}")
    return dataclasses.replace(cfg, num_layers=layers)


def e2e_part(args) -> dict:
    from verispec import load_model
    from verispec.bench.peaked import make_peaked
    from verispec.bench.studies.trees import coverage

    target = load_model(args.model, device="cuda", dtype=torch.bfloat16)
    make_peaked(target)
    draft = load_model(draft_shape(args.draft, args.draft_layers), device="cuda", dtype=torch.bfloat16)
    name = args.draft + (f" cut to {args.draft_layers} layer(s)" if args.draft_layers else "")
    # --coverage-exponent: a power law at the same alpha (the embedded head's measured x is about 0.4,
    # benchmarks/results/head_coverage.md), rounded for the page
    rates = TREE_RATES if args.coverage_exponent is None else {
        w: round(coverage(TREE_RATES[1], w, args.coverage_exponent), 4) for w in TREE_RATES}
    out = dict(env=environment(), model=args.model, draft=name, rates=rates, prompt_tokens=128,
               new_tokens=args.new_tokens, command="python benchmarks/trees.py " + " ".join(sys.argv[1:]))
    if not args.draft_layers:       # the floor: each pass's weights read once at the measured copy bandwidth
        from benchmarks.invariant_cluster import weights_floor_ms

        bandwidth = copy_bandwidth()
        out["floor_ms"] = dict(bandwidth=bandwidth, target=weights_floor_ms(args.model, bandwidth),
                               draft=weights_floor_ms(args.draft, bandwidth))
    configs = parse_configs(args.configs) if args.configs else e2e_configs()
    out["cells"] = e2e_cells(target, draft, (1, 8), 128, args.new_tokens, configs, torch.cuda.synchronize,
                             rates=rates, repeats=args.repeats)
    return out


def e2e_markdown(res: dict) -> list[str]:
    lines = [f"## End to end: {res['model']} target, OracleDraft trees with a {res['draft']} cost model", "",
             environment_line(res["env"]), "",
             f"Random weights (make_peaked), bf16, prompts of 128 tokens. The oracle puts the target's token among a "
             f"node's w children with probability {res['rates']} (an assumed top-w coverage; chain = w 1). tok/s = "
             f"new tokens of the batch / seconds of `generate` after a warm-up call of the same shapes and cache size, "
             f"less the call's own warm-up (`Stats.warmup_s`, which captures nothing then: `captured` = graphs the "
             f"timed call captured); `wall tok/s` includes it. `exact`: the output equals plain decoding's.", ""]
    if res.get("command"):
        lines += [f"Command: `{res['command']}`.", ""]
    floor = res.get("floor_ms")
    if floor:
        lines += [f"`floor tok/s`: B x the cell's tokens per round / (the target's weights + one draft pass's weights "
                  f"per depth, read once at the measured copy bandwidth {floor['bandwidth'] / 1e12:.2f} TB/s: "
                  f"{floor['target']:.2f} + {floor['draft']:.2f} ms a depth); `% floor` = tok/s / it.", ""]
    repeats = max(len(c.get("tok_s_runs", [0])) for c in res["cells"])
    if repeats > 1:
        lines += [f"Each config ran {repeats} timed calls, the configs in turn (a rotated order each time): `tok/s` is "
                  f"the median call's, `range` the slowest and fastest; the other columns are the median call's.", ""]
    for B in sorted({c["B"] for c in res["cells"]}):
        cells = [c for c in res["cells"] if c["B"] == B]
        chains = [c for c in cells if c["config"].startswith("chain")]
        best_chain = max(chains or cells, key=lambda c: c["tok_s"])
        rows = [(c["config"] + (" *" if c.get("cost_only") else ""), f"{c['tok_s']:.1f}")
                + ((_range(c),) if repeats > 1 else ())
                + (f"{c.get('wall_tok_s', c['tok_s']):.1f}", f"{c['tokens_per_round']:.2f}",
                   f"{c['ms_per_round']:.2f}" if "ms_per_round" in c else "?",
                   f"{c['tok_s'] / best_chain['tok_s']:.2f}", c.get("captured", "?"), "yes" if c["exact"] else "NO")
                + (_floor_cells(c, floor) if floor else ())
                for c in cells]
        lines += [f"### B = {B} (best chain: {best_chain['config']})", ""]
        lines += markdown_table(["config", "tok/s"] + (["range"] if repeats > 1 else [])
                                + ["wall tok/s", "tokens per round", "ms per round", "vs best chain", "captured",
                                   "exact"] + (["floor tok/s", "% floor"] if floor else []), rows) + [""]
        if any(c.get("cost_only") for c in cells):
            lines += [f"\\* cost only: drafted by the {res['draft']} draft model itself, whose random weights accept "
                      f"next to nothing against this target: its tok/s and tokens per round mean nothing; `ms per "
                      f"round` is the cost of its round (draft passes + the target's tree pass + verification), "
                      f"comparable between its dynamic tree and a static tree of its own (`dm-...`).", ""]
        trees = [c for c in cells if c["config"].startswith("tree") and not c.get("cost_only")]
        if trees and chains and len(best_chain.get("tok_s_runs", ())) > 1:
            best_tree = max(trees, key=lambda c: c["tok_s"])
            lines += [_paired(best_tree["config"], best_tree, best_chain), ""]
        fixed = [c for c in cells if not c["config"].startswith("auto")]
        for c in cells:
            if c["config"].startswith("auto") and fixed:
                best = max(fixed, key=lambda f: f["tok_s"])
                shapes = ", ".join(f"{s}: {n}" for s, n in c.get("shapes", {}).items())
                lines += [f"{c['config']}: {c['tok_s'] / best['tok_s']:.2f}x the best fixed config here "
                          f"({best['config']}, {best['tok_s']:.1f} tok/s); rounds by shape (the median call): {shapes}",
                          ""]
                if len(c.get("tok_s_runs", ())) > 1:
                    lines += [_paired(c["config"], c, best_chain), ""]
                if c.get("round_ms"):
                    lines += ["auto's measured rounds by shape (the rounds that paid no one-time work), median ms: "
                              "measured / its cost table's: " + ", ".join(
                                  f"{s}: {m:.2f} / {t:.2f} ({n})" for s, (n, m, t) in c["round_ms"].items()), ""]
    return lines


def _floor_cells(cell: dict, floor: dict) -> tuple[str, str]:
    """(floor tok/s, % floor) of a fixed shape's cell (blank for auto, cost-only and dynamic cells)."""
    shape = None if cell.get("cost_only") else config_shape(cell["config"])
    if shape is None:
        return "", ""
    depth = len(shape) if isinstance(shape, tuple) else shape
    best = cell["B"] * cell["tokens_per_round"] / (floor["target"] + depth * floor["draft"]) * 1e3
    return f"{best:.1f}", f"{cell['tok_s'] / best:.0%}"


def _range(cell: dict) -> str:
    runs = cell.get("tok_s_runs", [cell["tok_s"]])
    return f"{min(runs):.1f}-{max(runs):.1f}"


def _paired(name: str, cell: dict, peer: dict) -> str:
    """``cell`` over ``peer`` repeat by repeat (the calls timed in the same turn of ``e2e_cells``)."""
    ratios = [a / b for a, b in zip(cell["tok_s_runs"], peer["tok_s_runs"])]
    return (f"{name} / {peer['config']}, repeat by repeat: " + ", ".join(f"{r:.3f}" for r in ratios)
            + f" (median {statistics.median(ratios):.3f})")


# ------------------------------------------------------------------------------------------------ accept
ACCEPT_PROMPTS = [
    "Repeat exactly, twice: The quick brown fox jumps over the lazy dog near the river bank.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring and two tests.",
    "List the planets of the solar system in order, one per line, with one fact about each.",
    "Fix the typos: Teh wether is nise todya and we are goin to the parck after lunch with freinds.",
]


def accept_part(args) -> dict:
    from verispec import load_model
    from verispec.drafters import PromptLookup, SelfSpeculative
    from verispec.engine import generate
    from verispec.drafters.dynamic_tree import parse_tree_spec
    from verispec.engine.scheduler import tree_nodes

    cuda = torch.cuda.is_available()
    model = load_model(device="cuda" if cuda else "cpu", dtype=torch.bfloat16 if cuda else torch.float32)
    out = dict(env=environment(), cells=[])
    configs = [("self-speculative 10 layers", lambda: SelfSpeculative(10)), ("prompt lookup", lambda: PromptLookup())]
    shapes = [("chain", [1, 1, 1, 1]), ("tree", [3, 2, 1, 1]), ("tree", [4, 2, 2, 1]), ("dynamic", "dyn:4,2,8"),
              ("dynamic", "dyn:4,4,11")]
    for dname, make in configs:
        for kind, tree in shapes:
            if kind == "dynamic" and dname == "prompt lookup":
                continue                        # it ranks no nodes: no dynamic trees (refused by check_tree)
            gens = generate(model, ACCEPT_PROMPTS, drafter=make(), tree=tree, max_new_tokens=args.new_tokens, chat=True)
            rounds = sum(g.stats.rounds for g in gens)
            accepted = sum(g.stats.accepted for g in gens)
            nodes = tree_nodes(parse_tree_spec(tree) or tree)
            cell = dict(drafter=dname, shape=f"{kind} {tree}", nodes=nodes, rounds=rounds,
                        accepted_per_round=accepted / max(rounds, 1))
            out["cells"].append(cell)
            print("accept", json.dumps(cell), flush=True)
    return out


def accept_markdown(res: dict) -> list[str]:
    lines = ["## Accepted tokens per round on the embedded SmolLM2: chain vs tree of the same depth", "",
             environment_line(res["env"]), "",
             f"Greedy, {len(ACCEPT_PROMPTS)} chat prompts as one batch. A chain is the tree [1, 1, 1, 1]; "
             "`accepted / round` counts the accepted nodes (the emitted tokens are one more). `dyn:D,K,N`: a dynamic "
             "tree (D deep, each node's top K children, the N of highest cumulative draft probability kept per depth; "
             "not for prompt lookup, which ranks no nodes).", ""]
    rows = [(c["drafter"], c["shape"], c["nodes"], c["rounds"], f"{c['accepted_per_round']:.2f}") for c in res["cells"]]
    return lines + markdown_table(["drafter", "shape", "nodes", "rounds", "accepted / round"], rows) + [""]


# ------------------------------------------------------------------------------------------------ report
MARKDOWN = dict(zip(PARTS, (pass_markdown, attention_markdown, verify_markdown, e2e_markdown, accept_markdown)))


def report(folder: Path, missing: bool = True) -> list[str]:
    """The results page of the parts found in ``folder``; ``missing``: a "not run" line for each absent part."""
    lines = ["# Token trees: the tree pass, tree verification, trees end to end", "",
             "Written by `benchmarks/trees.py report DIR --write` from the parts found in DIR (docs: "
             "docs/engine.md, \"Trees\").", ""]
    for part in PARTS:
        f = folder / f"trees_{part}.json"
        if f.exists():
            lines += MARKDOWN[part](json.loads(f.read_text()))
        elif missing:
            lines += [f"## {part}: not run", ""]
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=PARTS + ("report",))
    ap.add_argument("folder", nargs="?", default=None, help="report: the folder the parts wrote to")
    ap.add_argument("--out", default=None, help="folder for trees_<part>.json and .md (default: a temp folder)")
    ap.add_argument("--write", action="store_true", help="report: also write benchmarks/results/<--results>")
    ap.add_argument("--results", default="trees.md", help="report --write: the results file's name (e.g. "
                    "trees_auto.md for an e2e --configs auto,... run; the parts not run are then left out)")
    ap.add_argument("--model", default="llama-3.1-8b", help="pass, e2e: the target shape (random weights)")
    ap.add_argument("--draft", default="llama-3.2-1b", help="e2e: the oracle's cost model (random weights)")
    ap.add_argument("--draft-layers", type=int, default=None, help="e2e: cut the cost model to its first N layers "
                    "(e.g. --draft llama-3.1-8b --draft-layers 1: an EAGLE-style head's cost)")
    ap.add_argument("--tokens", default="1,2,4,8,16,24,32,48,64", help="pass: tokens per sequence")
    ap.add_argument("--max-rows", type=int, default=2048, help="pass: skip B * T above this")
    ap.add_argument("--new-tokens", type=int, default=128, help="e2e, accept: tokens generated per sequence")
    ap.add_argument("--repeats", type=int, default=3, help="e2e: timed calls of each config, in turn (a cell: "
                    "their median)")
    ap.add_argument("--coverage-exponent", type=float, default=None, help="e2e: the oracle's top-w coverage "
                    "1 - (1 - 0.6) w^-X (0.4: the embedded head's measured law) instead of the assumed TREE_RATES")
    ap.add_argument("--configs", default=None, help="e2e: comma-separated plain, kN, W-W-... (a tree), auto, "
                    "dyn-D-K-N (a dynamic tree), dm-W-W-... (a tree drafted by the draft model) "
                    "(default: plain, the chains and the trees of the full study)")
    args = ap.parse_args(argv)
    if args.coverage_exponent is not None and not args.coverage_exponent > 0:
        ap.error(f"--coverage-exponent must be > 0 (more children cover more), got {args.coverage_exponent}")
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.configs:
        try:
            parse_configs(args.configs)
        except ValueError as e:
            ap.error(str(e))
    if args.part == "report":
        if args.folder is None:
            ap.error("report needs the folder the parts wrote to")
        if Path(args.results).name != args.results or not args.results.endswith(".md"):
            ap.error(f"--results must be a file name ending in .md, got {args.results!r}")
        lines = report(Path(args.folder), missing=args.results == "trees.md")
        print("\n".join(lines))
        if args.write:
            (RESULTS / args.results).write_text("\n".join(lines) + "\n")
            print(f"wrote {RESULTS / args.results}", file=sys.stderr)
        return
    if args.part != "accept" and not torch.cuda.is_available():
        ap.error(f"{args.part} needs a CUDA GPU")
    torch.set_num_threads(1)
    folder = Path(args.out or tempfile.mkdtemp(prefix="trees_"))
    folder.mkdir(parents=True, exist_ok=True)
    res = dict(pass_=pass_part, attention=attention_part, verify=verify_part, e2e=e2e_part, accept=accept_part)[
        "pass_" if args.part == "pass" else args.part](args)
    (folder / f"trees_{args.part}.json").write_text(json.dumps(res, indent=1))
    (folder / f"trees_{args.part}.md").write_text("\n".join(MARKDOWN[args.part](res)) + "\n")
    print("\n".join(MARKDOWN[args.part](res)))
    print(f"wrote {folder / f'trees_{args.part}.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
