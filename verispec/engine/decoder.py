"""The speculative decoding loop: draft -> ONE target pass -> verify -> commit/rollback, batched.

Vocabulary as in ``verispec.reference`` (accepted, recovered, bonus, emitted). For each sequence b:

    history h_b     prompt + every token emitted so far
    certain token   h_b[-1]: emitted, but not yet in the target's cache
    target cache    holds K/V for exactly h_b[:-1]          (invariant at the start of each round)

One round (the *folded* loop: no separate forward to commit the certain token):

    drafts   d_1..d_k = drafter.propose(k)                       k_b per sequence, K = max k_b
    pass     logits = target.verify([c, d_1, .., d_K])           [B, K+1, V]; lengths += K+1
             row i scores d_{i+1}; row k_b is the bonus row -> exactly verify_*'s ragged layout
    accept   num_accepted a_b, then one recovered/bonus token    (verify_greedy / verify_sample)
    commit   target.rollback(lengths_before + 1 + a_b)           keeps c, d_1..d_a; the rest is dead
             emitted = d_1..d_a + [recovered/bonus]; its last token is the next certain token

The first certain token comes from the prefill logits (verified with 0 drafts, so it is sampled by
the same code as every other token). ``drafter=None`` runs the same loop with K = 0: plain
autoregressive decoding, the baseline. Finished sequences leave the batch (``model.keep``).

Randomness: ``verify_sample`` draws from the counter-based stream keyed by (seed, offset, row);
the prefill sample uses offset 0 and round r uses offset r, so a run is reproducible from its seed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from ..verify import rng
from ..drafters.base import Drafter, SamplingParams
from ..device import to_device
from ..runtime.cache import fill_order
from ..verify import verify_greedy, verify_sample


@dataclass
class Stats:
    """Counts and timings of one generation (per sequence; the timings are the batch's)."""

    new_tokens: int = 0            # tokens emitted (the first one, from the prefill, included)
    rounds: int = 0                # target verify passes this sequence took part in
    proposed: int = 0              # draft tokens proposed
    accepted: int = 0              # draft tokens accepted
    prompt_tokens: int = 0
    seed: int | None = None        # the stream seed used (sampling runs are reproducible from it)
    prefill_s: float = 0.0         # target prefill + the drafter's begin
    draft_s: float = 0.0           # drafter.propose
    verify_s: float = 0.0          # the target pass
    accept_s: float = 0.0          # verify_greedy / verify_sample + reading acceptance on the host
    commit_s: float = 0.0          # rollback, drafter.commit, stop checks, streaming, keep
    decode_s: float = 0.0          # from the end of prefill until this sequence finished
    total_s: float = 0.0           # from start until this sequence finished
    timed_phases: bool = True      # False: phase times on an async device without synchronization

    @property
    def acceptance_rate(self) -> float:
        """accepted / proposed (0 when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0

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

    def summary(self) -> str:
        return (f"{self.new_tokens} tokens, {self.tokens_per_s:.1f} tok/s, {self.rounds} rounds, "
                f"accepted {self.accepted}/{self.proposed} ({100 * self.acceptance_rate:.0f}%), "
                f"{self.tokens_per_round:.2f} tokens/round; draft {self.draft_s:.2f}s verify {self.verify_s:.2f}s "
                f"accept {self.accept_s:.2f}s commit {self.commit_s:.2f}s")


@dataclass
class Generation:
    tokens: list[int]              # generated token ids (an EOS that ended the run included)
    text: str                      # decoded tokens (EOS excluded, cut before a stop string)
    stats: Stats
    finish_reason: str = "length"  # "length" | "eos" | "stop"
    prompt_tokens: list[int] = field(default_factory=list)


@dataclass
class _Seq:
    """Host-side state of one sequence."""

    index: int                     # position in the caller's batch
    prompt: list[int]
    generated: list[int]
    stats: Stats
    stop: tuple[str, ...]
    finish_reason: str | None = None
    text_cut: int | None = None    # text length to keep when a stop string ended the run
    stop_scan: int = 0             # text before this offset was already searched for stop strings


class SpeculativeDecoder:
    """Speculative decoding of ``target`` with ``drafter`` (None = plain decoding), k drafts/round.

    ``timing=True`` synchronizes the device around each phase so that the per-phase times in
    ``Stats`` are exact on GPUs (CPU timings are always exact); it costs a little throughput.
    ``verify_backend`` is passed to ``verify_greedy`` / ``verify_sample`` (None = fastest available).
    """

    def __init__(self, target, drafter: Drafter | None = None, *, k: int = 4, timing: bool = False,
                 verify_backend: str | None = None):
        if drafter is not None:
            if not isinstance(k, int) or k < 1:
                raise ValueError(f"k must be an integer >= 1 (drafts per round), got {k!r}")
            drafter.attach(target)
        self.target = target
        self.drafter = drafter
        self.k = k if drafter is not None else 0
        self.timing = timing
        self.verify_backend = verify_backend
        self.last_stats: Stats | None = None   # the whole batch's counts of the last generate()
        self._debug_round_hook: Callable[["SpeculativeDecoder", list[_Seq]], None] | None = None  # tests

    # ----------------------------------------------------------------------------- inputs
    def _encode(self, prompt, chat: bool) -> list[int]:
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
    def _per_seq(value, batch: int, name: str, default):
        values = list(value) if isinstance(value, (list, tuple)) else [value] * batch
        if len(values) != batch:
            raise ValueError(f"{name} has {len(values)} entries for a batch of {batch} prompts")
        return [default if v is None else v for v in values]

    def _sampling(self, batch, temperature, top_k, top_p, seed) -> SamplingParams:
        temps = [float(t) for t in self._per_seq(temperature, batch, "temperature", 0.0)]
        ks = [int(t) for t in self._per_seq(top_k, batch, "top_k", 0)]
        ps = [float(t) for t in self._per_seq(top_p, batch, "top_p", 1.0)]
        if any(t < 0 for t in temps):
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temps}")
        if any(t < 0 for t in ks):
            raise ValueError(f"top_k must be >= 0 (0 = off), got {ks}")
        if any(not 0 < p <= 1 for p in ps):
            raise ValueError(f"top_p must be in (0, 1], got {ps}")
        if seed is None:
            seed = rng.seed_from(None)
        return SamplingParams(tuple(temps), tuple(ks), tuple(ps), int(seed))

    # ----------------------------------------------------------------------------- timing
    def _now(self) -> float:
        if self.timing and self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)
        return time.perf_counter()

    # ----------------------------------------------------------------------------- generate
    def generate(self, prompt, *, max_new_tokens: int = 128, temperature=0.0, top_k=None, top_p=None,
                 seed: int | None = None, stop: str | Sequence[str] | None = None, chat: bool = False,
                 max_seq_len: int | None = None,
                 on_tokens: Callable[[int, list[int]], None] | None = None) -> Generation | list[Generation]:
        """Generate for one prompt (str or token ids) or a batch (a list of them).

        Returns a ``Generation`` for one prompt, a list of them for a batch (in order).
        ``on_tokens(seq_index, new_token_ids)`` is called for every emitted chunk.
        """
        is_batch = self._is_batch(prompt)
        prompts = [self._encode(p, chat) for p in (prompt if is_batch else [prompt])]
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        sampling = self._sampling(len(prompts), temperature, top_k, top_p, seed)
        stops = tuple([stop] if isinstance(stop, str) else (stop or ()))
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        if stops and self.target.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none")
        # room for the prompt, the new tokens and one round of lookahead (certain token + K drafts)
        needed = max(len(p) for p in prompts) + max_new_tokens + self.k + 1
        if max_seq_len is None:
            max_seq_len = needed
        elif max_seq_len < needed:
            raise ValueError(f"max_seq_len {max_seq_len} is too small: the longest prompt has "
                             f"{max(len(p) for p in prompts)} tokens, + max_new_tokens {max_new_tokens} "
                             f"+ {self.k + 1} lookahead = {needed}")
        limit = getattr(self.target.config, "max_position_embeddings", None)
        if limit is not None and needed > limit:
            raise ValueError(f"prompt ({max(len(p) for p in prompts)} tokens) + max_new_tokens {max_new_tokens} "
                             f"+ lookahead {self.k + 1} = {needed} exceeds the model's "
                             f"max_position_embeddings {limit}: shorten the prompt or max_new_tokens")
        seqs = [_Seq(i, p, [], Stats(prompt_tokens=len(p), seed=sampling.seed), stops) for i, p in enumerate(prompts)]
        self._run(seqs, sampling, max_new_tokens, max_seq_len, on_tokens)
        gens = [self._finish(s) for s in seqs]
        return gens if is_batch else gens[0]

    def _eos(self) -> set[int]:
        tok = self.target.tokenizer
        return set(tok.eos_token_ids) if tok is not None else set()

    def _finish(self, seq: _Seq) -> Generation:
        tok = self.target.tokenizer
        body = seq.generated[:-1] if seq.finish_reason == "eos" else seq.generated
        text = tok.decode(body) if tok is not None else ""
        if seq.text_cut is not None:
            text = text[: seq.text_cut]
        return Generation(seq.generated, text, seq.stats, seq.finish_reason or "length", seq.prompt)

    def _emit(self, seq: _Seq, chunk: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
        """Append ``chunk`` to ``seq`` up to its end (length, EOS, stop string); return what was kept."""
        room = max_new_tokens - len(seq.generated)
        kept = []
        for t in chunk[:room]:
            kept.append(t)
            if t in eos:
                seq.finish_reason = "eos"
                break
        seq.generated += kept
        if seq.finish_reason is None and seq.stop:
            kept = self._check_stop(seq, kept)
        if seq.finish_reason is None and len(seq.generated) >= max_new_tokens:
            seq.finish_reason = "length"
        seq.stats.new_tokens = len(seq.generated)
        return kept

    def _check_stop(self, seq: _Seq, kept: list[int]) -> list[int]:
        """If a stop string appeared, cut the tokens after the one that completed it."""
        decode = self.target.tokenizer.decode
        text = decode(seq.generated)
        start = max(0, seq.stop_scan - max(len(s) for s in seq.stop))
        hits = [(text.find(s, start), s) for s in seq.stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if not hits:
            seq.stop_scan = len(text)
            return kept
        cut = min(i for i, _ in hits)
        base = len(seq.generated) - len(kept)
        for n in range(1, len(kept) + 1):       # the first token whose text reaches the stop string
            if any(decode(seq.generated[: base + n]).find(s, start) >= 0 for s in seq.stop):
                break
        seq.generated = seq.generated[: base + n]
        seq.finish_reason, seq.text_cut = "stop", cut
        return kept[:n]

    def _run(self, seqs: list[_Seq], sampling: SamplingParams, max_new_tokens: int, max_seq_len: int,
             on_tokens) -> None:
        target, drafter = self.target, self.drafter
        device = target.device
        eos = self._eos()
        batch = len(seqs)
        t_start = self._now()

        target.setup_cache(batch, max_seq_len)
        prefill_logits = target.prefill([s.prompt for s in seqs])                       # [B, V]
        first = self._accept(prefill_logits, torch.zeros(0, dtype=torch.long, device=device), [0] * batch, 0,
                             None, sampling, offset=0)
        # NOTE: host sync: the first tokens decide EOS / stop and seed the drafter's history
        first_host = first.tokens[:, 0].tolist()
        active: list[_Seq] = []
        for s, t in zip(seqs, first_host):
            kept = self._emit(s, [t], max_new_tokens, eos)
            if on_tokens is not None and kept:
                on_tokens(s.index, kept)
            if s.finish_reason is None:
                active.append(s)
        certain = first.tokens[:, :1].to(torch.long)                                     # [B, 1]
        t_prefill_end = self._now()
        for s in seqs:
            s.stats.prefill_s = t_prefill_end - t_start
            if s.finish_reason is not None:
                s.stats.total_s = t_prefill_end - t_start
        if active and drafter is not None:
            drafter.begin(target, [s.prompt for s in seqs], first_host, sampling, max_seq_len)
        if active and len(active) < batch:
            idx = fill_order(batch, [s.index for s in active])
            active = [seqs[i] for i in idx]
            target.keep(idx)
            if drafter is not None:
                drafter.keep(idx)
            certain = certain[to_device(idx, device, torch.long)]
            sampling = sampling.select(idx)
        if active and drafter is not None:
            t_now = self._now()
            for s in seqs:
                s.stats.prefill_s = t_now - t_start

        round_index = 0
        totals = dict(draft=0.0, verify=0.0, accept=0.0, commit=0.0)
        while active:
            round_index += 1
            participants = active
            t0 = self._now()
            # ---- draft
            if drafter is not None:
                proposal = drafter.propose(self.k)
                num_draft = proposal.num_draft                                           # host [B]
                draft_tokens = to_device(proposal.draft_tokens, device)                  # [B, K]
                draft_probs = proposal.draft_probs
            else:
                num_draft, draft_probs = [0] * len(active), None
                draft_tokens = certain.new_zeros(len(active), 0)
            width = draft_tokens.shape[1]                                                # K
            t1 = self._now()
            # ---- verify: one target pass over [certain, d_1..d_K]
            logits = target.verify(torch.cat([certain, draft_tokens], dim=1))           # [B, K+1, V]
            t2 = self._now()
            # ---- accept
            if all(n == width for n in num_draft):
                flat_logits = logits.flatten(0, 1)                                       # [B*(K+1), V]
                flat_drafts = draft_tokens.flatten()                                     # [B*K]
            else:
                # ragged: keep k_b + 1 rows and k_b drafts of each sequence, e.g. K=2, k=[2,0,1]:
                # rows [0,1,2, 3, 6,7], drafts [0,1, 4]
                rows = [b * (width + 1) + i for b, n in enumerate(num_draft) for i in range(n + 1)]
                cols = [b * width + i for b, n in enumerate(num_draft) for i in range(n)]
                flat_logits = logits.flatten(0, 1)[to_device(rows, device, torch.long)]
                flat_drafts = draft_tokens.flatten()[to_device(cols, device, torch.long)]
            if draft_probs is not None:
                draft_probs = to_device(draft_probs, device)
            out = self._accept(flat_logits, flat_drafts, num_draft, width, draft_probs, sampling, round_index)
            # lengths after the pass = before + K + 1; keep the certain token + the accepted drafts
            target.rollback(target.lengths - width + out.num_accepted.to(torch.long))
            # NOTE: the one host sync per round: the host must learn how many tokens each sequence
            # emitted (EOS / stop / length checks, the drafter's history, streaming).
            result = torch.cat([out.num_accepted[:, None], out.tokens], dim=1).cpu()    # [B, 1 + K + 1]
            t3 = self._now()
            # ---- commit
            num_accepted = result[:, 0].tolist()
            emitted = [row[1: a + 2] for row, a in zip(result.tolist(), num_accepted)]
            certain = out.tokens.gather(1, out.num_accepted[:, None].to(torch.long)).to(torch.long)  # [B, 1]
            if drafter is not None:
                drafter.commit(num_accepted, emitted)
            still = []
            for j, (s, chunk) in enumerate(zip(active, emitted)):
                s.stats.rounds += 1
                s.stats.proposed += num_draft[j]
                s.stats.accepted += num_accepted[j]
                kept = self._emit(s, chunk, max_new_tokens, eos)
                if on_tokens is not None and kept:
                    on_tokens(s.index, kept)
                if s.finish_reason is None:
                    still.append(j)
            if len(still) < len(active):
                t_done = self._now()
                for j, s in enumerate(active):
                    if j not in still:
                        s.stats.total_s = t_done - t_start
                if still:
                    # rows stay put where they can; the tail fills the holes (keep copies only moved rows)
                    still = fill_order(len(active), still)
                    target.keep(still)
                    if drafter is not None:
                        drafter.keep(still)
                    certain = certain[to_device(still, device, torch.long)]
                    sampling = sampling.select(still)
                active = [active[j] for j in still]
            t4 = self._now()
            for name, dt in zip(totals, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                totals[name] += dt
            for s in participants:   # phase times are the batch's, up to each sequence's end
                s.stats.draft_s, s.stats.verify_s = totals["draft"], totals["verify"]
                s.stats.accept_s, s.stats.commit_s = totals["accept"], totals["commit"]
            if self._debug_round_hook is not None:
                self._debug_round_hook(self, active)

        timed = self.timing or device.type != "cuda"
        for s in seqs:
            s.stats.decode_s = max(s.stats.total_s - s.stats.prefill_s, 0.0)
            s.stats.timed_phases = timed
        agg = Stats(seed=sampling.seed, timed_phases=timed)
        for s in seqs:
            for f in ("new_tokens", "rounds", "proposed", "accepted", "prompt_tokens"):
                setattr(agg, f, getattr(agg, f) + getattr(s.stats, f))
        agg.new_tokens = sum(len(s.generated) for s in seqs)
        agg.rounds = round_index
        agg.prefill_s = max(s.stats.prefill_s for s in seqs)
        agg.total_s = max(s.stats.total_s for s in seqs)
        agg.decode_s = agg.total_s - agg.prefill_s
        agg.draft_s, agg.verify_s, agg.accept_s, agg.commit_s = (totals[n] for n in ("draft", "verify", "accept", "commit"))
        self.last_stats = agg

    def _accept(self, target_logits: Tensor, draft_tokens: Tensor, num_draft: list[int], width: int,
                draft_probs: Tensor | None, sampling: SamplingParams, offset: int):
        """verify_greedy when every sequence is greedy, else verify_sample (greedy rows stay greedy)."""
        num_draft_t = torch.tensor(num_draft, dtype=torch.int32)
        # check_values=False: the inputs come from our own passes; the value checks would sync
        if sampling.all_greedy:
            return verify_greedy(target_logits, draft_tokens, num_draft_t, max_num_draft=width, check_values=False,
                                 backend=self.verify_backend)
        device = target_logits.device
        return verify_sample(
            target_logits, draft_tokens, num_draft_t, draft_probs,
            temperature=to_device(sampling.temperature, device, torch.float32),
            top_k=to_device(sampling.top_k, device, torch.int32),
            top_p=to_device(sampling.top_p, device, torch.float32),
            seed=sampling.seed, offset=offset, max_num_draft=width, check_values=False, backend=self.verify_backend)


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
