"""``OracleDraft`` (benchmarks only): drafts with a chosen acceptance rate and a real draft cost.

It replays a known target continuation (e.g. the target's own greedy output for each prompt) and
corrupts each drafted position independently with probability 1 - alpha, so under greedy
verification a round accepts i drafts with probability alpha^i (1 - alpha) (i < k): the
i.i.d.-acceptance model behind E_SD = (1 - alpha^(k+1)) / (1 - alpha) (see ``verispec.analysis``).

``cost_model`` (optional, e.g. a random-weight llama-3.2-1b) runs the very passes a ``DraftModel``
would run, fed with the oracle's tokens, so the measured time includes a realistic draft cost.

Trees (``propose_tree(widths)``): every row gets the full tree of widths[d] children per node at depth d; a node
on the true path has the true next token among its children with probability alpha (at a random child index),
every other child is surely wrong. So under greedy verification a round accepts i nodes with probability
alpha^i (1 - alpha) (i < depth). ``tree_rates`` {w: rate} sets the rate for a node of w children (a real draft's
top-w covers the target's token more often than its top-1: e.g. {1: 0.6, 2: 0.75, 4: 0.87}); absent widths use
alpha. The width is the cost a tree pays for that rate (in the target pass, and in the cost model's passes).
"""
from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

import torch
from torch import Tensor

from ..runtime.quant.packed import PackedWeight
from .base import Drafter, Proposal, TreeProposal, full_tree
from .draft_model import DraftModel


@dataclass
class _Row:
    """One sequence (one object per row: ``keep`` moves it whole)."""

    continuation: list[int]     # the known target continuation it replays
    generated: int = 1          # tokens emitted so far (the first one at admission)


