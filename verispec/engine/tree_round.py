"""One speculative round over draft *trees*: draft tree -> ONE tree pass -> tree verification -> compaction -> commit.

The chain round (``round.run_round``) with a tree in place of the k drafts. For each row b, with n_b nodes:

    draft         drafter.propose_tree(widths) -> nodes, parents (local, -1 = the root), num_nodes
    target pass   target.append_tree([c, node_0 .. node_{n-1}, padding], parents + 1)   [B, T, V], T = 1 + max n_b
                  (a proposal with device paths, a dynamic tree's: ``append_tree_paths`` with those, no host layout)
                  row 0 is the root's (the certain token's) logits, row j + 1 node j's: exactly the layout of
                  verify_tree_greedy / verify_tree_sample; padding nodes (children of the root) fill short rows
    verification  the n_b + 1 live rows of each row -> path [B, D] (accepted nodes), num_accepted, tokens
    compaction    target.accept_tree_path(path + 1, num_accepted, T): the accepted nodes' K/V move to the chain
                  slots after the root; lengths = root + 1 + a_b (the rejected nodes' slots are dead)
    commit        as the chain's: one host read, emitted = accepted nodes + recovered/bonus; drafter.tree_accepted
                  (a draft model keeps its own accepted path), then drafter.commit

Faults as in the chain round: a ``DraftError`` fails its rows (their trees are empty), a row whose status word
is set fails alone, a drafter exception that names no row makes the round run without trees.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..device import to_device
from ..drafters.base import Drafter, Sampling, SamplingParams, TreeProposal, full_tree
from ..drafters.dynamic_tree import DynamicTree
from ..verify import TreeVerifyOutput, verify_tree_greedy, verify_tree_sample
from ..verify.tree_api import TREE_BACKENDS
from .round import (PhaseClock, RoundResult, RunningBatch, commit_outcome, failed_rows, prelaunched,
                    proposal_and_faults, read_outcome)


def tree_verification(target_logits, draft_tokens, parents: tuple[int, ...], num_nodes: list[int],
                      sampling: SamplingParams, offsets: list[int], backend: str | None) -> TreeVerifyOutput:
    """verify_tree_greedy when every row is greedy, else verify_tree_sample (deterministic proposals: no
    draft_probs), each row with its own seed and stream offset; the status is read with the round's outcome."""
    backend = backend if backend in TREE_BACKENDS else None
    if sampling.all_greedy:
        return verify_tree_greedy(target_logits, draft_tokens, parents, num_nodes, backend=backend,
                                  check_values=False)
    keys = to_device(torch.tensor([sampling.seed, offsets], dtype=torch.int64), target_logits.device)   # [2, B]
    return verify_tree_sample(target_logits, draft_tokens, parents, num_nodes, None,
                              temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                              seed=keys[0], offset=keys[1], backend=backend, check_values=False)


def warm_tree_verification(device, dtype, vocab: int, max_batch_size: int, widths: tuple[int, ...] | DynamicTree,
                           settings: list[tuple[float, int, float]], backend: str | None) -> None:
    """Run the tree verification once per batch size 1..max_batch_size and (temperature, top_k, top_p) setting over
    the full tree of ``widths`` (a ``DynamicTree``: one tree of its counts), on zero logits, its outcome read as a
    round reads it, so that its kernels are compiled before the first rounds (``Scheduler.warm_up``; Triton
    specializes a kernel on its integer arguments, such as the row and node counts, so each batch size may compile
    its own)."""
    local = widths.example_parents() if isinstance(widths, DynamicTree) else full_tree(widths)
    n = len(local)
    for b in range(1, max_batch_size + 1):
        for temp, top_k, top_p in settings:
            sampling = SamplingParams((Sampling(float(temp), int(top_k), float(top_p), 0),) * b)
            logits = torch.zeros(b * (n + 1), vocab, device=device, dtype=dtype)                 # [b * (n + 1), V]
            nodes = torch.zeros(b * n, dtype=torch.long, device=device)                        # [b * n]
            read_outcome(tree_verification(logits, nodes, local * b, [n] * b, sampling, [0] * b, backend))


def _without(proposal: TreeProposal, rows: set[int]) -> TreeProposal:
    """The proposal with the trees of ``rows`` removed (those rows propose no node)."""
    if not rows:
        return proposal
    tokens = proposal.draft_tokens
    keep_tok, parents, num_nodes, node0 = [], [], [], 0
    for b, n in enumerate(proposal.num_nodes):
        if b not in rows:
            keep_tok += range(node0, node0 + n)
            parents += proposal.parents[node0:node0 + n]
        num_nodes.append(0 if b in rows else n)
        node0 += n
    return TreeProposal(tokens[to_device(keep_tok, tokens.device, torch.long)], tuple(parents), num_nodes)


def _pass_inputs(certain, proposal: TreeProposal) -> tuple[torch.Tensor, list[tuple[int, ...]], int]:
    """(tokens [B, T] on the certain tokens' device, runtime parents per row (node 0 the root), T) for the tree
    pass; a row with fewer nodes is padded with children of the root (their logits are never read).
    e.g. num_nodes [2, 0], parents [-1, 0]: T = 3, rows' parents (-1, 0, 1) and (-1, 0, 0)."""
    B = certain.shape[0]
    T = 1 + max(proposal.num_nodes, default=0)
    device = certain.device
    nodes = to_device(proposal.draft_tokens, device, torch.long)                    # [sum n_b]
    if all(n == T - 1 for n in proposal.num_nodes):
        tokens = torch.cat([certain, nodes.view(B, T - 1)], dim=1)
    else:
        tokens = certain.expand(B, T).clone()
        cols = [(b, 1 + j) for b, n in enumerate(proposal.num_nodes) for j in range(n)]
        if cols:
            idx = to_device(cols, device, torch.long)
            tokens[idx[:, 0], idx[:, 1]] = nodes
    parents, node0 = [], 0
    for n in proposal.num_nodes:
        local = proposal.parents[node0:node0 + n]
        parents.append((-1,) + tuple(p + 1 for p in local) + (0,) * (T - 1 - n))
        node0 += n
    return tokens, parents, T


