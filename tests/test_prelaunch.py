"""Prelaunched drafts (``Drafter.prelaunch``): the next round's draft loop launched from a round's outcome on the
device, before the host reads it. The tokens must be exactly those of a run without it (greedy: plain decoding;
sampled: the same seeded draws), drafts launched for a round that then runs otherwise (a row ended, a request was
admitted, another k, a plain round between) must never be used, and the counters say what happened.

On the CPU the draft model's graph cache runs the captured program eagerly on the same padded buffers (``use_graphs``
forced on, as in test_draft_loop.py), which covers the logic; on a GPU the same checks replay real CUDA graphs.
"""
from __future__ import annotations

import collections

import pytest
import torch

from verispec.drafters import DraftModel, OracleDraft, SamplingParams
from verispec.engine import Request, Scheduler, SchedulerConfig, generate
from verispec.runtime import ModelConfig, load_model

CFG = ModelConfig(vocab_size=96, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                  intermediate_size=64)
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="replays CUDA graphs: needs a GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, GPU])]
# (prompt, max_new_tokens): rows end at different rounds, and the fifth request waits for a free row
REQUESTS = [([1, 2, 3, 4], 70), ([7, 8], 21), ([5, 9, 11], 43), ([3], 37), ([2, 4, 6, 8, 10], 29)]


def models(device: str, draft_kind: str = "other"):
    """(target, draft): the target's first layer (rounds accept some of their drafts) or its full-depth twin ("twin":
    every draft accepted, the history's last two tokens are the last draft and the bonus)."""
    target = load_model(CFG, device=device, dtype=torch.float32, seed=3)
    return target, target.truncated(CFG.num_layers if draft_kind == "twin" else 1)


def twin(draft):
    """A twin of ``draft`` (shared weights, its own cache) that takes the captured loop: on the CPU the graph cache's
    eager program (the loop's logic)."""
    model = draft.truncated(draft.config.num_layers)
    model.use_graphs = True
    return model


def serve(target, drafter, prelaunch: bool, temperature: float = 0.0, k: int = 3, max_batch_size: int = 4,
          timing: bool = False, tree: tuple[int, ...] | None = None,
          eos: set[int] = frozenset()) -> tuple[list[list[int]], Scheduler]:
    """Every request of REQUESTS through one scheduler (EOS off unless given: rows end by their lengths) -> (tokens,
    scheduler)."""
    if drafter is not None:
        drafter.attach(target)
        record_drafts(drafter)
    sched = Scheduler(target, drafter, SchedulerConfig(max_batch_size, 128, k, tree=tree), timing=timing)
    sched.eos = set(eos)
    sched.prelaunch = prelaunch
    seqs = [sched.submit(Request(p, n, temperature=temperature, top_k=0, top_p=1.0, seed=10 + i, id=i))
            for i, (p, n) in enumerate(REQUESTS)]
    sched.run()
    return [s.generated for s in seqs], sched


def record_drafts(drafter) -> None:
    """Keep every proposal's drafts on the host in ``drafter.drafts_log`` (round by round, in row order): drafts taken
    from a prelaunch must be those the round would have drafted (greedy tokens alone cannot show a wrong draft)."""
    drafter.drafts_log = []
    for name in ("propose", "propose_tree"):
        original = getattr(drafter, name)

        def logged(*args, _original=original, **kwargs):
            proposal = _original(*args, **kwargs)
            drafter.drafts_log.append(proposal.draft_tokens.cpu().tolist())
            return proposal
        setattr(drafter, name, logged)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("draft_kind", ["other", "twin"])
@pytest.mark.parametrize("temperature, tree", [(0.0, None), (1.0, None), (0.0, (2, 2)), (1.0, (3, 1))],
                         ids=["greedy", "sampled", "tree-greedy", "tree-sampled"])
