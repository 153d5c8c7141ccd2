"""Speculative speculative decoding (SSD): target ranks verify while a draft rank pre-speculates.

Ranks: 0 .. T-1 hold the target (tensor-parallel when T > 1, see tp.py); rank T holds the draft. One
sequence per run. One round r (time flows down):

    target ranks                                   draft rank
    recv drafts_r ------------------------------<- send drafts_r (+ their q rows)
    verify pass [c, d_1..d_K] -> K+1 logits rows   pre-speculate round r+1: for each likely outcome
    verify_greedy / verify_sample                    (j accepted, token t) draft K tokens from
    -> outcome (j, t); rollback                       h + d_1..d_j + t; store under (seq, j, t)
    send outcome (j, t) ------------------------->  look (seq, j, t) up: hit -> answer at once,
                                                     miss -> draft on the spot, answer

Outcomes pre-speculated: at each position j < K the draft's top-F_j tokens other than d_{j+1} (a recovered
token is never the rejected draft), at j = K the top-F_K tokens of the draft after d_K (bonus). Candidates
are ranked by the draft's own (untempered) distribution; the fan-out per position comes from
``simulator.fanout_for_budget``.

Exactness. Greedy: every draft is a deterministic function of its history, so a hit returns exactly the
drafts an on-the-spot drafting would, and the output equals SD's and plain greedy decoding's. Sampling: each
branch's drafts are drawn from the draft's q given that branch's history, and verification uses fresh
randomness (verify stream offset = round), so whichever of hit or miss supplies the drafts, they are draws
from q with their q rows attached, and rejection sampling returns the target distribution. With the cache
disabled the draft rank drafts on the spot every round, drawing from its generator in the same order as
``sd_generate``: the output is token-identical to single-process SD for the same seed.

Every receive has a timeout: a rank that dies ends the others with DistributedError.
"""
from __future__ import annotations

import datetime
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from ..verify import verify_greedy, verify_sample
from ..verify.sampling import filtered_probs
from .group import DistributedError
from .simulator import fanout_for_budget

# message header to the draft: [num_accepted, token, done]
_DONE, _GO = 1, 0


@dataclass(frozen=True)
class SSDConfig:
    """k: drafts per round. max_new_tokens: tokens to emit. temperature: 0 = greedy. seed: verify stream and
    draft sampling. budget: pre-speculated branches per round (0 disables the speculation cache: SD).
    fanout_policy: how ``budget`` is split over the K+1 positions (simulator.FANOUT_POLICIES).
    alpha_hint: acceptance rate assumed by the "profile"/"geometric" policies. recv_timeout_s: every wait."""
    k: int = 4
    max_new_tokens: int = 32
    temperature: float = 0.0
    seed: int = 0
    budget: int = 4
    fanout_policy: str = "profile"
    alpha_hint: float = 0.7
    recv_timeout_s: float = 20.0

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.budget < 0:
            raise ValueError(f"budget must be >= 0, got {self.budget}")

    @property
    def fanouts(self) -> tuple[int, ...]:
        return fanout_for_budget((self.alpha_hint,) * self.k, self.budget, self.fanout_policy)


@dataclass
class SSDStats:
    rounds: int = 0
    hits: int = 0
    misses: int = 0
    accepted: int = 0
    target_busy_s: float = 0.0        # verify passes + verification (target rank 0)
    target_wait_s: float = 0.0        # waiting for drafts (target rank 0)
    draft_prespec_s: float = 0.0      # pre-speculation (draft rank)
    draft_spot_s: float = 0.0         # drafting on the spot after a miss (draft rank)

    @property
    def hit_rate(self) -> float:
        return self.hits / max(1, self.hits + self.misses)