def _pass_layout(paths: torch.Tensor, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A proposal's device paths (``TreeProposal.paths`` [B, n, W]: node offsets from the root, entries past a node's
    depth repeating itself) -> the whole tree's (depth [B, T], path [B, T, P]) for ``Model.append_tree_paths``, the
    root first (T = n + 1; P = max(W, T): ``tree_layout``'s width, which the warm-up's graphs have). No host work
    per node: a dynamic tree's rows all differ. e.g. one node under the root: paths [[[0, 1]]] -> depth [[0, 1]],
    path [[[0, 0], [0, 1]]]."""
    B, n, W = paths.shape
    P = max(W, T)
    paths = to_device(paths, device, torch.long)
    body = torch.cat([paths, paths[:, :, -1:].expand(B, n, P - W)], dim=2)                  # [B, n, P]
    path = torch.cat([torch.zeros(B, 1, P, dtype=torch.long, device=device), body], dim=1)  # [B, T, P]
    depth = (path != path[:, :, -1:]).sum(dim=2)              # the entries before the node itself: its ancestors
    return depth, path


def run_tree_round(target, drafter: Drafter, batch: RunningBatch, widths: tuple[int, ...] | DynamicTree,
                   clock: PhaseClock, backend: str | None = None,
                   launched: Callable[[], None] | None = None,
                   next_shape: Callable[[], int | tuple[int, ...] | None] | None = None) -> RoundResult:
    """Advance every row of ``batch`` by one tree round (see the module docstring). ``RoundResult.num_draft`` holds
    each row's tree depth (the positions its round tested, as k_b for a chain). Exactly one device->host read (and
    the drafter's own read of a dynamic tree's parents: ``DraftModel._dynamic_passes``).
    ``launched()``, if given, is called once the target pass is launched (``Scheduler.launched_hook``);
    ``next_shape()``: as ``run_round``'s (the next round's drafts launched before this one's outcome is read)."""
    device = batch.certain.device
    certain_before = batch.certain                                                          # [B, 1]
    t0 = clock.now()
    proposal, failed, draft_error = proposal_and_faults(lambda: drafter.propose_tree(widths))
    drafted = proposal is not None                     # the drafter's cache holds this round's tree
    if proposal is None:
        proposal = TreeProposal(torch.zeros(0, dtype=torch.long), (), [0] * batch.size)
    proposal = _without(proposal, set(failed))
    t1 = clock.now()
    tokens, parents, T = _pass_inputs(batch.certain, proposal)
    if proposal.paths is not None and hasattr(target, "append_tree_paths"):
        logits = target.append_tree_paths(tokens, *_pass_layout(proposal.paths, T, device), T)  # [B, T, V]
    else:
        logits = target.append_tree(tokens, parents)                                        # [B, T, V]
    if launched is not None:
        launched()
    t2 = clock.now()
    live = [b * T + j for b, n in enumerate(proposal.num_nodes) for j in range(n + 1)]
    flat_logits = logits.flatten(0, 1)
    if len(live) != flat_logits.shape[0]:
        flat_logits = flat_logits[to_device(live, device, torch.long)]                      # [sum(n_b + 1), V]
    nodes = to_device(proposal.draft_tokens, device, torch.long)
    out = tree_verification(flat_logits, nodes, proposal.parents, proposal.num_nodes, batch.sampling, batch.offsets,
                            backend)
    path = out.path.to(torch.long) + 1                                                     # [B, D] offsets
    num_accepted = out.num_accepted.to(torch.long)
    target.accept_tree_path(path, num_accepted, T)
    batch.certain = out.tokens.gather(1, num_accepted[:, None]).to(torch.long)              # [B, 1]
    try:
        if drafted:
            drafter.tree_accepted(path, num_accepted)
    except Exception as e:  # noqa: BLE001 - names no row: the tokens stand, the scheduler sets the drafter aside
        draft_error = draft_error or ("commit", e)
    depths = _depths(proposal)
    outcome, draft_error = prelaunched(drafter if drafted else None, out, certain_before, depths, next_shape, clock,
                                       draft_error)
    failed.update(failed_rows(outcome, "this round's target logits"))
    t3 = clock.now()
    accepted, emitted, draft_error = commit_outcome(drafter, batch, outcome, failed, draft_error)
    t4 = clock.now()
    phases = dict(draft=t1 - t0, target=t2 - t1, verification=t3 - t2, commit=t4 - t3)
    return RoundResult(depths, accepted, emitted, phases, failed, draft_error)


def _depths(proposal: TreeProposal) -> list[int]:
    """Each row's tree depth (0 for no node)."""
    out, node0 = [], 0
    for n in proposal.num_nodes:
        depth: list[int] = []
        for p in proposal.parents[node0:node0 + n]:
            depth.append(1 if p < 0 else depth[p] + 1)
        out.append(max(depth, default=0))
        node0 += n
    return out
