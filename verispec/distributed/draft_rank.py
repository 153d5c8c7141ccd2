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
``DraftModel`` does), and the scores behind the last one rank the bonus outcomes of the next pre-speculation.
The scores are the draft's logits when every row is greedy, else q (a greedy row in a mixed batch then ranks
only its argmax first: fewer hits, same tokens).
"""
from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from ..drafters.base import Sampling, SamplingParams
from ..drafters.draft_model import DraftModel
from ..runtime.model import Model
from .channel import Channel
from .group import DistributedError
from .simulator import fanout_for_budget
from .ssd import SSDConfig, SSDStats


class ScoringDraftModel(DraftModel):
    """A ``DraftModel`` that also returns, for greedy batches, the logits each draft was chosen from (its q is
    None there): the scores that rank the outcomes to pre-speculate. Same tokens as ``DraftModel``."""

    GREEDY_KEY = ("greedy", "scores")

    def _choice(self, key: tuple):
        if key == self.GREEDY_KEY:
            return lambda i, logits, inputs: (logits.argmax(dim=-1), logits.float())
        return super()._choice(key)

    def _draw(self, logits: Tensor, steps: list[int]) -> tuple[Tensor, Tensor]:
        tokens, q = super()._draw(logits, steps)
        return tokens, logits.float() if q is None else q

    def draft(self, k: int) -> tuple[list[list[int]], Tensor]:
        """k drafts for every row from where ``redirect`` put it -> (drafts B x k host lists, scores [B, k, V])."""
        drafts, scores = self._run(k)
        return drafts.tolist(), scores


@dataclass
class _Seq:
    """Everything the draft rank keeps about one sequence (one object per row: ``keep`` moves it whole)."""

    history: list[int]                  # h: prompt + emitted; the certain token last
    sampling: Sampling
    step: int = 0                       # DRAFT-stream counter: the drafts proposed so far
    drafts: list[int] = field(default_factory=list)    # this round's drafts (k_b)
    scores: Tensor | None = None        # [k_b + 1, V]: ranks this round's outcomes
    ready: tuple[list[int], Tensor] | None = None       # next round's drafts (K+1) and their q/scores, from a branch
    branches: dict = field(default_factory=dict)        # (j, t) -> (drafts (K+1), q/scores [K+1, V])
    proposed: bool = False              # has drafted before (its first drafts are never pre-speculated)


def likely_outcomes(drafts: list[int], top: list[list[int]], fanouts: tuple[int, ...]) -> list[tuple[int, int]]:
    """The (j accepted, token t) outcomes to pre-speculate: fanouts[j] tokens at each position j <= k, in the
    order of ``top[j]`` (the draft's best tokens there), skipping the rejected draft d_{j+1} at j < k.
    e.g. drafts [5, 7], top [[5, 2, 9], [3, 7, 1], [4, 8, 6]], fanouts (1, 1, 2) -> [(0, 2), (1, 3), (2, 4), (2, 8)]"""
    out = []
    for j, f in enumerate(fanouts):
        skip = drafts[j] if j < len(drafts) else None
        out += [(j, t) for t in [t for t in top[j] if t != skip][:f]]
    return out


class DraftServer:
    """The draft rank's loop: ``serve()`` answers the calls of the target ranks' ``SSDDrafter``s until the leader
    closes the run; returns its ``SSDStats``. ``targets``: the target ranks (the first one is the leader)."""

    def __init__(self, draft_model: Model, targets: list[int], config: SSDConfig):
        self.config, self.k, self.width = config, config.k, config.budget
        self.model = draft_model
        self.spot = ScoringDraftModel(draft_model)
        self.branches = ScoringDraftModel(Model(draft_model.net, draft_model.tokenizer,
                                                num_layers=draft_model.num_active_layers,
                                                use_graphs=draft_model.use_graphs))
        self.channels = [Channel(r, config.recv_timeout_s) for r in targets]
        self.stats = SSDStats()
        self.seqs: list[_Seq] = []
        self.error: str | None = None        # a failure here: reported to the targets at the next propose
        self.outcomes = OutcomeStats(config.k, config.alpha_hint)
        self._fanouts: dict[int, tuple[int, ...]] = {}     # k -> fan-out, for this round's acceptance estimates

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
        self.branches.reserve(None, max(1, max_batch_size * self.width), room)
        self.seqs = []

    def _warm_up(self, max_batch_size: int, k: int, settings, prompt_tokens: int) -> None:
        self.spot.warm_up(max_batch_size, k + 1, settings, prompt_tokens)
        if self.width:
            self.branches.warm_up(max_batch_size * self.width, k + 1, settings, prompt_tokens)

    def _admit(self, seq_ids, prompts, first_tokens, sampling) -> None:
        rows = SamplingParams(tuple(Sampling(*s) for s in sampling))
        self.spot.admit(seq_ids, prompts, first_tokens, rows)
        if self.width:
            F = self.width
            self.branches.admit([i for i in seq_ids for _ in range(F)], [p for p in prompts for _ in range(F)],
                                [t for t in first_tokens for _ in range(F)], rows.select(
                                    [b for b in range(len(prompts)) for _ in range(F)]))
        self.seqs += [_Seq(list(p) + [t], s) for p, t, s in zip(prompts, first_tokens, rows.rows)]

    def _keep(self, order) -> None:
        self.seqs = [self.seqs[i] for i in order]
        self.spot.keep(order)
        if self.width:
            self.branches.keep([i * self.width + f for i in order for f in range(self.width)])

    def _commit(self, num_accepted, emitted) -> None:
        self.outcomes.add([len(seq.drafts) for seq in self.seqs], num_accepted, emitted)
        self._fanouts = {}
        for seq, a, chunk in zip(self.seqs, num_accepted, emitted, strict=True):
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
        if self.width:
            t0 = time.perf_counter()
            try:
                self._prespeculate()
            except Exception:  # noqa: BLE001 - reported to the targets with the next drafts
                self.error = f"pre-speculation: {traceback.format_exc(limit=3)}"
            self.stats.prespec_s += time.perf_counter() - t0
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
            drafts, scores = self.spot.draft(self.k + 1)
            for b, seq in enumerate(self.seqs):
                if seq.ready is None:
                    seq.ready = (drafts[b], scores[b])
            self.stats.spot_s += time.perf_counter() - t0
        self.stats.rounds += 1
        width = max(max_num_draft)
        sampled = not all(seq.sampling.greedy for seq in self.seqs)
        q_rows = []
        for seq, n in zip(self.seqs, max_num_draft):
            drafts, scores = seq.ready
            seq.drafts, seq.scores, seq.ready = drafts[:n], scores[: n + 1], None
            seq.step += n
            seq.proposed = True
            if sampled:
                q_rows.append(scores[:n])
        reply = {"drafts": [seq.drafts + [0] * (width - len(seq.drafts)) for seq in self.seqs], "q": sampled,
                 "stats": asdict(self.stats)}
        return reply, (torch.cat(q_rows) if sampled else None)               # q: [sum k_b, V]

    def _prespeculate(self) -> None:
        """Draft every sequence's F likeliest outcomes of this round, all B*F branch rows in one draft."""
        F = self.width
        top_n = min(F + 1, self.model.config.vocab_size)
        tops = torch.cat([torch.topk(seq.scores, top_n, dim=-1).indices for seq in self.seqs]).tolist()
        histories, steps, keys = [], [], []
        at = 0
        for seq in self.seqs:
            n = len(seq.drafts)
            top, at = tops[at: at + n + 1], at + n + 1
            outcomes = likely_outcomes(seq.drafts, top, self._fanout(n))[:F]
            filler = outcomes[0]                          # unused rows redo the first outcome (dropped)
            for f in range(F):
                j, t = outcomes[f] if f < len(outcomes) else filler
                histories.append(seq.history + seq.drafts[:j] + [t])
                steps.append(seq.step)
                keys.append((j, t) if f < len(outcomes) else None)
        self.branches.redirect(histories, steps)
        drafts, scores = self.branches.draft(self.k + 1)
        for r, key in enumerate(keys):
            if key is not None:
                self.seqs[r // F].branches[key] = (drafts[r], scores[r])

    def _fanout(self, k: int) -> tuple[int, ...]:
        """F split over the k + 1 outcome positions by the policy, for the acceptance measured so far."""
        if k not in self._fanouts:
            c = self.config       # a row that drafted nothing has one outcome position: its next token
            self._fanouts[k] = (fanout_for_budget(self.outcomes.alphas()[:k], c.budget, c.fanout_policy) if k
                                else (c.budget,))
        return self._fanouts[k]


class OutcomeStats:
    """Live acceptance per draft position, from every committed outcome: alpha_i = P(draft i accepted | drafts
    before it accepted), starting from ``prior`` (``SSDConfig.alpha_hint``) worth ``PRIOR_ROUNDS`` tests. It steers
    only which outcomes are pre-speculated (the hit rate), never a token.
    e.g. drafts [3, 3], accepted [1, 3]: position 0 tested 2, accepted 2; 1: tested 2, accepted 1; 2: tested 1, 1."""

    PRIOR_ROUNDS = 8

    def __init__(self, k: int, prior: float):
        self.tested = [float(self.PRIOR_ROUNDS)] * k
        self.accepted = [self.PRIOR_ROUNDS * prior] * k

    def add(self, num_draft: list[int], num_accepted: list[int], emitted: list[list[int]]) -> None:
        for n, a, chunk in zip(num_draft, num_accepted, emitted):
            if not chunk:                    # a failed row: no outcome
                continue
            for i in range(min(a + 1, n)):   # draft i was tested when every draft before it was accepted
                self.tested[i] += 1
                self.accepted[i] += i < a

    def alphas(self) -> tuple[float, ...]:
        return tuple(acc / tested for acc, tested in zip(self.accepted, self.tested))
