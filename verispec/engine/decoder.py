"""The static-batch driver: ``generate(model, prompts, ...)`` submits every prompt to a ``Scheduler`` sized
for them and steps it until all have ended. One engine: the server drives the same scheduler with requests
that arrive over time. ``drafter=None`` is plain autoregressive decoding through the same loop (the baseline).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence as Seq

from ..drafters.base import Drafter
from . import auto_k
from .auto_k import AutoK, CostTable, default_batch_sizes, measure_costs
from .guards import (ModelLease, check_drafter, check_k, check_max_new_tokens, check_prompts, check_same_model,
                     check_sampling, check_stop, check_tree)
from .request import Request, Sequence
from .scheduler import Scheduler, SchedulerConfig, tree_nodes
from .stats import Generation, Stats


class SpeculativeDecoder:
    """Speculative decoding of ``target`` with ``drafter`` (None = plain decoding), k drafts/round.

    ``timing=True`` synchronizes the device around each phase so that the per-phase times in
    ``Stats`` are exact on GPUs (CPU timings are always exact); it costs a little throughput.
    ``isolate_drafter=True``: a drafter exception that names no row sets the drafter aside (plain decode steps,
    exact) instead of raising (``Scheduler``; the SSD launch uses it: a draft rank that died is not a failed run).
    ``verify_backend`` is passed to ``verify_greedy`` / ``verify_sample`` (None = fastest available).
    ``warm=True``: before the run, capture every CUDA graph it can replay (``Scheduler.warm_up``; once per model
    and shape), so that no request captures; its time is ``Stats.warmup_s``, outside the timed run.
    ``tree=[w1, ..., wd]``: each round drafts a tree of w_i children per node at depth i and verifies it in one
    tree pass (engine/tree_round.py); ``k`` is then unused. None: chains of k drafts. ``tree="auto"``: each round
    plain decoding, a chain of up to k drafts or one of ``auto_k.AUTO_TREES`` (read at each call), whichever the
    cost model predicts the most tokens per second for (``AutoK.decide``; trees only for greedy batches), priced
    by ``costs`` (a ``CostTable``; None: measured on this machine at the first ``generate`` of each batch size,
    outside its timing).
    A sequence that fails (e.g. NaN logits) makes ``generate`` raise ``GenerationError`` (which holds every
    ``Generation``, the failed ones with their ``error``): a failure is never returned as a short output.
    """

    def __init__(self, target, drafter: Drafter | None = None, *, k: int = 4, timing: bool = False,
                 verify_backend: str | None = None, warm: bool = True, tree=None, isolate_drafter: bool = False,
                 costs: CostTable | None = None):
        check_drafter(drafter)
        self.tree = check_tree(tree, drafter)
        if self.tree is not None and not hasattr(target, "append_tree"):
            raise ValueError(f"tree= needs a target with a tree pass (verispec's Model); {type(target).__name__} has "
                             f"none: use tree=None")
        if drafter is not None:
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise ValueError(f"k must be an integer >= 1 (drafts per round), got {k!r}")
            drafter.attach(target)
            check_same_model(target, drafter)
        self.target = target
        self.drafter = drafter
        self.k = k if drafter is not None else 0
        self.timing = timing
        self.verify_backend = verify_backend
        self.warm = warm
        self.isolate_drafter = isolate_drafter
        if costs is not None and not isinstance(costs, CostTable):
            raise TypeError(f"costs must be a CostTable (engine/auto_k.py) or None, got {type(costs).__name__}")
        self.costs = costs
        self._measured: dict[int, tuple[int, CostTable]] = {}    # batch -> (k, the table measured for tree="auto")
        self.last_policy: AutoK | None = None   # tree="auto": the last generate()'s policy (its measured rounds)
        self.last_stats: Stats | None = None   # the whole batch's counts of the last generate()
        self._debug_round_hook: Callable[["SpeculativeDecoder", list[Sequence]], None] | None = None  # tests

    # ----------------------------------------------------------------------------- inputs
    def requests(self, prompts: list[list[int]], *, max_new_tokens: int, temperature, top_k, top_p, seed, stop,
                 on_tokens) -> list[Request]:
        """One checked ``Request`` per prompt (ids 0..n-1). Sequence b of a seeded batch uses seed + b, so every
        sequence has its own stream (and a one-prompt call uses the seed itself)."""
        sampling = check_sampling(temperature, top_k, top_p, seed, len(prompts))
        stops = check_stop(stop)
        if stops and self.target.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none")
        callback = None if on_tokens is None else (lambda req, toks: on_tokens(req.id, toks))
        return [Request(p, max_new_tokens, row.temperature, row.top_k, row.top_p, row.seed, stops, callback, id=b)
                for b, (p, row) in enumerate(zip(prompts, sampling.rows))]

    # ----------------------------------------------------------------------------- generate
    def generate(self, prompt, *, max_new_tokens: int = 128, temperature=0.0, top_k=None, top_p=None,
                 seed: int | None = None, stop: str | Seq[str] | None = None, chat: bool = False,
                 max_seq_len: int | None = None,
                 on_tokens: Callable[[int, list[int]], None] | None = None) -> Generation | list[Generation]:
        """Generate for one prompt (str or token ids) or a batch (a list of them).

        Returns a ``Generation`` for one prompt, a list of them for a batch (in order).
        ``on_tokens(seq_index, new_token_ids)`` is called for every emitted chunk.
        """
        t_start = time.perf_counter()
        prompts, is_batch = check_prompts(prompt, self.target.config.vocab_size, self.target.tokenizer, chat=chat)
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        requests = self.requests(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                 top_p=top_p, seed=seed, stop=stop, on_tokens=on_tokens)
        for r in requests:
            r.submitted_at = t_start
        longest = max(len(p) for p in prompts)
        limit = getattr(self.target.config, "max_position_embeddings", None)
        k = chain_k = self.k
        if self.tree == "auto":
            chain_k, _ = check_k(k, max_new_tokens, longest, limit)
            k = max([chain_k] + [tree_nodes(t) for t in auto_k.AUTO_TREES])     # the lookahead of the largest shape
        elif self.tree is not None:
            k = tree_nodes(self.tree)             # the lookahead: every node of a tree goes through the pass
        elif k:
            k, _ = check_k(k, max_new_tokens, longest, limit)
            chain_k = k
        # room for the prompt, the new tokens and one round of lookahead (certain token + K drafts)
        needed = longest + max_new_tokens + k + 1
        if max_seq_len is None:
            max_seq_len = needed
        elif max_seq_len < needed:
            raise ValueError(f"max_seq_len {max_seq_len} is too small: the longest prompt has {longest} tokens, "
                             f"+ max_new_tokens {max_new_tokens} + {k + 1} lookahead = {needed}")
        if limit is not None and needed > limit:
            raise ValueError(f"prompt ({longest} tokens) + max_new_tokens {max_new_tokens} + lookahead {k + 1} "
                             f"= {needed} exceeds the model's max_position_embeddings {limit}: shorten the prompt "
                             f"or max_new_tokens")
        with ModelLease(self.target, getattr(self.drafter, "model", None)):
            policy = None
            if self.tree == "auto":
                policy = AutoK(self.costs_for(len(prompts), chain_k), trees=auto_k.AUTO_TREES)
                self.last_policy = policy
            config = SchedulerConfig(len(prompts), max_seq_len, chain_k if self.tree == "auto" else k, tree=self.tree)
            scheduler = Scheduler(self.target, self.drafter, config, k_policy=policy,
                                  verify_backend=self.verify_backend, timing=self.timing, isolate_drafter=self.isolate_drafter)
            if self.warm:
                settings = sorted({(r.temperature, r.top_k, r.top_p) for r in requests})
                scheduler.warm_up(settings, longest)
                t_start = time.perf_counter()   # the one-time capture is reported (Stats.warmup_s), not timed
                for r in requests:
                    r.submitted_at = t_start
            gens, seqs = self._run(scheduler, requests)
        self.last_stats = self._aggregate(scheduler, seqs, requests[0].seed)
        failed = [(i, g.error) for i, g in enumerate(gens) if g.finish_reason == "error"]
        if failed:
            raise GenerationError(failed, gens)
        return gens if is_batch else gens[0]

    def costs_for(self, batch: int, k: int) -> CostTable:
        """tree="auto"'s cost table for ``batch`` prompts and chains of up to ``k`` drafts: the one given, else
        measured here (``measure_costs`` at the batch buckets up to ``batch``, with the candidate trees' passes and
        rounds), once per batch size (a table measured for a larger k serves a smaller one: a warm-up call's capped
        k). Call it before a scheduler is built (``generate`` does): it sets up the target's cache and the drafter
        its own way."""
        if self.costs is not None:
            return self.costs
        if batch not in self._measured or self._measured[batch][0] < k:
            self._measured[batch] = (k, measure_costs(self.target, self.drafter, k, default_batch_sizes(batch),
                                                      trees=auto_k.AUTO_TREES))
        return self._measured[batch][1]

    def _run(self, scheduler: Scheduler, requests: list[Request]) -> tuple[list[Generation], list[Sequence]]:
        if self._debug_round_hook is not None:
            scheduler.round_hook = lambda s: self._debug_round_hook(self, s.running)
        seqs = [scheduler.submit(r) for r in requests]
        scheduler.run()
        return [s.result(scheduler.decode) for s in seqs], seqs

    @staticmethod
    def _aggregate(scheduler: Scheduler, seqs: list[Sequence], seed: int) -> Stats:
        agg = scheduler.totals
        agg.seed = seed
        agg.prefill_s = max(s.stats.queue_s + s.stats.prefill_s for s in seqs)
        agg.total_s = max(s.stats.total_s for s in seqs)
        agg.decode_s = agg.total_s - agg.prefill_s
        return agg


class GenerationError(RuntimeError):
    """Some sequences of a ``generate`` call failed. ``failures``: [(sequence index, reason)]; ``generations``:
    every sequence's ``Generation`` (the others complete)."""

    def __init__(self, failures: list[tuple[int, str | None]], generations: list[Generation]):
        self.failures, self.generations = failures, generations
        shown = "; ".join(f"sequence {i}: {why}" for i, why in failures[:3])
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        super().__init__(f"{len(failures)} of {len(generations)} sequences failed: {shown}{more}")


