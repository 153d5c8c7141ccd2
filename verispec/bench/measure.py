"""Measurements the studies share: engine runs through the ``Scheduler`` (static batches and timed
arrivals) and their per-round phase times.

``run_engine`` drives one ``Scheduler`` in this process. Static batch: every request is submitted at once and
throughput is tokens after each request's first / decode seconds (from the end of the slowest prefill to the
last token). Timed arrivals: request i is submitted at ``arrivals[i]`` seconds after the start (its
``submitted_at`` is that planned time, so queueing counts in its latency) and throughput is every generated
token / the seconds from the first submission to the last end.

Phase times come from a run with ``timing=True`` (synchronized around each phase on a GPU; always exact on
the CPU): per round, ``draft_s`` (K draft steps), ``target_s`` (the target pass over K + 1 tokens per row),
``verification_s`` and ``commit_s``.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..engine import Request, Scheduler, SchedulerConfig
from ..engine.scheduler import tree_nodes
from ..runtime.tree import MAX_TREE_TOKENS


@dataclass
class EngineRun:
    batch: int                     # requests
    k: int                         # K max (0 = autoregressive)
    new_tokens: int                # every generated token
    decode_tokens: int             # tokens after each request's first
    seconds: float                 # decode seconds (static) or makespan (arrivals)
    rounds: int
    proposed: int
    accepted: int
    phase_s: dict                  # draft / target / verification / commit seconds, summed over rounds
    latencies_s: list[float]       # per request: submission to its last token
    outputs: list[list[int]] = field(repr=False, default_factory=list)
    stats: list = field(repr=False, default_factory=list)   # per request: its Stats (TTFT, TPOT, acceptance)
    accepted_per_position: list[int] = field(default_factory=list)   # [i]: rounds that accepted draft i (all requests)
    tested_per_position: list[int] = field(default_factory=list)     # [i]: rounds that tested draft i

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def alpha(self) -> float:
        """Measured acceptance rate of a draft position: accepted / *tested* drafts, over every position (the
        i.i.d. model's alpha). accepted / proposed would count the drafts after a rejection, which no one looked
        at, as rejected: at alpha = 0.8 and K = 4 it reads 0.59."""
        tested = sum(self.tested_per_position)
        return sum(self.accepted_per_position) / tested if tested else 0.0

    def position_alphas(self, k: int) -> list[float]:
        """[i < k]: accepted / tested at draft position i; ``alpha`` where position i was never tested."""
        accepted, tested = self.accepted_per_position + [0] * k, self.tested_per_position + [0] * k
        return [accepted[i] / tested[i] if tested[i] else self.alpha for i in range(k)]

    def per_round(self, phase: str) -> float:
        return self.phase_s[phase] / self.rounds if self.rounds else 0.0

    @property
    def ms_per_token(self) -> float:
        """Median per-request seconds per generated token, in ms (the latency a user sees)."""
        return 1e3 * statistics.median(self.latencies_s) / (self.new_tokens / self.batch)


def run_engine(target, drafter, prompts: list[list[int]], *, k: int, max_new_tokens: int | list[int],
               timing: bool = False, k_policy=None, arrivals: list[float] | None = None,
               max_batch: int | None = None, tree=None, max_seq_len: int | None = None,
               warm_up: bool = False) -> EngineRun:
    """One greedy run of ``prompts`` (see the module docstring); ``drafter=None`` = autoregressive.
    ``max_new_tokens``: one limit for every request, or one per request. Request i has id i and seed i.
    ``tree``: draft trees of these widths instead of chains of k (``SchedulerConfig.tree``; "auto" is passed as
    it is, with room for the largest tree pass). ``max_seq_len``: the cache's length (None: the longest request and
    one round's lookahead); runs that share one keep their cache, and on a GPU their CUDA graphs. ``warm_up``:
    capture every graph the scheduler's rounds can replay before the clock starts (``Scheduler.warm_up``, as the
    server does at startup): a policy that picks k per round (k=auto) meets shapes a warm-up run may not have met."""
    k = k if drafter is not None else 0
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(limits) != len(prompts):
        raise ValueError(f"run_engine: {len(limits)} max_new_tokens for {len(prompts)} prompts")
    if tree is None or drafter is None:
        tree, lookahead = None, k
    elif isinstance(tree, str):          # tree="auto": the engine picks each round's shape, up to a full tree pass
        lookahead = MAX_TREE_TOKENS - 1
    else:
        tree = tuple(tree)
        lookahead = tree_nodes(tree)
    longest = max(len(p) + n for p, n in zip(prompts, limits))
    config = SchedulerConfig(max_batch or len(prompts), max_seq_len or longest + lookahead + 1, k, tree=tree)
    scheduler = Scheduler(target, drafter, config, k_policy=k_policy, timing=timing)
    if warm_up:
        scheduler.warm_up(prompt_tokens=max(len(p) for p in prompts))
    requests = [Request(list(p), n, id=i, seed=i) for i, (p, n) in enumerate(zip(prompts, limits))]
    start = time.perf_counter()
    if arrivals is None:
        for r in requests:
            r.submitted_at = start
        seqs = [scheduler.submit(r) for r in requests]
        scheduler.run()
    else:
        seqs = _run_arrivals(scheduler, requests, arrivals, start)
    end = time.perf_counter()
    t = scheduler.totals
    new = sum(len(s.generated) for s in seqs)
    if arrivals is None:
        first = max(s.stats.queue_s + s.stats.prefill_s for s in seqs)
        seconds = max(s.stats.total_s for s in seqs) - first
        decode_tokens = new - len(seqs)
    else:
        seconds, decode_tokens = end - start, new
    errors = [s.error for s in seqs if s.finish_reason == "error"]
    if errors:
        raise RuntimeError(f"a benchmark request failed: {errors[0]}")
    return EngineRun(len(prompts), k, new, decode_tokens, seconds, t.rounds, t.proposed, t.accepted,
                     {p: getattr(t, f"{p}_s") for p in ("draft", "target", "verification", "commit")},
                     [s.stats.total_s for s in seqs], [list(s.generated) for s in seqs],
                     [s.stats for s in seqs], sum_positions([s.stats.accepted_per_position for s in seqs]),
                     sum_positions([s.stats.tested_per_position for s in seqs]))


def sum_positions(per_request: list[list[int]]) -> list[int]:
    """Per-position counts summed over requests (lists of different lengths)."""
    out: list[int] = []
    for counts in per_request:
        out += [0] * (len(counts) - len(out))
        for i, c in enumerate(counts):
            out[i] += c
    return out


def _run_arrivals(scheduler, requests, arrivals, start):
    pending = sorted(zip(arrivals, requests), key=lambda x: x[0])
    seqs = []
    while pending or not scheduler.idle:
        now = time.perf_counter() - start
        while pending and pending[0][0] <= now:
            at, r = pending.pop(0)
            r.submitted_at = start + at
            seqs.append(scheduler.submit(r))
        if scheduler.idle and pending:
            time.sleep(max(0.0, pending[0][0] - (time.perf_counter() - start)))
            continue
        scheduler.step()
    return sorted(seqs, key=lambda s: s.request.id)


def timed_runs(target, drafter_factory, prompts, *, k: int, max_new_tokens: int,
               policy_factory=None, tree=None) -> tuple[EngineRun, EngineRun]:
    """(phase run, throughput run) of one configuration: a warm-up run first on a GPU (CUDA graphs for every
    shape it meets; greedy decoding is deterministic, so later runs meet the same ones), then a
    ``timing=True`` run for phase times and, on a GPU, an untimed run for throughput (on the CPU the timed
    run is both). ``drafter_factory()`` builds a fresh drafter for each run (None: autoregressive);
    ``policy_factory()`` a fresh k policy (None: k drafts for every row); ``tree``: draft trees (``run_engine``)."""
    make_policy = policy_factory or (lambda: None)

    def run(timing: bool) -> EngineRun:
        return run_engine(target, drafter_factory(), prompts, k=k, max_new_tokens=max_new_tokens, timing=timing,
                          k_policy=make_policy(), tree=tree)

    if target.device.type != "cuda":
        phases = run(True)
        return phases, phases
    run(False)
    return run(True), run(False)


def pass_seconds(model, batch: int, tokens: int, *, reps: int = 3, prompt_len: int = 16) -> float:
    """Median seconds of one pass of ``model`` scoring ``tokens`` tokens for each of ``batch`` rows
    (the cache is left in an undefined state: the next run sets it up afresh)."""
    cuda = model.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(model.device)) if cuda else (lambda: None)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    model.setup_cache(batch, prompt_len + tokens + 1, empty=True)
    model.admit(torch.randint(0, vocab, (batch, prompt_len), generator=gen).tolist())
    base = model.lengths.clone()
    feed = torch.randint(0, vocab, (batch, tokens), generator=gen).to(model.device)
    times = []
    for i in range(reps + 1):
        model.rollback(base)
        sync()
        t0 = time.perf_counter()
        model.append(feed)
        sync()
        if i:                                   # the first pass warms up (graph capture, allocator)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start of n arrivals of a Poisson process of ``rate`` per second (the first at 0),
    reproducible from ``seed``."""
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times
