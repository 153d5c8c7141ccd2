"""Continuous batching: requests join the running batch between rounds and leave it the moment they end.

    submit(request)     queue it (checked against the cache's size first)
    step()              1. admit waiting requests into free rows: target prefill of just those rows, their
                           first token (verification with 0 drafts), the drafter's admit
                        2. one round for every running row (``round.run_round``), k per row from the policy
                        3. retire rows that ended (length, EOS, stop string, cancel): compact the target cache,
                           the drafter and the batch state so the running rows stay the prefix [0, B)
    cancel(request_id)  a waiting request is dropped; a running one ends at the next step

The running rows are always the cache prefix [0, B) (see verispec/runtime/cache.py), so the target pass runs
in the CUDA graph of B's bucket. A request's tokens depend only on itself: the target pass computes each row
independently, verification and drafting draw from each request's own seeded stream, and the k policy gives a
row a k that depends on that row alone (``auto_k.AutoK``; a greedy row's tokens do not depend on k).

A fault ends the request it belongs to and nothing else (docs/engine.md, "Faults"): a prefill that raises
is retried one request at a time, a row whose logits verification refuses or whose drafter fails
(``DraftError``) fails alone. With ``isolate_drafter=True`` (the server) a drafter exception that names no row
fails nobody: the drafter is set aside (plain decode steps) until every request that was running then has
ended, then restarts empty with the rows running at that point, none of which has drafted yet; by default it
propagates out of ``step`` (``generate``: the caller's own drafter is broken). Only a failure of the shared
target pass fails every running request.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from ..drafters.base import Drafter, SamplingParams
from ..drafters.dynamic_tree import DynamicTree, parse_tree_spec
from ..runtime.cache import fill_order
from ..runtime.tree import TREE_WIDTHS, tree_width
from .request import Request, Sequence
from .round import (PhaseClock, RoundResult, RunningBatch, failed_rows, read_outcome, run_round, verification,
                    warm_verification)
from .tree_round import run_tree_round, warm_tree_verification
from .stats import Stats

log = logging.getLogger(__name__)

KPolicy = Callable[[list[Sequence], int], list[int]]   # (running sequences, K max) -> drafts per row

# Launch the next round's drafts from each round's outcome on the device, before the host reads it, when that round's
# shape is known then (``Scheduler._next_shape``, ``Drafter.prelaunch``); a scheduler's ``prelaunch`` starts from this.
PRELAUNCH = True


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int            # rows of the target cache: requests running at once
    max_seq_len: int               # tokens a sequence may hold: prompt + new tokens + one round's lookahead
    k: int = 4                     # drafts per round (the most any row gets; 0 = plain decoding)
    max_waiting: int | None = None # queued requests beyond which submit() refuses (None = unbounded)
    # draft trees: children per node at each depth (None = chains of k); a DynamicTree (or "dyn:D,K,N"): the draft
    # model's beam (drafters/dynamic_tree.py); "auto": the k_policy (an AutoK with trees) picks plain decoding, a chain
    # of up to k drafts or one of its trees each round
    tree: tuple[int, ...] | str | DynamicTree | None = None


def tree_nodes(widths) -> int:
    """Nodes of the full tree of ``widths`` children per node at each depth: w1 + w1*w2 + ... e.g. (4, 2, 2, 1)
    -> 4 + 8 + 16 + 16 = 44; a ``DynamicTree``'s fixed count (dyn:4,2,8 -> 2 + 4 + 8 + 8 = 22)."""
    if isinstance(widths, DynamicTree):
        return widths.num_nodes
    total, level = 0, 1
    for w in widths:
        level *= w
        total += level
    return total


class QueueFull(RuntimeError):
    """submit() found ``max_waiting`` requests already queued."""