def generate(target, prompt, *, drafter: Drafter | None = None, k: int = 4, max_new_tokens: int = 128,
             temperature=0.0, top_k=None, top_p=None, seed: int | None = None, stop=None, chat: bool = False,
             max_seq_len: int | None = None, on_tokens=None, timing: bool = False, verify_backend: str | None = None,
             warm: bool = True, tree=None, costs: CostTable | None = None):
    """One-call speculative generation; see ``SpeculativeDecoder.generate`` (``tree=[w1, ..., wd]``: draft trees;
    ``tree="auto"``: plain, chain or tree per round by the cost model, ``costs`` its table or None to measure it).

    Example (the embedded SmolLM2; greedy output equals plain decoding's token for token)::

        from verispec.runtime import load_model
        from verispec.drafters import PromptLookup
        model = load_model()
        out = generate(model, "Repeat exactly: the cat sat on the mat.", drafter=PromptLookup(), k=8, chat=True)
        print(out.text, out.stats.summary())
    """
    decoder = SpeculativeDecoder(target, drafter, k=k, timing=timing, verify_backend=verify_backend, warm=warm,
                                 tree=tree, costs=costs)
    return decoder.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, stop=stop, chat=chat, max_seq_len=max_seq_len,
                            on_tokens=on_tokens)
