"""The SSD draft rank: answers the target's drafter calls (ssd.py) and pre-speculates the next round.

Two ``DraftModel``s share the draft weights: ``spot`` (one row per sequence) drafts on a miss, ``branches``
(F rows per sequence, rows [b*F, (b+1)*F) for sequence b) holds the pre-speculated outcomes. Both follow the
engine's batch (``admit`` / ``keep``) and draft through ``DraftModel``'s own passes: ``redirect`` points a row
at a history and a DRAFT-stream counter, and one draft call then drafts every row together (B rows on the spot,
B*F branch rows when pre-speculating: one batched pass per depth, the captured draft loop on a GPU). So a branch
row drafts exactly what the engine's ``DraftModel`` drafts for that history and counter.

One round, for sequence b with committed history h (its certain token last) and counter s:

    propose(k_b)   drafts d = the branch picked at the last commit, or (miss) drafted on the spot from (h, s);
                   s += k_b; the drafts' q rows go along when some row samples
    pre-speculate  outcomes (j accepted, token t) for j <= k_b: at j < k_b the draft's top tokens other than
                   d_{j+1} (a recovered token is never the rejected draft), at j = k_b its top tokens after d_k
                   (the bonus); ``simulator.fanout_for_budget`` splits the F branches over the positions for the
                   acceptance measured so far (``OutcomeStats``). Branch (j, t) drafts from (h + d_1..d_j + t, s).
    commit         h += emitted; the branch whose (j, t) is the outcome holds the next round's drafts (a hit)

Every draft call drafts K + 1 tokens: the first K are the drafts (a row asking for fewer takes a prefix, as
``DraftModel`` does), and the ranking behind the last one orders the bonus outcomes of the next pre-speculation.
Each draft position's F + 1 likeliest tokens are ranked on the device (``ScoringDraftModel``: by the logits
inside the captured greedy loop, by q after a sampled one; a greedy row in a mixed batch has a one-hot q and
then ranks only its argmax first: fewer hits, same tokens) and reach the host with the drafts in one read per
draft call; rows of V scores stay on the device, and only in batches where some row samples (their q goes to
verification with the drafts). A pre-speculation thus reads the device once; on a GPU every pass it runs
replays a graph ``_warm_up`` captured (the draft loop of K + 1 steps, the catch-up widths).

Passes per round: on a miss the spot draft (K + 1 passes), and the pre-speculation (K + 1 passes), nothing else.
A row's cache keeps the K/V of the drafts it fed, so accepted drafts are not fed again; what a row moving to a
new history lacks, another row of its sequence holds: every branch of sequence b starts from h + d_1..d_j, whose
K/V the row that drafted d (the spot row, or the hit branch's) has, and a spot row whose sequence hit finds its
new history in the hit branch's row. Those entries are copied (``ScoringDraftModel.catch_up_from``, one gather
and one write for all layers) instead of computed again in a catch-up pass; a row no other row covers still gets
the pass.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from ..device import to_device
from ..drafters.base import Sampling, SamplingParams
from ..drafters.draft_model import CATCH_UP_TOKENS, DraftModel
from ..runtime.model import Model
from ..verify.sampling import is_greedy
from .channel import Channel
from .group import DistributedError
from .simulator import best_budget, fanout_for_budget
from .ssd import SSDConfig, SSDStats


class ScoringDraftModel(DraftModel):
    """A ``DraftModel`` that also ranks, at every draft position, the ``top_n`` tokens the draft thought likeliest
    (the outcomes worth pre-speculating), on the device: inside the captured greedy loop (its choice returns the
    argmax and the top ids of the same logits), or from q after a sampled loop (one topk over all rows). Only the
    drafts and these ids reach the host, in one read per ``draft``; whole rows of V scores never leave the loop
    unless some row samples (its q is then needed by verification). Same tokens as ``DraftModel``.

    It also remembers the drafts it fed: after ``draft(k)`` the cache holds K/V for each row's history and its
    first k - 1 drafts, so a ``redirect`` to a history that runs through them (the round accepted them) keeps
    them valid instead of feeding them again in a catch-up pass."""

    # the branch rows copy a spot row's prompt K/V at admission (``admit_from``): the prompt must be there by then
    prefill_at_admission = True

    def __init__(self, model, top_n: int):
        super().__init__(model)
        if top_n < 1:
            raise ValueError(f"top_n must be >= 1 (tokens ranked per draft position), got {top_n}")
        self.top_n = top_n
        self.GREEDY_KEY = ("greedy", "top", top_n)       # the choice's output shape is baked into its graph

    def _choice(self, key: tuple):
        if key == self.GREEDY_KEY:
            n = self.top_n
            return lambda i, logits, inputs: (logits.argmax(dim=-1), logits.topk(n, dim=-1).indices)
        return super()._choice(key)

    def _draw(self, logits: Tensor, steps: list[int]) -> tuple[Tensor, Tensor]:
        tokens, q = super()._draw(logits, steps)
        return tokens, logits.topk(self.top_n, dim=-1).indices if q is None else q

    def warm_up(self, max_batch_size: int, k: int, settings, prompt_tokens: int = 0, forced: bool = False) -> int:
        """The graphs ``draft(k)`` replays and no others: the draft loops of exactly ``k`` steps (the draft rank
        always drafts K + 1) for every batch bucket and setting, the catch-up widths and the prompts' prefills."""
        if not getattr(self.model, "use_graphs", False) or not hasattr(self.model, "warm_up_draft_loop") or k < 1:
            return 0
        keys = sorted({self.GREEDY_KEY if is_greedy(t) else ("sample", t, tk, tp) for t, tk, tp in settings}, key=repr)
        n = sum(self.model.warm_up_draft_loop(max_batch_size, k, self._choice(key), key, 5) for key in keys)
        return n + self.model.warm_up(max_batch_size, CATCH_UP_TOKENS, prompt_tokens=prompt_tokens)

    def admit_from(self, source: DraftModel, source_rows: list[int], prompts, first_tokens, sampling) -> None:
        """``admit`` whose prompts ``source`` holds already in rows ``source_rows`` (the same weights): their K/V
        are copied, not prefilled again (the spot row's prompt for each of its F branch rows)."""
        self.model.admit_from(source.model, source_rows, [len(p) for p in prompts])
        self._add_rows(prompts, first_tokens, sampling)

    def catch_up_from(self, candidates: dict[int, list[tuple[DraftModel, int, list[int], int]]]) -> None:
        """``_catch_up`` by copying instead of a pass: make row r valid for h[:L - 2] with the K/V another row of
        the same weights holds for those tokens. candidates[r]: (source, source row, the tokens that row's cache
        holds, how many leading ones are valid), in order of preference; the first that covers h[:L - 2] (valid
        that far, the same tokens) is copied from. A row none covers is left as it is: the next draft's catch-up
        pass feeds it. e.g. a branch row moving to h + d_1 d_2 + t copies the entries of d_1 from the row that
        drafted d_1 d_2 ... from h."""
        todo: dict[DraftModel, list[tuple[int, int, int]]] = {}
        for r, options in candidates.items():
            row = self._rows[r]
            need = len(row.history) - 2
            if row.valid >= need:
                continue
            tail = max(0, need - 8)          # a cheap look at the last tokens first: most candidates part there
            for source, src, tokens, valid in options:
                if valid >= need and tokens[tail:need] == row.history[tail:need] \
                        and tokens[:need] == row.history[:need]:
                    todo.setdefault(source, []).append((r, src, need))
                    break
        for source, rows in todo.items():
            width = max(need - self._rows[r].valid for r, _, need in rows)
            # one uniform width: a row re-copies entries it holds (the same values), or runs past need (dead slots)
            self.model.copy_kv([r for r, _, _ in rows], source.model, [src for _, src, _ in rows],
                               [max(0, need - width) for _, _, need in rows], width)
            for r, _, need in rows:
                self._rows[r].valid = need

    def draft(self, k: int) -> tuple[list[list[int]], list[list[list[int]]], Tensor | None]:
        """k drafts for every row from where ``redirect`` put it -> (drafts B x k, top ids B x k x top_n (host
        lists: position i's ids rank the tokens that could follow the row's first i drafts), q [B, k, V] on the
        device when some row samples, else None)."""
        drafts, out = self._run(k)               # [B, k]; top ids [B, k, n] (greedy) or q [B, k, V]
        q = out if out.is_floating_point() else None
        top = out if q is None else q.topk(self.top_n, dim=-1).indices
        host = torch.cat([drafts[:, :, None], top], dim=2).tolist()        # the one device read: [B][k][1 + n]
        drafts_h = [[p[0] for p in row] for row in host]
        for row, d in zip(self._rows, drafts_h):    # ``_run`` set valid = L + k - 1: the history and d_1..d_{k-1}
            row.history = row.history + d[:k - 1]
        return drafts_h, [[p[1:] for p in row] for row in host], q