class OracleDraft(Drafter):
    def __init__(self, continuations: list[list[int]], acceptance_rate: float, cost_model=None, seed: int = 0,
                 tree_rates: dict[int, float] | None = None):
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"OracleDraft: acceptance_rate must be in [0, 1], got {acceptance_rate}")
        bad = {w: r for w, r in (tree_rates or {}).items() if not (isinstance(w, int) and w >= 1 and 0.0 <= r <= 1.0)}
        if bad:
            raise ValueError(f"OracleDraft: tree_rates maps widths >= 1 to rates in [0, 1], got {bad}")
        self.tree_rates = dict(tree_rates or {})
        self.continuations = [list(c) for c in continuations]
        self.acceptance_rate = acceptance_rate
        self.seed = seed
        self._runner = DraftModel(cost_model) if cost_model is not None else None
        self._rows: list[_Row] = []          # batch order
        self._vocab = 0

    def attach(self, target) -> None:
        self._vocab = target.config.vocab_size
        if self._runner is not None:
            self._runner.attach(target)

    def reserve(self, target, max_batch_size: int, max_seq_len: int) -> None:
        self._rng = random.Random(self.seed)
        self._gen = torch.Generator().manual_seed(self.seed)     # the surely-wrong tree nodes
        self._rows = []
        if self._runner is not None:
            self._runner.reserve(target, max_batch_size, max_seq_len)

    def warm_up(self, max_batch_size: int, k: int, settings, prompt_tokens: int = 0) -> int:
        if self._runner is None:
            return 0
        return self._runner.warm_up(max_batch_size, k, settings, prompt_tokens, forced=True)

    def admit(self, seq_ids, prompts, first_tokens, sampling) -> None:
        bad = [i for i in seq_ids if not 0 <= i < len(self.continuations)]
        if bad:
            raise ValueError(f"OracleDraft has {len(self.continuations)} continuations; sequences {bad} have none")
        self._rows += [_Row(self.continuations[i]) for i in seq_ids]
        if self._runner is not None:
            self._runner.admit(seq_ids, prompts, first_tokens, sampling)

    def _oracle(self, b: int, k: int) -> list[int]:
        cont, g = self._rows[b].continuation, self._rows[b].generated
        out = []
        for i in range(k):
            true = cont[g + i] if g + i < len(cont) else 0
            if self._rng.random() >= self.acceptance_rate:
                true = (true + 1 + self._rng.randrange(self._vocab - 1)) % self._vocab  # surely wrong
            out.append(true)
        return out

    def propose(self, max_num_draft: list[int]) -> Proposal:
        k = max(max_num_draft, default=0)
        drafts = torch.tensor([self._oracle(b, k) for b in range(len(self._rows))], dtype=torch.long)  # [B, K]
        drafts = drafts.reshape(len(self._rows), k)
        if self._runner is not None and k and self._runner._take_prelaunched(k, list(max_num_draft)) is None:
            self._runner._run(k, forced=drafts, drawn=list(max_num_draft))   # a row asking for 0 owes no prefill
        return Proposal(drafts, list(max_num_draft), None)

    def prelaunch(self, shape: int | tuple[int, ...], num_draft: list[int], num_accepted: Tensor,
                  tail: Tensor) -> bool:
        """The cost model's next draft passes (``DraftModel.prelaunch``: k drafts, or a tree's widths), fed token 0
        where the oracle's drafts would go: they are chosen on the host after the commit, and what the cost model's
        cache holds past the history is never read (its passes cost the same whatever the tokens)."""
        if self._runner is None or not self._rows:
            return False
        width = len(_tree_shape(shape)[0]) if isinstance(shape, tuple) else shape
        forced = torch.zeros(len(self._rows), width, dtype=torch.long, device=self._runner.model.device)   # [B, n]
        return self._runner.prelaunch(shape, num_draft, num_accepted, tail, forced=forced)

    drafts_trees = True

    def propose_tree(self, widths: tuple[int, ...]) -> TreeProposal:
        """Every row's full tree (see the module docstring): all nodes drawn surely wrong at once (one host draw per
        node, no Python per node), then per row the true path's walk puts the true token at its hit children."""
        widths = tuple(widths)
        parents, sizes, depth = _tree_shape(widths)
        B, n = len(self._rows), len(parents)
        truth = torch.tensor([self._truth(b, len(widths)) for b in range(B)], dtype=torch.long).reshape(B, -1)  # [B, D]
        # true + 1 + r with r < V - 1, mod V: never the true token
        nodes = (truth[:, depth] + 1 + torch.randint(self._vocab - 1, (B, n), generator=self._gen)) % self._vocab
        rows, cols = [], []
        for b in range(B):
            first, i = 0, 0                     # the depth's first node; the true path's index within its depth
            for d, w in enumerate(widths):
                if self._rng.random() >= self.tree_rates.get(w, self.acceptance_rate):
                    break                       # the true token is none of this node's children: off the path
                i = i * w + self._rng.randrange(w)
                rows.append(b)
                cols.append(first + i)
                first += sizes[d]
        if rows:
            nodes[rows, cols] = truth[rows, depth[cols]]                                # [B, n]
        if self._runner is not None and self._runner._take_prelaunched(widths) is None:
            self._runner._tree_passes(widths, forced=nodes)
        return TreeProposal(nodes.reshape(-1), parents * B, [n] * B)

    def _truth(self, b: int, depth: int) -> list[int]:
        """Row b's true next ``depth`` tokens (0 past its known continuation)."""
        cont, g = self._rows[b].continuation, self._rows[b].generated
        return [cont[g + d] if g + d < len(cont) else 0 for d in range(depth)]

    def warm_up_tree(self, max_batch_size: int, widths: tuple[int, ...], prompt_tokens: int = 0) -> int:
        return 0 if self._runner is None else self._runner.warm_up_tree(max_batch_size, widths, prompt_tokens)

    # the cost model's counters (0 without one)
    graph_captures = property(lambda self: _runner_count(self, "graph_captures"))
    prefill_tokens = property(lambda self: _runner_count(self, "prefill_tokens"))
    catch_up_passes = property(lambda self: _runner_count(self, "catch_up_passes"))
    prelaunches = property(lambda self: _runner_count(self, "prelaunches"))
    prelaunches_taken = property(lambda self: _runner_count(self, "prelaunches_taken"))

    def draft_debt(self) -> tuple[list[int], int] | None:
        return None if self._runner is None else self._runner.draft_debt()

    def tree_accepted(self, path, num_accepted) -> None:
        if self._runner is not None:
            self._runner.tree_accepted(path, num_accepted)

    def commit(self, num_accepted, emitted) -> None:
        for row, e in zip(self._rows, emitted, strict=True):
            row.generated += len(e)
        if self._runner is not None:
            self._runner.commit(num_accepted, emitted)

    def keep(self, batch_indices) -> None:
        self._rows = [self._rows[i] for i in batch_indices]
        if self._runner is not None:
            self._runner.keep(batch_indices)


def _runner_count(oracle: OracleDraft, name: str) -> int:
    """The cost model's counter ``name`` (a ``DraftModel``'s), or 0 for an oracle without one."""
    return 0 if oracle._runner is None else getattr(oracle._runner, name)


@functools.lru_cache(maxsize=64)
def _tree_shape(widths: tuple[int, ...]) -> tuple[tuple[int, ...], list[int], Tensor]:
    """The full tree of ``widths``: (local parents, nodes per depth, each node's depth - 1 as an int64 [n] tensor)."""
    sizes = [math.prod(widths[:d + 1]) for d in range(len(widths))]
    return full_tree(widths), sizes, torch.repeat_interleave(torch.arange(len(widths)), torch.tensor(sizes))