def test_prelaunched_drafts_give_the_tokens_of_a_run_without_them(device, draft_kind, temperature, tree):
    target, draft = models(device, draft_kind)
    baseline = DraftModel(twin(draft))
    want, _ = serve(target, baseline, False, temperature, tree=tree)
    drafter = DraftModel(twin(draft))
    got, sched = serve(target, drafter, True, temperature, tree=tree)
    assert got == want and drafter.drafts_log == baseline.drafts_log
    assert sched.totals.accepted > 0 and baseline.prelaunches == 0
    if temperature == 0.0:
        plain, _ = serve(target, None, False)
        assert got == plain
    # most rounds took the drafts launched in the round before; the waiting request's admission drops one (a round
    # that may end a row by its length launches none)
    assert drafter.prelaunches_taken > 10
    assert drafter.prelaunches - drafter.prelaunches_taken <= 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", [None, (2, 2)])
def test_the_oracles_cost_model_takes_prelaunched_loops_and_its_drafts_stay_the_same(device, tree):
    target, draft = models(device)
    continuations = [p + g for (p, _), g in zip(REQUESTS, serve(target, None, False)[0])]
    outs = {}
    for prelaunch in (False, True):
        oracle = OracleDraft([c[len(p):] for c, (p, _) in zip(continuations, REQUESTS)], 0.7,
                             cost_model=twin(draft), seed=1, tree_rates={2: 0.8})
        tokens, sched = serve(target, oracle, prelaunch, tree=tree)
        outs[prelaunch] = (tokens, sched.totals.rounds, sched.totals.accepted)
        assert (oracle.prelaunches_taken > 10) == prelaunch
    assert outs[True] == outs[False]


def test_no_prelaunch_when_phases_are_timed_or_k_is_chosen_per_round():
    target, draft = models("cpu")
    drafter = DraftModel(twin(draft))
    serve(target, drafter, True, timing=True)            # a timed phase would hold the next round's drafts
    assert drafter.prelaunches == 0
    drafter = DraftModel(twin(draft))
    drafter.attach(target)
    sched = Scheduler(target, drafter, SchedulerConfig(2, 64, 3), k_policy=lambda running, k: [k] * len(running))
    sched.submit(Request([1, 2, 3], 20))
    sched.run()
    assert drafter.prelaunches == 0                      # a policy's k is known only at the round's start


def drafter_after_one_round(draft, k: int = 2):
    """A DraftModel with two rows after one round of k drafts, and that round's outcome as the engine passes it."""
    drafter = DraftModel(twin(draft))
    drafter.reserve(None, 4, 64)
    drafter.admit([0, 1], [[1, 2, 3], [4, 5]], [6, 7], SamplingParams.columns((0.0, 0.0), (0, 0), (1.0, 1.0), (0, 1)))
    proposal = drafter.propose([k, k])
    accepted = [1, 0]
    emitted = [proposal.draft_tokens[0, :1].tolist() + [9], [11]]
    tokens = torch.full((2, k + 1), -1, dtype=torch.long)
    for b, e in enumerate(emitted):
        tokens[b, :len(e)] = torch.tensor(e)
    tail = torch.cat([torch.tensor([[6], [7]]), tokens], dim=1)                     # [B, K + 2]
    return drafter, accepted, emitted, tail


@pytest.mark.parametrize("shape", [2, (2, 2)])
def test_prelaunched_drafts_equal_the_drafts_proposed_after_the_commit(shape):
    _, draft = models("cpu")
    drafter, accepted, emitted, tail = drafter_after_one_round(draft)
    twin, *_ = drafter_after_one_round(draft)
    assert drafter.prelaunch(shape, [2, 2], torch.tensor(accepted), tail)
    drafter.commit(accepted, emitted)
    twin.commit(accepted, emitted)
    propose = (lambda d: d.propose_tree(shape)) if isinstance(shape, tuple) else (lambda d: d.propose([2, 2]))
    got, want = propose(drafter), propose(twin)
    assert drafter.prelaunches_taken == 1 and twin.prelaunches_taken == 0
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    assert [r.valid for r in drafter._rows] == [r.valid for r in twin._rows]
    assert [r.step for r in drafter._rows] == [r.step for r in twin._rows]