@dataclass
class Drafted:
    """One row's K + 1 drafts as the draft rank keeps them: host ids, and q on the device only when it sampled."""

    drafts: list[int]                   # K + 1
    tops: list[list[int]]               # [K + 1][F + 1]: ``ScoringDraftModel.draft``'s ranked ids
    q: Tensor | None                    # [K + 1, V] (a view of its draft's q) when its batch sampled, else None
    slot: int | None = None             # the branch slot f (row b*F + f) that drafted it; None: the spot row b


@dataclass
class _Seq:
    """Everything the draft rank keeps about one sequence (one object per row: ``keep`` moves it whole)."""

    history: list[int]                  # h: prompt + emitted; the certain token last
    sampling: Sampling
    step: int = 0                       # DRAFT-stream counter: the drafts proposed so far
    drafts: list[int] = field(default_factory=list)    # this round's drafts (k_b)
    tops: list[list[int]] = field(default_factory=list)  # [k_b + 1][F + 1]: the draft's likeliest tokens per
                                                         # outcome position (host ids), rank this round's outcomes
    ready: "Drafted | None" = None      # next round's drafts, from a branch (a hit) or drafted on the spot
    branches: dict = field(default_factory=dict)        # (j, t) -> Drafted: the pre-speculated outcomes
    proposed: bool = False              # has drafted before (its first drafts are never pre-speculated)
    prompt_len: int = 0                 # h[:prompt_len] is its prompt, whose K/V its spot row always holds
    slot: int | None = None             # where this round's drafts were drafted (``Drafted.slot``): that row's
                                        # cache holds the history and the drafts every branch starts from


