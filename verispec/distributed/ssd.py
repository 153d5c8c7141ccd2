"""Speculative speculative decoding (SSD): the target side's drafter, whose drafts come from a draft rank.

Ranks: 0 .. T-1 hold the target (tensor-parallel when T > 1, see tp.py) and each runs the ordinary engine
(``verispec.generate`` / the scheduler: its round, verification backends, status word, stop rules, stats) with
an ``SSDDrafter``; rank T, the *draft rank*, runs ``draft_rank.DraftServer``. The drafter interface is the whole
contract between them. Target rank 0 (the leader) sends every call to the draft rank; every target rank
receives the drafts (they run the same rounds in lockstep).

    target ranks (engine)                          draft rank (DraftServer)
    propose(max_num_draft) -> "propose" -------->  drafts: the cached branch on a hit, drafted on the spot
                           <- drafts [B, K] (+ q)  on a miss (all rows in one batched draft)
    target pass + verification                     pre-speculate the next round: for each sequence, its F
                                                   likeliest outcomes (j accepted, token t), all B*F branch
                                                   rows drafted together in one batched draft
    commit(num_accepted, emitted) -> "commit" -->  (no wait) each sequence's outcome picks its branch (hit)
    keep(order) / admit(...)      -> "keep"/"admit"  rows follow the engine's batch

Exactness. The draft rank drafts row b exactly as the local ``DraftModel`` would at the same (sequence,
position): the same history, the same DRAFT-stream counter (``draw`` / ``race`` in drafters/base.py: seed of
the sequence, step = drafts proposed so far), the same passes. A branch is only used when its outcome is the
round's outcome, so its drafts are the ones on-the-spot drafting would give: SSD's output equals the engine's
SD output with ``DraftModel`` token for token, greedy and sampled, whatever the hit rate (tested on gloo).

Faults. Every receive waits at most ``SSDConfig.recv_timeout_s``. A draft rank that died, went silent or failed
makes ``propose`` raise ``DistributedError`` (naming no row); from then on every call raises at once, so an
engine with ``isolate_drafter=True`` decodes plainly (exact) and a plain ``generate`` raises that error.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from ..drafters.base import Drafter, Proposal, SamplingParams
from .channel import Channel
from .group import DistributedError
from .simulator import FANOUT_POLICIES, SSDCosts

BUDGET_MODES = ("fixed", "auto")


@dataclass(frozen=True)
class SSDConfig:
    """What the target ranks and the draft rank agree on (checked when they connect)."""

    k: int = 4                      # drafts per round at most (the engine's k)
    budget: int = 4                 # pre-speculated branches per sequence and round (0: no cache, plain SD);
                                    # with budget_mode "auto" the most (the rows the draft rank reserves)
    fanout_policy: str = "profile"  # how the budget is split over the K+1 outcome positions (simulator)
    alpha_hint: float = 0.7         # the acceptance rate assumed before any outcome is seen (then: measured)
    recv_timeout_s: float = 60.0    # the longest wait for drafts, or for the draft rank's next message in a run
    budget_mode: str = "fixed"      # "fixed": F = budget every round; "auto": the draft rank picks F in
                                    # 0..budget from ``costs`` and the acceptance measured so far
                                    # (``simulator.best_budget``)
    costs: SSDCosts | None = None   # the measured costs "auto" picks F from (``SSDCosts.from_results``)

    def __post_init__(self):
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be an integer >= 1, got {self.k!r}")
        if not isinstance(self.budget, int) or self.budget < 0:
            raise ValueError(f"budget must be an integer >= 0 (branches per sequence), got {self.budget!r}")
        if self.fanout_policy not in FANOUT_POLICIES:
            raise ValueError(f"fanout_policy must be one of {FANOUT_POLICIES}, got {self.fanout_policy!r}")
        if not 0.0 <= self.alpha_hint <= 1.0:
            raise ValueError(f"alpha_hint must be in [0, 1], got {self.alpha_hint}")
        if self.recv_timeout_s <= 0:
            raise ValueError(f"recv_timeout_s must be > 0, got {self.recv_timeout_s}")
        if self.budget_mode not in BUDGET_MODES:
            raise ValueError(f"budget_mode must be one of {BUDGET_MODES}, got {self.budget_mode!r}")
        if self.budget_mode == "auto" and not isinstance(self.costs, SSDCosts):
            raise ValueError("budget_mode 'auto' needs costs (an SSDCosts: the measured pass times it picks F from, "
                             "e.g. SSDCosts.from_results of ssd_calibration.json)")
        if self.budget_mode == "fixed" and self.costs is not None:
            raise ValueError("costs are read only with budget_mode 'auto' (budget_mode 'fixed' uses F = budget)")


@dataclass
class SSDStats:
    """The draft rank's counts (sent with every batch of drafts) and the target's waits (this rank)."""

    rounds: int = 0                 # rounds with drafts
    hits: int = 0                   # rows whose drafts came from a pre-speculated branch
    misses: int = 0                 # rows drafted on the spot (a row's first drafts count as neither)
    prespec_s: float = 0.0          # draft rank: pre-speculating (hidden behind the target's pass)
    spot_s: float = 0.0             # draft rank: drafting on the spot (on the critical path)
    wait_s: float = 0.0             # this target rank: from asking for drafts to having them
    budget: int = 0                 # draft rank: branches per sequence of its last pre-speculation (the F it runs)
    budget_changes: int = 0         # draft rank: how often "auto" changed F (each moves its branch rows)

    @property
    def hit_rate(self) -> float:
        return self.hits / max(1, self.hits + self.misses)


class SSDDrafter(Drafter):
    """The drafter of a target rank: every call goes to the draft rank ``draft_rank`` (see the module
    docstring). ``leader``: this is target rank 0, which sends the calls (the other target ranks only receive
    drafts).

    Connects in ``attach`` (once): both sides check the vocabulary and the configuration."""

    def __init__(self, draft_rank: int, config: SSDConfig, *, leader: bool):
        self.config, self.leader = config, leader
        self.channel = Channel(draft_rank, config.recv_timeout_s)
        self.stats = SSDStats()
        self.error: str | None = None       # why the draft rank is unusable (then every call raises at once)
        self.vocab_size: int | None = None
        self.closed = False

    # ---------------------------------------------------------------------------------- the connection
    def attach(self, target) -> None:
        vocab = target.config.vocab_size
        if self.vocab_size is not None:
            if vocab != self.vocab_size:
                raise ValueError(f"this SSDDrafter is connected for vocab {self.vocab_size}, the target has {vocab}")
            return
        self._call(self._hello, vocab)
        self.vocab_size = vocab

    def _hello(self, vocab: int) -> None:
        self.channel.send_object({"op": "hello", "vocab_size": vocab, "config": asdict(self.config),
                                  "leader": self.leader})
        answer = self.channel.recv_object(f"draft rank {self.channel.peer}: its answer to the connection")
        if answer.get("error"):
            raise DistributedError(answer["error"])

    def close(self) -> None:
        """Tell the draft rank that this run is over (leader only; its ``serve`` returns its stats). Also after a
        fault: a draft rank that failed but lives still waits for it; one that died makes the send fail (bounded)."""
        if self.leader and not self.closed:
            try:
                self.channel.send_object({"op": "close"})
            except DistributedError as e:
                self.error = self.error or str(e)
        self.closed = True

    def _call(self, fn, *args):
        if self.error is not None:
            raise DistributedError(f"the draft rank is unusable: {self.error}")
        try:
            return fn(*args)
        except DistributedError as e:
            self.error = str(e)
            raise

    def _tell(self, message: dict) -> None:
        """A call the target does not wait for (only the leader sends)."""
        if self.leader:
            self._call(lambda: self.channel.send_object(message, wait=False))
        elif self.error is not None:
            raise DistributedError(f"the draft rank is unusable: {self.error}")

    # ---------------------------------------------------------------------------------- the interface
    def reserve(self, target, max_batch_size: int, max_seq_len: int) -> None:
        self._tell({"op": "reserve", "max_batch_size": max_batch_size, "max_seq_len": max_seq_len})

    def warm_up(self, max_batch_size: int, k: int, settings, prompt_tokens: int = 0) -> int:
        self._tell({"op": "warm_up", "max_batch_size": max_batch_size, "k": k, "settings": list(settings),
                    "prompt_tokens": prompt_tokens})
        return 0                            # the draft rank's graphs are its own

    def admit(self, seq_ids, prompts, first_tokens, sampling: SamplingParams) -> None:
        self._tell({"op": "admit", "seq_ids": list(seq_ids), "prompts": [list(p) for p in prompts],
                    "first_tokens": list(first_tokens), "sampling": [(r.temperature, r.top_k, r.top_p, r.seed) for r in sampling.rows]})

    def propose(self, max_num_draft: list[int]) -> Proposal:
        return self._call(self._propose, list(max_num_draft))

    def _propose(self, max_num_draft: list[int]) -> Proposal:
        t0 = time.perf_counter()
        if self.leader:
            self.channel.send_object({"op": "propose", "max_num_draft": max_num_draft}, wait=False)
        reply = self.channel.recv_object(f"draft rank {self.channel.peer}: the drafts of this round")
        if reply.get("error"):
            raise DistributedError(f"draft rank {self.channel.peer} failed: {reply['error']}")
        draft_probs = None
        if reply["q"]:
            draft_probs = self.channel.recv_tensor((sum(max_num_draft), self.vocab_size), torch.float32,
                                                   f"draft rank {self.channel.peer}: the drafts' q")
        self.channel.flush()
        for name in ("rounds", "hits", "misses", "prespec_s", "spot_s", "budget", "budget_changes"):
            setattr(self.stats, name, reply["stats"][name])
        self.stats.wait_s += time.perf_counter() - t0
        tokens = torch.tensor(reply["drafts"], dtype=torch.long).reshape(len(max_num_draft), max(max_num_draft))
        return Proposal(tokens, max_num_draft, draft_probs)

    def commit(self, num_accepted, emitted) -> None:
        self._tell({"op": "commit", "num_accepted": list(num_accepted), "emitted": [list(e) for e in emitted]})

    def keep(self, batch_indices) -> None:
        self._tell({"op": "keep", "order": list(batch_indices)})