@pytest.mark.parametrize("between", ["plain round", "other k", "keep", "tree", "other tree"])
def test_prelaunched_drafts_for_a_round_that_runs_otherwise_are_dropped(between):
    """Drafts launched for the next round are never taken by a later one, nor for another shape; after a row ended
    (keep) the rows that go on keep theirs. The drafts then proposed equal those of a twin that never launched any."""
    _, draft = models("cpu")
    drafters = [drafter_after_one_round(draft) for _ in range(2)]
    (drafter, accepted, emitted, tail), (twin, *_) = drafters
    assert drafter.prelaunch((2, 2) if between == "other tree" else 2, [2, 2], torch.tensor(accepted), tail)
    for d in (drafter, twin):
        d.commit(accepted, emitted)
    if between == "other tree":                          # launched for a tree of other widths
        got, want = drafter.propose_tree((3, 1)), twin.propose_tree((3, 1))
        assert torch.equal(got.draft_tokens, want.draft_tokens) and drafter.prelaunches_taken == 0
        assert [r.valid for r in drafter._rows] == [r.valid for r in twin._rows]
        return
    if between == "plain round":                         # a round without drafts: one more commit, no propose
        for d in (drafter, twin):
            d.commit([0, 0], [[12], [13]])
    if between == "keep":
        for d in (drafter, twin):
            d.keep([1])
    if between == "tree":
        for d in (drafter, twin):
            d.propose_tree((2,))
            d.commit([0] * len(d._rows), [[14]] * len(d._rows))
    caps = [3] * len(drafter._rows) if between == "other k" else [2] * len(drafter._rows)
    got, want = drafter.propose(caps), twin.propose(caps)
    # a row that ended (keep) leaves the others' prelaunched drafts standing: taken, and the same drafts
    assert drafter.prelaunches == 1 and drafter.prelaunches_taken == (between == "keep")
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    assert [r.valid for r in drafter._rows] == [r.valid for r in twin._rows]


def test_no_prelaunch_while_a_row_owes_its_prefill_or_a_catch_up():
    _, draft = models("cpu")
    drafter = DraftModel(twin(draft))
    drafter.reserve(None, 4, 64)
    drafter.admit([0], [[1, 2, 3]], [6], SamplingParams.columns((0.0,), (0,), (1.0,), (0,)))
    # a plain round first: the row owes its prompt (lazy prefill)
    assert not drafter.prelaunch(2, [0], torch.tensor([0]), torch.tensor([[6, 8, -1]]))
    drafter.commit([0], [[8]])
    drafter.propose([2])                                  # prefilled now; V = L + 1
    drafter.commit([0], [[9]])
    drafter.commit([0], [[10]])                           # two plain rounds: V < L - 2, a catch-up is owed
    assert not drafter.prelaunch(2, [0], torch.tensor([0]), torch.tensor([[10, 12, -1]]))


def test_a_prelaunch_that_raises_sets_the_drafter_aside_and_the_tokens_stand(monkeypatch, caplog):
    target, draft = models("cpu")
    drafter = DraftModel(twin(draft))

    def broken(*args, **kwargs):
        raise RuntimeError("prelaunch broke")
    monkeypatch.setattr(drafter, "prelaunch", broken)
    drafter.attach(target)
    sched = Scheduler(target, drafter, SchedulerConfig(2, 64, 3), isolate_drafter=True)
    sched.eos = set()
    seq = sched.submit(Request([1, 2, 3, 4], 20))
    sched.run()
    plain, _ = serve(target, None, False)
    assert seq.generated == plain[0][:20]
    # set aside after its first drafting round, back once the request running then had ended (none was left)
    assert sched.drafter_faults == 1 and sched.totals.proposed == 3
    assert "drafter.prelaunch: RuntimeError: prelaunch broke" in caplog.text


def test_generate_prelaunches_with_a_fixed_k():
    target, draft = models("cpu")
    drafter = DraftModel(twin(draft))
    plain = generate(target, [[1, 2, 3]], drafter=None, max_new_tokens=24)
    out = generate(target, [[1, 2, 3]], drafter=drafter, k=3, max_new_tokens=24)
    assert [g.tokens for g in out] == [g.tokens for g in plain]
    assert drafter.prelaunches_taken > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature, ends", [(0.0, "length"), (0.9, "length"), (0.0, "eos")])