def likely_outcomes(drafts: list[int], top: list[list[int]], fanouts: tuple[int, ...]) -> list[tuple[int, int]]:
    """The (j accepted, token t) outcomes to pre-speculate: fanouts[j] tokens at each position j <= k, in the
    order of ``top[j]`` (the draft's best tokens there), skipping the rejected draft d_{j+1} at j < k.
    e.g. drafts [5, 7], top [[5, 2, 9], [3, 7, 1], [4, 8, 6]], fanouts (1, 1, 2) -> [(0, 2), (1, 3), (2, 4), (2, 8)]"""
    return [(j, t) for j, f in enumerate(fanouts) for t in candidates(drafts, top, j)[:f]]


def candidates(drafts: list[int], top: list[list[int]], j: int) -> list[int]:
    """The tokens that could end a round at position j (j drafts accepted), best first: ``top[j]`` without the
    rejected draft d_{j+1} (j < k), or all of it (j = k: the bonus)."""
    skip = drafts[j] if j < len(drafts) else None
    return [t for t in top[j] if t != skip]


class DraftServer:
    """The draft rank's loop: ``serve()`` answers the calls of the target ranks' ``SSDDrafter``s until the leader
    closes the run; returns its ``SSDStats``. ``targets``: the target ranks (the first one is the leader)."""

    def __init__(self, draft_model: Model, targets: list[int], config: SSDConfig):
        # width: the branch rows per sequence now (F; row b*F + f), config.budget at most ("auto" moves it)
        self.config, self.k, self.width = config, config.k, config.budget
        self.model = draft_model
        top_n = min(config.budget + 1, draft_model.config.vocab_size)   # F outcomes at one position + the draft
        self.spot = ScoringDraftModel(draft_model, top_n)
        self.branches = ScoringDraftModel(Model(draft_model.net, draft_model.tokenizer,
                                                num_layers=draft_model.num_active_layers,
                                                use_graphs=draft_model.use_graphs), top_n)
        self.channels = [Channel(r, config.recv_timeout_s) for r in targets]
        self.stats = SSDStats()
        self.seqs: list[_Seq] = []
        self.error: str | None = None        # a failure here: reported to the targets at the next propose
        self.outcomes = OutcomeStats(config.k, config.alpha_hint)
        self._fanouts: dict[tuple[int, int], tuple[int, ...]] = {}  # (k, F) -> fan-out, for this round's acceptance
        self._picked: tuple[int, int, int] | None = None   # "auto": (batch size, round, F) of the last pick

    @property
    def leader(self) -> Channel:
        return self.channels[0]

    def serve(self, idle_timeout_s: float | None = None) -> SSDStats:
        """Answer calls until "close". ``idle_timeout_s``: the longest wait for the leader's next call (default
        ``recv_timeout_s``); a target that goes away ends the loop with DistributedError."""
        self._connect()
        while True:
            message = self.leader.recv_object(f"the draft rank: the next call of target rank {self.leader.peer}",
                                              idle_timeout_s)
            op = message.pop("op")
            if op == "close":
                for channel in self.channels:
                    channel.flush()
                return self.stats
            if op == "propose":
                self._propose(**message)            # answers, then pre-speculates
                continue
            if self.error is None:
                try:
                    getattr(self, f"_{op}")(**message)
                except Exception:  # noqa: BLE001 - reported to the targets with the next drafts
                    self.error = f"{op}: {traceback.format_exc(limit=3)}"

    def _connect(self) -> None:
        """Every target rank says hello; each is answered with an error naming a mismatch, or ok."""
        hellos = [c.recv_object(f"the draft rank: the connection of target rank {c.peer}") for c in self.channels]
        mine = asdict(self.config)
        problem = None
        for channel, hello in zip(self.channels, hellos):
            if hello.get("op") != "hello":
                problem = f"target rank {channel.peer} sent {hello.get('op')!r} before connecting"
            elif hello["vocab_size"] != self.model.config.vocab_size:
                problem = (f"draft and target vocabularies differ: draft V={self.model.config.vocab_size}, target "
                           f"rank {channel.peer} V={hello['vocab_size']}: the draft model must share the "
                           f"target's tokenizer")
            elif hello["config"] != mine:
                diff = {k: (v, hello["config"].get(k)) for k, v in mine.items() if hello["config"].get(k) != v}
                problem = f"SSD configuration differs (draft rank, target rank {channel.peer}): {diff}"
        for channel in self.channels:
            channel.send_object({"error": problem})
        if problem:
            raise DistributedError(problem)

    # ------------------------------------------------------------------------------------------- calls
    def _reserve(self, max_batch_size: int, max_seq_len: int) -> None:
        # a branch history runs up to K + 1 tokens past its sequence's, and its drafts K + 1 further
        room = max_seq_len + 2 * self.k + 4
        self.spot.reserve(None, max_batch_size, room)
        self.branches.reserve(None, max(1, max_batch_size * self.config.budget), room)   # "auto": F at most
        self.seqs, self.width, self._picked = [], self.config.budget, None

    def _warm_up(self, max_batch_size: int, k: int, settings, prompt_tokens: int) -> None:
        self.spot.warm_up(max_batch_size, k + 1, settings, prompt_tokens)
        if self.config.budget:   # every bucket up to the most rows: also those of a smaller F ("auto")
            self.branches.warm_up(max_batch_size * self.config.budget, k + 1, settings, 0)  # never prefills

    def _admit(self, seq_ids, prompts, first_tokens, sampling) -> None:
        rows = SamplingParams(tuple(Sampling(*s) for s in sampling))
        first = len(self.seqs)
        self.spot.admit(seq_ids, prompts, first_tokens, rows)
        if self.width:       # each branch row copies its prompt's K/V from the spot row (one prefill, not F + 1)
            each = [b for b in range(len(prompts)) for _ in range(self.width)]             # branch row -> prompt
            self.branches.admit_from(self.spot, [first + b for b in each], [prompts[b] for b in each],
                                     [first_tokens[b] for b in each], rows.select(each))
        self.seqs += [_Seq(list(p) + [t], s, prompt_len=len(p)) for p, t, s in zip(prompts, first_tokens, rows.rows)]

    def _keep(self, order) -> None:
        self.seqs = [self.seqs[i] for i in order]
        self.spot.keep(order)
        if self.width:
            self.branches.keep([i * self.width + f for i in order for f in range(self.width)])

    def _commit(self, num_accepted, emitted) -> None:
        self.outcomes.add([len(seq.drafts) for seq in self.seqs], num_accepted, emitted)
        self._fanouts = {}
        for seq, a, chunk in zip(self.seqs, num_accepted, emitted, strict=True):
            if chunk and a < len(seq.tops):   # where the round's token stood among the draft's candidates there
                self.outcomes.add_rank(candidates(seq.drafts, seq.tops, a), chunk[-1])
            seq.history += chunk
            # a failed row (no tokens) or an outcome not pre-speculated: drafted on the spot at the next propose
            seq.ready = seq.branches.get((a, chunk[-1])) if chunk else None
            seq.branches = {}

    def _propose(self, max_num_draft: list[int]) -> None:
        if self.error is None:
            try:
                reply, q = self._drafts(max_num_draft)
            except Exception:  # noqa: BLE001 - the targets learn why, and stop asking
                self.error = f"propose: {traceback.format_exc(limit=3)}"
        if self.error is not None:
            for channel in self.channels:
                channel.send_object({"error": self.error})
            return
        for channel in self.channels:
            channel.send_object(reply, wait=False)
            if q is not None:
                channel.send_tensor(q, wait=False)
        if self.config.budget:
            t0 = time.perf_counter()
            try:
                self._prespeculate()
            except Exception:  # noqa: BLE001 - reported to the targets with the next drafts
                self.error = f"pre-speculation: {traceback.format_exc(limit=3)}"
            self.stats.prespec_s += time.perf_counter() - t0
            if self.config.budget_mode == "auto" and self.error is None:
                self._pick_width()       # a due pick now, while the target verifies, not before the next passes
        for channel in self.channels:
            channel.flush()

    def _drafts(self, max_num_draft: list[int]) -> tuple[dict, Tensor | None]:
        """This round's drafts: a branch's on a hit, else all rows drafted on the spot in one batched draft."""
        if len(max_num_draft) != len(self.seqs):
            raise DistributedError(f"propose for {len(max_num_draft)} rows, the draft rank holds {len(self.seqs)}")
        missed = [seq for seq in self.seqs if seq.ready is None]
        for seq in self.seqs:
            if seq.proposed:
                self.stats.hits += seq.ready is not None
                self.stats.misses += seq.ready is None
        if missed:
            t0 = time.perf_counter()
            self.spot.redirect([s.history for s in self.seqs], [s.step for s in self.seqs])
            # a spot row that did not draft its sequence's last drafts (they came from a branch) copies the entries
            # it lacks from a branch row of that sequence: the hit's on a hit, else one whose branch covers them
            F = self.width
            self.spot.catch_up_from({b: [self._held(self.branches, r) for r in (
                [b * F + seq.ready.slot] if seq.ready is not None else range(b * F, (b + 1) * F))]
                for b, seq in enumerate(self.seqs) if F})
            drafts, tops, q = self.spot.draft(self.k + 1)
            for b, seq in enumerate(self.seqs):
                if seq.ready is None:
                    seq.ready = Drafted(drafts[b], tops[b], None if q is None else q[b])
            self.stats.spot_s += time.perf_counter() - t0
        self.stats.rounds += 1
        width = max(max_num_draft)
        sampled = not all(seq.sampling.greedy for seq in self.seqs)
        q_rows = []
        for seq, n in zip(self.seqs, max_num_draft):
            ready = seq.ready
            seq.drafts, seq.tops, seq.slot, seq.ready = ready.drafts[:n], ready.tops[: n + 1], ready.slot, None
            seq.step += n
            seq.proposed = True
            if sampled:
                q_rows.append(self._q(ready, n))
        reply = {"drafts": [seq.drafts + [0] * (width - len(seq.drafts)) for seq in self.seqs], "q": sampled,
                 "stats": asdict(self.stats)}
        return reply, (torch.cat(q_rows) if sampled else None)               # q: [sum k_b, V]

    def _q(self, ready: Drafted, n: int) -> Tensor:
        """q of a row's first n drafts [n, V] on the draft's device (the rows go to the host together): its
        draft's q, or, for a greedy row drafted while its batch was greedy (no q kept), the one-hot of its drafts:
        what ``draw`` gives a greedy row in a sampled batch."""
        if ready.q is not None:
            return ready.q[:n]
        device = self.model.device
        drafts = to_device(ready.drafts[:n], device, torch.long)
        return torch.zeros(n, self.model.config.vocab_size, device=device).scatter_(1, drafts[:, None], 1.0)

    def _prespeculate(self) -> None:
        """Draft every sequence's F likeliest outcomes of this round, all B*F branch rows in one draft. The outcomes
        are ranked by host ids that came with the drafts (no device read before the draft); the draft's own
        drafts and ids come back in one read. With budget_mode "auto" F is picked first (0: nothing is
        pre-speculated, every sequence is drafted on the spot next round)."""
        if self.config.budget_mode == "auto":
            self._set_width(self._pick_width())
        F = self.stats.budget = self.width
        if not F or not self.seqs:
            return
        histories, steps, keys = [], [], []
        # The row that drafted sequence b's drafts this round (the spot row b, or its hit branch's row) holds K/V
        # for h + d_1..d_K, where every branch of b starts: (b, that row, its tokens and valid count), taken
        # before the redirect moves the branch rows.
        sources = [self._held(self.spot, b) if seq.slot is None else self._held(self.branches, b * F + seq.slot)
                   for b, seq in enumerate(self.seqs)]
        for seq in self.seqs:
            outcomes = likely_outcomes(seq.drafts, seq.tops, self._fanout(len(seq.drafts)))[:F]
            filler = outcomes[0]                          # unused rows redo the first outcome (dropped)
            for f in range(F):
                j, t = outcomes[f] if f < len(outcomes) else filler
                histories.append(seq.history + seq.drafts[:j] + [t])
                steps.append(seq.step)
                keys.append((j, t) if f < len(outcomes) else None)
        self.branches.redirect(histories, steps)
        # instead of a catch-up pass (those K/V, not computed again)
        self.branches.catch_up_from({r: [sources[r // F]] for r in range(len(histories))})
        drafts, tops, q = self.branches.draft(self.k + 1)
        for r, key in enumerate(keys):
            if key is not None:
                self.seqs[r // F].branches[key] = Drafted(drafts[r], tops[r], None if q is None else q[r], r % F)

    @staticmethod
    def _held(model: DraftModel, row: int) -> tuple[DraftModel, int, list[int], int]:
        """What row ``row`` of ``model``'s cache holds now (a ``catch_up_from`` candidate)."""
        return model, row, model._rows[row].history, model._rows[row].valid

    def _fanout(self, k: int) -> tuple[int, ...]:
        """F split over the k + 1 outcome positions by the policy, for the acceptance measured so far."""
        F = self.width
        if (k, F) not in self._fanouts:
            # a row that drafted nothing has one outcome position: its next token
            self._fanouts[k, F] = (fanout_for_budget(self.outcomes.alphas()[:k], F, self.config.fanout_policy,
                                                     self.outcomes.rank_accept()) if k else (F,))
        return self._fanouts[k, F]

    REPICK_ROUNDS = 16      # "auto" picks F again after this many rounds (or when the batch size changes): the
                            # acceptance moves slowly, and a pick costs ~(F + 1) (B + 1) simulated rounds on the host

    def _pick_width(self) -> int:
        """budget_mode "auto": F = ``simulator.best_budget`` for this batch size, the configuration's costs, the
        acceptance and the draft's candidate ranking (beta) measured so far; the last pick while it is recent and
        for this batch size."""
        B = len(self.seqs)
        if not B:
            return self.width
        if self._picked is None or self._picked[0] != B or self.stats.rounds - self._picked[1] >= self.REPICK_ROUNDS:
            c = self.config
            self._picked = (B, self.stats.rounds, best_budget(c.costs, B, self.outcomes.alphas(), c.budget,
                                                              c.fanout_policy, self.outcomes.rank_accept()))
        return self._picked[2]

    def _set_width(self, F: int) -> None:
        """Make the branch model hold F rows per sequence (row b*F + f). Each sequence keeps the branch row that
        drafted its drafts of this round (``_Seq.slot``, moved to slot 0 when F shrinks below it: its K/V are the
        next branches' source); a new row joins with its sequence's prompt K/V copied from the spot row. Rows
        change places (whole-row copies), so this runs only when F changes. Exactness does not depend on it: a
        branch row keeps only the K/V its ``redirect`` finds valid, and copies or computes the rest."""
        old, B = self.width, len(self.seqs)
        if F == old or not B:         # no rows to move: the next admissions get F rows each
            self.width = F
            return
        slots = [[b * old + f for f in range(old)] for b in range(B)]
        if F > old:
            joining = [b for b in range(B) for _ in range(F - old)]
            seqs = [self.seqs[b] for b in joining]
            self.branches.admit_from(self.spot, joining, [s.history[:s.prompt_len] for s in seqs],
                                     [s.history[s.prompt_len] for s in seqs],
                                     SamplingParams(tuple(s.sampling for s in seqs)))
            for i, b in enumerate(joining):
                slots[b].append(B * old + i)
        for b, seq in enumerate(self.seqs):
            if seq.slot is not None and seq.slot >= F:
                held = slots[b].pop(seq.slot)
                slots[b].insert(0, held)
                seq.slot = 0
        self.branches.keep([r for b in range(B) for r in slots[b][:F]])
        self.width = F
        self.stats.budget_changes += 1


class OutcomeStats:
    """Live acceptance per draft position, from every committed outcome: alpha_i = P(draft i accepted | drafts
    before it accepted), starting from ``prior`` (``SSDConfig.alpha_hint``) worth ``PRIOR_ROUNDS`` tests. It steers
    only which outcomes are pre-speculated (the hit rate), never a token.
    e.g. drafts [3, 3], accepted [1, 3]: position 0 tested 2, accepted 2; 1: tested 2, accepted 1; 2: tested 1, 1.

    It also measures the hit model's beta (``rank_accept``): how often the round's token is the draft's next
    candidate at its position given it is none of the earlier ones (``add_rank``), from the same prior. The
    simulator's default beta = alpha is an assumption (the GPU check's greedy run hit 17 % of its rounds at F = 4),
    so the fan-out split and the "auto" pick of F use this measured beta."""

    PRIOR_ROUNDS = 8

    def __init__(self, k: int, prior: float):
        self.tested = [float(self.PRIOR_ROUNDS)] * k
        self.accepted = [self.PRIOR_ROUNDS * prior] * k
        self.rank_trials, self.rank_found = float(self.PRIOR_ROUNDS), self.PRIOR_ROUNDS * prior

    def add_rank(self, candidates: list[int], token: int) -> None:
        """One outcome against the draft's candidates at its position (best first): found at index i is i + 1
        trials and one success (the geometric model's likelihood), not found len(candidates) trials.
        e.g. candidates [4, 8, 6]: token 8 -> 2 trials, 1 found; token 5 -> 3 trials, 0 found."""
        if token in candidates:
            self.rank_trials += candidates.index(token) + 1
            self.rank_found += 1
        else:
            self.rank_trials += len(candidates)

    def rank_accept(self) -> float:
        return self.rank_found / self.rank_trials

    def add(self, num_draft: list[int], num_accepted: list[int], emitted: list[list[int]]) -> None:
        for n, a, chunk in zip(num_draft, num_accepted, emitted):
            if not chunk:                    # a failed row: no outcome
                continue
            for i in range(min(a + 1, n)):   # draft i was tested when every draft before it was accepted
                self.tested[i] += 1
                self.accepted[i] += i < a

    def alphas(self) -> tuple[float, ...]:
        return tuple(acc / tested for acc, tested in zip(self.accepted, self.tested))
