"""The PyTorch reference semantics of *tree* verification: the oracle every tree kernel is tested against.

A drafter may propose a tree instead of a chain: several candidates per position, each continued by its own
children. The target scores every node in one pass; verification walks the tree from the root, keeping the
accepted path, and emits one more token (recovered or bonus) where the walk stops. A chain is the tree in which
every node has one child, and then everything here is exactly ``reference_verify_greedy`` /
``reference_verify_sample`` (same tokens, same random numbers).

Vocabulary (as in ``verispec.verify.reference``):
    node       one draft token of the tree; its parent is the root (the last committed position) or a node
    accepted   the nodes of the accepted path, root first: num_accepted of them, at depths 1, 2, ...
    recovered  the token emitted where the path stops at a node whose children were all rejected
    bonus      the token emitted where the path ends at a leaf (from that leaf's own row)
    emitted    accepted + exactly one recovered-or-bonus token: num_emitted = num_accepted + 1

Ragged, flattened layout (B sequences, sequence b proposes n_b >= 0 nodes), e.g. num_nodes = [3, 0]:
    num_nodes      [B]              n_b                                                         [3, 0]
    cu_num_nodes   [B + 1]          exclusive prefix sum                                        [0, 3, 3]
    draft_tokens   [sum n_b]        sequence b's nodes at cu_num_nodes[b] : cu_num_nodes[b+1]
    parents        [sum n_b]        node j's parent, local to its sequence: -1 = the root,      [-1, -1, 0]
                                    else an earlier node (parents come before children)
    draft_probs    [sum n_b, V]     the distribution node j was drawn from (None = deterministic proposals)
    target_logits  [sum (n_b+1), V] sequence b's rows start at cu_num_nodes[b] + b: row 0 is the root's
                                    (it scores the depth-1 nodes), row j + 1 is node j's (it scores j's
                                    children, or gives the bonus when the path ends at j)
    tokens (out)   [B, D + 1]       int32: accepted tokens, then the recovered/bonus token, -1 pad
    path (out)     [B, D]           int32: the accepted nodes' local indices, root first, -1 pad
D is the deepest node of the batch (depth 1 = a child of the root). In the example, sequence 0 is a root with
children 0 and 1, and node 2 below node 0: depths [1, 1, 2], D = 2; its rows are 0 (root), 1, 2, 3 (nodes
0, 1, 2) and sequence 1's single row is 4. A chain is parents = [-1, 0, 1, ...]: exactly the chain layout.

Greedy: from the root, move to the first child (in index order) whose token is the argmax of the current
row; where no child matches, emit that argmax (the bonus, at a leaf).

Sampling (docs/verification.md, "Trees", has the proof): at the current node, with its filtered target
distribution p (``verispec.verify.sampling``), the children are tested in index order against a residual r
that starts at p:
    accept child c (token x, drawn from q_c)   iff   u_c * q_c(x) < r(x)          (u_c: c's ACCEPT uniform)
    else  r <- norm(max(r - q_c, 0))          and test the next child
If a child is accepted the walk moves to it (its row's p, a fresh residual); if all are rejected the recovered
token is a sample of the last residual; at a leaf the bonus is a sample of p.
    draft_probs given: q_c = draft_probs[c], the distribution c was drawn from; siblings must be drawn
        independently (i.i.d. from their parent's q: SpecInfer's multi-draft rejection sampling).
    draft_probs None:  q_c = the point mass at x (any deterministic proposals, e.g. the draft's top-w):
        accept with probability r(x); a rejected token is removed from r, which is renormalized.
Temperature-0 sequences walk greedily (no randomness), exactly as ``reference_verify_tree_greedy``.

Randomness (``verispec.verify.rng``), per sequence with its own seed and offset, at counters local to it:
    accept uniform of node j         row = j (its node index), col = 0,      purpose ACCEPT
    race of the stop row             row = the stop row's local index (0 = root, j + 1 = node j), col = v, RACE
In a chain, node j is draft position j and the stop row is num_accepted: the chain API's counters exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import rng
from .reference import _race, _stream_keys, _unusable, reference_status
from .sampling import filtered_probs
from .status import NUM_DRAFT


@dataclass
class TreeVerifyOutput:
    """Result of verifying one batch of trees.

    tokens:       [B, D + 1] int32, emitted tokens left-aligned (accepted path, then recovered/bonus), -1 padded
    num_accepted: [B] int32, nodes on the accepted path (0 <= num_accepted <= depth of the tree)
    num_emitted:  [B] int32, num_accepted + 1
    path:         [B, D] int32, the accepted nodes' indices local to their sequence, root first, -1 padded
    status:       [B] int32, 0 = sequence b's inputs were clean (``verispec.verify.status``)
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    num_emitted: torch.Tensor
    path: torch.Tensor
    status: torch.Tensor | None = None