# ----------------------------------------------------------------------------------------- draft side
class DraftWorker:
    """Drafts K tokens from any history with a ``verispec.runtime.Model`` holding ONE sequence.

    The cache holds K/V for ``self.cached`` (a prefix of the last history drafted from plus its drafts); a
    new history reuses the longest common prefix and feeds the rest in one pass, so branches that share
    the round's history cost only their own suffix."""

    def __init__(self, model, k: int, temperature: float, seed: int, max_seq_len: int):
        self.model, self.k, self.temperature = model, k, temperature
        self.generator = torch.Generator(device=model.device).manual_seed(seed ^ 0x5EED)
        self.model.setup_cache(1, max_seq_len)
        self.cached: list[int] = []

    def _feed(self, tokens: list[int]) -> Tensor:
        """Feed ``tokens`` after ``self.cached``; returns the logits [V] after the last one."""
        logits = self.model.append(torch.tensor([tokens], dtype=torch.long))[0, -1]
        self.cached += tokens
        return logits.float()

    def _draw(self, logits: Tensor) -> tuple[int, Tensor]:
        q = filtered_probs(logits, self.temperature)                 # one-hot of the argmax when greedy
        tok = int(q.argmax()) if self.temperature == 0 else int(torch.multinomial(q, 1, generator=self.generator))
        return tok, q

    def draft(self, history: list[int]) -> tuple[list[int], Tensor, list[Tensor]]:
        """K drafts continuing ``history`` -> (tokens [K], q [K, V] they were drawn from, raw logits [K+1]
        at each draft position and after d_K, for ranking the outcomes)."""
        common = 0
        limit = min(len(self.cached), len(history) - 1)       # feed at least one token
        while common < limit and self.cached[common] == history[common]:
            common += 1
        self.model.rollback(torch.tensor([common]))
        self.cached = self.cached[:common]
        logits = self._feed(history[common:])
        tokens, qs, raw = [], [], []
        for _ in range(self.k):
            raw.append(logits)
            tok, q = self._draw(logits)
            tokens.append(tok)
            qs.append(q)
            logits = self._feed([tok])
        raw.append(logits)                                   # after d_K: ranks the bonus token
        return tokens, torch.stack(qs), raw


def likely_outcomes(drafts: list[int], raw: list[Tensor], fanouts: tuple[int, ...]) -> list[tuple[int, int]]:
    """(num accepted j, token t) pairs to pre-speculate: the top-F_j draft tokens at position j, skipping the
    rejected draft itself (j < K), most likely first within each position."""
    out = []
    for j, f in enumerate(fanouts):
        if f == 0:
            continue
        order = torch.argsort(raw[j], descending=True, stable=True).tolist()
        skip = drafts[j] if j < len(drafts) else None
        out += [(j, t) for t in [t for t in order if t != skip][:f]]
    return out


def draft_rank_loop(worker: DraftWorker, cfg: SSDConfig, prompt: list[int], targets: list[int],
                    seq: int = 0) -> SSDStats:
    """The draft rank: answer each outcome with drafts (from the speculation cache or on the spot) and
    pre-speculate the next round while the target verifies."""
    stats = SSDStats()
    timeout = datetime.timedelta(seconds=cfg.recv_timeout_s)
    fanouts = cfg.fanouts
    history, drafts, cache = list(prompt), [], {}
    while True:
        header = torch.zeros(3, dtype=torch.long)
        work = dist.irecv(header, src=targets[0])
        if drafts and cfg.budget:                            # pre-speculate while the target verifies
            t0 = time.perf_counter()
            for j, t in likely_outcomes(drafts, raw, fanouts):
                cache[(seq, j, t)] = worker.draft(history + drafts[:j] + [t])
            stats.draft_prespec_s += time.perf_counter() - t0
        _wait(work, timeout, f"draft rank: outcome from target rank {targets[0]}")
        j, t, done = header.tolist()
        if done == _DONE:
            return stats
        first_round = not drafts
        history = history + drafts[:j] + [t]
        hit = cache.get((seq, j, t))
        cache = {}                                           # branches of other outcomes are dead
        if hit is not None:
            stats.hits += 1
            drafts, q, raw = hit
        else:
            stats.misses += 0 if first_round else 1
            t0 = time.perf_counter()
            drafts, q, raw = worker.draft(history)
            stats.draft_spot_s += time.perf_counter() - t0
        stats.rounds += 1
        for dst in targets:
            dist.send(torch.tensor([1 if hit is not None else 0] + drafts, dtype=torch.long), dst=dst)
            dist.send(q.contiguous(), dst=dst)


