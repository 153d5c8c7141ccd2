"""``Scheduler.warm_up`` captures every graph a run can replay: rounds of any k <= K (k=auto's choice, rows near their
end) and the draft model's catch-up passes after rounds without drafting. A graph first needed inside a request
stalls it for its capture; past the draft-loop cap it runs eagerly for good (the 8B server's k=auto ran below
every fixed K that way). On the CPU the graph path runs eagerly on the same keys, so the keys a run adds after the
warm-up are the graphs a GPU would have captured inside requests.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from verispec.drafters import DraftModel, FeatureHead
from verispec.drafters.head_net import HeadConfig, HeadNet
from verispec.engine import Request, Scheduler, SchedulerConfig
from verispec.runtime import ModelConfig, load_model

CFG = ModelConfig(vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=64)
PROMPTS = [[3, 4, 5, 6, 7], [9, 1], [20, 21, 22, 23, 24, 25, 26, 27, 28]]
K = 4
# k per round: a long run of plain rounds (the draft cache falls > 17 tokens behind: a chunked catch-up), then
# every k in 1..K in a mixed order, and back
SCRIPT = [0] * 20 + [3, 1, 4, 2, 0, 0, 1, 4, 3, 0, 2, 2, 4]


def models(use_graphs: bool):
    target = load_model(CFG, dtype=torch.float32, seed=0)
    draft = load_model(CFG, dtype=torch.float32, seed=5)
    target.use_graphs = draft.use_graphs = use_graphs
    return target, draft


def drafter(kind: str, draft):
    if kind == "draft model":
        return DraftModel(draft)
    net = HeadNet(HeadConfig.for_target(CFG))
    net.reset_parameters(1)
    return FeatureHead(net)


def graph_keys(model, drafter) -> set:
    keys = set(model._graphs._graphs)
    head_graphs = getattr(drafter, "_graphs", None)           # FeatureHead's own GraphCache
    return keys | (set(head_graphs._graphs) if head_graphs is not None else set())


def run(use_graphs: bool, warm: bool, kind: str = "draft model"):
    target, draft = models(use_graphs)
    script = itertools.chain(SCRIPT, itertools.repeat(K))
    d = drafter(kind, draft)
    scheduler = Scheduler(target, d, SchedulerConfig(4, 128, K),
                          k_policy=lambda running, k: [next(script)] * len(running))
    scheduler.eos = set()
    if warm:
        scheduler.warm_up(prompt_tokens=16)
    keys_after_warm_up = (set(target._graphs._graphs), graph_keys(draft, d))
    seqs = [scheduler.submit(Request(p, 48, id=i)) for i, p in enumerate(PROMPTS)]
    scheduler.run()
    return [s.generated for s in seqs], keys_after_warm_up, (set(target._graphs._graphs), graph_keys(draft, d))


@pytest.mark.parametrize("kind", ["draft model", "feature head"])
def test_rounds_of_every_k_and_catch_ups_replay_warmed_graphs_only(kind):
    tokens, before, after = run(use_graphs=True, warm=True, kind=kind)
    assert after[0] == before[0], f"target graphs first needed in a request: {sorted(after[0] - before[0])}"
    assert after[1] == before[1], f"draft graphs first needed in a request: {sorted(after[1] - before[1])}"
    draft_loops = {key[2] for key in before[1] if key[0] == "draft"}   # (kind, rows, k, ...)
    assert draft_loops == set(range(1, K + 1))          # a loop for every k, and the run used them
    plain, _, _ = run(use_graphs=False, warm=False)
    assert tokens == plain                              # chunked catch-ups and every k: the same greedy tokens


def test_without_warm_up_the_run_captures():
    # the check above can fail: the same run without warm-up adds keys
    _, before, after = run(use_graphs=True, warm=False)
    assert after[1] - before[1]


GPU_CFG = ModelConfig(vocab_size=97, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=64)      # head_dim 16: the kernels' path (prefill graphs included)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="counts CUDA graph captures: needs a CUDA GPU")
def test_lazy_draft_prefills_replay_warmed_prefill_graphs_only():
    # the draft model prefills a row's prompt in the first round it drafts (DraftModel's lazy prefill), into a row
    # already in the batch: the prefill graphs of the warm-up serve it (the row is a device value), as they served
    # the admission's; plain stretches, catch-ups and every k capture nothing either
    target = load_model(GPU_CFG, device="cuda", dtype=torch.float32, seed=0)
    draft = load_model(GPU_CFG, device="cuda", dtype=torch.float32, seed=5)
    script = itertools.chain(SCRIPT, itertools.repeat(K))
    d = DraftModel(draft)
    scheduler = Scheduler(target, d, SchedulerConfig(4, 128, K),
                          k_policy=lambda running, k: [next(script)] * len(running))
    scheduler.eos = set()
    scheduler.warm_up(prompt_tokens=16)
    captures = (target.graph_captures, draft.graph_captures)
    seqs = [scheduler.submit(Request(p, 48, id=i)) for i, p in enumerate(PROMPTS)]
    scheduler.run()
    assert d.prefill_tokens == sum(len(p) for p in PROMPTS)
    assert (target.graph_captures, draft.graph_captures) == captures
    assert all(len(s.generated) == 48 for s in seqs)
