"""Event-driven model of AR / SD / SSD decoding rounds, with an optional tensor-parallel target.

Inputs are step times (measured or given), the acceptance model and the topology; outputs are tokens/s and
the timeline of one round. Pure Python: nothing here touches a GPU.

One steady-state round of each method (time 0 = the target starts its pass):

  AR    target: decode pass of B tokens                                  -> B tokens
  SD    draft:  K steps of B tokens | link | target: verify B*(K+1) | link -> B * E_SD tokens
        (draft and target on one GPU: link latency 0)
  SSD   target: verify B*(K+1) tokens, then sends the outcome (link).
        draft:  pre-speculates the next round for the likely outcomes while the target verifies (it
                started one link latency before the target, right after it sent this round's drafts),
                then looks the outcome up: on a hit it answers at once, on a miss it drafts on the spot.
        The next round starts when the drafts reach the target (link).
        What the draft rank runs (verispec/distributed/draft_rank.py), and so what is charged: a
        pre-speculation is its host work (``draft_host``: choosing the outcomes, pointing the rows, the K/V
        copy; a per-call constant plus a per-row term) and K + 1 draft passes of B*F rows (the K drafts, and
        one more whose ranking orders the next bonus outcomes); a spot draft is K + 1 passes too.

Acceptance model: position j of a round is accepted with probability alpha_j given every earlier one was
(``alpha`` a float: alpha_j = alpha for all j). P(num_accepted = j) = alpha_0...alpha_{j-1} (1 - alpha_j) for
j < K and alpha_0...alpha_{K-1} for j = K; the expected tokens per round per sequence is E_SD.

Hit model (SSD): the outcome of a round is (num accepted j, the recovery/bonus token t). The draft rank
pre-speculates F_j candidate tokens t at each of the K+1 positions j, in the draft's own rank order. With
``rank_accept`` = beta the probability that the target's token is the draft's next candidate given it is none
of the earlier ones (beta = alpha by default: the draft's top candidate is right with probability alpha, and
after a rejection the draft's ranking of the remaining tokens is assumed as good), the outcome is covered with
probability 1 - (1 - beta)^F_j, so
    p_hit = sum_j P(num_accepted = j) * (1 - (1 - beta)^F_j).
Greedy allocation of a branch budget by marginal gain P(j) beta (1 - beta)^F_j is optimal for this concave
objective (``fanout_for_budget(policy="profile")``).

Batch: each sequence hits independently. Miss policy "batch" re-drafts every sequence when any misses (the
published SSD design); "sequences" drafts only the sequences that missed (the others already have drafts).

Throughput is E[tokens per round] / E[round time] (renewal-reward: exact for the steady state); the expected
round time averages the event timeline over the number of sequences that missed (binomial). ``simulate``
draws rounds at random instead, as a check of the expectation and to show the spread.
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field, replace
from typing import Sequence

METHODS = ("ar", "sd", "ssd")
MISS_POLICIES = ("batch", "sequences")
FANOUT_POLICIES = ("uniform", "geometric", "profile")


# ----------------------------------------------------------------------------------------- step times
@dataclass(frozen=True)
class PassTime:
    """Time of one forward pass as a function of the tokens it processes (summed over the batch).

    points: ((tokens, seconds), ...) sorted by tokens; linear interpolation between points, the last slope
    beyond the last point, the first point's time below it (a pass never gets cheaper than the smallest
    measured one: weight reads dominate small passes).
    """
    points: tuple[tuple[int, float], ...]

    def __post_init__(self):
        if not self.points:
            raise ValueError("PassTime needs at least one (tokens, seconds) point")
        pts = tuple(sorted((int(n), float(s)) for n, s in self.points))
        if any(n < 1 for n, _ in pts) or any(s < 0 for _, s in pts):
            raise ValueError(f"PassTime points need tokens >= 1 and seconds >= 0, got {pts}")
        if len({n for n, _ in pts}) != len(pts):
            raise ValueError(f"PassTime points repeat a token count: {pts}")
        object.__setattr__(self, "points", pts)

    @classmethod
    def constant(cls, seconds: float) -> "PassTime":
        return cls(((1, seconds),))

    def __call__(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        pts = self.points
        xs = [n for n, _ in pts]
        if tokens <= xs[0]:
            return pts[0][1]
        i = bisect.bisect_left(xs, tokens)
        if i == len(pts):
            if len(pts) == 1:
                return pts[0][1]
            (x0, y0), (x1, y1) = pts[-2], pts[-1]
        else:
            (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)


@dataclass(frozen=True)
class TensorParallel:
    """A target split over ``ranks`` GPUs: each rank computes 1/ranks of the pass (times ``efficiency``,
    <= 1 for kernels that lose efficiency on thinner matrices) and every layer does two all-reduces (after
    attention's output projection and after the MLP's down projection) of the pass's activations.

    allreduce_s(tokens) = latency_s + 2 (ranks - 1) / ranks * tokens * hidden_size * bytes_per_value / bandwidth
    (ring all-reduce; at decode sizes the latency term dominates)."""
    ranks: int = 1
    num_layers: int = 32
    hidden_size: int = 4096
    bytes_per_value: int = 2
    allreduce_latency_s: float = 10e-6
    bandwidth_bytes_s: float = 300e9
    efficiency: float = 1.0

    def __post_init__(self):
        if self.ranks < 1:
            raise ValueError(f"TensorParallel.ranks must be >= 1, got {self.ranks}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"TensorParallel.efficiency must be in (0, 1], got {self.efficiency}")

    def allreduce_s(self, tokens: float) -> float:
        if self.ranks == 1:
            return 0.0
        volume = 2 * (self.ranks - 1) / self.ranks * tokens * self.hidden_size * self.bytes_per_value
        return self.allreduce_latency_s + volume / self.bandwidth_bytes_s

    def pass_s(self, single_gpu: PassTime, tokens: float) -> tuple[float, float]:
        """(compute seconds per rank, all-reduce seconds) of one target pass of ``tokens`` tokens."""
        compute = single_gpu(tokens) / (self.ranks * self.efficiency) if self.ranks > 1 else single_gpu(tokens)
        return compute, 2 * self.num_layers * self.allreduce_s(tokens)


@dataclass(frozen=True)
class HostCost:
    """Host seconds of one draft call of the draft rank before its passes: per_call_s + per_row_s * rows (0 for no
    rows). ``fit`` takes it from measured (rows, seconds) points."""
    per_call_s: float = 0.0
    per_row_s: float = 0.0

    def __post_init__(self):
        if not (0 <= self.per_call_s < math.inf and 0 <= self.per_row_s < math.inf):
            raise ValueError(f"HostCost needs finite seconds >= 0, got {self.per_call_s}, {self.per_row_s}")

    def __call__(self, rows: float) -> float:
        return self.per_call_s + self.per_row_s * rows if rows > 0 else 0.0

    @classmethod
    def from_gpu_check(cls, measured: dict) -> "HostCost":
        """``fit`` to the host times before the pre-speculation's passes that ``benchmarks/ssd_gpu_check.py``
        measured ({"per_round": [{"rows", "host_before_loop_ms": [after a miss, after a hit]}]}), by rows."""
        if "per_round" not in measured:
            raise ValueError("not an ssd_gpu_check.py result: no 'per_round' section")
        return cls.fit([(r["rows"], ms * 1e-3) for r in measured["per_round"] for ms in r["host_before_loop_ms"]])

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> "HostCost":
        """Least squares over (rows, seconds) points, both terms kept >= 0 (a negative slope fits the mean
        as a constant; one point, or one row count, is a constant too).
        e.g. ((2, 0.5e-3), (64, 1.5e-3)) -> HostCost(0.4677e-3, 1.613e-5)."""
        if not points:
            raise ValueError("HostCost.fit needs at least one (rows, seconds) point")
        xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
        if slope <= 0:
            return cls(max(0.0, my), 0.0)
        return cls(max(0.0, my - slope * mx), slope)


# ----------------------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class SimConfig:
    """One regime to simulate.

    target: the target's pass time on one GPU vs tokens per pass (a 70B target that does not fit one GPU:
        its would-be single-GPU time, split by ``tp``). draft: the draft's pass time vs tokens per pass.
    alpha: per-position acceptance, a float or K values. k: drafts per round. batch_size: sequences.
    fanout: pre-speculated candidates per position (an int for all K+1 positions, or K+1 ints).
    hit_rate: per-sequence SSD hit rate; None derives it from alpha and the fan-out (module docstring).
    rank_accept: beta of the hit model (None: the mean of alpha).
    link_latency_s: one message between the draft GPU and the target (0 when SD shares the target's GPU).
    fallback_s: extra cost of a miss before drafting on the spot (cache lookup, discarding branches).
    draft_host: the draft rank's host work before a pre-speculation's passes (``HostCost`` of its B*F rows).
    overhead_s: per-round host work outside the passes (acceptance, bookkeeping), on the critical path of
        every method (AR included).
    miss_policy: "batch" or "sequences" (module docstring).
    """
    target: PassTime
    draft: PassTime
    alpha: float | tuple[float, ...] = 0.8
    k: int = 4
    batch_size: int = 1
    fanout: int | tuple[int, ...] = 1
    hit_rate: float | None = None
    rank_accept: float | None = None
    link_latency_s: float = 0.0
    fallback_s: float = 0.0
    overhead_s: float = 0.0
    miss_policy: str = "sequences"
    tp: TensorParallel = field(default_factory=TensorParallel)
    draft_host: HostCost = field(default_factory=HostCost)

    def __post_init__(self):
        if self.k < 1 or int(self.k) != self.k:
            raise ValueError(f"k must be an integer >= 1, got {self.k}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        alphas = self.alphas
        if any(not 0.0 <= a <= 1.0 for a in alphas):
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        f = self.fanouts
        if any(x < 0 or int(x) != x for x in f):
            raise ValueError(f"fanout must be non-negative integers, got {self.fanout}")
        if self.hit_rate is not None and not 0.0 <= self.hit_rate <= 1.0:
            raise ValueError(f"hit_rate must be in [0, 1] or None, got {self.hit_rate}")
        if self.rank_accept is not None and not 0.0 <= self.rank_accept <= 1.0:
            raise ValueError(f"rank_accept must be in [0, 1] or None, got {self.rank_accept}")
        if min(self.link_latency_s, self.fallback_s, self.overhead_s) < 0:
            raise ValueError("link_latency_s, fallback_s and overhead_s must be >= 0")
        if self.miss_policy not in MISS_POLICIES:
            raise ValueError(f"miss_policy must be one of {MISS_POLICIES}, got {self.miss_policy!r}")

    @property
    def alphas(self) -> tuple[float, ...]:
        """K per-position acceptance probabilities."""
        if isinstance(self.alpha, (int, float)):
            return (float(self.alpha),) * self.k
        if len(self.alpha) != self.k:
            raise ValueError(f"alpha has {len(self.alpha)} values, expected K={self.k}")
        return tuple(float(a) for a in self.alpha)

    @property
    def fanouts(self) -> tuple[int, ...]:
        """K+1 per-position fan-outs."""
        if isinstance(self.fanout, int):
            return (self.fanout,) * (self.k + 1)
        if len(self.fanout) != self.k + 1:
            raise ValueError(f"fanout has {len(self.fanout)} values, expected K+1={self.k + 1}")
        return tuple(int(f) for f in self.fanout)

    @property
    def branches(self) -> int:
        """Pre-speculated branches per sequence (sum of the per-position fan-outs)."""
        return sum(self.fanouts)


# ----------------------------------------------------------------------------------------- acceptance maths
def accepted_distribution(alphas: Sequence[float]) -> list[float]:
    """P(num_accepted = j) for j = 0..K under per-position acceptance ``alphas`` (K values)."""
    probs, reach = [], 1.0
    for a in alphas:
        probs.append(reach * (1.0 - a))
        reach *= a
    probs.append(reach)
    return probs


def expected_tokens(alphas: Sequence[float]) -> float:
    """E_SD: expected accepted drafts + the recovery/bonus token, per sequence per round."""
    return sum(j * p for j, p in enumerate(accepted_distribution(alphas))) + 1.0


def derived_hit_rate(alphas: Sequence[float], fanouts: Sequence[int], rank_accept: float) -> float:
    """Per-sequence probability that the round's outcome (j, token) is among the pre-speculated ones."""
    if len(fanouts) != len(alphas) + 1:
        raise ValueError(f"need K+1={len(alphas) + 1} fan-outs, got {len(fanouts)}")
    miss_each = 1.0 - rank_accept
    return sum(p * (1.0 - miss_each ** f) for p, f in zip(accepted_distribution(alphas), fanouts))


def fanout_for_budget(alphas: Sequence[float], budget: int, policy: str = "profile",
                      rank_accept: float | None = None) -> tuple[int, ...]:
    """Split ``budget`` pre-speculated branches (per sequence) over the K+1 positions.

    uniform: equal shares, the remainder to the earliest positions.
    geometric: shares proportional to P(num_accepted = j) (largest remainders first).
    profile: greedy on the marginal hit probability P(j) beta (1 - beta)^F_j, optimal for the hit model.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if policy not in FANOUT_POLICIES:
        raise ValueError(f"policy must be one of {FANOUT_POLICIES}, got {policy!r}")
    positions = len(alphas) + 1
    probs = accepted_distribution(alphas)
    if policy == "uniform":
        base, extra = divmod(budget, positions)
        return tuple(base + (1 if j < extra else 0) for j in range(positions))
    if policy == "geometric":
        total = sum(probs) or 1.0
        shares = [budget * p / total for p in probs]
        out = [math.floor(s) for s in shares]
        order = sorted(range(positions), key=lambda j: (-(shares[j] - out[j]), j))
        for j in order[: budget - sum(out)]:
            out[j] += 1
        return tuple(out)
    beta = sum(alphas) / len(alphas) if rank_accept is None else rank_accept
    out = [0] * positions
    for _ in range(budget):
        j = max(range(positions), key=lambda j: (probs[j] * beta * (1.0 - beta) ** out[j], -j))
        out[j] += 1
    return tuple(out)


def hit_rate(cfg: SimConfig) -> float:
    """The per-sequence SSD hit rate of ``cfg`` (given, or derived from alpha and the fan-out)."""
    if cfg.hit_rate is not None:
        return cfg.hit_rate
    alphas = cfg.alphas
    beta = sum(alphas) / len(alphas) if cfg.rank_accept is None else cfg.rank_accept
    return derived_hit_rate(alphas, cfg.fanouts, beta)


# ----------------------------------------------------------------------------------------- event timeline
@dataclass(frozen=True)
class Interval:
    """One activity on one resource: resource in {"target", "draft", "link"}."""
    resource: str
    activity: str
    start: float
    end: float


@dataclass
class Timeline:
    """The events of one round; ``end`` is when the next round's target pass can start."""
    intervals: list[Interval] = field(default_factory=list)
    end: float = 0.0

    def add(self, resource: str, activity: str, start: float, duration: float) -> float:
        if duration > 0:
            self.intervals.append(Interval(resource, activity, start, start + duration))
        return start + duration

    def busy(self, resource: str, start: float | None = None, end: float | None = None) -> float:
        """Seconds ``resource`` is busy within [start, end] (default: the round [0, end])."""
        lo = 0.0 if start is None else start
        hi = self.end if end is None else end
        return sum(max(0.0, min(i.end, hi) - max(i.start, lo)) for i in self.intervals if i.resource == resource)


def target_pass(cfg: SimConfig, tokens: float) -> tuple[float, float]:
    """(compute, all-reduce) seconds of one target pass (TP-aware)."""
    return cfg.tp.pass_s(cfg.target, tokens)


def ar_round(cfg: SimConfig) -> Timeline:
    tl = Timeline()
    compute, comm = target_pass(cfg, cfg.batch_size)
    t = tl.add("target", "target pass", 0.0, compute)
    t = tl.add("target", "all-reduce", t, comm)
    tl.end = tl.add("target", "overhead", t, cfg.overhead_s)
    return tl


def sd_round(cfg: SimConfig) -> Timeline:
    """Draft K steps, send drafts, verify, send the outcome back (link latency 0 = one GPU)."""
    tl = Timeline()
    B, K, L = cfg.batch_size, cfg.k, cfg.link_latency_s
    t = 0.0
    for _ in range(K):
        t = tl.add("draft", "draft step", t, cfg.draft(B))
    t = tl.add("link", "drafts to target", t, L)
    compute, comm = target_pass(cfg, B * (K + 1))
    t = tl.add("target", "target pass", t, compute)
    t = tl.add("target", "all-reduce", t, comm)
    t = tl.add("target", "overhead", t, cfg.overhead_s)
    tl.end = tl.add("link", "outcome to draft", t, L)
    return tl


def prespeculation_s(cfg: SimConfig) -> float:
    """Seconds of one pre-speculation: the draft rank's host work, then K + 1 draft passes of B*F rows (0 when
    nothing is pre-speculated)."""
    rows = cfg.batch_size * cfg.branches
    return cfg.draft_host(rows) + (cfg.k + 1) * cfg.draft(rows) if rows else 0.0


def ssd_round(cfg: SimConfig, num_missed: int) -> Timeline:
    """One SSD round in which ``num_missed`` of the B sequences missed the speculation cache.

    The draft began pre-speculating this round's successors one link latency before the target pass started
    (right after it sent this round's drafts). Time 0 = the target pass starts. Charged as the draft rank runs
    (module docstring): pre-speculation = host work + K + 1 passes of B*F rows, a spot draft K + 1 passes."""
    tl = Timeline()
    B, K, L = cfg.batch_size, cfg.k, cfg.link_latency_s
    prespec = prespeculation_s(cfg)
    tl.add("draft", "pre-speculation", -L, prespec)
    compute, comm = target_pass(cfg, B * (K + 1))
    t = tl.add("target", "target pass", 0.0, compute)
    t = tl.add("target", "all-reduce", t, comm)
    t = tl.add("target", "overhead", t, cfg.overhead_s)
    outcome_at = tl.add("link", "outcome to draft", t, L)
    ready = max(outcome_at, prespec - L)              # the draft finishes its pre-speculation pass first
    if num_missed:
        redraft = B if cfg.miss_policy == "batch" else num_missed
        ready = tl.add("draft", "miss fallback", ready, cfg.fallback_s)
        for _ in range(K + 1):
            ready = tl.add("draft", "draft on the spot", ready, cfg.draft(redraft))
    tl.end = tl.add("link", "drafts to target", ready, L)
    return tl


def _breakdown(tl: Timeline) -> dict:
    """Critical-path split of one round: target busy, exposed draft (target waits on it), communication."""
    target_busy = tl.busy("target")
    comm = sum(i.end - i.start for i in tl.intervals if i.resource == "link") + \
        sum(i.end - i.start for i in tl.intervals if i.activity == "all-reduce")
    allreduce = sum(i.end - i.start for i in tl.intervals if i.activity == "all-reduce")
    link = comm - allreduce
    waiting = max(0.0, tl.end - target_busy - link)   # target idle, waiting on the draft
    return {"round_s": tl.end, "target_busy_s": target_busy - allreduce, "allreduce_s": allreduce,
            "link_s": link, "draft_busy_s": tl.busy("draft", start=-math.inf, end=math.inf),
            "target_waiting_s": waiting}


def _binomial(n: int, p: float) -> list[float]:
    return [math.comb(n, m) * p ** m * (1 - p) ** (n - m) for m in range(n + 1)]


# ----------------------------------------------------------------------------------------- predictions
def predict(cfg: SimConfig, method: str) -> dict:
    """Steady-state prediction for one method: a row with tokens/s, tokens per round and the expected round
    timeline (seconds): target_busy_s (compute), allreduce_s, link_s, draft_busy_s, target_waiting_s."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    B = cfg.batch_size
    row = {"method": method, "alpha": cfg.alpha, "k": cfg.k, "batch_size": B, "tp": cfg.tp.ranks,
           "fanout": cfg.fanout if method == "ssd" else 0, "hit_rate": None}
    if method == "ar":
        parts = _breakdown(ar_round(cfg))
        tokens = float(B)
    elif method == "sd":
        parts = _breakdown(sd_round(cfg))
        tokens = B * expected_tokens(cfg.alphas)
    else:
        p = hit_rate(cfg)
        weights = _binomial(B, 1.0 - p)               # P(num_missed = m)
        parts = {}
        for m, w in enumerate(weights):
            if w == 0.0:
                continue
            for key, val in _breakdown(ssd_round(cfg, m)).items():
                parts[key] = parts.get(key, 0.0) + w * val
        tokens = B * expected_tokens(cfg.alphas)
        row["hit_rate"] = p
        row["batch_hit_rate"] = p ** B
    row.update(parts)
    row["tokens_per_round"] = tokens
    row["tokens_per_s"] = tokens / parts["round_s"]
    return row


def compare(cfg: SimConfig) -> list[dict]:
    """AR, SD and SSD rows for ``cfg``, each with ``speedup_vs_ar``."""
    rows = [predict(cfg, m) for m in METHODS]
    ar = rows[0]["tokens_per_s"]
    for r in rows:
        r["speedup_vs_ar"] = r["tokens_per_s"] / ar
    return rows


def simulate(cfg: SimConfig, method: str, num_rounds: int, seed: int = 0) -> list[dict]:
    """Draw ``num_rounds`` rounds at random (accepted counts and hits per sequence); one row per round
    with its tokens, seconds, misses and timeline split. Averages converge to ``predict``."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be >= 1, got {num_rounds}")
    rng = random.Random(seed)
    probs = accepted_distribution(cfg.alphas)
    p = hit_rate(cfg) if method == "ssd" else 0.0
    rows = []
    for r in range(num_rounds):
        if method == "ar":
            tl, tokens, missed = ar_round(cfg), cfg.batch_size, 0
        else:
            accepted = rng.choices(range(cfg.k + 1), weights=probs, k=cfg.batch_size)
            tokens = sum(a + 1 for a in accepted)
            missed = sum(rng.random() >= p for _ in range(cfg.batch_size)) if method == "ssd" else 0
            tl = sd_round(cfg) if method == "sd" else ssd_round(cfg, missed)
        row = {"round": r, "method": method, "tokens": tokens, "missed": missed}
        row.update(_breakdown(tl))
        rows.append(row)
    return rows