def _wait(work, timeout: datetime.timedelta, what: str) -> None:
    try:
        ok = work.wait(timeout)
    except RuntimeError as e:
        raise DistributedError(f"{what}: the peer failed or closed the connection ({e})") from e
    if ok is False:
        raise DistributedError(f"{what}: nothing arrived within {timeout.total_seconds():.0f} s")


def _recv(tensor: Tensor, src: int, timeout: datetime.timedelta, what: str) -> Tensor:
    _wait(dist.irecv(tensor, src=src), timeout, what)
    return tensor


# ----------------------------------------------------------------------------------------- target side
class TargetRounds:
    """The target's half of a round: verify drafts after the certain token, emit, roll the cache back.

    ``model`` is a ``verispec.runtime.Model`` (or its tensor-parallel shard) holding ONE sequence."""

    def __init__(self, model, cfg: SSDConfig, prompt: list[int], max_seq_len: int):
        self.model, self.cfg = model, cfg
        model.setup_cache(1, max_seq_len)
        logits = model.prefill([prompt])                         # [1, V]
        self.round = 0
        self.certain = self._verify(logits, [], None)[1][0]      # the first token, sampled like any bonus
        self.out = [self.certain]

    def _verify(self, logits: Tensor, drafts: list[int], q: Tensor | None) -> tuple[int, list[int]]:
        d = torch.tensor(drafts, dtype=torch.long)
        if self.cfg.temperature == 0:
            res = verify_greedy(logits, d, [len(drafts)], backend="torch")
        else:
            res = verify_sample(logits.float(), d, [len(drafts)], q, temperature=self.cfg.temperature,
                                seed=self.cfg.seed, offset=self.round, backend="torch")
        self.round += 1
        j = int(res.num_accepted[0])
        return j, res.tokens[0, : j + 1].tolist()

    def step(self, drafts: list[int], q: Tensor | None) -> tuple[int, int]:
        """One round: verify ``drafts`` -> (num accepted, recovery/bonus token); appends to ``out``."""
        n = int(self.model.lengths[0])
        logits = self.model.append(torch.tensor([[self.certain] + drafts]))[0]   # [K+1, V]
        j, emitted = self._verify(logits, drafts, q)
        self.model.rollback(torch.tensor([n + 1 + j]))          # the certain token + accepted drafts
        self.certain = emitted[-1]
        self.out += emitted
        return j, emitted[-1]

    @property
    def done(self) -> bool:
        return len(self.out) >= self.cfg.max_new_tokens


def target_rank_loop(rounds: TargetRounds, cfg: SSDConfig, draft_rank: int, is_leader: bool,
                     vocab_size: int) -> tuple[list[int], SSDStats]:
    """A target rank: receive drafts, verify, (leader) send the outcome. Every target rank of a TP group
    runs this in lockstep (replicated logits give every rank the same outcome)."""
    stats = SSDStats()
    timeout = datetime.timedelta(seconds=cfg.recv_timeout_s)
    j, t = 0, rounds.certain
    while True:
        done = rounds.done
        if is_leader:
            dist.send(torch.tensor([j, t, _DONE if done else _GO]), dst=draft_rank)
        if done:
            return rounds.out[: cfg.max_new_tokens], stats
        t0 = time.perf_counter()
        head = _recv(torch.zeros(1 + cfg.k, dtype=torch.long), draft_rank, timeout,
                     f"target: drafts from draft rank {draft_rank}")
        q = _recv(torch.zeros(cfg.k, vocab_size), draft_rank, timeout, f"target: draft probs from rank {draft_rank}")
        t1 = time.perf_counter()
        hit, drafts = int(head[0]), head[1:].tolist()
        j, t = rounds.step(drafts, q if cfg.temperature > 0 else None)
        t2 = time.perf_counter()
        stats.rounds += 1
        stats.accepted += j
        stats.hits += hit
        stats.misses += 0 if (hit or stats.rounds == 1) else 1
        stats.target_wait_s += t1 - t0
        stats.target_busy_s += t2 - t1


