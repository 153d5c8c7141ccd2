"""``DraftModel``: a smaller model with the target's vocabulary drafts k tokens autoregressively.

Draft-cache bookkeeping per row b (host ints, no device reads): L_b = len(h_b) (the certain token is
h_b[-1]) and V_b = how many leading tokens of h_b the draft cache holds valid K/V for. ``propose`` rolls
every row back to L_b - 2 and feeds [h_b[-2], h_b[-1]] in one uniform [B, 2] pass (re-writing an entry the
cache already holds is idempotent), then k - 1 single-token steps: k draft passes per round.
  * some drafts rejected last round: V_b = L_b - 1, h_b[-2] is re-written;
  * all k drafts accepted: the cache never saw d_k = h_b[-2] (it was only ever an output);
  * rounds without drafting (k = 0 chosen for every row): V_b < L_b - 2; one catch-up pass first
    (``_catch_up``) brings every row to L_b - 2.
e.g. k=3, L=10, V=9: rollback to 8, feed h[8], h[9] -> d1; feed d1 -> d2; feed d2 -> d3; V = 12 until
     the commit; if 1 draft is accepted, L' = 12 and V' = min(12, 10 + 1) = 11.

On a model with CUDA graphs the rollback, the feed and the k - 1 steps, with each step's choice (argmax, or
filtered_probs + the exponential race for a sampled batch), run as one captured graph
(``Model.draft_loop``): a round's draft costs k passes and no host work between them. The eager loop
(``_run_eager``: one ``append`` per pass, ``draw`` in between) serves every other case and draws the same
drafts; the catch-up pass stays eager (rare, and of a width no graph would be reused for).

Trees (``propose_tree(widths)``): the same rollback and [B, 2] feed give the root's logits; its top-w_1 tokens are
the depth-1 nodes, and each further depth is ONE tree pass over the previous depth's nodes (``Model.append_tree``:
each node attends to the history and its own path), whose top-w_d tokens per node are the next depth. The last
depth is never fed. After verification ``tree_accepted`` moves the accepted nodes the cache holds (depth < D) to
the chain slots after the root, so V_b = L_b + min(a, D - 1) holds for the next round as in the chain case.
e.g. widths (2, 2), L = 10: feed h[8], h[9] -> d1 in {x, y}; one pass over [x, y] (slots 10, 11, position 10)
     -> children {x1, x2, y1, y2}; the tree's nodes 1..6; accepted [y, y2]: y moves from slot 11 to slot 10.

Dynamic trees (``propose_tree(DynamicTree)``, drafters/dynamic_tree.py): the same feed and one pass per depth, the
n_d nodes of each depth chosen per row by cumulative draft log-probability on the device and fed with their device
paths (``Model.append_tree_paths``); the parents are read to the host once, after the last depth
(``_dynamic_passes``). The cache bookkeeping is the static tree's.

Lazy prefill: ``admit`` runs no pass. The row joins the draft cache empty (``Model.admit_empty``, V_b = 0) and owes
its prompt; the first round in which it drafts (k_b > 0) prefills that prompt in one prefill pass per row
(``Model.prefill_rows``: the same pass, K/V and graphs as an admission's), for every row drafting for the first
time at once, before the catch-up. A row that never drafts (k=auto holding k = 0, a short request) never pays a
draft pass; and a plain round (k = 0 for every row) runs no draft pass at all, so the draft model's work is never
charged to a plain round (on a GPU a prefill launched at admission, after the target's admission sync, would run
inside the next round, whatever its k). Rows that owe their prefill and draft 0 in a round where others draft stay owed:
the batch's passes write into their cache row too, but only into slots the prefill overwrites (V_b stays 0).
The drafts are the same as with the prefill at admission: the prompt's K/V are bit for bit an admission's, the
tokens after it come through the same catch-up, and the DRAFT-stream counter moves only with drafts drawn.

Prelaunch (``prelaunch``, on a GPU with the captured loop): between a round's verification and its commit, the engine
may launch the next round's draft loop from the outcome on the device, before the host has read it: row b's inputs
[L_b + a_b - 1, tail[a_b], tail[a_b + 1], seed_b, step_b] are computed there from its accepted count a_b (L_b + a_b + 1
is its history's length after the commit; tail, the certain token before the round then the verification's tokens,
holds its last two tokens at a_b, a_b + 1). The device then drafts while the host reads the outcome and commits it,
instead of waiting for the host in between. Only when no row owes a prefill or will need a catch-up; the next
``propose`` of k drafts for every row of the same batch takes those drafts (``_take_prelaunched``: V_b = L_b + k - 1
and the counter advances by k, as after ``_run``); after a ``keep`` (rows that met EOS left) the rows that go on keep
theirs (``Prelaunch.kept``: their cache rows moved with them); anything else drops them. Dropped, they leave the
cache as a run whose drafts were all rejected would: h_b[-2], h_b[-1] re-written at their own slots, drafts past L_b
that V_b never counts; the next ``_run`` rolls back and feeds as usual, so the drafts are the same either way.

Per row, everything on the host lives in one ``_Row`` (history, V_b, the prompt it owes, settings and seed,
draft-stream counter).
A round runs k = max_b k_b draft passes for every row; row b proposes its first k_b drafts and its counter
advances by k_b, so its next draws start where its own drafts ended whatever the others asked for (the draws
of its drafts past k_b were never shown to verification: they are still fresh, and sampling stays exact).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
from torch import Tensor

from ..device import to_device
from ..runtime.model import WIDTH_BUCKETS
from ..verify.sampling import filtered_probs, is_greedy
from .base import (Drafter, Proposal, Sampling, SamplingParams, TreeProposal, check_same_vocab, draw, greedy_tokens,
                   one_setting, race)
from .dynamic_tree import DynamicTree, child_paths, expand

# A catch-up pass (after rounds without drafting) runs in chunks of at most the widest step graph's tokens: a wider
# pass would run eagerly, and each width below it would capture its own graph inside a request.
CATCH_UP_TOKENS = WIDTH_BUCKETS[-1]


@dataclass
class _Row:
    """Everything the draft model keeps about one sequence on the host (one object per row: ``keep`` moves it
    whole). Its K/V live in row b of the draft cache, which ``Model.keep`` moves with the same indices."""

    history: list[int]          # h_b
    valid: int                  # V_b: leading tokens of h_b with valid K/V in the draft cache
    sampling: Sampling          # its settings and seed
    step: int = 0               # DRAFT-stream counter: its next draw uses step, step + 1, ...
    owed: int = 0               # its prompt h_b[:owed] is not in the draft cache yet (lazy prefill); 0: nothing owed


@dataclass
class Prelaunch:
    """Drafting a drafter's ``prelaunch`` launched for each of ``rows`` rows (device tensors, still being computed);
    ``DraftModel`` and ``FeatureHead`` keep one until the next round takes or drops it."""

    shape: int | tuple[int, ...]   # k drafts, or a tree's widths
    rows: int
    commit: int                 # the drafter's commits before it: it serves the round after the next commit only
    drafts: Tensor              # [B, k] int64 (a tree: its nodes [B, N - 1])
    probs: Tensor | None = None        # [B, k, V] float32: the q of sampled rows' drafts
    parents: list[int] | None = None   # a tree's runtime parents (node 0 the root)

    def serves(self, shape, rows: int, commits: int, max_num_draft: list[int] | None = None) -> bool:
        """Whether these are the drafts of a round of ``shape`` over ``rows`` rows after ``commits`` commits (the next
        round: launched before the last commit), every row asking for all of them (``max_num_draft``, a chain's)."""
        return (self.shape == shape and self.rows == rows and self.commit + 1 == commits
                and (max_num_draft is None or (len(max_num_draft) == rows and all(n == shape for n in max_num_draft))))

    def kept(self, batch_indices: list[int]) -> "Prelaunch":
        """These drafts for the rows that go on (a drafter's ``keep``: a row met EOS or a stop string after they were
        launched), in that order: each row's drafts are its own, and its cache row moved with it."""
        index = to_device(batch_indices, self.drafts.device, torch.long)
        return dataclasses.replace(self, rows=len(batch_indices), drafts=self.drafts[index],
                                   probs=None if self.probs is None else self.probs[index])


class DraftModel(Drafter):
    """Draft with ``model`` (the runtime contract: setup_cache/admit/append/decode/rollback/keep).

    The draft model may live on another device or dtype than the target; drafts and q are moved to
    the target's device by the engine. It must not be the target object itself (they would share one
    KV cache): use ``target.truncated(n)`` (``SelfSpeculative``) or a second ``load_model``.
    """

    # True: ``admit`` prefills every prompt at once (SSD's draft rank copies a spot row's prompt K/V into its branch
    # rows at admission); False: a row's prompt is prefilled when it first drafts (module docstring)
    prefill_at_admission = False

    def __init__(self, model):
        if isinstance(model, (str, bytes)) or isinstance(model, os.PathLike):
            raise TypeError(f"DraftModel({model!r}) got a name: load the model first, "
                            f"DraftModel(verispec.load_model({model!r}))")
        if model is not None and not all(hasattr(model, a) for a in ("setup_cache", "admit", "append", "config")):
            raise TypeError(f"DraftModel(model) needs a loaded model (verispec.load_model(...)), "
                            f"got {type(model).__name__}")
        self.model = model
        self._rows: list[_Row] = []             # batch order
        self._sampling = SamplingParams.empty() # the rows' settings as a batch (derived: ``_set_rows``)
        self.prefill_tokens = 0                 # prompt tokens prefilled so far (the lazy prefill's bill)
        self.catch_up_passes = 0                # catch-up passes run so far (``_catch_up``)
        self._prelaunched: Prelaunch | None = None
        self._commits = 0                       # commits so far (a prelaunch serves the round after the next one)
        self.prelaunches = 0                    # draft loops launched from a round's outcome (``prelaunch``)
        self.prelaunches_taken = 0              # of those, the ones a ``propose`` took

    def _set_rows(self, rows: list[_Row]) -> None:
        self._prelaunched = None                # drafted for the batch before
        self._rows = rows
        self._sampling = SamplingParams(tuple(r.sampling for r in rows))

    def attach(self, target) -> None:
        if self.model is target:
            # one object as target and draft would share one KV cache; a full-depth twin shares the
            # weights but owns its cache, so the drafts are exactly the target's own predictions
            if not hasattr(target, "truncated"):
                raise ValueError("the draft model is the target model object (they would share one KV cache): "
                                 "load the draft model a second time")
            self.model = target.truncated(target.config.num_layers)
        check_same_vocab(target, self.model)

    def reserve(self, target, max_batch_size: int, max_seq_len: int) -> None:
        self.model.setup_cache(max_batch_size, max_seq_len, empty=True)
        self._set_rows([])

    def warm_up(self, max_batch_size: int, k: int, settings: list[tuple[float, int, float]],
                prompt_tokens: int = 0, forced: bool = False) -> int:
        """The captured draft loops of every batch bucket for 1..``k`` drafts (a round drafts fewer than k when its
        rows near their end, or k=auto, ask for fewer): one choice per setting (all greedy rows share one), or the
        forced feed (``OracleDraft``'s cost model); the step graphs of every width a catch-up pass runs in
        (``_catch_up``, after rounds without drafting); the prefill graphs of its prompts."""
        if not getattr(self.model, "use_graphs", False) or not hasattr(self.model, "warm_up_draft_loop") or k < 1:
            return 0
        keys = [("forced",)] if forced else sorted({self.GREEDY_KEY if is_greedy(t) else ("sample", t, tk, tp)
                                                     for t, tk, tp in settings}, key=repr)
        n = 0
        for steps in range(1, k + 1):
            width = 5 + (steps if forced else 0)
            n += sum(self.model.warm_up_draft_loop(max_batch_size, steps, self._choice(key), key, width)
                     for key in keys)
        return n + self.model.warm_up(max_batch_size, CATCH_UP_TOKENS, prompt_tokens=prompt_tokens)

    def admit(self, seq_ids, prompts, first_tokens, sampling) -> None:
        # a model without the deferred prefill (``admit_empty`` / ``prefill_rows``: the runtime's ``Model`` has both)
        # is prefilled here
        deferred = hasattr(self.model, "admit_empty") and hasattr(self.model, "prefill_rows")
        if self.prefill_at_admission or not deferred:
            self.model.admit(prompts)
            self.prefill_tokens += sum(len(p) for p in prompts)
            self._add_rows(prompts, first_tokens, sampling)
            return
        self.model.admit_empty(len(prompts))
        self._add_rows(prompts, first_tokens, sampling, owed=True)

    def _add_rows(self, prompts, first_tokens, sampling: SamplingParams, owed: bool = False) -> None:
        """The host state of rows just admitted to the cache: their prompts valid there, the first token not
        (``owed``: the prompts are not there yet; ``_prefill_owed`` writes them when the row first drafts)."""
        self._set_rows(self._rows + [_Row(list(p) + [t], 0, s, owed=len(p)) if owed else
                                     _Row(list(p) + [t], len(p), s)
                                     for p, t, s in zip(prompts, first_tokens, sampling.rows, strict=True)])

    def _prefill_owed(self, drawing: list[bool]) -> None:
        """The lazy prefill: every row that drafts this round (``drawing[b]``) and still owes its prompt gets it, one
        prefill pass per row (``Model.prefill_rows``), all before the round's catch-up. Rows drawing nothing keep
        owing it."""
        due = [b for b, (row, d) in enumerate(zip(self._rows, drawing, strict=True)) if d and row.owed]
        if not due:
            return
        self.model.prefill_rows(due, [self._rows[b].history[:self._rows[b].owed] for b in due])
        for b in due:
            row = self._rows[b]
            self.prefill_tokens += row.owed
            row.valid, row.owed = row.owed, 0

    def draft_debt(self) -> tuple[list[int], int]:
        """(each row's owed prompt tokens, the catch-up width the next drafting round runs): the rows that owe their
        prompt have it prefilled first (then their gap is counted from its end), so the width is the widest
        L_b - 2 - V_b after that."""
        owed = [row.owed for row in self._rows]
        gap = max((len(row.history) - 2 - (row.owed or row.valid) for row in self._rows), default=0)
        return owed, max(gap, 0)

    def _catch_up(self, lengths: list[int]) -> None:
        """Make the draft cache valid for at least h_b[:L_b - 2] in every row that owes no prefill (``_prefill_owed``
        ran first for the rows that draft), in one pass of width gap = max_b(L_b - 2 - V_b) over those rows (needed
        only after rounds without drafting; a row still owing its prompt is fed too, into slots its prefill will
        overwrite, and stays invalid). Row b feeds
        h_b[s_b : s_b + gap] from s_b = max(0, L_b - 2 - gap) (re-writing valid entries is idempotent), padded
        with token 0 where its history is shorter: pad entries land past its valid length and are never read
        before being overwritten. e.g. L = [20, 6], V = [10, 5]: gap = 8, row 0 feeds h[10:18], row 1 feeds
        h[0:6] + [0, 0]; afterwards V = [18, 6]."""
        gap = max((L - 2 - row.valid for L, row in zip(lengths, self._rows) if not row.owed), default=0)
        if gap <= 0:
            return
        starts = [max(0, L - 2 - gap) for L in lengths]
        feed = to_device([(row.history[s:s + gap] + [0] * gap)[:gap] for row, s in zip(self._rows, starts)],
                         self.model.device, torch.long)                                       # [B, gap]
        self.model.rollback(starts)
        self.catch_up_passes += 1
        for j in range(0, gap, CATCH_UP_TOKENS):  # passes a warm-up captured; the same K/V as one pass (invariant)
            self.model.append(feed[:, j:j + CATCH_UP_TOKENS])
        for row, s, L in zip(self._rows, starts, lengths):
            if not row.owed:
                row.valid = min(s + gap, L)

    def _run(self, k: int, forced: Tensor | None = None,
             drawn: list[int] | None = None) -> tuple[Tensor, Tensor | None]:
        """k draft passes for the whole batch -> (drafts [B, k] int64, q [B, k, V] float32 or None).
        ``forced`` [B, k] (host, int64): feed these tokens instead of choosing (``OracleDraft``'s cost model
        runs the very passes a draft model would run). ``drawn[b]`` (default k): the drafts row b proposes; its
        DRAFT-stream counter advances by that many, so its next round draws from where its own drafts ended,
        whatever the other rows asked for (the draws past drawn[b] were never shown to anyone: fresh)."""
        self._prelaunched = None
        lengths = [len(row.history) for row in self._rows]
        drawn = drawn or [k] * len(self._rows)
        self._prefill_owed([n > 0 for n in drawn])
        self._catch_up(lengths)
        key = self._loop_key(forced is not None)
        if key is None:
            drafts, q = self._run_eager(k, lengths, forced)
        else:
            drafts, q = self._run_captured(k, lengths, key, forced)
        for row, L, n in zip(self._rows, lengths, drawn):
            if not row.owed:
                row.valid = L + k - 1
            row.step += n
        return drafts, q

    def prelaunch(self, shape: int | tuple[int, ...], num_draft: list[int], num_accepted: Tensor, tail: Tensor,
                  forced: Tensor | None = None) -> bool:
        """The next round's drafting, launched from this round's outcome on the device (module docstring,
        "Prelaunch"): the captured draft loop of k = ``shape`` drafts, or the passes of the tree of widths ``shape``.
        ``forced`` [B, k] (or [B, nodes]) on the device: ``OracleDraft``'s cost model feeds these tokens."""
        self._prelaunched = None
        tree = isinstance(shape, tuple)
        key = self._loop_key(forced is not None)
        a = self._prelaunch_counts(len(self._rows), num_draft, num_accepted, tail)                # [B]
        # a row must owe nothing (prefill, catch-up) after the commit: V_b >= L_b + a_b - 1 for every a_b <= its drafts
        if (key is None or not shape or not self._rows
                or any(row.owed or row.valid < len(row.history) + n - 1 for row, n in zip(self._rows, num_draft))):
            return False
        device = self.model.device
        a = a.to(device)
        host = to_device([[len(row.history) - 1, row.sampling.seed, row.step] for row in self._rows],
                         device, torch.long)                                                      # [B, 3]
        last_two = tail.to(device, torch.long).gather(1, torch.stack([a, a + 1], dim=1))          # [B, 2]
        # a failed row's tokens mean nothing (it leaves before the next round): keep them inside the vocabulary
        last_two.clamp_(0, self.model.config.vocab_size - 1)
        back = host[:, 0] + a                                                                     # [B] L_b' - 2
        bound = max(len(row.history) + n - 1 for row, n in zip(self._rows, num_draft))
        pre = Prelaunch(shape, len(self._rows), self._commits, drafts=None)
        if tree:
            pre.drafts, pre.parents = self._tree_passes(shape, forced, device_start=(back, last_two, bound))
        else:
            inputs = torch.cat([back[:, None], last_two, host[:, 1:]], dim=1)                    # [B, 5]
            if forced is not None:
                inputs = torch.cat([inputs, forced.to(device, torch.long)], dim=1)               # [B, 5 + k]
            pre.drafts, pre.probs = self.model.draft_loop(inputs, shape, self._choice(key), key, length_bound=bound)
        self._prelaunched = pre
        self.prelaunches += 1
        return True

    def _take_prelaunched(self, shape: int | tuple[int, ...], max_num_draft: list[int] | None = None
                          ) -> tuple[Tensor, Tensor | list[int] | None] | None:
        """The prelaunched drafts if they are this round's (``Prelaunch.serves``: launched in the round before for
        this batch and ``shape``, a chain's k asked of every row of ``max_num_draft``), the batch owing nothing:
        (drafts, q) for a chain, (nodes, parents) for a tree, with the host state ``_run`` / ``_tree_passes`` would
        leave. Else None (dropped)."""
        pre, self._prelaunched = self._prelaunched, None
        if (pre is None or not pre.serves(shape, len(self._rows), self._commits, max_num_draft)
                or any(row.owed or row.valid < len(row.history) - 2 for row in self._rows)):
            return None
        tree = isinstance(shape, tuple)
        depth = len(shape) if tree else shape
        for row in self._rows:
            row.valid = len(row.history) + depth - 1
            if not tree:
                row.step += depth
        self.prelaunches_taken += 1
        return (pre.drafts, pre.parents) if tree else (pre.drafts, pre.probs)

    def _loop_key(self, forced: bool = False) -> tuple | None:
        """The key of the captured draft loop for this batch's choice, or None to run the eager loop: the
        model has no CUDA graphs (CPU, ``use_graphs=False``, a model without ``draft_loop``), or the rows
        sample under several settings (each distinct setting would need its own choice inside one graph;
        rare, so those batches take the eager loop)."""
        if not getattr(self.model, "use_graphs", False) or not hasattr(self.model, "draft_loop"):
            return None
        if forced:
            return ("forced",)
        if self._sampling.all_greedy:
            return self.GREEDY_KEY
        setting = one_setting(self._sampling)
        return None if setting is None else ("sample", *setting)

    def _run_captured(self, k: int, lengths: list[int], key: tuple,
                      forced: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``Model.draft_loop``: rollback, the [B, 2] feed and k - 1 steps in one graph replay. Its inputs go
        in one host tensor, one row per sequence: [L_b - 2, h_b[-2], h_b[-1], seed_b, step_b (, forced_b)]."""
        rows = [[L - 2, *row.history[-2:], row.sampling.seed, row.step] for L, row in zip(lengths, self._rows)]
        inputs = torch.tensor(rows, dtype=torch.long)                                    # [B, 5]
        if forced is not None:
            inputs = torch.cat([inputs, forced.to(torch.long)], dim=1)                   # [B, 5 + k]
        return self.model.draft_loop(inputs, k, self._choice(key), key)

    def _run_eager(self, k: int, lengths: list[int], forced: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """The same draft passes as ``Model.draft_loop``, one ``append`` at a time with the choice on the host
        side in between (any model of the runtime contract, any mix of sampling settings)."""
        model = self.model
        model.rollback([L - 2 for L in lengths])
        feed = to_device([row.history[-2:] for row in self._rows], model.device, torch.long)   # [B, 2]
        logits = model.append(feed)[:, -1]                                                # [B, V]
        if forced is not None:
            forced = to_device(forced, model.device, torch.long)
        tokens, probs = [], []
        for i in range(k):
            if forced is not None:
                d, q = forced[:, i], None
            else:
                d, q = self._draw(logits, [row.step + i for row in self._rows])
            tokens.append(d)
            probs.append(q)
            if i < k - 1:
                logits = model.decode(to_device(d[:, None], model.device))[:, 0]
        return torch.stack(tokens, dim=1), None if probs[0] is None else torch.stack(probs, dim=1)

    # The choice of each draft, as hooks: the captured loop's (``_choice``, keyed by ``_loop_key``) and the eager
    # loop's (``_draw``) compute the same tokens. SSD's draft rank (verispec/distributed/draft_rank.py) overrides
    # them to also keep the greedy logits, which rank the outcomes it pre-speculates.
    GREEDY_KEY: tuple = ("greedy",)

    def _choice(self, key: tuple):
        return _choose(key)

    def _draw(self, logits: Tensor, steps: list[int]) -> tuple[Tensor, Tensor | None]:
        return draw(logits, self._sampling, steps)

    REDIRECT_SCAN = 32      # tokens ``redirect`` compares one by one at the end of the agreeing prefix

    def redirect(self, histories: list[list[int]], steps: list[int]) -> None:
        """Point row b at history ``histories[b]`` (its certain token last) and DRAFT-stream counter ``steps[b]``:
        the next ``propose`` drafts what a row with that history and counter drafts. The row's K/V stay valid for
        the longest common prefix of its old history and the new one (``_catch_up`` feeds the rest). SSD's draft
        rank moves its rows between the outcomes it pre-speculates this way."""
        for row, history, step in zip(self._rows, histories, steps, strict=True):
            if row.owed and row.history[:row.owed] != history[:row.owed]:
                row.owed = 0                  # the prompt it owed is not the new history's: the catch-up feeds it all
            old, m = row.history, min(row.valid, len(row.history), len(history))
            # SSD's rows part from their new histories within the last few tokens: one C-speed compare of the rest,
            # then a short scan; a prefix that differs earlier is searched by halving
            tail = max(0, m - self.REDIRECT_SCAN)
            if old[:tail] == history[:tail]:
                m = next((i for i in range(tail, m) if old[i] != history[i]), m)
            else:
                lo, hi = 0, tail - 1                      # the agreeing prefix is shorter than tail
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if old[:mid] == history[:mid] else (lo, mid - 1)
                m = lo
            row.history, row.valid, row.step = list(history), m, step
        self._prelaunched = None

    def propose(self, max_num_draft: list[int]) -> Proposal:
        k = max(max_num_draft)
        if k == 0:
            return Proposal(torch.zeros(len(max_num_draft), 0, dtype=torch.long), [0] * len(max_num_draft), None)
        draft_tokens, q = self._take_prelaunched(k, max_num_draft) or self._run(k, drawn=list(max_num_draft))
        draft_probs = None
        if q is not None:
            draft_probs = q.flatten(0, 1)                                 # [B * K, V], rows (b, i)
            if any(n != k for n in max_num_draft):   # ragged: keep rows i < k_b (host indices: no sync)
                rows = [b * k + i for b, n in enumerate(max_num_draft) for i in range(n)]
                draft_probs = draft_probs[to_device(rows, q.device, torch.long)]
        return Proposal(draft_tokens, list(max_num_draft), draft_probs)

    drafts_trees = True
    drafts_dynamic_trees = True

    def propose_tree(self, widths: tuple[int, ...] | DynamicTree) -> TreeProposal:
        """Top-w_d children per node by the draft's logits, one batched pass per depth (see the module docstring);
        every row proposes the full tree. A ``DynamicTree``: the beam of ``_dynamic_passes``."""
        if isinstance(widths, DynamicTree):
            self._prelaunched = None
            return self._dynamic_passes(widths)
        nodes, parents = self._take_prelaunched(tuple(widths)) or self._tree_passes(tuple(widths))
        B = len(self._rows)
        local = tuple(p - 1 for p in parents[1:]) * B            # verification's layout: -1 = the root
        return TreeProposal(nodes.reshape(-1), local, [nodes.shape[1]] * B)

    def _tree_passes(self, widths: tuple[int, ...], forced: Tensor | None = None,
                     device_start: tuple[Tensor, Tensor, int] | None = None) -> tuple[Tensor, list[int]]:
        """The tree's passes for the whole batch -> (nodes [B, N - 1] int64 on the draft device, in node order;
        the runtime parents of all N nodes, node 0 the root). ``forced`` [B, N - 1]: these nodes instead of the
        top-w (``OracleDraft``'s cost model runs the same passes). ``device_start`` (``prelaunch``): (the rows' lengths
        L_b - 2 [B], their last two tokens [B, 2], both on the device, a host bound on the lengths) instead of the
        host's histories; the rows' V_b are then left for ``_take_prelaunched``."""
        self._prelaunched = None
        model = self.model
        lengths = [len(row.history) for row in self._rows]
        if device_start is None:
            self._prefill_owed([True] * len(self._rows))                 # every row proposes the full tree
            self._catch_up(lengths)
            model.rollback([L - 2 for L in lengths])
            feed = to_device([row.history[-2:] for row in self._rows], model.device, torch.long)   # [B, 2]
        else:
            back, feed, bound = device_start
            model.rollback(back, bound=bound)
        logits = model.append(feed)[:, -1:]                                           # [B, 1, V]: the root's
        if forced is not None:
            forced = to_device(forced, model.device, torch.long)
        parents, level, levels = [-1], [0], []
        for d, w in enumerate(widths):
            start = len(parents)
            if forced is None:
                new = logits.topk(w, dim=-1).indices.reshape(len(lengths), -1)         # [B, n_d]
            else:
                new = forced[:, start - 1:start - 1 + len(level) * w]
            parents += [p for p in level for _ in range(w)]
            level = list(range(start, len(parents)))
            levels.append(new)
            if d < len(widths) - 1:
                logits = model.append_tree(new, [tuple(parents)] * len(lengths))      # [B, n_d, V]
        self._tree_size = len(parents) - len(level)       # the nodes the cache holds: root + all but the last depth
        self._tree_depth = len(widths)
        if device_start is None:
            for row, L in zip(self._rows, lengths):
                row.valid = L + len(widths) - 1           # commit lowers it to L + min(a, D - 1)
        return torch.cat(levels, dim=1), parents

    def _dynamic_passes(self, shape: DynamicTree) -> TreeProposal:
        """A dynamic tree per row (drafters/dynamic_tree.py): the same rollback and [B, 2] feed give the root's
        logits; each depth keeps the n_d best of the previous depth's top-K children (``expand``, on the device) and,
        but for the last, is ONE tree pass of n_d nodes per row (``Model.append_tree_paths``: the rows' paths built
        on the device from the beam's parents, so no depth waits for the host). The parents are read to the host
        ONCE per round, after the last depth (the verification takes host parents); the proposal also carries the
        nodes' paths on the device, which the target's tree pass takes as they are (``TreeProposal.paths``). Rows
        share the counts (n_1, ..., n_D) and differ in their parents."""
        model = self.model
        vocab = model.config.vocab_size
        if shape.top_k > vocab:
            raise ValueError(f"dynamic tree {shape}: top_k {shape.top_k} exceeds the vocabulary ({vocab} tokens)")
        lengths = [len(row.history) for row in self._rows]
        B = len(lengths)
        self._prefill_owed([True] * B)
        self._catch_up(lengths)
        model.rollback([L - 2 for L in lengths])
        feed = to_device([row.history[-2:] for row in self._rows], model.device, torch.long)   # [B, 2]
        logits = model.append(feed)[:, -1:]                                               # [B, 1, V]: the root's
        dev = logits.device
        scores = torch.zeros(B, 1, device=dev)                                            # [B, n]: the root's 0
        paths = torch.zeros(B, 1, 1, dtype=torch.long, device=dev)                        # [B, n, d]
        sizes = shape.level_sizes
        levels, parents, all_paths, first = [], [], [], 1   # first: the depth's first node offset from the root
        for d, n in enumerate(sizes):
            tokens, parent, scores = expand(scores, logits, shape.top_k, n)              # [B, n] each
            paths = child_paths(paths, parent, first)                                     # [B, n, d + 2]
            all_paths.append(torch.cat([paths, paths[:, :, -1:].expand(B, n, len(sizes) - d - 1)], dim=2))
            # local parents (-1 = the root): the previous depth starts at offset first - n_{d-1}, local index - 1
            parents.append(parent + (first - sizes[d - 1] - 1) if d else torch.full_like(parent, -1))
            levels.append(tokens)
            first += n
            if d < len(sizes) - 1:
                width = max(d + 2, n)              # tree_layout's path width: its warm-up captured this key
                padded = torch.cat([paths, paths[:, :, -1:].expand(B, n, width - (d + 2))], dim=2)  # [B, n, width]
                depth = torch.full((B, n), d + 1, dtype=torch.long, device=dev)
                logits = model.append_tree_paths(tokens, depth, padded, first)           # [B, n, V]
        local = torch.cat(parents, dim=1).tolist()                                        # the round's one read
        self._tree_size = first - sizes[-1]        # the nodes the cache holds: root + all but the last depth
        self._tree_depth = len(sizes)
        for row, L in zip(self._rows, lengths):
            row.valid = L + len(sizes) - 1         # commit lowers it to L + min(a, D - 1)
        nodes = torch.cat(levels, dim=1)                                                  # [B, M]
        return TreeProposal(nodes.reshape(-1), tuple(p for row in local for p in row), [nodes.shape[1]] * B,
                            paths=torch.cat(all_paths, dim=1))                            # [B, M, D + 1]

    def warm_up_tree(self, max_batch_size: int, widths: tuple[int, ...] | DynamicTree, prompt_tokens: int = 0) -> int:
        """The graphs of ``_tree_passes``: the [B, 2] feed and one tree pass per depth but the last, each at its
        exact width (every round's tree has this shape: no padding nodes); the prefill graphs of its prompts. A
        ``DynamicTree``'s passes likewise (their widths are its fixed counts per depth)."""
        model = self.model
        if not getattr(model, "use_graphs", False) or not hasattr(model, "warm_up_tree"):
            return 0
        n = model.warm_up(max_batch_size, 2, prompt_tokens=prompt_tokens)
        if isinstance(widths, DynamicTree):
            parents, sizes = (-1,) + tuple(p + 1 for p in widths.example_parents()), widths.level_sizes
            for d in range(len(sizes) - 1):
                end = 1 + sum(sizes[:d + 1])
                n += model.warm_up_tree(max_batch_size, parents[:end], sizes[d], exact=True)
            return n
        parents, level = [-1], [0]
        for w in widths[:-1]:
            start = len(parents)
            parents += [p for p in level for _ in range(w)]
            level = list(range(start, len(parents)))
            n += model.warm_up_tree(max_batch_size, tuple(parents), len(level), exact=True)
        return n

    @property
    def graph_captures(self) -> int:
        return getattr(self.model, "graph_captures", 0)

    def tree_accepted(self, path: Tensor, num_accepted: Tensor) -> None:
        held = self._tree_depth - 1                       # the last depth was never fed
        path = to_device(path, self.model.device, torch.long)[:, :held]
        if path.shape[1] < held:                          # every row's path ended early (e.g. all rows failed)
            path = torch.nn.functional.pad(path, (0, held - path.shape[1]))
        self.model.accept_tree_path(path, to_device(num_accepted, self.model.device, torch.long).clamp(max=held),
                                    self._tree_size)

    def commit(self, num_accepted, emitted) -> None:
        # the cache stays valid for the history and the accepted drafts it was fed; the rest is dead
        self._commits += 1
        for row, a, e in zip(self._rows, num_accepted, emitted, strict=True):
            row.valid = min(row.valid, len(row.history) + a)
            row.history.extend(e)

    def keep(self, batch_indices) -> None:
        pre = self._prelaunched
        self.model.keep(list(batch_indices))
        self._set_rows([self._rows[i] for i in batch_indices])
        if pre is not None and batch_indices:        # the rows that go on keep their prelaunched drafts
            self._prelaunched = pre.kept(list(batch_indices))


def _choose(key: tuple, seed_column: int = 3):
    """The device-side choice of a captured draft loop (``Model.draft_loop``'s ``choose``) for ``key``:
    ("greedy",) -> argmax; ("sample", temperature, top_k, top_p) -> q = filtered_probs, then the race with
    the DRAFT stream at (seed, step + i) read from the loop's inputs (columns ``seed_column`` and the next:
    3 and 4 in ``Model.draft_loop``'s layout, 1 and 2 in ``FeatureHead``'s). ``draw`` computes the same for a
    batch of one setting, so the captured and the eager loop draw the same drafts.
    ("forced",) -> the i-th given token (input column 5 + i)."""
    if key[0] == "greedy":
        return lambda i, logits, inputs: (greedy_tokens(logits), None)
    if key[0] == "forced":
        return lambda i, logits, inputs: (inputs[:, 5 + i], None)
    setting = key[1:]

    def choose(i: int, logits: Tensor, inputs: Tensor) -> tuple[Tensor, Tensor]:
        q = filtered_probs(logits, *setting)                                          # [R, V]
        return race(q, inputs[:, seed_column], inputs[:, seed_column + 1] + i), q

    return choose