def children_of(parents: list[int]) -> dict[int, list[int]]:
    """{node: its children in index order} of one sequence (node -1 = the root), e.g.
    [-1, -1, 0] -> {-1: [0, 1], 0: [2], 1: [], 2: []}."""
    children = {j: [] for j in range(-1, len(parents))}
    for j, parent in enumerate(parents):
        children[parent].append(j)
    return children


def tree_depth(parents: list[int]) -> int:
    """Depth of the deepest node of one sequence (parents before children), e.g. [-1, -1, 0] -> 2; 0 without nodes."""
    depth = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return max(depth, default=0)


def _sequences(num_nodes: torch.Tensor):
    """(b, first node, first row, n_b) of every sequence: rows start at cu_num_nodes[b] + b."""
    node0 = 0
    for b, n in enumerate(num_nodes.tolist()):
        yield b, node0, node0 + b, n
        node0 += n


def _outputs(tokens, path, num_accepted, status, device) -> TreeVerifyOutput:
    num_accepted = torch.tensor(num_accepted, dtype=torch.int32)
    return TreeVerifyOutput(tokens.to(device), num_accepted.to(device), (num_accepted + 1).to(device),
                            path.to(device), status.to(device))


def _unusable_tree(batch: int, max_depth: int, status: torch.Tensor, device) -> TreeVerifyOutput:
    """A batch whose layout is wrong (a NUM_DRAFT word): no tokens, no path, only the status."""
    out = _unusable(batch, max_depth, status, device)
    path = torch.full((batch, max_depth), -1, dtype=torch.int32, device=device)
    return TreeVerifyOutput(out.tokens, out.num_accepted, out.num_emitted, path, out.status)


def reference_verify_tree_greedy(
    target_logits: torch.Tensor, draft_tokens: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor,
    max_depth: int,
) -> TreeVerifyOutput:
    """Greedy: follow the first child whose token is the current row's argmax; emit the argmax where none is.

    ``parents`` must be valid (``verispec.verify.tree_api`` checks it); ``max_depth`` >= every tree's depth.

    >>> logits = torch.tensor([[0., 5, 0],    # root: argmax 1, so node 1 (token 1) is accepted, not node 0
    ...                        [5, 0, 0],     # node 0 (token 2)
    ...                        [0, 0, 5],     # node 1: argmax 2; its child node 2 has token 0: rejected
    ...                        [5, 0, 0]])    # node 2
    >>> out = reference_verify_tree_greedy(logits, torch.tensor([2, 1, 0]), torch.tensor([-1, -1, 1]),
    ...                                    torch.tensor([3]), 2)
    >>> out.tokens.tolist(), out.path.tolist(), out.num_accepted.tolist()
    ([[1, 2, -1]], [[1, -1]], [1])
    """
    batch = num_nodes.shape[0]
    status = reference_status(target_logits, draft_tokens, num_nodes, max(num_nodes.tolist(), default=0))
    if bool((status == NUM_DRAFT).any()):
        return _unusable_tree(batch, max_depth, status, target_logits.device)
    target_argmax = target_logits.float().argmax(dim=-1).tolist()
    drafts, parents = draft_tokens.tolist(), parents.tolist()
    tokens = torch.full((batch, max_depth + 1), -1, dtype=torch.int32)
    path = torch.full((batch, max_depth), -1, dtype=torch.int32)
    num_accepted = []
    for b, node0, row0, n in _sequences(num_nodes):
        children = children_of(parents[node0:node0 + n])
        node, accepted = -1, 0                       # start at the root, whose row is row0
        while True:
            argmax = target_argmax[row0 + node + 1]
            match = [c for c in children[node] if drafts[node0 + c] == argmax]
            if not match:
                tokens[b, accepted] = argmax         # recovered, or the bonus at a leaf
                break
            node = match[0]                          # the first matching child in index order
            tokens[b, accepted], path[b, accepted] = argmax, node
            accepted += 1
        num_accepted.append(accepted)
    return _outputs(tokens, path, num_accepted, status, target_logits.device)


def accepts(u: float, q_x: float, r_x: float) -> bool:
    """The accept test u < min(1, r(x) / q(x)), as u * q(x) < r(x). u, q(x) and r(x) are float32 values (held
    in Python floats, i.e. float64), so the product is exact and the test has one answer on every backend
    (as in the chain reference)."""
    return u * q_x < r_x