# ----------------------------------------------------------------------------------------- entry points
def check_same_config(cfg: SSDConfig, vocab_size: int, role: str) -> None:
    """All ranks exchange (role, vocab, config); DistributedError naming the difference otherwise."""
    mine = {"role": role, "vocab_size": vocab_size, **asdict(cfg)}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    vocabs = {e["vocab_size"] for e in everyone}
    if len(vocabs) > 1:
        detail = ", ".join(f"rank {r} ({e['role']}) V={e['vocab_size']}" for r, e in enumerate(everyone))
        raise DistributedError(f"draft and target vocabularies differ: {detail}")
    for key in asdict(cfg):
        values = [e[key] for e in everyone]
        if any(v != values[0] for v in values):
            raise DistributedError(f"SSD configuration differs across ranks: {key} = {values} (rank order)")


def run_ssd(target_model, draft_model, prompt: list[int], cfg: SSDConfig, max_seq_len: int = 256):
    """Run SSD on this rank of an initialized process group: ranks 0..W-2 are the target (tensor-parallel
    over a subgroup when W > 2), rank W-1 the draft. ``target_model``: the full target ``Model`` (target
    ranks shard it); ``draft_model``: the draft ``Model`` (used on the draft rank only; None elsewhere).
    Returns (tokens, SSDStats) on target ranks, (None, SSDStats) on the draft rank."""
    from .tp import tensor_parallel_model

    world, rank = dist.get_world_size(), dist.get_rank()
    if world < 2:
        raise DistributedError(f"SSD needs >= 2 ranks (target ranks + one draft rank), world size is {world}")
    targets, draft_rank = list(range(world - 1)), world - 1
    tp_group = dist.new_group(targets) if len(targets) > 1 else None
    is_draft = rank == draft_rank
    model = draft_model if is_draft else target_model
    if model is None:
        raise DistributedError(f"rank {rank} ({'draft' if is_draft else 'target'}) was given no model")
    check_same_config(cfg, model.config.vocab_size, "draft" if is_draft else "target")
    if is_draft:
        worker = DraftWorker(draft_model, cfg.k, cfg.temperature, cfg.seed, max_seq_len)
        return None, draft_rank_loop(worker, cfg, prompt, targets)
    if tp_group is not None:
        target_model = tensor_parallel_model(target_model, tp_group, use_graphs=False)
    rounds = TargetRounds(target_model, cfg, prompt, max_seq_len)
    return target_rank_loop(rounds, cfg, draft_rank, rank == 0, target_model.config.vocab_size)


def sd_generate(target_model, draft_model, prompt: list[int], cfg: SSDConfig, max_seq_len: int = 256):
    """Single-process speculative decoding with the same draft and verification steps (the reference SSD
    must reproduce with its speculation cache off)."""
    worker = DraftWorker(draft_model, cfg.k, cfg.temperature, cfg.seed, max_seq_len)
    rounds = TargetRounds(target_model, cfg, prompt, max_seq_len)
    history = list(prompt) + [rounds.certain]
    while not rounds.done:
        drafts, q, _ = worker.draft(history)
        j, t = rounds.step(drafts, q if cfg.temperature > 0 else None)
        history += drafts[:j] + [t]
    return rounds.out[: cfg.max_new_tokens]


def greedy_generate(model, prompt: list[int], max_new_tokens: int, max_seq_len: int = 256) -> list[int]:
    """Plain greedy decoding, one target step per token."""
    model.setup_cache(1, max_seq_len)
    tok = int(model.prefill([prompt])[0].argmax())
    out = [tok]
    while len(out) < max_new_tokens:
        tok = int(model.decode(torch.tensor([[tok]]))[0, 0].argmax())
        out.append(tok)
    return out