def sweep(base: SimConfig, **axes) -> list[dict]:
    """``compare`` over the Cartesian product of the given SimConfig fields, e.g.
    sweep(cfg, alpha=[0.6, 0.8], k=[2, 4]); each row carries the swept values."""
    names = list(axes)
    rows = []

    def rec(i: int, changes: dict):
        if i == len(names):
            for row in compare(replace(base, **changes)):
                row.update(changes)
                rows.append(row)
            return
        for v in axes[names[i]]:
            rec(i + 1, {**changes, names[i]: v})

    rec(0, {})
    return rows


# ----------------------------------------------------------------------------------------- the budget F
@dataclass(frozen=True)
class SSDCosts:
    """The measured costs of an SSD round, from which the draft rank picks its budget F (``best_budget``).

    targets: ((batch size, PassTime over tokens per sequence), ...), ascending batch sizes: the target's verify
        pass of [B, n] tokens. A batch between two measured sizes costs as the next larger one (the graph bucket
        it runs in), a batch beyond the largest as the largest (an underestimate: measure the batches you run).
    draft: one draft pass vs its rows. draft_host: the draft rank's host work before a pre-speculation's passes.
    link_latency_s, overhead_s, fallback_s: as in ``SimConfig``.
    ``from_results`` builds one from ``benchmarks/ssd_calibrate.py``'s JSON (passes) and, for the host term,
    ``benchmarks/ssd_gpu_check.py``'s (the draft rank's host time before its passes, by rows)."""
    targets: tuple[tuple[int, PassTime], ...]
    draft: PassTime
    draft_host: HostCost = field(default_factory=HostCost)
    link_latency_s: float = 0.0
    overhead_s: float = 0.0
    fallback_s: float = 0.0

    def __post_init__(self):
        sizes = [b for b, _ in self.targets]
        if not sizes or sizes != sorted(set(sizes)) or sizes[0] < 1:
            raise ValueError(f"SSDCosts.targets needs ascending distinct batch sizes >= 1, got {sizes}")
        if min(self.link_latency_s, self.overhead_s, self.fallback_s) < 0:
            raise ValueError("SSDCosts: link_latency_s, overhead_s and fallback_s must be >= 0")

    def target(self, batch_size: int) -> PassTime:
        """The target's pass time over the tokens of a whole [batch_size, n] pass."""
        sizes = [b for b, _ in self.targets]
        per_row = self.targets[min(bisect.bisect_left(sizes, batch_size), len(sizes) - 1)][1]
        return PassTime(tuple((batch_size * n, s) for n, s in per_row.points))

    def sim_config(self, batch_size: int, alphas: Sequence[float], fanout: int | tuple[int, ...],
                   rank_accept: float | None = None) -> SimConfig:
        """The simulator's SSD regime for these costs: K = len(alphas) drafts per round."""
        return SimConfig(self.target(batch_size), self.draft, alpha=tuple(alphas), k=len(alphas),
                         batch_size=batch_size, fanout=fanout, rank_accept=rank_accept,
                         link_latency_s=self.link_latency_s, overhead_s=self.overhead_s, fallback_s=self.fallback_s,
                         draft_host=self.draft_host)

    @classmethod
    def from_results(cls, calibration: dict, measured: dict | None = None, *, link_latency_s: float = 0.0,
                     overhead_s: float = 0.0) -> "SSDCosts":
        """calibration: ``ssd_calibrate.py``'s JSON ({"target": {B: {n: s}}, "draft": {rows: s}}); measured:
        ``ssd_gpu_check.py``'s ({"per_round": [{"rows", "host_before_loop_ms": [after a miss, after a hit]}]}),
        whose host times fit ``draft_host`` (without it the host work is 0: optimistic)."""
        for key in ("target", "draft"):
            if key not in calibration:
                raise ValueError(f"not an ssd_calibrate.py result: no {key!r} section")
        targets = tuple(sorted((int(b), PassTime(tuple((int(n), s) for n, s in row.items())))
                               for b, row in calibration["target"].items()))
        draft = PassTime(tuple((int(r), s) for r, s in calibration["draft"].items()))
        host = HostCost() if measured is None else HostCost.from_gpu_check(measured)
        return cls(targets, draft, host, link_latency_s=link_latency_s, overhead_s=overhead_s)


def best_budget(costs: SSDCosts, batch_size: int, alphas: Sequence[float], max_budget: int,
                policy: str = "profile", rank_accept: float | None = None) -> int:
    """The budget F in 0..max_budget (branches per sequence) whose SSD round has the most expected tokens per
    second under this module's round model at ``costs``, the per-position acceptance ``alphas`` (K values), the
    hit model's ``rank_accept`` (beta; None: the mean of alphas) and the fan-out ``policy``; the smallest F on
    ties (a branch that buys nothing costs rows). F = 0 (nothing pre-speculated: every round drafts on the spot)
    wins when no pre-speculation pays for the time it adds."""
    if max_budget < 0:
        raise ValueError(f"max_budget must be >= 0, got {max_budget}")
    best, best_rate = 0, -1.0
    for f in range(max_budget + 1):
        fanout = fanout_for_budget(alphas, f, policy, rank_accept)
        rate = predict(costs.sim_config(batch_size, alphas, fanout, rank_accept), "ssd")["tokens_per_s"]
        if rate > best_rate * (1 + 1e-12):
            best, best_rate = f, rate
    return best