@torch.no_grad()
def make_peaked(model, embed_scale: float = 1e4, seed: int = 0) -> list[int]:
    """Give a model a well-separated greedy argmax that is a known function of the current token (same
    shapes, same cost; its weights are overwritten), in place. Returns ``successor``: the greedy next token
    after token t is ``successor[t]``.

    With N(0, 0.02) weights the top-2 logits of a 128k vocabulary are often closer than bf16 noise,
    and the noise depends on the batch shape (a [B, K+1] verify pass and a [B, 1] decode step use
    different GEMM kernels), so the greedy path of AR and speculative decoding can split at a near-tie
    and an oracle's replayed continuation becomes useless. Here the residual stream is dominated by
    the (scaled) token embedding and the LM head is a row permutation of the embedding, so the next
    token is perm^-1(current token) by a margin of ~sqrt(hidden) standard deviations.

    A packed LM head (GGUF blocks, ``load_model(..., packed=True)``) keeps its blocks, so a step reads what the
    unpeaked model's does; the embedding table becomes a dense copy of the head's rows in a random order, scaled
    (embed[t] = scale * head[successor[t]]: the same relation, built the other way round). A step reads one row of
    that table, so its dense copy costs memory, not time. A packed table beside a dense head is made dense first.
    """
    net = model.net
    if net.lm_head is None:
        raise ValueError("make_peaked needs an untied LM head (tie_word_embeddings=False, e.g. llama-3.1-8b)")
    if isinstance(net.lm_head, PackedWeight):
        return _peak_at_packed_head(net, embed_scale, seed)
    if isinstance(net.embed, PackedWeight):
        net.embed = torch.nn.Parameter(net.embed.dequantize(), requires_grad=False)
    perm = torch.randperm(net.cfg.vocab_size, generator=torch.Generator().manual_seed(seed))
    head = net.embed[perm.to(net.embed.device)].clone()
    net.embed.mul_(embed_scale)
    net.lm_head.copy_(head)
    return torch.argsort(perm).tolist()            # logits[j] peaks where perm[j] = t: j = perm^-1[t]


def _peak_at_packed_head(net, embed_scale: float, seed: int, chunk_rows: int = 8192) -> list[int]:
    """``make_peaked`` for a packed LM head: net.embed = scale * head[successor] (dense, the head's compute dtype)."""
    head = net.lm_head
    V = head.shape[0]
    successor = torch.randperm(V, generator=torch.Generator().manual_seed(seed))
    ids = successor.to(head.device)
    table = torch.empty(V, head.K, dtype=head.dtype, device=head.device)                            # [V, E]
    for i in range(0, V, chunk_rows):        # a chunk of rows at a time: the dequantizer's temporaries stay small
        table[i:i + chunk_rows] = (head.embedding(ids[i:i + chunk_rows]).float() * embed_scale).to(head.dtype)
    net.embed = torch.nn.Parameter(table, requires_grad=False)
    return successor.tolist()


class SuccessorOracle(OracleDraft):
    """``OracleDraft`` for a server (benchmarks only): no continuation is known in advance, but on a model made
    by ``make_peaked`` the target's greedy next token is ``successor[current]``, so each row's drafts follow
    that chain from its certain token, each corrupted with probability 1 - alpha (the same i.i.d. acceptance
    as ``OracleDraft`` under greedy verification). ``cost_model`` pays a draft model's passes as there."""

    drafts_trees = False                     # no trees here yet: its rows know no continuation to branch on
    propose_tree = Drafter.propose_tree

    def __init__(self, successor: list[int], acceptance_rate: float, cost_model=None, seed: int = 0):
        super().__init__([], acceptance_rate, cost_model, seed)
        self.successor = successor

    def admit(self, seq_ids, prompts, first_tokens, sampling) -> None:
        # no continuation: a row's "continuation" is its certain token, the start of the successor chain
        self._rows += [_Row([t]) for t in first_tokens]
        if self._runner is not None:
            self._runner.admit(seq_ids, prompts, first_tokens, sampling)

    def _oracle(self, b: int, k: int) -> list[int]:
        out, t = [], self._rows[b].continuation[-1]
        for _ in range(k):
            t = self.successor[t]
            draft = t
            if self._rng.random() >= self.acceptance_rate:
                draft = (t + 1 + self._rng.randrange(self._vocab - 1)) % self._vocab      # surely wrong
            out.append(draft)
        return out

    def commit(self, num_accepted, emitted) -> None:
        super().commit(num_accepted, emitted)
        for row, e in zip(self._rows, emitted, strict=True):
            row.continuation = [e[-1]]                  # the next certain token
