"""Tree rejection sampling preserves the target distribution: χ² tests at fixed seeds, with their power.

The target is a small Markov model over V = 5 tokens: the root's row has logits L[0], a depth-d node carrying
token t has the row L[d][t]. So the first two tokens of the stream have the joint p1(t1) · p2(t2 | t1), with
p1 = p(L[0]) and p2(· | t1) = p(L[1][t1]) (p: temperature / top-k / top-p of ``verispec.verify.sampling``).
Each of N sequences drafts a full tree of a given branching per depth (children of a node carrying token t
hold the draft's next tokens for t), then one ``verify_tree_sample`` call verifies the batch. When a round
emits one token only, the second is drawn from p2(· | t1), as the next round would.

- draft_probs mode: siblings drawn i.i.d. from their parent's q (Q[d][t]); each node's draft_probs row is it.
- deterministic mode: the children are the top-w tokens of that q (distinct, always the same): point masses.

Significance: each test rejects at p < 1e-3 (seeds are fixed: deterministic). The power tests run the same
harness with a deliberately wrong rule patched into the reference and require a rejection at p < 1e-3: accepting
with r(x) instead of min(1, r(x)/q(x)), not renormalizing the residual between siblings, or testing every
sibling against p instead of the residual. So the tests above can fail.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from stats import chi2_pvalue
from verispec import verify_tree_sample
from verispec.verify import tree_reference
from verispec.verify.sampling import filtered_probs

VOCAB = 5
SEQUENCES = 8_000
SIGNIFICANCE = 1e-3
MAX_DEPTH = 3


def _model(seed: int = 1234):
    """(L, Q): target logits L[0] [V] and L[d] [V, V] (d = 1..3); draft distributions Q[0] [V], Q[d] [V, V]."""
    gen = torch.Generator().manual_seed(seed)
    logits = [torch.randn(VOCAB, generator=gen) * 1.5] + [torch.randn(VOCAB, VOCAB, generator=gen) * 1.5
                                                          for _ in range(MAX_DEPTH)]
    q = [torch.softmax(torch.randn(VOCAB, generator=gen) * 1.5, 0)] + [
        torch.softmax(torch.randn(VOCAB, VOCAB, generator=gen) * 1.5, -1) for _ in range(MAX_DEPTH)]
    return logits, q


def _tree_layout(branching: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """(parents, depth) of the full tree with branching[d - 1] children per depth-(d - 1) node, breadth first:
    e.g. (2, 2) -> parents [-1, -1, 0, 0, 1, 1], depths [1, 1, 2, 2, 2, 2]."""
    parents, depths, level = [], [], [-1]
    for d, width in enumerate(branching, start=1):
        next_level = []
        for parent in level:
            for _ in range(width):
                next_level.append(len(parents))
                parents.append(parent)
                depths.append(d)
        level = next_level
    return parents, depths


def _draft_batch(branching, mode: str, gen: torch.Generator):
    """The batch of SEQUENCES full trees: logits [N (n + 1), V], tokens [N n], parents, num_nodes, q [N n, V]."""
    logits_model, q_model = _model()
    parents, depths = _tree_layout(branching)
    n = len(parents)
    tokens = torch.empty(SEQUENCES, n, dtype=torch.long)
    q = torch.empty(SEQUENCES, n, VOCAB)
    rows = torch.empty(SEQUENCES, n + 1, VOCAB)
    rows[:, 0] = logits_model[0]
    for j, (parent, d) in enumerate(zip(parents, depths)):
        q_j = q_model[0].expand(SEQUENCES, VOCAB) if parent < 0 else q_model[d - 1][tokens[:, parent]]  # [N, V]
        if mode == "draft_probs":
            tokens[:, j] = torch.multinomial(q_j, 1, generator=gen).squeeze(1)
        else:   # the rank-th most likely token of the parent's q, rank = the child's position among its siblings
            rank = sum(1 for i in range(j) if parents[i] == parent)
            tokens[:, j] = q_j.argsort(dim=1, descending=True, stable=True)[:, rank]
        q[:, j] = q_j
        rows[:, j + 1] = logits_model[d][tokens[:, j]]
    return rows.reshape(-1, VOCAB), tokens.reshape(-1), parents * SEQUENCES, [n] * SEQUENCES, q.reshape(-1, VOCAB)


def _first_two(branching, mode: str, filt: dict, seed: int, backend: str = "torch"):
    """(counts of the first token [V], counts of the first two [V * V], p1 [V], joint [V * V], the output)."""
    gen = torch.Generator().manual_seed(seed)
    logits, tokens, parents, num_nodes, q = _draft_batch(branching, mode, gen)
    device = "cuda" if backend == "triton" else "cpu"
    out = verify_tree_sample(logits.to(device), tokens.to(device), parents, num_nodes,
                             q.to(device) if mode == "draft_probs" else None, seed=seed, backend=backend, **filt)
    out.tokens, out.num_emitted, out.num_accepted = out.tokens.cpu(), out.num_emitted.cpu(), out.num_accepted.cpu()
    settings = (filt.get("temperature", 1.0), filt.get("top_k") or 0, filt.get("top_p") or 1.0)
    logits_model, _ = _model()
    p1 = filtered_probs(logits_model[0][None], *settings)[0]
    p2 = filtered_probs(logits_model[1], *settings)                                  # [V, V]: row t1
    first = out.tokens[:, 0].long()
    second = out.tokens[:, 1].long()
    next_round = torch.multinomial(p2[first], 1, generator=gen).squeeze(1)            # one token emitted only
    second = torch.where(out.num_emitted >= 2, second, next_round)
    return (torch.bincount(first, minlength=VOCAB), torch.bincount(first * VOCAB + second, minlength=VOCAB**2),
            p1, (p1[:, None] * p2).flatten(), out)


TREES = [(4,), (2, 3), (3, 2, 2)]
FILTERS = {(2, 3): dict(temperature=0.8, top_k=4), (3, 2, 2): dict(temperature=1.2, top_p=0.9)}


@pytest.mark.parametrize("mode", ["draft_probs", "deterministic"])
@pytest.mark.parametrize("branching", TREES, ids=lambda b: "x".join(map(str, b)))
def test_first_two_emitted_tokens_follow_the_target(branching, mode):
    first, pairs, p1, joint, out = _first_two(branching, mode, FILTERS.get(branching, {}), seed=len(branching) + 7)
    assert chi2_pvalue(first, p1) > SIGNIFICANCE, (first.tolist(), p1.tolist())
    assert chi2_pvalue(pairs, joint) > SIGNIFICANCE
    # the walks went everywhere: rejections at the root, and paths to the deepest level
    assert int((out.num_accepted == 0).sum()) > 0 and int(out.num_accepted.max()) == len(branching)


def _accept_with_r(u, q_x, r_x):
    return u < r_x                     # wrong: ignores q (accept with r(x), not min(1, r(x) / q(x)))


def _unnormalized(weights, norm, q):
    new_weights = np.maximum(weights / norm - q, np.float32(0))
    return new_weights, np.float32(1)  # wrong: the residual max(r - q, 0) is used as if it summed to 1


def _residual_kept(weights, norm, q):
    return weights, norm               # wrong: every sibling is tested against p itself


WRONG = {"accept-with-r": ("accepts", _accept_with_r), "unnormalized-residual": ("rejected", _unnormalized),
         "no-residual": ("rejected", _residual_kept)}
# (with point-mass proposals q(x) = 1, accepting with r(x) is the right rule: that pair is not a wrong rule)
WRONG_CASES = [("accept-with-r", "draft_probs"), ("unnormalized-residual", "draft_probs"),
               ("unnormalized-residual", "deterministic"), ("no-residual", "draft_probs"),
               ("no-residual", "deterministic")]


@pytest.mark.parametrize("rule, mode", WRONG_CASES)
def test_a_wrong_rule_fails_the_same_test(rule, mode, monkeypatch):
    name, wrong = WRONG[rule]
    monkeypatch.setattr(tree_reference, name, wrong)
    first, pairs, p1, joint, _ = _first_two((4,), mode, {}, seed=8)
    assert min(chi2_pvalue(first, p1), chi2_pvalue(pairs, joint)) < SIGNIFICANCE


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the Triton tree sampler at this sample size: needs a CUDA GPU (and TRITON_INTERPRET unset)")
@pytest.mark.parametrize("mode", ["draft_probs", "deterministic"])
def test_triton_tree_sampler_follows_the_target_on_gpu(mode):
    branching = (3, 2, 2)
    first, pairs, p1, joint, out = _first_two(branching, mode, FILTERS[branching], seed=10, backend="triton")
    assert chi2_pvalue(first, p1) > SIGNIFICANCE and chi2_pvalue(pairs, joint) > SIGNIFICANCE
    assert int(out.num_accepted.max()) == len(branching)
