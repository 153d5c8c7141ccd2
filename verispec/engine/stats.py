"""What a generation reports: ``Stats`` (counts and timings of one sequence, or of a whole run) and
``Generation`` (the tokens, the text, why it ended)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    """Counts and timings of one sequence (``Generation.stats``) or of a whole run (``last_stats``).

    Phase times are the batch's: a round's phases count for every sequence that took part in it.
    """

    new_tokens: int = 0            # tokens emitted (the first one, from the prefill, included)
    rounds: int = 0                # target passes this sequence took part in
    proposed: int = 0              # draft tokens proposed
    accepted: int = 0              # draft tokens accepted
    accepted_per_position: list[int] = field(default_factory=list)   # [i]: rounds whose draft i was accepted
    proposed_per_position: list[int] = field(default_factory=list)   # [i]: rounds that proposed a draft i
    # [i]: rounds that *tested* draft i: proposed it and accepted drafts 0..i-1 (a rejection ends the round, so
    # later drafts are never looked at). accepted[i] / tested[i] is the acceptance rate at position i
    tested_per_position: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    seed: int | None = None        # the stream seed used (sampling runs are reproducible from it)
    num_draft_last: int = 0        # drafts proposed in the last round (k="auto" shows its choice here)
    queue_s: float = 0.0           # from submission until admission (continuous batching)
    prefill_s: float = 0.0         # admission: target prefill + first token + the drafter's admit
    draft_s: float = 0.0           # drafter.propose
    target_s: float = 0.0          # the target pass over [certain token, drafts]
    verification_s: float = 0.0    # verify_greedy / verify_sample + reading the outcome on the host
    commit_s: float = 0.0          # rollback, drafter.commit, stop checks, streaming, compaction
    decode_s: float = 0.0          # from the first token until this sequence finished
    total_s: float = 0.0           # from submission until this sequence finished
    warmup_s: float = 0.0          # capturing CUDA graphs before the run (Scheduler.warm_up): not in total_s
    graphs_captured: int = 0       # graphs that warm-up captured (0 when they existed or there are none)
    timed_phases: bool = True      # False: phase times on an async device without synchronization

    @property
    def acceptance_rate(self) -> float:
        """accepted / proposed (0 when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """[i]: accepted / tested at draft position i (0 where never tested)."""
        return [a / t if t else 0.0 for a, t in zip(self.accepted_per_position, self.tested_per_position)]

    @property
    def mean_accepted_length(self) -> float:
        """Accepted drafts per round."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens emitted per target pass (= mean accepted length + 1 once decoding)."""
        return (self.new_tokens - 1) / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens emitted after the first one, per second of decoding."""
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0

    def add_round(self, num_draft: int, num_accepted: int) -> None:
        """Count one round in which this sequence proposed ``num_draft`` drafts and kept ``num_accepted``."""
        self.rounds += 1
        self.proposed += num_draft
        self.accepted += num_accepted
        self.num_draft_last = num_draft
        grow = num_draft - len(self.proposed_per_position)
        if grow > 0:
            self.proposed_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
            self.tested_per_position += [0] * grow
        for i in range(num_draft):
            self.proposed_per_position[i] += 1
            self.accepted_per_position[i] += i < num_accepted
            self.tested_per_position[i] += i <= num_accepted

    def summary(self) -> str:
        return (f"{self.new_tokens} tokens, {self.tokens_per_s:.1f} tok/s, {self.rounds} rounds, "
                f"accepted {self.accepted}/{self.proposed} ({100 * self.acceptance_rate:.0f}%), "
                f"{self.tokens_per_round:.2f} tokens/round; draft {self.draft_s:.2f}s target {self.target_s:.2f}s "
                f"verification {self.verification_s:.2f}s commit {self.commit_s:.2f}s")


@dataclass
class Generation:
    tokens: list[int]              # generated token ids (an EOS that ended the run included)
    text: str                      # decoded tokens (EOS excluded, cut before a stop string)
    stats: Stats
    finish_reason: str = "length"  # "length" | "eos" | "stop" | "cancelled" | "error"
    prompt_tokens: list[int] = field(default_factory=list)
    error: str | None = None       # why it failed (finish_reason "error")
