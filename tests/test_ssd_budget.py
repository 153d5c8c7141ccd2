"""SSD's budget F picked by the draft rank (``SSDConfig(budget_mode="auto")``): the pick follows the costs, the branch
rows follow the pick (``DraftServer._set_width``), and every branch still drafts what a plain ``DraftModel`` drafts
from its history whatever F did in between. The process-level SSD == SD check with "auto" is in
test_distributed_ssd.py; the chooser's model (``simulator.best_budget``) in test_distributed_simulator.py."""
from __future__ import annotations

import pytest
import torch

from test_ssd_prespeculation import CFG, K, PROMPTS, check_branches
from verispec.distributed.channel import NullChannel
from verispec.distributed.draft_rank import DraftServer
from verispec.distributed.simulator import HostCost, PassTime, SSDCosts
from verispec.distributed.ssd import SSDConfig
from verispec.drafters import DraftModel
from verispec.runtime import load_model
from verispec.runtime.model import Model

MAX_F = 3


def costs(draft_row_s: float) -> SSDCosts:
    """A 6 ms target pass; a draft pass of 0.5 ms plus ``draft_row_s`` per row."""
    target = PassTime(((1, 6.0e-3), (K + 1, 6.0e-3)))
    return SSDCosts(((1, target),), PassTime(((1, 0.5e-3 + draft_row_s), (64, 0.5e-3 + 64 * draft_row_s))),
                    HostCost(0.1e-3, 0.0))


def server(table: SSDCosts) -> DraftServer:
    draft = load_model(CFG, device="cpu", dtype=torch.float32, seed=2)
    srv = DraftServer(draft, [0], SSDConfig(k=K, budget=MAX_F, budget_mode="auto", costs=table))
    srv.channels = [NullChannel()]
    srv._reserve(len(PROMPTS), 128)
    srv._admit([0, 1], PROMPTS, [1, 1], [(0.0, 0, 1.0, 40), (0.8, 0, 0.9, 41)])
    return srv


def round_trip(srv: DraftServer, hit: bool) -> list[int]:
    """Drafts, pre-speculation, and a commit whose outcome is pre-speculated (a hit) or not (a miss) -> the number
    of branches each sequence had."""
    srv._drafts([K] * len(srv.seqs))
    srv._prespeculate()
    branches = [len(seq.branches) for seq in srv.seqs]
    accepted, emitted = [], []
    for seq in srv.seqs:
        j, t = max(seq.branches) if hit and seq.branches else (0, next(t for t in range(64) if (0, t) not in
                                                                     seq.branches and t != seq.drafts[0]))
        accepted.append(j)
        emitted.append(seq.drafts[:j] + [t])
    srv._commit(accepted, emitted)
    return branches


@pytest.mark.parametrize("row_s,want", [(0.0, MAX_F), (2e-3, 0)])
def test_auto_picks_the_most_branches_when_rows_are_free_and_none_when_they_are_dear(row_s, want):
    srv = server(costs(row_s))
    assert round_trip(srv, hit=True) == [want] * len(PROMPTS)
    assert srv.width == want and srv.stats.budget == want
    assert srv.branches.model.batch_size == len(PROMPTS) * want
    round_trip(srv, hit=True)
    assert srv.stats.hits == (len(PROMPTS) if want else 0)     # F = 0: nothing pre-speculated, every row drafted
    assert srv.stats.misses == (0 if want else len(PROMPTS))   # on the spot


def test_branch_rows_follow_f_up_and_down_and_every_branch_stays_exact(monkeypatch):
    srv = server(costs(0.0))
    widths = [3, 1, 0, 2, 2, 3, 1, 3]                 # round r (stats.rounds = r + 1 once it drafted) runs widths[r]
    monkeypatch.setattr(srv, "_pick_width", lambda: widths[srv.stats.rounds - 1])
    reference = DraftModel(Model(srv.model.net, srv.model.tokenizer, use_graphs=False))
    reference.reserve(None, len(PROMPTS) * MAX_F, 128)
    seen = []
    for r in range(8):
        srv._drafts([K] * len(srv.seqs))
        srv._prespeculate()
        seen.append(srv.width)
        assert srv.branches.model.batch_size == len(srv.branches._rows) == len(PROMPTS) * srv.width
        assert all(len(seq.branches) == srv.width for seq in srv.seqs)
        if srv.width:
            check_branches(srv, reference)
        accepted, emitted = [], []
        for seq in srv.seqs:                           # the hit branch is the last slot: shrinking moves it to 0
            key = max(seq.branches, key=lambda key: seq.branches[key].slot) if seq.branches else None
            j, t = key if key is not None and r % 2 == 0 else (0, next(
                t for t in range(64) if (0, t) not in seq.branches and t != seq.drafts[0]))
            accepted.append(j)
            emitted.append(seq.drafts[:j] + [t])
        srv._commit(accepted, emitted)
    assert seen == [3, 1, 0, 2, 2, 3, 1, 3] and srv.stats.budget_changes == 6
    assert srv.stats.hits > 0 and srv.stats.misses > 0


def test_auto_without_costs_or_costs_without_auto_is_refused():
    with pytest.raises(ValueError, match="'auto' needs costs"):
        SSDConfig(budget_mode="auto")
    with pytest.raises(ValueError, match="only with budget_mode 'auto'"):
        SSDConfig(costs=costs(0.0))
    with pytest.raises(ValueError, match="budget_mode must be one of"):
        SSDConfig(budget_mode="adaptive")


def test_an_empty_batch_changes_f_without_rows_and_later_admissions_get_the_new_f():
    srv = server(costs(0.0))
    srv._keep([])                                       # every sequence left
    srv._set_width(1)
    assert srv.width == 1 and srv.branches.model.batch_size == 0
    srv._admit([2], [[4, 5, 6]], [7], [(0.0, 0, 1.0, 42)])
    assert srv.branches.model.batch_size == 1