def test_the_feature_heads_prelaunched_commit_and_drafts_give_the_same_tokens(device, temperature, ends):
    """``FeatureHead.prelaunch``: this round's commit pass and the next round's draft loop built from the outcome on
    the device. Greedy: a head drafting plain decoding's most common token (rounds accept 0..k drafts: every commit
    width) equals plain decoding; sampled (a peaked random head): the same tokens as without prelaunch. "eos": rows
    end by EOS one by one after the next drafts were launched; the rows that go on keep theirs."""
    from collections import Counter

    from test_feature_head import random_head
    from test_feature_head import target as head_target
    from verispec.drafters import FeatureHead

    model = head_target(use_graphs=True, device=device)       # on the CPU: the graph programs, run eagerly
    with torch.no_grad():
        model.net.lm_head.mul_(6.0)                           # peaked: sampled rows accept some drafts too
    plain, _ = serve(model, None, False, temperature)
    eos = set()
    if ends == "eos":             # the third most common token: rows end at their own points
        eos = {collections.Counter(t for g in plain for t in g[3:]).most_common(3)[2][0]}
        plain, _ = serve(model, None, False, temperature, eos=eos)
        assert len({len(g) for g in plain}) > 2

    def head():
        if temperature or ends == "eos":                      # drafts that differ by row (a wrong row's would show)
            return FeatureHead(random_head(seed=5))
        constant = random_head(draft_vocab=1)
        constant.d2t.fill_(Counter(t for tokens in plain for t in tokens[1:-1]).most_common(1)[0][0])
        return FeatureHead(constant)

    baseline = head()
    without, _ = serve(model, baseline, False, temperature, eos=eos)
    drafter = head()
    got, sched = serve(model, drafter, True, temperature, eos=eos)
    assert got == without and drafter.drafts_log == baseline.drafts_log
    if temperature == 0.0:
        assert got == plain
    assert sched.totals.accepted > 0 or ends == "eos"           # the random greedy head's drafts: accepted by chance
    assert drafter.prelaunches_taken > 10 and drafter.prelaunches - drafter.prelaunches_taken <= 2


def test_the_head_benchmark_runs_each_chain_with_and_without_prelaunch():
    """benchmarks/feature_head.py --without-prelaunch: each head chain also runs with ``PRELAUNCH`` off (the embedded
    SmolLM2 on the CPU: the plumbing and exactness; the difference is a GPU's), and the setting is put back."""
    from benchmarks import feature_head
    from verispec.engine import scheduler as scheduler_module

    rows = feature_head.acceptance_rows(None, None, 1, 6, trees=(), others=False, chain_ks=(2,),
                                        without_prelaunch=True)
    assert [r[0] for r in rows] == ["plain", "head, chain k=2", "head, chain k=2, without prelaunch"]
    assert all(r[-1] == "yes" for r in rows) and scheduler_module.PRELAUNCH is True


def test_k_auto_chains_planned_ahead_are_prelaunched_and_stay_exact():
    """k="auto" without trees (``AutoK(trees=())``, the server's default): for an all-greedy batch the next round's k is
    planned during this round's pass (``AutoK.plan``) and its drafts launched before the outcome is read; the output
    equals plain decoding, and a sampled batch (no plan: its rows' k are their own) gives the tokens of a run
    without prelaunch."""
    from verispec.engine.auto_k import AutoK, CostTable

    target, draft = models("cpu")
    flat = CostTable((1, 2, 4, 8), (1, 2, 64), ((1.0, 1.0, 1.0),) * 4, (0.05,) * 4)   # wide passes free: drafting pays

    def run(prelaunch: bool, temperature: float):
        drafter = DraftModel(twin(draft))
        drafter.attach(target)
        policy = AutoK(flat, trees=())
        sched = Scheduler(target, drafter, SchedulerConfig(4, 128, 4), k_policy=policy)
        sched.eos, sched.prelaunch = set(), prelaunch
        seqs = [sched.submit(Request(p, n, temperature=temperature, seed=10 + i, id=i))
                for i, (p, n) in enumerate(REQUESTS)]
        sched.run()
        return [s.generated for s in seqs], drafter, policy

    plain, _ = serve(target, None, False)
    got, drafter, policy = run(True, 0.0)
    assert got == plain
    assert policy.plans_adopted > 0 and drafter.prelaunches_taken > 0
    sampled, drafter, policy = run(True, 1.0)
    assert sampled == run(False, 1.0)[0] and drafter.prelaunches == 0 and policy.plans_adopted == 0