def rejected(weights: np.ndarray, norm: np.float32, q: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """After a rejection of a child drawn from ``q`` [V]: the next residual's (weights, norm), i.e.
    max(r - q, 0) and its sum, where r = weights / norm is the current one. float32 throughout."""
    new_weights = np.maximum(weights / norm - q, np.float32(0))
    return new_weights, new_weights.sum(dtype=np.float32)


def reference_verify_tree_sample(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    max_depth: int,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
) -> TreeVerifyOutput:
    """Tree rejection sampling (module docstring), per sequence, with per-sequence T / top-k / top-p.

    The residual is kept as (weights, norm), r = weights / norm: it starts as (p, 1), so the first child's test
    is the chain's u * q(x) < p(x) bit for bit, and a rejection makes it (max(r - q, 0), its sum). The
    recovered token races over the last weights (unnormalized: the race needs no normalizer), which for a
    chain is the chain's max(p - q, 0). If float rounding empties a residual (sum 0, an event of probability 0
    in exact arithmetic) the previous one is kept, as the chain falls back to p.
    seed, offset: [B] int64, sequence b's Philox key and counter offset (``verispec.verify.rng``).
    Inputs that make a sequence's status word non-zero give it tokens of no meaning (ids out of range are
    clamped into the vocabulary so that they can be looked up).
    """
    batch = num_nodes.shape[0]
    status = reference_status(target_logits, draft_tokens, num_nodes, max(num_nodes.tolist(), default=0),
                              draft_probs, temperature, top_k, top_p)
    if bool((status == NUM_DRAFT).any()):
        return _unusable_tree(batch, max_depth, status, target_logits.device)
    logits = target_logits.float().cpu()
    vocab = logits.shape[1]
    counts = num_nodes.cpu().long()
    seed, offset = _stream_keys(seed, batch, "seed"), _stream_keys(offset, batch, "offset")
    seq_of_row = torch.repeat_interleave(torch.arange(batch), counts + 1)
    seq_of_node = torch.repeat_interleave(torch.arange(batch), counts)
    first_node = torch.cumsum(counts, 0) - counts
    local_node = torch.arange(seq_of_node.shape[0]) - first_node[seq_of_node]
    p_all = filtered_probs(logits, temperature[seq_of_row], top_k[seq_of_row], top_p[seq_of_row])   # [R, V]
    u_all = rng.uniform(seed[seq_of_node], offset[seq_of_node], local_node, 0, rng.ACCEPT)              # [N]
    # NOTE: the walk below works on numpy float32 rows: elementwise the same IEEE float32 arithmetic as torch,
    # at a fraction of the per-call cost (the statistical tests verify hundreds of thousands of nodes)
    p_rows = p_all.numpy()
    q_rows = None if draft_probs is None else draft_probs.float().cpu().numpy()
    u_all = u_all.tolist()
    drafts = draft_tokens.cpu().long().clamp(0, vocab - 1).tolist()
    parents = parents.tolist()
    greedy_seq = (temperature.cpu() == 0).tolist()

    tokens = torch.full((batch, max_depth + 1), -1, dtype=torch.int32)
    path = torch.full((batch, max_depth), -1, dtype=torch.int32)
    num_accepted, stop_rows, stop_weights = [], [], []
    for b, node0, row0, n in _sequences(counts):
        children = children_of(parents[node0:node0 + n])
        node, accepted = -1, 0
        while True:
            p = p_rows[row0 + node + 1]                                     # the current node's row
            weights, norm = p, np.float32(1)                                # the residual r = weights / norm
            chosen = None
            for c in children[node]:
                x = drafts[node0 + c]
                if greedy_seq[b]:                                           # one-hot p: the greedy walk
                    if p[x] == 1:
                        chosen = c
                        break
                    continue
                q = q_rows[node0 + c] if q_rows is not None else None    # None: the point mass at x
                q_x = float(q[x]) if q is not None else 1.0
                if accepts(u_all[node0 + c], q_x, float(weights[x] / norm)):
                    chosen = c
                    break
                if q is None:
                    q = np.zeros(vocab, dtype=np.float32)
                    q[x] = 1
                new_weights, new_norm = rejected(weights, norm, q)
                if new_norm > 0:                                            # else rounding emptied it: keep r
                    weights, norm = new_weights, new_norm
            if chosen is None:                                              # stop: recovered or bonus
                stop_rows.append(node + 1)
                stop_weights.append(weights)
                break
            node = chosen
            tokens[b, accepted], path[b, accepted] = drafts[node0 + node], node
            accepted += 1
        num_accepted.append(accepted)

    # the emitted token of every sequence: a race over its stop row's weights at local row `stop_rows[b]`
    # (greedy sequences: the argmax of p, a one-hot)
    weights = torch.from_numpy(np.stack(stop_weights))
    stop_local = torch.tensor(stop_rows, dtype=torch.long)
    race_u = rng.uniform(seed[:, None], offset[:, None], stop_local[:, None], torch.arange(vocab)[None, :], rng.RACE)
    sampled = _race(weights, -torch.log(race_u))
    emitted = torch.where(torch.tensor(greedy_seq, dtype=torch.bool), weights.argmax(dim=1), sampled)
    tokens[torch.arange(batch), torch.tensor(num_accepted, dtype=torch.long)] = emitted.to(torch.int32)
    return _outputs(tokens, path, num_accepted, status, target_logits.device)