class Scheduler:
    """One target (+ drafter) serving a stream of ``Request``s; see the module docstring.

    ``k_policy(running, k)`` picks each row's number of drafts per round (default: k for every row);
    ``verify_backend`` goes to verify_greedy / verify_sample; ``timing=True`` synchronizes around phases;
    ``isolate_drafter=True``: a drafter exception that names no row sets the drafter aside instead of raising.
    """

    def __init__(self, target, drafter: Drafter | None, config: SchedulerConfig, *, k_policy: KPolicy | None = None,
                 verify_backend: str | None = None, timing: bool = False, isolate_drafter: bool = False):
        if config.max_batch_size < 1 or config.max_seq_len < 2:
            raise ValueError(f"max_batch_size must be >= 1 and max_seq_len >= 2, got {config}")
        self.target, self.drafter, self.config = target, drafter, config
        self.k = config.k if drafter is not None else 0
        # tree="auto": the policy's trees and chains of up to k_max drafts, shape by shape (``AutoK.decide``)
        self.tree_auto = config.tree == "auto" and drafter is not None
        self.auto_trees: tuple[tuple[int, ...], ...] = ()
        if self.tree_auto:
            self.auto_trees = tuple(getattr(k_policy, "trees", ()))
            if not hasattr(k_policy, "decide") or not self.auto_trees:
                raise ValueError("tree='auto' needs a k_policy that chooses trees: AutoK(costs, trees=AUTO_TREES)")
        # a tree round appends the certain token and every node of the tree: its lookahead is the tree's size
        self.tree = (parse_tree_spec(config.tree) or tuple(config.tree)
                     if config.tree is not None and config.tree != "auto" and drafter is not None else None)
        self.k_max = self.k                  # the chains' K (the policy's k_max)
        if self.tree is not None:
            self.k = tree_nodes(self.tree)
        elif self.tree_auto:
            self.k = max([self.k_max] + [tree_nodes(t) for t in self.auto_trees])
        self.k_policy = k_policy or (lambda running, k: [k] * len(running))
        self._fixed_k = k_policy is None and self.tree is None and not self.tree_auto
        # the most positions a round tests (its emitted tokens - 1)
        self._deepest = (len(self.tree) if isinstance(self.tree, tuple) else
                         max([self.k_max] + [len(t) for t in self.auto_trees]))
        self.prelaunch = PRELAUNCH
        self.verify_backend = verify_backend
        self.isolate_drafter = isolate_drafter
        self.clock = PhaseClock(target.device, timing)
        self.timed = timing or target.device.type != "cuda"
        tok = target.tokenizer
        self.eos = set(tok.eos_token_ids) if tok is not None else set()
        self.decode = tok.decode if tok is not None else None
        self.waiting: deque[Sequence] = deque()
        self.totals = Stats(timed_phases=self.timed)   # counts and phase times of everything run so far
        self.round_hook: Callable[["Scheduler"], None] | None = None   # after every round and its retire (tests)
        # called in every round once the target pass is launched: on a GPU the host then only launches the
        # verification and waits for the device, so a caller's own work done here overlaps the device's (the
        # server hands the previous round's tokens to its event loop here: serve/engine.py)
        self.launched_hook: Callable[[], None] | None = None
        # called once after a step's admissions delivered their first tokens, before its round drafts: the server
        # hands those tokens to its event loop here, so that a new request's first token does not wait for the next
        # round's drafting (a draft model's K passes; its lazy prefill of the new rows)
        self.admitted_hook: Callable[[], None] | None = None
        self.drafter_fault: str | None = None          # why the drafter is set aside (None: in use)
        self.drafter_faults = 0                        # drafter exceptions that named no row, so far
        self._fault_rows: set[int] = set()             # ids of the requests running at the last such fault
        self._admitted = False                         # this step admitted requests (its round is no cost sample)
        self._plan = None                              # tree="auto": the next round's shape, planned during this one
        target.setup_cache(config.max_batch_size, config.max_seq_len, empty=True)
        if drafter is not None:
            drafter.reserve(target, config.max_batch_size, config.max_seq_len)
        self.batch = RunningBatch.empty(target.device)   # the running sequences, in cache row order

    @property
    def running(self) -> list[Sequence]:
        """The running sequences, in cache row order (``batch.seqs``: read it, never change it)."""
        return self.batch.seqs

    # ------------------------------------------------------------------------------------ requests
    def room_needed(self, request: Request) -> int:
        """Cache slots the request can use: its prompt, its new tokens and one round of lookahead."""
        return len(request.prompt) + request.max_new_tokens + self.k + 1

    def submit(self, request: Request) -> Sequence:
        """Queue ``request``; ValueError if it can never fit, QueueFull if the queue is at its bound."""
        if not request.prompt:
            raise ValueError("empty prompt: give at least one token")
        need = self.room_needed(request)
        if need > self.config.max_seq_len:
            raise ValueError(f"prompt ({len(request.prompt)} tokens) + max_new_tokens {request.max_new_tokens} + "
                             f"lookahead {self.k + 1} = {need} exceeds max_seq_len {self.config.max_seq_len}")
        if self.config.max_waiting is not None and len(self.waiting) >= self.config.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests are already waiting (max_waiting)")
        seq = Sequence(request, Stats(prompt_tokens=len(request.prompt), seed=request.seed, timed_phases=self.timed))
        self.waiting.append(seq)
        return seq

    def cancel(self, request_id: int) -> bool:
        """Cancel a waiting or running request; False if it is not here (finished or unknown)."""
        for seq in list(self.waiting):
            if seq.request.id == request_id:
                self.waiting.remove(seq)
                seq.finish_reason = "cancelled"
                return True
        for seq in self.running:
            if seq.request.id == request_id and seq.finish_reason is None:
                seq.finish_reason = "cancelled"
                return True
        return False

    def warm_up(self, settings=((0.0, 0, 1.0),), prompt_tokens: int = 512) -> int:
        """Capture, before requests run, every CUDA graph this scheduler's rounds and admissions can replay: the
        target's passes for each batch bucket up to max_batch_size and each width up to k + 1, its prefill graphs
        for prompts of up to ``prompt_tokens`` tokens, and the drafter's (its draft loops for each sampling
        setting in ``settings``: (temperature, top_k, top_p) tuples). Without it the first round of each new shape
        captures inside a request. Time and count go to ``totals`` (warmup_s, graphs_captured)."""
        t0 = time.perf_counter()
        if self.tree_auto:       # a round may be any of them: every chain k and every tree
            n = self._warm_up_chains(list(settings), prompt_tokens) + self._warm_up_trees(
                self.auto_trees, list(settings), prompt_tokens)
        elif self.tree is not None:
            n = self._warm_up_trees((self.tree,), list(settings), prompt_tokens)
        else:
            n = self._warm_up_chains(list(settings), prompt_tokens)
        self.totals.warmup_s += time.perf_counter() - t0
        self.totals.graphs_captured += n
        return n

    def _warm_up_chains(self, settings: list[tuple[float, int, float]], prompt_tokens: int) -> int:
        """The chain rounds' graphs (target passes of 1..k_max + 1 tokens, the drafter's loops) and verification."""
        n = 0
        if hasattr(self.target, "warm_up"):
            n += self.target.warm_up(self.config.max_batch_size, self.k_max + 1, prompt_tokens)
        if self.drafter is not None and self.k_max:
            n += self.drafter.warm_up(self.config.max_batch_size, self.k_max, settings, prompt_tokens)
        self._warm_verification(settings)
        return n

    def _warm_up_trees(self, trees, settings: list[tuple[float, int, float]], prompt_tokens: int) -> int:
        """The tree rounds' graphs of every shape in ``trees``: the target's tree passes of every node bucket up to
        the largest tree (a prompt-lookup trie may be smaller) and of each full tree's exact width (a draft model's
        trees are always full, its dynamic trees always of their fixed count), the drafter's tree passes, both
        prefill graphs; the tree verification's kernels."""
        B, n = self.config.max_batch_size, 0
        largest = max(tree_nodes(t) for t in trees)
        if hasattr(self.target, "warm_up_tree"):
            n += self.target.warm_up(B, 1, prompt_tokens)
            for w in TREE_WIDTHS:
                if w <= tree_width(largest + 1):
                    n += self.target.warm_up_tree(B, (-1,) + (0,) * (w - 1), w)
            for tree in trees:
                nodes = tree_nodes(tree)
                n += self.target.warm_up_tree(B, (-1,) + (0,) * nodes, nodes + 1, exact=True)
        for tree in trees:
            if self.drafting:
                n += self.drafter.warm_up_tree(B, tree, prompt_tokens)
            if self.target.device.type == "cuda":
                warm_tree_verification(self.target.device, self.target.dtype, self.target.config.vocab_size, B,
                                       tree, settings, self.verify_backend)
        return n

    def _warm_verification(self, settings: list[tuple[float, int, float]]) -> None:
        """On a GPU: ``warm_verification`` for every batch size and draft count this scheduler will see."""
        if self.target.device.type == "cuda":
            warm_verification(self.target.device, self.target.dtype, self.target.config.vocab_size,
                              self.config.max_batch_size, self.k_max, settings, self.verify_backend)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def drafting(self) -> bool:
        """Whether the drafter is in use (there is one and it is not set aside after a fault)."""
        return self.drafter is not None and self.drafter_fault is None

    # ------------------------------------------------------------------------------------ the loop
    def step(self) -> list[Sequence]:
        """Admit, run one round, retire; returns the sequences that ended in this step."""
        ended = self._retire()                # cancellations since the last step
        self._admitted = False
        ended += self._admit()                # requests whose admission failed (they never joined the batch)
        if self._admitted and self.admitted_hook is not None:
            self.admitted_hook()
        ended += self._retire()               # requests done after their first token
        if self.running:
            self._round()
            ended += self._retire()
            if self.round_hook is not None:
                self.round_hook(self)
        if self._plan is not None and not self.running:     # every row ended: no round will adopt or drop it
            self.k_policy.drop(self._plan)
            self._plan = None
        self._restart_drafter()
        return ended

    def run(self) -> None:
        """Step until every submitted request has ended."""
        while not self.idle:
            self.step()

    @staticmethod
    def _sampling(seqs: list[Sequence]) -> SamplingParams:
        return SamplingParams(tuple(s.request.sampling for s in seqs))

    def _admit(self) -> list[Sequence]:
        """Admit waiting requests into free rows; returns those whose admission raised (they end at once)."""
        free = self.config.max_batch_size - len(self.running)
        if free <= 0 or not self.waiting:
            return []
        new = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
        t0 = time.perf_counter()
        try:
            certain, outcome = self._prefill(new)
            refused: list[Sequence] = []
        except Exception:  # noqa: BLE001 - whose fault? One at a time: a request whose own prefill raises fails alone
            certain, outcome, refused = self._prefill_one_by_one(new)
            new = [s for s in new if s not in refused]
        if new:
            first_host = [row[1] for row in outcome]
            bad = failed_rows(outcome, "the prompt's logits")
            sampling = self._sampling(new)
            if self.drafting:
                self._call_drafter("admit", [s.request.id for s in new], [s.request.prompt for s in new],
                                   first_host, sampling)
            self.batch.extend(certain, new)
            self._admitted = True
            t1 = self.clock.now()
            for j, (seq, token) in enumerate(zip(new, first_host)):
                seq.stats.queue_s = t0 - seq.request.submitted_at
                seq.stats.prefill_s = t1 - t0
                if j in bad:          # admitted without a token; it leaves at the next retire
                    seq.finish_reason, seq.error = "error", bad[j]
                else:
                    self._deliver(seq, [token])
        now = time.perf_counter()
        for seq in refused:
            seq.stats.queue_s = t0 - seq.request.submitted_at
            seq.stats.total_s = now - seq.request.submitted_at
        return refused

    def _prefill(self, seqs: list[Sequence]) -> tuple[torch.Tensor, list[list[int]]]:
        """Target prefill of ``seqs`` into the rows after the running ones and their first token (verification
        with 0 drafts) -> (first tokens [n, 1] on the device, ``read_outcome`` rows on the host)."""
        sampling = self._sampling(seqs)
        logits = self.target.admit([s.request.prompt for s in seqs])                       # [n, V]
        none = torch.zeros(0, dtype=torch.long, device=logits.device)
        first = verification(logits, none, [0] * len(seqs), 0, None, sampling, [0] * len(seqs),
                             self.verify_backend)
        # NOTE: host sync: the first tokens decide EOS / stop and seed the drafter's history
        return first.tokens[:, :1].to(torch.long), read_outcome(first)

    def _prefill_one_by_one(self, seqs: list[Sequence]) -> tuple[torch.Tensor | None, list[list[int]], list[Sequence]]:
        """After a group prefill raised: each request alone, so that a failure (out of memory, a prompt the
        model refuses) is its own -> (first tokens, outcome rows of the admitted ones, the refused ones)."""
        certain, outcome, refused = [], [], []
        for seq in seqs:
            self._drop_rows_from(len(self.running) + len(outcome))          # a failed admit's partial rows
            try:
                c, rows = self._prefill([seq])
            except Exception as e:  # noqa: BLE001 - this request's own admission failed
                seq.finish_reason, seq.error = "error", f"admission failed: {type(e).__name__}: {e}"
                refused.append(seq)
                continue
            certain.append(c)
            outcome += rows
        self._drop_rows_from(len(self.running) + len(outcome))
        return (torch.cat(certain) if certain else None), outcome, refused

    def _drop_rows_from(self, num_rows: int) -> None:
        """Cut the target's batch back to its first ``num_rows`` rows (rows a failed admit may have added)."""
        if len(self.target.lengths) > num_rows:
            self.target.keep(list(range(num_rows)))

    def _round(self) -> None:
        drafter = self.drafter if self.drafting else None
        t0 = time.perf_counter()
        prefilled = getattr(drafter, "prefill_tokens", 0)
        caught_up = getattr(drafter, "catch_up_passes", 0)
        if hasattr(self.k_policy, "debt_source"):     # what the rows owe before drafting (k=auto prices it)
            self.k_policy.debt_source = getattr(drafter, "draft_debt", None)
        # a policy that plans the next round's shape during this round's pass (``AutoK.plan_ahead``)
        planning = drafter is not None and self.k_max > 0 and getattr(self.k_policy, "plan_ahead", False)
        tree, planned, plan, self._plan = self.tree, None, self._plan, None
        if plan is not None:
            if planning:
                planned = self.k_policy.adopt(plan, self.running, self.k_max)
            else:                                     # the drafter was set aside since: the plan is void
                self.k_policy.drop(plan)
        if self.tree_auto and drafter is not None:
            caps, tree = planned or self.k_policy.decide(self.running, self.k_max)
        elif planned is not None:
            caps = planned[0]
        else:
            caps = (self.k_policy(self.running, self.k_max) if self.k_max and drafter is not None
                    else [0] * len(self.running))
        launched = self.launched_hook
        if planning and not self.waiting:
            launched = self._launched_and_plan
        next_shape = self._next_shape if drafter is not None and self.prelaunch else None
        try:
            if tree is not None and drafter is not None:
                result = run_tree_round(self.target, drafter, self.batch, tree, self.clock, self.verify_backend,
                                        launched, next_shape)
            else:
                result = run_round(self.target, drafter, self.batch, caps, self.clock, self.verify_backend, launched,
                                   next_shape)
        except Exception as e:  # noqa: BLE001 - the target pass is shared: every running request fails with it
            self._fail_running(e)
            return
        if result.draft_error is not None:
            self._drafter_failed(*result.draft_error)
        observe = getattr(self.k_policy, "observe_round", None)
        # the policy prices k by the rounds it ran (AutoK), and only by rounds that paid no one-time work: on a GPU
        # the drafter's admission work (a feature head's prompt pass) is still running when the round starts and
        # the round's one sync waits for it; a round in which the drafter prefilled rows drafting for the first time
        # (``DraftModel``'s lazy prefill) or caught up rows that had not drafted for a while paid that. Either would
        # price that k by its admissions or by its start (a few such rounds in the moving average double what a
        # plain round seems to cost at 32 rows on the 8B shape). A round whose only one-time work was the drafter's
        # goes to ``observe_debt_round`` instead: what it cost beyond its k's round prices the draft debt.
        drafter_debt = drafter is not None and (getattr(drafter, "prefill_tokens", 0) != prefilled
                                                or getattr(drafter, "catch_up_passes", 0) != caught_up)
        if observe is not None and (self.tree is None or self.tree_auto) and not self._admitted:
            shape = tree if tree is not None else max(result.num_draft, default=0)
            seconds = time.perf_counter() - t0
            if not drafter_debt:
                observe(len(self.running), shape, seconds)
            elif hasattr(self.k_policy, "observe_debt_round"):
                self.k_policy.observe_debt_round(len(self.running), shape, seconds)
        self._account(result)
        for seq, n, a in zip(self.running, result.num_draft, result.num_accepted):
            seq.stats.add_round(n, a)
        if self.tree_auto and tree is not None:      # a tree's acceptance is evidence on its widths, not the chain's
            self.k_policy.observe_tree(self.running, tree, result.num_draft, result.num_accepted)
        for b, (seq, chunk) in enumerate(zip(self.running, result.emitted)):
            if seq.finish_reason is not None:
                continue
            if b in result.failed:
                seq.finish_reason, seq.error = "error", result.failed[b]
            else:
                self._deliver(seq, chunk)

    def _next_shape(self) -> int | tuple[int, ...] | None:
        """The next round's shape (k for every row, or a tree's widths), if it is known before this round's outcome is
        read, else None: the drafter may then launch that round's drafts already (``Drafter.prelaunch``). Known with a
        fixed k (the default policy) or tree, or the shape ``AutoK.plan`` chose during this round's pass, for the same
        batch: none when a waiting request may be admitted first, or when a row may end by its length this round (a
        row that meets EOS or a stop string leaves with its drafts, the others keep theirs: ``Prelaunch.kept``)."""
        if self.waiting and len(self.running) < self.config.max_batch_size:
            return None
        if self._fixed_k:
            shape = self.k
        elif isinstance(self.tree, tuple):
            shape = self.tree
        elif self._plan is not None:
            shape = self._plan.shape
        else:
            return None
        if any(seq.tokens_left <= self._deepest + 1 for seq in self.running):
            return None
        return shape or None

    def _launched_and_plan(self) -> None:
        """The round's target pass is launched: the caller's hook, then the next round's shape (``AutoK.plan``), on
        the host while the device runs the pass."""
        if self.launched_hook is not None:
            self.launched_hook()
        self._plan = self.k_policy.plan(self.running, self.k_max)

    # ------------------------------------------------------------------------------------ drafter faults
    def _call_drafter(self, what: str, *args) -> None:
        """drafter.<what>(*args); an exception sets the drafter aside (``_drafter_failed``)."""
        try:
            getattr(self.drafter, what)(*args)
        except Exception as e:  # noqa: BLE001 - names no row: nobody fails, the drafter is set aside
            self._drafter_failed(what, e)

    def _drafter_failed(self, what: str, error: Exception) -> None:
        """The drafter raised without naming a row: its state can no longer be trusted for any row, and failing
        one request would be a guess. Drafting stops (plain decode steps, exact) until every request running now
        has ended; ``_restart_drafter`` then starts it afresh. Without ``isolate_drafter``: raise ``error``."""
        if not self.isolate_drafter:
            raise error
        self.drafter_fault = f"drafter.{what}: {type(error).__name__}: {error}"
        self.drafter_faults += 1
        self._fault_rows = {s.request.id for s in self.running}
        log.warning("%s; drafting stops until the %d running requests have ended", self.drafter_fault,
                    len(self._fault_rows))

    def _restart_drafter(self) -> None:
        """After a fault, once no request that was running at it remains: the drafter drops every row and takes
        in the running ones from their histories. None of them has drafted yet (they joined while it was set
        aside), so their draft streams start at 0 as in a run without the fault: sampling stays exact."""
        if self.drafter_fault is None or any(s.request.id in self._fault_rows for s in self.running):
            return
        try:
            self.drafter.keep([])
            if self.running:
                history = [s.request.prompt + s.generated for s in self.running]
                self.drafter.admit([s.request.id for s in self.running], [h[:-1] for h in history],
                                   [h[-1] for h in history], self.batch.sampling)
        except Exception as e:  # noqa: BLE001 - stays aside until these requests have ended too
            self._drafter_failed("restart", e)
            return
        log.warning("the drafter is back in use after: %s", self.drafter_fault)
        self.drafter_fault = None

    def _deliver(self, seq: Sequence, chunk: list[int]) -> None:
        kept = seq.emit(chunk, self.eos, self.decode)
        callback = seq.request.on_tokens
        if callback is not None and kept:
            try:
                callback(seq.request, kept)
            except Exception as e:  # noqa: BLE001 - a consumer's failure ends its own request only
                seq.finish_reason, seq.error = "error", f"{type(e).__name__}: {e}"

    def _account(self, result: RoundResult) -> None:
        t = self.totals
        t.rounds += 1
        t.proposed += sum(result.num_draft)
        t.accepted += sum(result.num_accepted)
        phase = result.phase_s
        draft, target, verification, commit = phase["draft"], phase["target"], phase["verification"], phase["commit"]
        for stats in [t] + [seq.stats for seq in self.running]:   # every row took part in the whole round
            stats.draft_s += draft
            stats.target_s += target
            stats.verification_s += verification
            stats.commit_s += commit

    def _fail_running(self, error: Exception) -> None:
        for seq in self.running:
            if seq.finish_reason is None:
                seq.finish_reason, seq.error = "error", f"{type(error).__name__}: {error}"

    def _retire(self) -> list[Sequence]:
        ended = [s for s in self.running if s.finish_reason is not None]
        if not ended:
            return []
        now = time.perf_counter()
        for seq in ended:
            seq.stats.total_s = now - seq.request.submitted_at
            seq.stats.decode_s = max(seq.stats.total_s - seq.stats.queue_s - seq.stats.prefill_s, 0.0)
            self.totals.new_tokens += len(seq.generated)
            self.totals.prompt_tokens += len(seq.request.prompt)
        still = [j for j, s in enumerate(self.running) if s.finish_reason is None]
        # rows stay put where they can; the tail fills the holes (keep copies only the rows that move)
        order = fill_order(len(self.running), still)
        self.target.keep(order)
        if self.drafting:
            self._call_drafter("keep", order)
        self.batch.keep(order)
        return ended
