"""Steady tree and chain rounds (CPU, tiny real models with the CUDA-graph code path forced on: the CPU runs the same
padded programs eagerly, ``GraphCache.replay``): after ``Scheduler.warm_up`` a round captures no graph, runs no
pass outside a graph program, runs the target's and the draft model's tree passes at their exact widths (no
padding nodes), and reads the device once (its outcome). And ``benchmarks/trees.py``'s end-to-end protocol: a timed
run captures nothing (its warm-up call covers every shape, and one cache size serves every call).

What went wrong before: the host bound of the cache lengths grew by a whole tree per tree pass (the accepted-path
compaction and a draft model's rollback did not lower it), so after a few rounds every pass read the lengths back
(a sync in the middle of the round); the tree passes ran in the next width bucket (34 tokens as 49); and the
benchmark's warm-up call (8 new tokens: a chain k = 8 capped to 7, a smaller cache) left the timed call to capture
the k = 8 draft loop, and for trees of 33 nodes a grown cache's every graph, inside the timing.
"""
from __future__ import annotations

import collections
import inspect
import os

import pytest
import torch

import verispec
from verispec.drafters import OracleDraft
from verispec.engine import Request, Scheduler, SchedulerConfig
from verispec.engine.scheduler import tree_nodes
from verispec.runtime import ModelConfig, load_model
from verispec.runtime import graphs as graphs_module
from verispec.runtime.model import Model

CFG = ModelConfig(vocab_size=97, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                  intermediate_size=48)
RATES = {1: 0.6, 2: 0.75, 3: 0.82, 4: 0.87}
PACKAGE = os.path.dirname(os.path.abspath(verispec.__file__))
CONVERSIONS = ("item", "tolist", "__bool__", "__int__", "__float__", "cpu")
# the Triton kernels, as on a GPU, on the CPU interpreter (the torch reference verification reads its inputs back);
# at B = 1 only: the interpreter runs a program per (row, V-chunk), seconds per round at B = 8
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(scope="module")
def models():
    target = load_model(CFG, device="cpu", dtype=torch.float32, seed=0)
    draft = load_model(CFG.replace(num_layers=1), device="cpu", dtype=torch.float32, seed=1)
    target.use_graphs = draft.use_graphs = True          # the graph programs, run eagerly on the CPU
    return target, draft


def _scheduler(target, draft, B: int, k: int, tree, new_tokens: int, backend: str) -> Scheduler:
    """A warmed-up scheduler of B greedy requests drafted by OracleDraft (its cost model: ``draft``), after its
    admission and first round."""
    gen = torch.Generator().manual_seed(B)
    prompts = [torch.randint(0, CFG.vocab_size, (9,), generator=gen).tolist() for _ in range(B)]
    continuations = [p + torch.randint(0, CFG.vocab_size, (new_tokens,), generator=gen).tolist() for p in prompts]
    drafter = OracleDraft([c[len(p):] for c, p in zip(continuations, prompts)], 0.6, cost_model=draft, seed=0,
                          tree_rates=RATES)
    drafter.attach(target)
    k_nodes = k if tree is None else tree_nodes(tree)
    sched = Scheduler(target, drafter, SchedulerConfig(B, 9 + new_tokens + k_nodes + 1, k, tree=tree),
                      verify_backend=backend)
    sched.warm_up(prompt_tokens=9)
    for i, p in enumerate(prompts):
        sched.submit(Request(p, new_tokens, id=i))
    sched.step()
    return sched


class _Watch:
    """Counts, while on: graph captures, passes run outside a graph program (eager), tree graph widths replayed,
    and tensor -> host conversions made from verispec's code (call sites)."""

    def __init__(self, monkeypatch, models):
        self.models, self.eager, self.widths, self.sites = models, 0, collections.Counter(), collections.Counter()
        self._in_graph = 0
        replay = graphs_module.GraphCache.replay

        def watched_replay(cache, key, program, inputs, rows):
            if key[0] == "tree":
                self.widths[key[2]] += 1
            self._in_graph += 1
            try:
                return replay(cache, key, program, inputs, rows)
            finally:
                self._in_graph -= 1

        monkeypatch.setattr(graphs_module.GraphCache, "replay", watched_replay)
        for name in ("_step", "_tree_step"):
            body = getattr(Model, name)

            def counted(model, *args, _body=body, **kwargs):
                self.eager += not self._in_graph
                return _body(model, *args, **kwargs)

            monkeypatch.setattr(Model, name, counted)
        for name in CONVERSIONS:
            monkeypatch.setattr(torch.Tensor, name, self._recorder(name, getattr(torch.Tensor, name)))
        self.captures = sum(m.graph_captures for m in models)

    def _recorder(self, name, original):
        def conversion(tensor, *args, **kwargs):
            caller = inspect.currentframe().f_back
            path = os.path.abspath(caller.f_code.co_filename)
            if path.startswith(PACKAGE + os.sep):
                rel = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
                self.sites[(rel, caller.f_code.co_name, name)] += 1
            return original(tensor, *args, **kwargs)
        return conversion

    def captured(self) -> int:
        return sum(m.graph_captures for m in self.models) - self.captures


@pytest.mark.parametrize("B", [1, 8])
@pytest.mark.parametrize("k, tree", [(4, (3, 2, 2, 1)), (8, None)], ids=["tree-3221", "chain-k8"])
def test_steady_rounds_capture_nothing_run_no_eager_pass_and_read_once(models, monkeypatch, B, k, tree):
    target, draft = models
    backend = "triton" if INTERPRET and B == 1 else "torch"
    sched = _scheduler(target, draft, B, k, tree, new_tokens=60, backend=backend)
    rounds = 4                                   # far from capacity: 9 + 60 + the lookahead
    watch = _Watch(monkeypatch, models)
    taken = sched.drafter.prelaunches_taken
    for _ in range(rounds):
        sched._round()
    monkeypatch.undo()
    assert all(s.finish_reason is None for s in sched.running)
    assert watch.captured() == 0
    assert watch.eager == 0
    # every steady round drafted in the round before it, from that round's outcome on the device (Drafter.prelaunch)
    assert sched.drafter.prelaunches_taken - taken == rounds
    sites = {site: n for site, n in watch.sites.items() if backend == "triton" or not site[0].startswith("verify/")}
    expected = {("engine/round.py", "read_outcome", "cpu"): rounds,          # the one read per round
                ("engine/round.py", "read_outcome", "tolist"): rounds}
    assert sites == expected
    if tree is not None:
        # 34 tokens in the target pass, 3, 6 and 12 in the draft model's: each at its exact width
        assert watch.widths == {34: rounds, 3: rounds, 6: rounds, 12: rounds}


def test_benchmark_timed_runs_capture_nothing_and_stay_exact(models):
    from benchmarks import trees

    target, draft = models
    configs = trees.e2e_configs(trees=((3, 2, 2, 1),), chain_ks=(8,))
    cells = trees.e2e_cells(target, draft, (1, 4), prompt_tokens=16, new_tokens=20, configs=configs)
    assert [(c["B"], c["config"]) for c in cells] == [(B, n) for B in (1, 4) for n, _, _ in configs]
    assert [c["captured"] for c in cells] == [0] * len(cells)
    assert all(c["exact"] for c in cells)
