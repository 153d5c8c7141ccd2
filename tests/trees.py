"""Random ragged draft trees for the tree-verification tests (layout: verispec/verify/tree_reference.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Trees:
    """One batch of trees: logits [sum(n_b + 1), V], tokens [N], parents [N] (local), num_nodes [B], q [N, V]."""

    logits: torch.Tensor
    tokens: torch.Tensor
    parents: list[int]
    num_nodes: list[int]
    q: torch.Tensor

    def rows(self, b: int) -> range:
        """Sequence b's rows of ``logits``: the root's, then one per node."""
        start = sum(self.num_nodes[:b]) + b
        return range(start, start + self.num_nodes[b] + 1)

    def nodes(self, b: int) -> range:
        start = sum(self.num_nodes[:b])
        return range(start, start + self.num_nodes[b])

    def sequence(self, b: int) -> "Trees":
        """Sequence b alone, as a batch of one."""
        rows, nodes = self.rows(b), self.nodes(b)
        return Trees(self.logits[rows.start:rows.stop], self.tokens[nodes.start:nodes.stop],
                     self.parents[nodes.start:nodes.stop], [self.num_nodes[b]], self.q[nodes.start:nodes.stop])


def random_parents(gen: torch.Generator, num_nodes: int, chain_bias: float = 0.0) -> list[int]:
    """Parents of one random tree: node j's parent uniform in [-1, j) (or j - 1 with probability chain_bias)."""
    parents = []
    for j in range(num_nodes):
        if j and torch.rand((), generator=gen) < chain_bias:
            parents.append(j - 1)
        else:
            parents.append(int(torch.randint(-1, j, (), generator=gen)) if j else -1)
    return parents


def random_trees(gen: torch.Generator, num_nodes: list[int], vocab: int, *, ties: bool = False,
                 match: float = 0.7, dtype=torch.float32) -> Trees:
    """Ragged random trees whose nodes often carry their parent row's argmax (so that walks go deep and sibling
    order matters); ``ties``: few distinct logit values (many tied maxima). q: each node's draft distribution,
    its token sometimes drawn from q, sometimes the argmax (q(token) > 0 always)."""
    rows = sum(num_nodes) + len(num_nodes)
    if ties:
        logits = torch.randint(-2, 2, (rows, vocab), generator=gen).float()
    else:
        logits = torch.randn(rows, vocab, generator=gen) * 2
    logits = logits.to(dtype)
    argmax = logits.float().argmax(-1)
    parents, tokens, qs = [], [], []
    row0 = 0
    for n in num_nodes:
        local = random_parents(gen, n, chain_bias=0.3)
        for j, parent in enumerate(local):
            q = torch.softmax(torch.randn(vocab, generator=gen) * 1.5, 0)
            if torch.rand((), generator=gen) < match:
                token = int(argmax[row0 + parent + 1])
            else:
                token = int(torch.multinomial(q, 1, generator=gen))
            q[token] += 0.05
            qs.append(q / q.sum())
            tokens.append(token)
        parents += local
        row0 += n + 1
    q = torch.stack(qs) if qs else torch.zeros(0, vocab)
    return Trees(logits, torch.tensor(tokens, dtype=torch.long), parents, list(num_nodes), q)


def chain_parents(num_draft: list[int]) -> list[int]:
    """The parents of chains: [2, 0, 3] -> [-1, 0, -1, 0, 1]."""
    return [j - 1 for k in num_draft for j in range(k)]