def test_prelaunch_inputs_that_do_not_fit_the_batch_are_named():
    """A caller's misuse of ``prelaunch`` (another engine's): a ValueError naming the input, never an index out of range
    on the device; a failed row's count past what tail holds is clamped (the row leaves before the next round)."""
    _, draft = models("cpu")
    drafter, accepted, _, tail = drafter_after_one_round(draft)
    with pytest.raises(ValueError, match="num_draft has 3 entries for a batch of 2 rows"):
        drafter.prelaunch(2, [2, 2, 2], torch.tensor(accepted), tail)
    with pytest.raises(ValueError, match=r"num_accepted must be \[2\]"):
        drafter.prelaunch(2, [2, 2], torch.tensor([1]), tail)
    with pytest.raises(ValueError, match=r"tail must be \[2, >= 4\]"):
        drafter.prelaunch(2, [2, 2], torch.tensor(accepted), tail[:, :3])
    assert drafter.prelaunch(2, [2, 2], torch.tensor([7, 0]), tail)          # row 0's count: out of range, clamped


@pytest.mark.parametrize("tree", [None, (2, 2)])
def test_rows_ending_by_eos_leave_the_others_prelaunched_drafts_standing(tree):
    """Rows that meet EOS after the next round's drafts were launched leave the batch (``keep``); the rows that go on
    take their drafts (``Prelaunch.kept``), and every row's tokens are those of a run without prelaunch (greedy: plain
    decoding's, EOS included)."""
    target, draft = models("cpu", "other")
    free, _ = serve(target, None, False)
    # a token every request meets at a different point: rows end by EOS, one by one, while others go on
    eos = {collections.Counter(t for g in free for t in g[3:]).most_common(1)[0][0]}
    plain, _ = serve(target, None, False, eos=eos)
    assert len({len(g) for g in plain}) > 2 and any(len(g) < n for g, (_, n) in zip(plain, REQUESTS))
    baseline = DraftModel(twin(draft))
    without, _ = serve(target, baseline, False, tree=tree, eos=eos)
    drafter = DraftModel(twin(draft))
    got, _ = serve(target, drafter, True, tree=tree, eos=eos)
    assert got == without == plain and drafter.drafts_log == baseline.drafts_log
    assert drafter.prelaunches_taken >= drafter.prelaunches - 2 > 0       # the EOS ends dropped none


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_stream_of_requests_with_cancels_and_eos_gets_the_same_tokens_and_drafts(seed):
    """A server's life on one scheduler: requests submitted between steps (some wait for a row), some cancelled
    mid-run, rows ending by EOS and by length, greedy and sampled rows mixed. The same event sequence with and without
    prelaunch gives every request the same tokens and every round the same drafts."""
    import random

    target, draft = models("cpu", "other")
    free, _ = serve(target, None, False)
    eos = {collections.Counter(t for g in free for t in g[3:]).most_common(1)[0][0]}

    def life(prelaunch: bool):
        rng = random.Random(seed)
        drafter = DraftModel(twin(draft))
        drafter.attach(target)
        record_drafts(drafter)
        sched = Scheduler(target, drafter, SchedulerConfig(3, 128, 3), isolate_drafter=True)
        sched.eos, sched.prelaunch = set(eos), prelaunch
        seqs = []
        for step in range(60):
            if step % 4 == 0 and len(seqs) < 9:
                p, n = REQUESTS[len(seqs) % len(REQUESTS)]
                temperature = 0.0 if rng.random() < 0.6 else 1.0
                seqs.append(sched.submit(Request(p, n, temperature=temperature, seed=len(seqs), id=len(seqs))))
            if step % 7 == 3 and seqs:
                sched.cancel(seqs[rng.randrange(len(seqs))].request.id)
            sched.step()
            if sched.idle and len(seqs) >= 9:
                break
        return [(s.generated, s.finish_reason) for s in seqs], drafter

    got, drafter = life(True)
    want, baseline = life(False)
    assert got == want and drafter.drafts_log == baseline.drafts_log
    assert {reason for _, reason in got} >= {"eos", "cancelled"} and drafter.prelaunches_taken > 0
