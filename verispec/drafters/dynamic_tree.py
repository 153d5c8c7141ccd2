"""EAGLE-2-style dynamic draft trees: the spec (``DynamicTree``, spelled ``"dyn:D,K,N"``) and its beam step.

A static tree (``tree=[w1, ..., wd]``) gives every node at depth d the same w_d children. A dynamic tree spends its
nodes where the draft is confident: per row, depth 1 holds the root's top-K tokens; each further depth expands every
node of the previous depth into its top-K children and keeps the N candidates of the highest *cumulative* draft
log-probability (the sum of log q along the root-to-node path): a beam of width N across the whole depth, so a
confident branch may keep all N while an unsure one keeps none. The last depth is kept the same way.

The counts per depth are static -- n_1 = min(K, N), n_d = min(N, n_{d-1} * K) -- so every draft pass has a fixed
width (one CUDA graph per depth) and every row has the same number of nodes; only the parents differ from row to
row (and round to round). The choice is a deterministic function of the draft's logits (top-K, then top-N), so the
tree verification of deterministic proposals stays exact, greedy and sampled (``verify_tree_sample`` with no
draft_probs). No final rerank: every kept node is proposed.

    e.g. dyn:3,2,3 (D = 3, K = 2, N = 3): counts 2, 3, 3 (8 nodes). Depth 1: the root's top 2, a and b, at
         cumulative log q -0.1 and -2.5; depth 2's candidates: a's top 2, x and y, at -0.3 and -2.0 (a's -0.1 plus
         their own), b's, z and w, at -2.6 and -4.0: keep x, y, z (a gets 2 children, b 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import torch
from torch import Tensor

PREFIX = "dyn:"


@dataclass(frozen=True)
class DynamicTree:
    """A dynamic draft tree: ``depth`` D levels, ``top_k`` K children per expanded node, ``nodes`` N kept per depth
    (the beam). ``DynamicTree.parse("dyn:4,2,8")`` or ``DynamicTree(4, 2, 8)``; ``str()`` gives the spelling back."""

    depth: int
    top_k: int
    nodes: int

    def __post_init__(self):
        for name in ("depth", "top_k", "nodes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, Integral):
                raise TypeError(f"dynamic tree {name} must be an integer, got {v!r}")
            if v < 1:
                raise ValueError(f"dynamic tree {name} must be >= 1, got {v} (spelling: dyn:DEPTH,TOP_K,NODES, "
                                 f"e.g. dyn:4,2,8)")

    @staticmethod
    def parse(text: str) -> "DynamicTree":
        """``"dyn:D,K,N"`` -> DynamicTree(D, K, N); ValueError naming the problem."""
        if not isinstance(text, str) or not text.strip().lower().startswith(PREFIX):
            raise ValueError(f"a dynamic tree is spelled dyn:DEPTH,TOP_K,NODES (e.g. dyn:4,2,8), got {text!r}")
        parts = text.strip()[len(PREFIX):].split(",")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"a dynamic tree is spelled dyn:DEPTH,TOP_K,NODES with three integers (e.g. dyn:4,2,8: "
                             f"depth 4, each node's top 2 children, 8 nodes kept per depth), got {text!r}")
        return DynamicTree(*(int(p) for p in parts))

    def __str__(self) -> str:
        return f"{PREFIX}{self.depth},{self.top_k},{self.nodes}"

    @property
    def level_sizes(self) -> tuple[int, ...]:
        """Nodes at each depth: n_1 = min(K, N), n_d = min(N, n_{d-1} * K). e.g. dyn:4,2,8 -> (2, 4, 8, 8)."""
        sizes, n = [], 1
        for _ in range(self.depth):
            n = min(self.nodes, n * self.top_k)
            sizes.append(n)
        return tuple(sizes)

    @property
    def num_nodes(self) -> int:
        """Every row's node count (the tree pass holds these and the certain token)."""
        return sum(self.level_sizes)

    def example_parents(self) -> tuple[int, ...]:
        """The local parents (``TreeProposal``'s layout, -1 = the root) of one tree of this shape: depth d's i-th node
        under depth d - 1's node i // K (valid: i < n_{d-1} * K). Warm-ups use it: a pass's graph depends on the
        counts only, never on which parents a round picks."""
        parents: list[int] = []
        first = -1                                    # the previous depth's first local index (-1: the root)
        for d, n in enumerate(self.level_sizes):
            parents += [-1] * n if d == 0 else [first + i // self.top_k for i in range(n)]
            first = len(parents) - n
        return tuple(parents)


def parse_tree_spec(tree):
    """A ``DynamicTree`` from itself or its spelling ``"dyn:D,K,N"``; None for anything else (a static tree's
    widths, "auto", None: ``check_tree`` handles those)."""
    if isinstance(tree, DynamicTree):
        return tree
    if isinstance(tree, str) and tree.strip().lower().startswith(PREFIX):
        return DynamicTree.parse(tree)
    return None


def expand(scores: Tensor, logits: Tensor, top_k: int, keep: int) -> tuple[Tensor, Tensor, Tensor]:
    """One depth of the beam, on the device (no host read). scores [B, n] (the cumulative log-probabilities of the
    nodes just fed; zeros for the root), logits [B, n, V] (their draft logits) -> (tokens [B, keep] int64,
    parent [B, keep] int64: the index among the n nodes, scores [B, keep] float32), best first.

    Each node's children are its top-K tokens by logit (the same order as by probability; ties as ``topk``), scored
    by the parent's score + log q(child); the ``keep`` best of the n * K candidates survive."""
    B, n, _ = logits.shape
    top = logits.topk(top_k, dim=-1)                                                   # [B, n, K]
    logq = top.values.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True)  # [B, n, K] log q(child)
    cand = (scores[:, :, None] + logq).reshape(B, n * top_k)                           # [B, n * K]
    best = cand.topk(keep, dim=-1)                                                     # sorted: best first
    tokens = top.indices.reshape(B, n * top_k).gather(1, best.indices)
    return tokens, torch.div(best.indices, top_k, rounding_mode="floor"), best.values


def child_paths(paths: Tensor, parent: Tensor, first: int) -> Tensor:
    """The root-to-node paths of a new depth, on the device. paths [B, n, d] (the previous depth's paths: node
    offsets from the root, root first, exactly d entries), parent [B, m] (indices into those n nodes), first: the
    new depth's first node offset -> [B, m, d + 1] (the new node i at offset first + i, last).
    e.g. paths [[[0, 1], [0, 2]]], parent [[1, 1, 0]], first 3 -> [[[0, 2, 3], [0, 2, 4], [0, 1, 5]]]."""
    B, m = parent.shape
    up = paths.gather(1, parent[:, :, None].expand(B, m, paths.shape[2]))               # [B, m, d]
    own = torch.arange(first, first + m, device=paths.device).expand(B, m)[:, :, None]  # [B, m, 1]
    return torch.cat([up, own], dim=2)
