"""The draft rank's work per round, counted on the CPU: the passes it runs, the graphs they replay, its device reads
and what it keeps. The GPU measured pre-speculation at 2-4.6x the K bare draft steps the simulator charges; these
pin the causes found on the CPU: a catch-up pass before every pre-speculation (and before a spot draft after
accepted drafts), a device read per sequence to rank outcomes plus one for the drafts, [K + 1, V] score rows kept
per branch row of a greedy batch, draft loops captured that no round replays.

On the CPU the graph path runs eagerly on the same keys (``use_graphs`` forced on), so keys added after the warm-up
are graphs a GPU would capture inside a request. Each round's outcome is scripted: a pre-speculated one (a hit) or
not (a miss); every branch's drafts are checked against a plain ``DraftModel`` drafting its history alone.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from verispec.distributed.channel import NullChannel
from verispec.distributed.draft_rank import DraftServer
from verispec.distributed.ssd import SSDConfig
from verispec.drafters import DraftModel
from verispec.drafters.base import Sampling, SamplingParams
from verispec.runtime import ModelConfig, load_model
from verispec.runtime.model import Model

CFG = ModelConfig(vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=48, max_position_embeddings=256)
K, F = 3, 3
PROMPTS = [[3, 14, 15, 9, 26, 5], [2, 7]]
ROUNDS = 9


def server_run(temperature: float, monkeypatch) -> dict:
    """ROUNDS rounds of a DraftServer (every row hits, row 0 hits and row 1 misses, or every row misses, in turn)
    -> what each round ran."""
    draft = load_model(CFG, device="cpu", dtype=torch.float32, seed=2)
    server = DraftServer(draft, [0], SSDConfig(k=K, budget=F))
    server.channels = [NullChannel()]
    server._reserve(len(PROMPTS), 128)
    models = {"spot": server.spot.model, "branches": server.branches.model}
    for model in models.values():
        model.use_graphs = True                         # the graph path, run eagerly on the CPU: the GPU's keys
    setting = (temperature, 0, 0.9 if temperature else 1.0)
    server._warm_up(len(PROMPTS), K, [setting], 16)
    warmed = {name: set(m._graphs._graphs) for name, m in models.items()}
    server._admit([0, 1], PROMPTS, [1, 1], [(*setting, 40 + b) for b in range(len(PROMPTS))])

    passes, reads = [], Counter()
    append, loop, tolist = Model.append, Model.draft_loop, torch.Tensor.tolist
    name = {id(m): n for n, m in models.items()}
    monkeypatch.setattr(Model, "append", lambda self, t: passes.append((name.get(id(self)), "append"))
                        or append(self, t))
    monkeypatch.setattr(Model, "draft_loop", lambda self, i, k, c, key: passes.append((name.get(id(self)), "loop", k))
                        or loop(self, i, k, c, key))
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.update([phase]) or tolist(self))

    reference = DraftModel(Model(draft.net, draft.tokenizer, use_graphs=False))    # drafts each branch plainly
    reference.reserve(None, len(PROMPTS) * F, 128)
    rounds = []
    for r in range(ROUNDS):
        passes.clear()
        reads.clear()
        phase = "spot"
        server._drafts([K] * len(PROMPTS))
        spot_passes = list(passes)
        passes.clear()
        phase = "prespeculate"
        server._prespeculate()
        kept = [t for seq in server.seqs for d in seq.branches.values()
                for t in (vars(d).values() if hasattr(d, "__dict__") else d) if isinstance(t, torch.Tensor)]
        rounds.append(dict(spot=spot_passes, prespeculate=list(passes), reads=dict(reads),
                           kept_bytes=sum(t.numel() * t.element_size() for t in kept if t.shape[-1] == CFG.vocab_size)))
        phase = "reference"
        check_branches(server, reference)
        passes.clear()
        accepted, emitted = [], []
        for b, seq in enumerate(server.seqs):
            hits = sorted(key for key in seq.branches if key[0] <= len(seq.drafts))
            hit = r % 3 == 0 or (r % 3 == 1 and b == 0)
            j, t = hits[-1] if hit else (0, next(t for t in range(64) if (0, t) not in seq.branches
                                                 and t != seq.drafts[0]))
            accepted.append(j)
            emitted.append(seq.drafts[:j] + [t])
        server._commit(accepted, emitted)
    return dict(rounds=rounds, stats=server.stats, warmed=warmed,
                after={name: set(m._graphs._graphs) for name, m in models.items()})


def check_branches(server: DraftServer, reference: DraftModel) -> None:
    """Every pre-speculated branch drafts what a plain DraftModel drafts from its history and counter."""
    branches = [(seq, key, d) for seq in server.seqs for key, d in seq.branches.items()]
    seqs = [seq for seq, _, _ in branches]
    reference.keep([])
    reference.admit(list(range(len(branches))), [s.history[:-1] for s in seqs], [s.history[-1] for s in seqs],
                    SamplingParams(tuple(s.sampling for s in seqs)))
    reference.redirect([s.history + s.drafts[:j] + [t] for s, (j, t), _ in branches], [s.step for s in seqs])
    drafts, _ = reference._run(K + 1)
    assert drafts.tolist() == [d.drafts for _, _, d in branches]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_prespeculation_runs_k_plus_1_warmed_passes_reads_the_device_once_and_keeps_no_score_rows(
        temperature, monkeypatch):
    run = server_run(temperature, monkeypatch)
    assert run["stats"].hits > 0 and run["stats"].misses > 0
    for r, rnd in enumerate(run["rounds"]):
        # no catch-up pass: the branch rows copy the K/V of the row that drafted this round's drafts, and the spot
        # rows keep those of the drafts they fed
        assert rnd["prespeculate"] == [("branches", "loop", K + 1)], (r, rnd)
        assert rnd["spot"] in ([], [("spot", "loop", K + 1)]), (r, rnd)
        # drafts and the ranked ids in one device read per draft call (none to rank the outcomes)
        assert rnd["reads"] == {"prespeculate": 1, **({"spot": 1} if rnd["spot"] else {})}, (r, rnd)
        if temperature == 0:
            assert rnd["kept_bytes"] == 0, (r, rnd)     # greedy rows keep host ids, no [K + 1, V] rows
    for name in ("spot", "branches"):
        assert run["after"][name] == run["warmed"][name], f"{name}: graphs first needed in a round"
        loops = {key for key in run["warmed"][name] if key[0] == "draft"}
        assert {key[2] for key in loops} == {K + 1}, loops  # the warm-up captures only the loops rounds replay


def test_redirect_keeps_exactly_the_agreeing_prefix():
    """The agreeing prefix, wherever the histories part (near the end: a scan; earlier: halving), or nowhere."""
    draft = load_model(CFG, device="cpu", dtype=torch.float32, seed=2)
    model = DraftModel(draft)
    model.reserve(None, 1, 256)
    old = [i % 60 + 1 for i in range(100)]          # never 0: the new histories part with 0
    model.admit([0], [old[:-1]], [old[-1]], SamplingParams((Sampling(0.0, 0, 1.0, 0),)))
    for part in (0, 3, 50, 69, 70, 90, 99, 100):
        new = old[:part] + [0] * 5
        model._rows[0].history, model._rows[0].valid = list(old), len(old)
        model.redirect([new], [0])
        assert model._rows[0].valid == part, part


def test_copy_kv_copies_the_named_positions_sets_lengths_and_refuses_bad_input():
    draft = load_model(CFG, device="cpu", dtype=torch.float32, seed=2)
    source, target = draft, Model(draft.net, draft.tokenizer, use_graphs=False)
    source.setup_cache(1, 64, empty=True)
    source.admit([[5, 6, 7, 8, 9, 10, 11, 12]])
    target.setup_cache(2, 64, empty=True)
    target.admit([[5, 6, 7], [1, 2]])
    before = [t.clone() for t in target.cache.k + target.cache.v]
    target.copy_kv([0], source, [0], [3], 5)
    for got, want, old in zip(target.cache.k + target.cache.v, source.cache.k + source.cache.v, before):
        assert torch.equal(got[0, :, 3:8], want[0, :, 3:8])  # the named positions
        assert torch.equal(got[0, :, :3], old[0, :, :3]) and torch.equal(got[1], old[1])   # nothing else
    assert target.cache.lengths.tolist() == [8, 2]
    for args, message in [(([0], Model(load_model(CFG, seed=3).net, None), [0], [0], 1), "share this model"),
                          (([2], source, [0], [0], 1), "rows must be in"),
                          (([0], source, [0], [1000], 8), "outside the caches"),
                          (([0, 1], source, [0], [0], 1), "one entry per row")]:
        with pytest.raises(ValueError, match=message):
            target.copy_kv(*args)


def test_a_sampled_row_joining_greedy_rows_gets_q_for_every_row():
    """Greedy rows' branches keep no q; when a sampled row joins, the round's q rows for those greedy rows are the
    one-hot of their drafts (what ``draw`` gives a greedy row in a sampled batch) and the sampled row's are its q."""
    draft = load_model(CFG, device="cpu", dtype=torch.float32, seed=2)
    server = DraftServer(draft, [0], SSDConfig(k=K, budget=F))
    server._reserve(3, 128)
    server._admit([0, 1], PROMPTS, [1, 1], [(0.0, 0, 1.0, 40), (0.0, 0, 1.0, 41)])
    server._drafts([K, K])
    server._prespeculate()
    hits = [max(seq.branches) for seq in server.seqs]                    # both greedy rows hit
    server._commit([j for j, _ in hits], [seq.drafts[:j] + [t] for seq, (j, t) in zip(server.seqs, hits)])
    server.branches.model._prefill_one = None           # joining rows copy their prompt's K/V from the spot row
    server._admit([2], [[4, 5, 6]], [7], [(0.8, 0, 0.9, 42)])
    for spot, branches in zip(server.spot.model.cache.k + server.spot.model.cache.v,
                              server.branches.model.cache.k + server.branches.model.cache.v):
        assert all(torch.equal(branches[r, :, :3], spot[2, :, :3]) for r in range(2 * F, 3 * F))
    reply, q = server._drafts([K, 2, K])
    assert reply["q"] and q.shape == (2 * K + 2, CFG.vocab_size) and server.stats.hits == 2
    for b, rows in enumerate((range(0, K), range(K, K + 2))):
        expected = torch.nn.functional.one_hot(torch.tensor(server.seqs[b].drafts), CFG.vocab_size).float()
        assert torch.equal(q[list(rows)], expected)
    sampled = q[K + 2:]
    assert torch.allclose(sampled.sum(-1), torch.ones(K)) and (sampled < 1).any()
