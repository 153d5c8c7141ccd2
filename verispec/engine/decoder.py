"""The static-batch driver: ``generate(model, prompts, ...)`` submits every prompt to a ``Scheduler`` sized
for them and steps it until all have ended. One engine: the server drives the same scheduler with requests
that arrive over time. ``drafter=None`` is plain autoregressive decoding through the same loop (the baseline).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence as Seq

from torch import Tensor

from ..drafters.base import Drafter
from ..verify import rng
from .request import Request, Sequence
from .scheduler import Scheduler, SchedulerConfig
from .stats import Generation, Stats


class SpeculativeDecoder:
    """Speculative decoding of ``target`` with ``drafter`` (None = plain decoding), k drafts/round.

    ``timing=True`` synchronizes the device around each phase so that the per-phase times in
    ``Stats`` are exact on GPUs (CPU timings are always exact); it costs a little throughput.
    ``verify_backend`` is passed to ``verify_greedy`` / ``verify_sample`` (None = fastest available).
    """

    def __init__(self, target, drafter: Drafter | None = None, *, k: int = 4, timing: bool = False,
                 verify_backend: str | None = None):
        if drafter is not None:
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise ValueError(f"k must be an integer >= 1 (drafts per round), got {k!r}")
            drafter.attach(target)
        self.target = target
        self.drafter = drafter
        self.k = k if drafter is not None else 0
        self.timing = timing
        self.verify_backend = verify_backend
        self.last_stats: Stats | None = None   # the whole batch's counts of the last generate()
        self._debug_round_hook: Callable[["SpeculativeDecoder", list[Sequence]], None] | None = None  # tests

    # ----------------------------------------------------------------------------- inputs
    def encode(self, prompt, chat: bool) -> list[int]:
        """Token ids of one prompt (a string, encoded with the model's tokenizer, or token ids)."""
        tok = self.target.tokenizer
        if isinstance(prompt, str):
            if tok is None:
                raise ValueError("this model has no tokenizer (random weights?): pass the prompt as token ids")
            if chat:
                ids = list(tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True))
            else:
                ids = list(tok.encode(prompt))
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("empty prompt: give at least one token (or a non-empty string)")
        vocab = self.target.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {vocab}), got e.g. {bad[:5]}")
        return ids

    @staticmethod
    def _is_batch(prompt) -> bool:
        return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and not isinstance(prompt[0], int) \
            and not (isinstance(prompt[0], Tensor) and prompt[0].dim() == 0)

    @staticmethod
    def _per_seq(value, batch: int, name: str, default) -> list:
        """A per-sequence setting as a list of ``batch`` values (one value applies to every sequence)."""
        values = list(value) if isinstance(value, (list, tuple)) else [value] * batch
        if len(values) != batch:
            raise ValueError(f"{name} has {len(values)} entries for a batch of {batch} prompts")
        return [default if v is None else v for v in values]

    def requests(self, prompts: list[list[int]], *, max_new_tokens, temperature, top_k, top_p, seed, stop,
                 on_tokens) -> list[Request]:
        """One ``Request`` per prompt (ids 0..n-1) with each sequence's settings; sequence b of a seeded batch
        uses seed + b, so every sequence has its own stream."""
        n = len(prompts)
        temps = [float(t) for t in self._per_seq(temperature, n, "temperature", 0.0)]
        ks = [int(t) for t in self._per_seq(top_k, n, "top_k", 0)]
        ps = [float(t) for t in self._per_seq(top_p, n, "top_p", 1.0)]
        if any(not t >= 0 for t in temps):
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temps}")
        if any(t < 0 for t in ks):
            raise ValueError(f"top_k must be >= 0 (0 = off), got {ks}")
        if any(not 0 < p <= 1 for p in ps):
            raise ValueError(f"top_p must be in (0, 1], got {ps}")
        base = rng.seed_from(None) if seed is None else int(seed)
        stops = tuple([stop] if isinstance(stop, str) else (stop or ()))
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        if stops and self.target.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none")
        callback = None if on_tokens is None else (lambda req, toks: on_tokens(req.id, toks))
        return [Request(p, max_new_tokens, temps[b], ks[b], ps[b], (base + b) % 2**63, stops, callback, id=b)
                for b, p in enumerate(prompts)]

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
        is_batch = self._is_batch(prompt)
        prompts = [self.encode(p, chat) for p in (prompt if is_batch else [prompt])]
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        requests = self.requests(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                 top_p=top_p, seed=seed, stop=stop, on_tokens=on_tokens)
        longest = max(len(p) for p in prompts)
        # room for the prompt, the new tokens and one round of lookahead (certain token + K drafts)
        needed = longest + max_new_tokens + self.k + 1
        if max_seq_len is None:
            max_seq_len = needed
        elif max_seq_len < needed:
            raise ValueError(f"max_seq_len {max_seq_len} is too small: the longest prompt has {longest} tokens, "
                             f"+ max_new_tokens {max_new_tokens} + {self.k + 1} lookahead = {needed}")
        limit = getattr(self.target.config, "max_position_embeddings", None)
        if limit is not None and needed > limit:
            raise ValueError(f"prompt ({longest} tokens) + max_new_tokens {max_new_tokens} + lookahead {self.k + 1} "
                             f"= {needed} exceeds the model's max_position_embeddings {limit}: shorten the prompt "
                             f"or max_new_tokens")
        scheduler = Scheduler(self.target, self.drafter, SchedulerConfig(len(prompts), max_seq_len, self.k),
                              verify_backend=self.verify_backend, timing=self.timing)
        if self._debug_round_hook is not None:
            scheduler.round_hook = lambda s: self._debug_round_hook(self, s.running)
        seqs = []
        for r in requests:
            r.submitted_at = t_start
            seqs.append(scheduler.submit(r))
        scheduler.run()
        self.last_stats = self._aggregate(scheduler, seqs, requests[0].seed)
        gens = [s.result(scheduler.decode) for s in seqs]
        return gens if is_batch else gens[0]

    @staticmethod
    def _aggregate(scheduler: Scheduler, seqs: list[Sequence], seed: int) -> Stats:
        agg = scheduler.totals
        agg.seed = seed
        agg.prefill_s = max(s.stats.queue_s + s.stats.prefill_s for s in seqs)
        agg.total_s = max(s.stats.total_s for s in seqs)
        agg.decode_s = agg.total_s - agg.prefill_s
        return agg


def generate(target, prompt, *, drafter: Drafter | None = None, k: int = 4, max_new_tokens: int = 128,
             temperature=0.0, top_k=None, top_p=None, seed: int | None = None, stop=None, chat: bool = False,
             max_seq_len: int | None = None, on_tokens=None, timing: bool = False, verify_backend: str | None = None):
    """One-call speculative generation; see ``SpeculativeDecoder.generate``.

    Example (the embedded SmolLM2; greedy output equals plain decoding's token for token)::

        from verispec.runtime import load_model
        from verispec.drafters import PromptLookup
        model = load_model()
        out = generate(model, "Repeat exactly: the cat sat on the mat.", drafter=PromptLookup(), k=8, chat=True)
        print(out.text, out.stats.summary())
    """
    decoder = SpeculativeDecoder(target, drafter, k=k, timing=timing, verify_backend=verify_backend)
    return decoder.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, stop=stop, chat=chat, max_seq_len=max_seq_len,
                            on_tokens=on_tokens)
