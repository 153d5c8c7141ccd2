"""Speculative speculative decoding (SSD): target ranks verify while a draft rank pre-speculates.

Ranks: 0 .. T-1 hold the target (tensor-parallel when T > 1, see tp.py); rank T holds the draft. A run
decodes B sequences together: the target verifies all B in one pass per round. One round r (time flows
down):

    target ranks                                   draft rank
    recv drafts_r [B, K] + q [B, K, V] ---------<- send drafts_r
    verify pass [c_b, d_b1..d_bK] for every b      pre-speculate round r+1: for each sequence b and
    verify_greedy / verify_sample                    each likely outcome (j accepted, token t) draft K
    -> outcomes (j_b, t_b); rollback                 tokens from h_b + d_b1..d_bj + t; store (b, j, t)
    send outcomes [B] --------------------------->  look each (b, j_b, t_b) up: hits answer from the
                                                     cache, only the sequences that missed are drafted
                                                     on the spot, then all B drafts go out

Outcomes pre-speculated: at each position j < K the draft's top-F_j tokens other than d_{j+1} (a recovered
token is never the rejected draft), at j = K the top-F_K tokens of the draft after d_K (bonus). Candidates
are ranked by the draft's own (untempered) distribution; the fan-out per position comes from
``simulator.fanout_for_budget``.

Exactness. Greedy: every draft is a deterministic function of its history, so a hit returns exactly the
drafts an on-the-spot drafting would, and the output equals SD's and plain greedy decoding's. Sampling: each
branch's drafts are drawn from the draft's q given that branch's history, and verification uses fresh
randomness (verify stream offset = round, key = the sequence's row), so whichever of hit or miss supplies the
drafts, they are draws from q with their q rows attached, and rejection sampling returns the target
distribution (tested with a chi-square test over hits and misses). With the cache disabled the draft rank
drafts on the spot every round, drawing from each sequence's generator in the same order as
``sd_generate``: for one sequence the output is token-identical to single-process SD for the same seed.

The draft rank keeps one ``DraftWorker`` (one draft KV row, weights shared) per sequence and drafts the
sequences one after another; batching the branches of all sequences into one draft pass is not done yet
(its cost is what ``benchmarks/ssd_calibrate.py`` measures for the simulator).

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

# outcome message to the draft: [done, j_0, t_0, j_1, t_1, ...] (j = drafts accepted, t = the new token)
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
    """Drafts K tokens from any history of ONE sequence, with its own KV row of the draft model.

    The cache holds K/V for ``self.cached`` (a prefix of the last history drafted from plus its drafts); a
    new history reuses the longest common prefix and feeds the rest in one pass, so branches that share
    the round's history cost only their own suffix. ``seed`` keys the sequence's draft sampling stream."""

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


def draft_workers(draft_model, num_sequences: int, cfg: "SSDConfig", max_seq_len: int) -> list[DraftWorker]:
    """One worker per sequence; all share ``draft_model``'s weights (a ``Model`` per KV row). Sequence b
    samples with seed ``cfg.seed + b`` (sequence 0 with ``cfg.seed``, as ``sd_generate``)."""
    from ..runtime.model import Model

    models = [draft_model] + [Model(draft_model.net, draft_model.tokenizer, num_layers=draft_model.num_active_layers,
                                    use_graphs=draft_model.use_graphs) for _ in range(num_sequences - 1)]
    return [DraftWorker(m, cfg.k, cfg.temperature, cfg.seed + b, max_seq_len) for b, m in enumerate(models)]


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


class DraftState:
    """The draft rank's view of the B sequences: histories (what the target has emitted), the drafts last
    sent, their raw logits, and the speculation cache {(sequence, j, t): (drafts, q, raw)}."""

    def __init__(self, workers: list[DraftWorker], prompts: list[list[int]]):
        self.workers = workers
        self.history = [list(p) for p in prompts]
        self.drafts: list[list[int]] = [[] for _ in prompts]
        self.raw: list[list[Tensor]] = [[] for _ in prompts]
        self.q: list[Tensor | None] = [None for _ in prompts]
        self.cache: dict[tuple[int, int, int], tuple] = {}

    def prespeculate(self, fanouts: tuple[int, ...]) -> None:
        for b, worker in enumerate(self.workers):
            for j, t in likely_outcomes(self.drafts[b], self.raw[b], fanouts):
                self.cache[(b, j, t)] = worker.draft(self.history[b] + self.drafts[b][:j] + [t])

    def advance(self, outcomes: list[tuple[int, int]]) -> tuple[list[bool], float]:
        """Apply the round's outcomes; each sequence's next drafts come from the cache (hit) or are drafted
        on the spot (miss: only that sequence). Returns (hit per sequence, seconds spent drafting on the spot)."""
        hits, spot = [], 0.0
        for b, (j, t) in enumerate(outcomes):
            self.history[b] = self.history[b] + self.drafts[b][:j] + [t]
            found = self.cache.get((b, j, t))
            hits.append(found is not None)
            if found is None:
                t0 = time.perf_counter()
                found = self.workers[b].draft(self.history[b])
                spot += time.perf_counter() - t0
            self.drafts[b], self.q[b], self.raw[b] = found
        self.cache = {}                                      # branches of other outcomes are dead
        return hits, spot


def draft_rank_loop(workers: list[DraftWorker], cfg: SSDConfig, prompts: list[list[int]],
                    targets: list[int]) -> SSDStats:
    """The draft rank: answer each round's outcomes with drafts (from the speculation cache or on the spot)
    and pre-speculate the next round while the target verifies."""
    stats = SSDStats()
    timeout = datetime.timedelta(seconds=cfg.recv_timeout_s)
    fanouts, B = cfg.fanouts, len(prompts)
    state = DraftState(workers, prompts)
    first_round = True
    while True:
        message = torch.zeros(1 + 2 * B, dtype=torch.long)
        work = dist.irecv(message, src=targets[0])
        if not first_round and cfg.budget:                   # pre-speculate while the target verifies
            t0 = time.perf_counter()
            state.prespeculate(fanouts)
            stats.draft_prespec_s += time.perf_counter() - t0
        _wait(work, timeout, f"draft rank: outcomes from target rank {targets[0]}")
        if int(message[0]) == _DONE:
            return stats
        outcomes = [tuple(pair) for pair in message[1:].view(B, 2).tolist()]
        hits, spot = state.advance(outcomes)
        stats.draft_spot_s += spot
        if not first_round:                                  # the first drafts are never pre-speculated
            stats.hits += sum(hits)
            stats.misses += B - sum(hits)
        first_round = False
        stats.rounds += 1
        head = torch.tensor([[int(h)] + d for h, d in zip(hits, state.drafts)], dtype=torch.long)   # [B, 1+K]
        q = torch.stack(state.q).contiguous()                                                      # [B, K, V]
        for dst in targets:
            dist.send(head, dst=dst)
            dist.send(q, dst=dst)


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
    """The target's half of a round for B sequences: verify each one's drafts after its certain token in one
    pass, emit, roll the cache back.

    ``model`` is a ``verispec.runtime.Model`` (or its tensor-parallel shard); ``prompts`` B token lists."""

    def __init__(self, model, cfg: SSDConfig, prompts: list[list[int]], max_seq_len: int):
        if not prompts or any(not p for p in prompts):
            raise ValueError("prompts must be a non-empty list of non-empty token lists")
        self.model, self.cfg, self.batch_size = model, cfg, len(prompts)
        model.setup_cache(len(prompts), max_seq_len)
        logits = model.prefill(prompts)                          # [B, V]
        self.round = 0
        _, emitted = self._verify(logits, [[] for _ in prompts], None)   # the first tokens, sampled like bonuses
        self.certain = [e[0] for e in emitted]
        self.out = [[t] for t in self.certain]

    def _verify(self, logits: Tensor, drafts: list[list[int]], q: Tensor | None) -> tuple[list[int], list[list[int]]]:
        """logits [sum(k_b + 1), V], drafts B lists, q [sum(k_b), V] -> (accepted per sequence, emitted)."""
        d = torch.tensor([t for ds in drafts for t in ds], dtype=torch.long)
        num = [len(ds) for ds in drafts]
        if self.cfg.temperature == 0:
            res = verify_greedy(logits, d, num, backend="torch")
        else:
            res = verify_sample(logits.float(), d, num, q, temperature=self.cfg.temperature,
                                seed=self.cfg.seed, offset=self.round, backend="torch")
        self.round += 1
        accepted = res.num_accepted.tolist()
        return accepted, [res.tokens[b, : j + 1].tolist() for b, j in enumerate(accepted)]

    def step(self, drafts: list[list[int]], q: Tensor | None) -> list[tuple[int, int]]:
        """One round: verify ``drafts`` (B lists of K) with q [B, K, V] (None when greedy) -> per sequence
        (num accepted, recovery/bonus token); appends to ``out``."""
        n = self.model.lengths.tolist()
        logits = self.model.append(torch.tensor([[c] + d for c, d in zip(self.certain, drafts)]))   # [B, K+1, V]
        accepted, emitted = self._verify(logits.reshape(-1, logits.shape[-1]), drafts,
                                         None if q is None else q.reshape(-1, q.shape[-1]))
        # keep the certain token + the accepted drafts of every sequence
        self.model.rollback(torch.tensor([n_b + 1 + j for n_b, j in zip(n, accepted)]))
        self.certain = [e[-1] for e in emitted]
        for out, e in zip(self.out, emitted):
            out += e
        return [(j, e[-1]) for j, e in zip(accepted, emitted)]

    @property
    def done(self) -> bool:
        return min(len(o) for o in self.out) >= self.cfg.max_new_tokens

    def tokens(self) -> list[list[int]]:
        return [o[: self.cfg.max_new_tokens] for o in self.out]


def target_rank_loop(rounds: TargetRounds, cfg: SSDConfig, draft_rank: int, is_leader: bool,
                     vocab_size: int) -> tuple[list[list[int]], SSDStats]:
    """A target rank: receive drafts, verify, (leader) send the outcomes. Every target rank of a TP group
    runs this in lockstep (replicated logits give every rank the same outcomes)."""
    stats = SSDStats()
    timeout = datetime.timedelta(seconds=cfg.recv_timeout_s)
    B = rounds.batch_size
    outcomes = [(0, t) for t in rounds.certain]
    while True:
        done = rounds.done
        if is_leader:
            dist.send(torch.tensor([_DONE if done else _GO] + [x for o in outcomes for x in o]), dst=draft_rank)
        if done:
            return rounds.tokens(), stats
        t0 = time.perf_counter()
        head = _recv(torch.zeros(B, 1 + cfg.k, dtype=torch.long), draft_rank, timeout,
                     f"target: drafts from draft rank {draft_rank}")
        q = _recv(torch.zeros(B, cfg.k, vocab_size), draft_rank, timeout,
                  f"target: draft probs from rank {draft_rank}")
        t1 = time.perf_counter()
        hits = int(head[:, 0].sum())
        outcomes = rounds.step(head[:, 1:].tolist(), q if cfg.temperature > 0 else None)
        t2 = time.perf_counter()
        stats.rounds += 1
        stats.accepted += sum(j for j, _ in outcomes)
        if stats.rounds > 1:                                 # the first drafts are never pre-speculated
            stats.hits += hits
            stats.misses += B - hits
        stats.target_wait_s += t1 - t0
        stats.target_busy_s += t2 - t1


# ----------------------------------------------------------------------------------------- entry points
def check_same_config(cfg: SSDConfig, vocab_size: int, role: str, prompts: list[list[int]]) -> None:
    """All ranks exchange (role, vocab, config, prompts); DistributedError naming the difference otherwise."""
    mine = {"role": role, "vocab_size": vocab_size, "prompts": prompts, **asdict(cfg)}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    vocabs = {e["vocab_size"] for e in everyone}
    if len(vocabs) > 1:
        detail = ", ".join(f"rank {r} ({e['role']}) V={e['vocab_size']}" for r, e in enumerate(everyone))
        raise DistributedError(f"draft and target vocabularies differ: {detail}")
    for key in ["prompts", *asdict(cfg)]:
        values = [e[key] for e in everyone]
        if any(v != values[0] for v in values):
            raise DistributedError(f"SSD configuration differs across ranks: {key} = {values} (rank order)")


def check_prompts(prompts) -> list[list[int]]:
    """``prompts`` must be B >= 1 non-empty lists of token ids (a flat list of ints is one prompt)."""
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
        raise ValueError("prompts must be a list of prompts (lists of token ids); for one sequence pass [prompt]")
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of token-id lists, got {prompts!r}")
    for b, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)) or not p or not all(isinstance(t, int) for t in p):
            raise ValueError(f"prompt {b} must be a non-empty list of token ids, got {p!r}")
    return [list(p) for p in prompts]


def run_ssd(target_model, draft_model, prompts: list[list[int]], cfg: SSDConfig, max_seq_len: int = 256):
    """Run SSD for the B sequences ``prompts`` on this rank of an initialized process group: ranks 0..W-2
    are the target (tensor-parallel over a subgroup when W > 2), rank W-1 the draft. ``target_model``: the
    full target ``Model`` (target ranks shard it); ``draft_model``: the draft ``Model`` (used on the draft
    rank only; None elsewhere). Returns (B token lists, SSDStats) on target ranks, (None, SSDStats) on the
    draft rank."""
    from .tp import tensor_parallel_model

    prompts = check_prompts(prompts)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world < 2:
        raise DistributedError(f"SSD needs >= 2 ranks (target ranks + one draft rank), world size is {world}")
    targets, draft_rank = list(range(world - 1)), world - 1
    tp_group = dist.new_group(targets) if len(targets) > 1 else None
    is_draft = rank == draft_rank
    model = draft_model if is_draft else target_model
    if model is None:
        raise DistributedError(f"rank {rank} ({'draft' if is_draft else 'target'}) was given no model")
    check_same_config(cfg, model.config.vocab_size, "draft" if is_draft else "target", prompts)
    if is_draft:
        workers = draft_workers(draft_model, len(prompts), cfg, max_seq_len)
        return None, draft_rank_loop(workers, cfg, prompts, targets)
    if tp_group is not None:
        target_model = tensor_parallel_model(target_model, tp_group)
    rounds = TargetRounds(target_model, cfg, prompts, max_seq_len)
    return target_rank_loop(rounds, cfg, draft_rank, rank == 0, target_model.config.vocab_size)


def sd_generate(target_model, draft_model, prompt: list[int], cfg: SSDConfig, max_seq_len: int = 256) -> list[int]:
    """Single-process speculative decoding of ONE sequence with the same draft and verification steps (the
    reference SSD must reproduce with its speculation cache off)."""
    worker = draft_workers(draft_model, 1, cfg, max_seq_len)[0]
    rounds = TargetRounds(target_model, cfg, [prompt], max_seq_len)
    history = list(prompt) + [rounds.certain[0]]
    while not rounds.done:
        drafts, q, _ = worker.draft(history)
        [(j, t)] = rounds.step([drafts], q[None] if cfg.temperature > 0 else None)
        history += drafts[:j] + [t]
    return rounds.tokens()[0]


def greedy_generate(model, prompt: list[int], max_new_tokens: int, max_seq_len: int = 256) -> list[int]:
    """Plain greedy decoding of one sequence, one target step per token."""
    model.setup_cache(1, max_seq_len)
    tok = int(model.prefill([prompt])[0].argmax())
    out = [tok]
    while len(out) < max_new_tokens:
        tok = int(model.decode(torch.tensor([[tok]]))[0, 0].argmax())
        out.append(tok)
    return out
