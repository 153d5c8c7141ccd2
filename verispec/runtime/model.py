"""``Model``: the object the engine talks to — weights + tokenizer + static cache + CUDA graphs.

Contract (see docs/runtime.md):
  setup_cache(B_max, S) -> prefill(prompts) [B, V] | admit(prompts) [n, V] (join a running batch)
  -> decode(tokens [B,1]) [B,1,V] / append(tokens [B,k]) [B,k,V] (the target pass)
     / draft_loop(inputs [B,C], k, choose, key) (a draft model's k steps in one graph replay)
  -> rollback(new_lengths [B]) / keep(batch_indices [B']) ... ; truncated(n) shares weights, owns its cache.
decode / append never read a device value on the host; see ``_check_room`` for the one exception.

Hidden states for feature-level draft heads (off by default, free when off): ``capture_hidden(layers)`` makes
every pass also write the outputs of those C layers, for every token it scores, into ONE buffer the model owns
(allocated with the cache, never moved, so the captured graphs write into it too): the same pass, no second
one, no host read. After ``append`` [B, k] (or ``append_tree`` [B, T]), ``hidden`` is a view [B, k, C, E] of
it (valid until the next pass); after ``admit``, ``take_prompt_hidden(row)`` gives each admitted prompt's states
[P, C, E] (a copy).
"""
from __future__ import annotations

from typing import Callable, Hashable

import torch
from torch import Tensor

from ..device import to_device
from .cache import StaticKVCache
from .config import ModelConfig
from .graphs import GraphCache, PrefillGraphs, pack_prefill, unpack_prefill
from .transformer import Transformer, rope_table
from . import tree as trees


# Passes of more tokens a sequence (a drafter catching up after rounds without drafting) run eagerly: each
# distinct token count would capture its own graph. The same bound caps a captured draft loop's k.
GRAPH_MAX_TOKENS = 16
# The token widths of the captured decode / verify passes: a pass of k tokens a sequence runs in the graph of the
# smallest width >= k, its k..width-1 extra tokens are padding (their K/V land in dead slots past the sequence,
# their logits are dropped). 1 + 2^j fits the usual k = 1, 2, 4, 8, 16 drafts exactly, and a warm-up captures 6
# graphs per batch bucket instead of 17. Exact because the pass is batch-invariant (ops.matmul_path): padding
# tokens do not change the real tokens' logits. Widest - narrowest gap (17 - 10) <= cache.PAD_SLOTS.
WIDTH_BUCKETS = (1, 2, 3, 5, 9, 17)
# Captured draft loops per model at most (one per bucket, k and sampling setting); further ones run eagerly. A
# round drafts any k <= K (k=auto's choice; rows near their end), so one setting needs a loop per (bucket, k):
# 7 buckets up to 32 rows x k = 1..8 is 56; an eager loop at 32 rows costs several captured ones.
MAX_DRAFT_GRAPHS = 128

# choose(i, logits [R, V], inputs [R, C]) -> (tokens [R] int64, probs [R, V] float32 or None): see draft_loop
Choose = Callable[[int, Tensor, Tensor], tuple[Tensor, "Tensor | None"]]

# Each admitted prompt is prefilled in its own pass: a batched prefill would change its matmuls' shapes (cuBLAS
# picks kernels, and reduction orders, by shape), so a prompt's K/V and first token would depend on the prompts
# admitted beside it. A prompt of at most PREFILL_BUCKETS[-1] tokens runs as a CUDA graph of the smallest bucket
# that holds it (capped at the cache's capacity): a short prefill is launch-bound (~9 kernels per layer), and its
# padded tail costs little while the pass reads the weights once anyway. Longer prompts run eagerly at their own
# length: their math dwarfs the launches, and padding them would add real work.
PREFILL_BUCKETS = (16, 32, 64, 128, 256, 384, 512)
PREFILL_GRAPH_MAX_PROMPTS = 1


class Model:
    def __init__(self, net: Transformer, tokenizer, *, num_layers: int | None = None, use_graphs: bool = True):
        self.net = net
        self.tokenizer = tokenizer
        n = net.cfg.num_layers if num_layers is None else num_layers
        if not 1 <= n <= net.cfg.num_layers:
            raise ValueError(f"num_layers must be in [1, {net.cfg.num_layers}], got {n}")
        self.num_active_layers = n
        self.config: ModelConfig = net.cfg.replace(num_layers=n)
        self.device: torch.device = net.embed.device
        self.dtype: torch.dtype = net.embed.dtype
        self.cache: StaticKVCache | None = None
        self._rope: Tensor | None = None
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self._graphs = GraphCache(self._step, lambda rows: self.cache.lengths_for(rows))
        self._prefill_graphs = PrefillGraphs(self._prefill_step)
        self.hidden_layers: tuple[int, ...] = ()      # C layers whose outputs every pass writes (empty: off)
        self._hidden_buf: Tensor | None = None        # [rows, C, E]: what every pass writes, allocated with the cache
        self._hidden_wide: Tensor | None = None       # eager passes wider than the buffer (no graph uses it)
        self.hidden: Tensor | None = None             # [B, k, C, E] view: the last append's (or tree pass's) states
        self._prompt_hidden: dict[int, Tensor] = {}   # cache row -> its admitted prompt's states [P, C, E]

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights this model's passes use: the embedding, its ``num_active_layers`` layers, the final
        norm and the LM head (a tied head counted once; GGUF blocks at their packed size)."""
        from .quant.packed import PackedWeight

        net = self.net
        held = [net.embed, net.norm, net.lm_head]
        for L in net.layers[:self.num_active_layers]:
            held += [L.attn_norm, L.wqkv, L.bqkv, L.wo, L.bo, L.q_norm, L.k_norm, L.ffn_norm, L.w13, L.w2]
        return sum(w.nbytes if isinstance(w, PackedWeight) else w.numel() * w.element_size()
                   for w in held if w is not None)

    @property
    def graph_captures(self) -> int:
        """CUDA graphs this model captured so far (passes, draft loops, tree passes, prefills; a cache that had to
        grow re-captures its graphs): a benchmark checks that its timed run adds none."""
        return self._graphs.captures + self._prefill_graphs.captures

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({c.model_type}, layers={c.num_layers}, E={c.hidden_size}, V={c.vocab_size}, "
                f"device={self.device}, dtype={self.dtype})")

    # ------------------------------------------------------------------------------- cache
    def setup_cache(self, batch_size: int, max_seq_len: int, *, empty: bool = False) -> None:
        """Make the static cache hold ``batch_size`` empty sequences of up to ``max_seq_len`` tokens
        (``empty=True``: room for ``batch_size`` rows but a batch of 0, which ``admit`` fills).

        The buffers of the previous cache are reused when they fit (``StaticKVCache.fits``), and with them
        every CUDA graph captured so far: repeated ``generate`` calls pay for graph capture once."""
        sw = self.config.sliding_window
        if sw is not None and max_seq_len > sw:
            raise ValueError(f"max_seq_len {max_seq_len} > sliding_window {sw}: sliding-window attention is not "
                             f"implemented; use max_seq_len <= {sw}")
        self._prompt_hidden.clear()
        if self.cache is not None and self.cache.fits(batch_size, max_seq_len):
            self.cache.reset(0 if empty else batch_size, max_seq_len)
            self._alloc_hidden()
            return
        self.cache = None
        self._graphs.clear()
        self._prefill_graphs.clear()
        self.cache = StaticKVCache(self.config, batch_size, max_seq_len, self.device, self.dtype)
        if empty:
            self.cache.reset(0, max_seq_len)
        if self._rope is None or self._rope.shape[0] < self.cache.k[0].shape[2]:
            self._rope = rope_table(self.config, self.cache.k[0].shape[2], self.device)
        self._hidden_buf = None
        self._alloc_hidden()

    # ------------------------------------------------------------------------------- hidden states
    def capture_hidden(self, layers) -> None:
        """From now on every pass writes the outputs of ``layers`` (C distinct layer indices in [0,
        num_active_layers), in the order given) for every token it scores: ``hidden`` after ``append``,
        ``take_prompt_hidden`` after ``admit``. ``()`` or None turns it off. The captured CUDA graphs are dropped
        when the layers change (they are recaptured with or without the writes)."""
        layers = tuple(int(l) for l in (layers or ()))
        n = self.num_active_layers
        if any(not 0 <= l < n for l in layers) or len(set(layers)) != len(layers):
            raise ValueError(f"capture_hidden: layers must be distinct indices in [0, {n}), got {list(layers)}")
        if layers == self.hidden_layers:
            return
        self.hidden_layers = layers
        self._graphs.clear()
        self._prefill_graphs.clear()
        self._hidden_buf, self.hidden = None, None
        self._prompt_hidden.clear()
        self._alloc_hidden()

    def _alloc_hidden(self) -> None:
        """The hidden-state buffer: rows for the widest graph pass (every bucket row x the widest width bucket, or
        the widest tree pass) and for a prompt of the cache's whole capacity (a prefill pass writes one row per
        token, padding included). e.g. SmolLM2 (E = 576), C = 3, capacity 2112, 8 rows: 2112 x 3 x 576 fp32 =
        14.6 MB."""
        if not self.hidden_layers or self.cache is None:
            self._hidden_buf = None
            return
        widest = max(WIDTH_BUCKETS[-1], trees.MAX_TREE_TOKENS)
        rows = max(self.cache.capacity, self.cache.max_batch_size * widest)
        buf = self._hidden_buf
        if buf is None or buf.shape[0] < rows:
            self._graphs.clear()   # graphs captured against an older buffer would write there
            self._prefill_graphs.clear()
            self._hidden_buf = torch.zeros(rows, len(self.hidden_layers), self.config.hidden_size,
                                           device=self.device, dtype=self.dtype)

    def _hidden_out(self, num_rows: int) -> Tensor | None:
        """Where a pass of ``num_rows`` tokens writes its states: the buffer's first rows; a fresh tensor for an
        eager pass wider than the buffer (never a graph: graph passes fit it by construction)."""
        if not self.hidden_layers:
            return None
        if num_rows <= self._hidden_buf.shape[0]:
            return self._hidden_buf[:num_rows]
        if self._hidden_wide is None or self._hidden_wide.shape[0] < num_rows:
            self._hidden_wide = torch.empty(num_rows, *self._hidden_buf.shape[1:], device=self.device,
                                            dtype=self.dtype)
        return self._hidden_wide[:num_rows]

    def take_prompt_hidden(self, row: int) -> Tensor:
        """The hidden states [P, C, E] of the prompt admitted into cache row ``row`` (by ``admit``; rows move
        with ``keep``), handed over once: the model keeps no copy after this call."""
        if not self.hidden_layers:
            raise RuntimeError("take_prompt_hidden: hidden states are off (call capture_hidden(layers) first)")
        if row not in self._prompt_hidden:
            raise KeyError(f"take_prompt_hidden: no prompt states for row {row} (admitted before capture_hidden, "
                           f"or already taken)")
        return self._prompt_hidden.pop(row)

    def _need_cache(self) -> StaticKVCache:
        if self.cache is None:
            raise RuntimeError("no cache: call model.setup_cache(batch_size, max_seq_len) first")
        return self.cache

    @property
    def lengths(self) -> Tensor:
        """[B] int64 on model.device: tokens currently cached per sequence."""
        return self._need_cache().lengths

    @property
    def max_seq_len(self) -> int:
        return self._need_cache().max_seq_len

    @property
    def batch_size(self) -> int:
        return self._need_cache().batch_size

    # ------------------------------------------------------------------------------- passes
    def prefill(self, prompts: list[list[int]]) -> Tensor:
        """Fresh start: the cache's batch becomes exactly these prompts (prompt b in row b, positions
        [0, len_b)). Returns logits [B, V] at each last token."""
        cache = self._need_cache()
        if len(prompts) != cache.batch_size:
            raise ValueError(f"prefill got {len(prompts)} prompts but the cache holds {cache.batch_size} sequences")
        cache.reset(0, cache.max_seq_len)
        return self.admit(prompts)

    @torch.no_grad()
    def admit(self, prompts: list[list[int]]) -> Tensor:
        """Append sequences to the running batch: prompt j fills row B + j, positions [0, len_j); rows
        below B keep their state, so requests can join between rounds. Returns logits [n, V] at each
        prompt's last token. The cache must have room (``setup_cache(max_batch_size, ...)``).
        Each prompt runs in its own pass (see PREFILL_BUCKETS): a short one replays the CUDA graph of its token
        bucket (``prefill_bucket``), a long one runs eagerly; path and bucket follow from the prompt alone, so its
        K/V and logits do not depend on the other prompts admitted with it or already running."""
        cache = self._need_cache()
        lens = [len(p) for p in prompts]
        if not lens:
            raise ValueError("admit: no prompts given")
        if cache.batch_size + len(lens) > cache.max_batch_size:
            raise ValueError(f"admit: {cache.batch_size} running + {len(lens)} new sequences exceed the cache's "
                             f"{cache.max_batch_size} rows")
        for b, n in enumerate(lens):
            if n == 0:
                raise ValueError(f"prompt {b} is empty: every sequence needs at least one token")
            if n > cache.max_seq_len:
                raise ValueError(f"prompt {b} has {n} tokens > max_seq_len {cache.max_seq_len}: "
                                 f"call setup_cache with a larger max_seq_len")
        first_row = cache.batch_size
        logits, states = [], {}
        for j, prompt in enumerate(prompts):
            logits.append(self._prefill_one(prompt, first_row + j))
            if self.hidden_layers:   # a copy: the next prompt's pass writes the same buffer
                states[first_row + j] = self._hidden_buf[:len(prompt)].clone()
        cache.admit(lens)
        self._prompt_hidden.update(states)
        return torch.cat(logits)

    def admit_empty(self, num_rows: int) -> None:
        """Append ``num_rows`` sequences with nothing cached yet (length 0): they hold their rows in the batch
        (``keep`` moves them like any other) until ``prefill_rows`` writes their prompts. A draft model defers
        its prefill this way until a row first drafts (``DraftModel``), so a row that never drafts never pays it."""
        if num_rows < 1:
            raise ValueError(f"admit_empty: num_rows must be >= 1, got {num_rows}")
        self._need_cache().admit([0] * num_rows, allow_empty=True)

    @torch.no_grad()
    def prefill_rows(self, rows: list[int], prompts: list[list[int]]) -> None:
        """``admit``'s prefill into rows already in the batch: prompt j's K/V into row rows[j], positions
        [0, len_j), whose length becomes len_j (whatever the row held before is dead). The same pass per prompt
        as ``admit`` (path and token bucket from the prompt alone: the same K/V bit for bit, and on a GPU the
        same prefill graphs, which take the row as a device value). No logits; no hidden states."""
        cache = self._need_cache()
        if self.hidden_layers:
            raise RuntimeError("prefill_rows keeps no hidden states: admit the prompts with admit() instead")
        if len(rows) != len(prompts) or len(set(rows)) != len(rows):
            raise ValueError(f"prefill_rows: one prompt per distinct row, got rows {rows} and {len(prompts)} prompts")
        for r, prompt in zip(rows, prompts):
            if not 0 <= r < cache.batch_size:
                raise ValueError(f"prefill_rows: row {r} is not in the batch of {cache.batch_size}")
            if not 1 <= len(prompt) <= cache.max_seq_len:
                raise ValueError(f"prefill_rows: row {r}'s prompt has {len(prompt)} tokens, need 1.."
                                 f"{cache.max_seq_len}")
        if not rows:
            return
        for r, prompt in zip(rows, prompts):
            self._prefill_one(prompt, r)
        lengths = [len(p) for p in prompts]
        cache.lengths[to_device(rows, self.device, torch.long)] = to_device(lengths, self.device, torch.long)
        cache.max_len_bound = max(cache.max_len_bound, max(lengths))

    @torch.no_grad()
    def admit_from(self, source: "Model", source_rows: list[int], lengths: list[int]) -> None:
        """``admit`` without a prefill: sequence j joins as row B + j with the K/V of positions [0, lengths[j])
        that row source_rows[j] of ``source`` (a model on the same weights) holds, e.g. the same prompt prefilled
        there (a prompt's K/V depend on the prompt alone: see ``admit``). No logits."""
        cache = self._need_cache()
        if len(source_rows) != len(lengths) or not lengths or min(lengths) < 1:
            raise ValueError(f"admit_from: one length >= 1 per source row, got rows {source_rows}, lengths {lengths}")
        if cache.batch_size + len(lengths) > cache.max_batch_size:
            raise ValueError(f"admit_from: {cache.batch_size} running + {len(lengths)} new sequences exceed the "
                             f"cache's {cache.max_batch_size} rows")
        first_row = cache.batch_size
        cache.admit(lengths)
        self.copy_kv(list(range(first_row, first_row + len(lengths))), source, source_rows, [0] * len(lengths),
                     max(lengths))
        cache.lengths[first_row:] = to_device(lengths, self.device, torch.long)   # copy_kv set max(lengths)

    def _prefill_one(self, prompt: list[int], row: int) -> Tensor:
        """One prompt's prefill into cache row ``row`` -> logits [1, V] at its last token."""
        bucket = self.prefill_bucket(1, len(prompt))
        T = bucket or len(prompt)
        packed = to_device(pack_prefill([prompt], T, row), self.device)   # one host -> device copy
        if bucket and self.device.type == "cuda":   # on a CPU model forced to use graphs: the same padded pass, eager
            return self._prefill_graphs.run(packed, 1, bucket)
        tokens, last, _ = unpack_prefill(packed, 1, T)
        return self.net.prefill(tokens, last, self._rope[:T], self.cache, self.num_active_layers, row,
                                self._hidden_out(T), self.hidden_layers)

    def prefill_bucket(self, num_prompts: int, num_tokens: int) -> int | None:
        """The token count T of the CUDA graph that admits ``num_prompts`` prompts of at most ``num_tokens``
        tokens: the smallest of PREFILL_BUCKETS >= num_tokens, at most the cache's capacity (its padded tail
        must fit the rows' slots); None where the admission runs eagerly (no graphs, the torch path, too many
        prompts or tokens). e.g. capacity 1024: 100 tokens -> 128, 500 -> 512, 600 -> None; capacity 64: 40 -> 64."""
        cache = self._need_cache()
        if not (self.use_graphs and self.net.use_kernels and num_prompts <= PREFILL_GRAPH_MAX_PROMPTS):
            return None
        bucket = next((T for T in PREFILL_BUCKETS if T >= num_tokens), None)
        return None if bucket is None else min(bucket, cache.capacity)

    def _prefill_step(self, tokens: Tensor, last: Tensor, first_row: Tensor) -> Tensor:
        # the body of the prefill graphs: tokens [n, T], last [n], first_row [1] (device values) -> logits [n, V]
        return self.net.prefill_kernels(tokens, last, self._rope, self.cache, self.num_active_layers, first_row,
                                        self._hidden_out(tokens.numel()), self.hidden_layers)

    def _step(self, tokens: Tensor) -> Tensor:
        # tokens [R, k] -> logits [R, k, V]; the body captured in CUDA graphs. R >= B when a graph runs a
        # larger batch bucket: rows [B:R] are padding rows, which ``live`` keeps at length 0.
        rows = tokens.shape[0]
        lengths = self.cache.lengths_for(rows)
        logits = self.net.append(tokens, lengths, self._rope, self.cache, self.num_active_layers,
                                 self._hidden_out(tokens.numel()), self.hidden_layers)
        lengths.add_(self.cache.live[:rows], alpha=tokens.shape[1])
        return logits

    def graph_rows(self, batch_size: int) -> int:
        """The batch bucket whose CUDA graph serves ``batch_size`` live sequences: 1, 2, 4, 8, then multiples
        of 8 up to 64, then of 32; at most the cache's allocated rows. Sequences that finish shrink the
        batch; buckets bound the number of graphs to capture (each costs ~0.1-1 s) at the price of running a
        few padding rows, which cost little in a weight-bandwidth-bound pass."""
        if batch_size <= 8:
            rows = 1 << (batch_size - 1).bit_length()
        else:
            step = 8 if batch_size <= 64 else 32
            rows = -(-batch_size // step) * step
        return min(rows, self._need_cache().max_batch_size)

    def _check_room(self, cache: StaticKVCache, k: int) -> None:
        if cache.max_len_bound + k <= cache.max_seq_len:
            return
        # NOTE: the host bound is conservative (rollbacks do not lower it), so near capacity we read the true
        # lengths once. This is the only host sync on the decode/verify path, and it happens only within k
        # tokens of max_seq_len.
        cache.max_len_bound = int(cache.lengths.max())
        if cache.max_len_bound + k > cache.max_seq_len:
            raise ValueError(f"cache full: a sequence has {cache.max_len_bound} tokens and {k} more would exceed "
                             f"max_seq_len {cache.max_seq_len}; keep() finished sequences out or setup_cache larger")

    def graph_width(self, k: int) -> int | None:
        """The token width of the CUDA graph that runs a pass of ``k`` tokens a sequence: the smallest of
        WIDTH_BUCKETS >= k; None where the pass runs eagerly (no graphs, or k > GRAPH_MAX_TOKENS + 1).
        e.g. 1 -> 1, 4 -> 5, 5 -> 5, 6 -> 9."""
        if not self.use_graphs:
            return None
        return next((w for w in WIDTH_BUCKETS if w >= k), None)

    @torch.no_grad()
    def append(self, tokens: Tensor) -> Tensor:
        """The target pass: score tokens [B, k] at positions lengths[b] + i in one forward pass, their K/V
        appended to the cache; advance lengths by k. -> logits [B, k, V] (row i predicts the token after
        tokens[:, i]). With graphs, the pass replays the graph of (``graph_rows(B)``, ``graph_width(k)``); its
        padding rows and tokens change nothing the caller sees."""
        cache = self._need_cache()
        if tokens.dim() != 2 or tokens.shape[0] != cache.batch_size:
            raise ValueError(f"tokens must be [B={cache.batch_size}, k], got {tuple(tokens.shape)}")
        k = tokens.shape[1]
        self._check_room(cache, k)
        width = self.graph_width(k)
        if width is not None:
            tokens = tokens.to(torch.long)
            if width > k:   # padding tokens: any valid id; their K/V go to dead slots < capacity (cache.PAD_SLOTS)
                tokens = torch.cat([tokens, tokens[:, -1:].expand(-1, width - k)], dim=1)
            rows = self.graph_rows(cache.batch_size)
            logits = self._graphs.run(tokens, rows, width=k)
            if width > k:
                cache.lengths.sub_(width - k)   # the graph advanced every live row by width
        else:
            rows, width = cache.batch_size, k
            logits = self._step(to_device(tokens, self.device, torch.long))
        if self.hidden_layers:   # the rows this pass wrote, in (row, token) order of its [rows, width] layout
            out = self._hidden_out(rows * width)
            self.hidden = out.view(rows, width, *out.shape[1:])[:cache.batch_size, :k]
        cache.max_len_bound += k
        return logits

    @torch.no_grad()
    def warm_up(self, max_batch_size: int, max_tokens: int = 1, prompt_tokens: int = 0) -> int:
        """Capture, outside any request, every CUDA graph a run of up to ``max_batch_size`` sequences with passes of
        up to ``max_tokens`` tokens a sequence may replay: the step graphs of every batch bucket <= graph_rows(
        max_batch_size) and width bucket <= graph_width(max_tokens), and the prefill graphs of the token buckets up
        to ``prompt_tokens``. Captures only (nothing replays, lengths are restored): safe while sequences run.
        Returns the number of graphs captured now (0 without graphs or when all exist)."""
        cache = self._need_cache()
        if not self.use_graphs:
            return 0
        top = self.graph_width(min(max_tokens, GRAPH_MAX_TOKENS + 1)) or 1
        widths = [w for w in WIDTH_BUCKETS if w <= top]
        buckets = sorted({self.graph_rows(b) for b in range(1, min(max_batch_size, cache.max_batch_size) + 1)})
        before = len(self._graphs) + len(self._prefill_graphs)
        for rows in buckets:
            for w in widths:
                dummy = torch.zeros(rows, w, dtype=torch.long)
                self._graphs.ensure(("step", rows, w), lambda static: (self._step(static),), dummy, rows)
        free_row = cache.batch_size   # the prefill's warm-up runs write K/V into the row it names
        top = self.prefill_bucket(1, min(prompt_tokens, PREFILL_BUCKETS[-1])) if prompt_tokens else None
        for bucket in sorted({self.prefill_bucket(1, T) for T in PREFILL_BUCKETS} - {None}):
            if top is not None and bucket <= top and free_row < cache.max_batch_size and self.device.type == "cuda":
                packed = to_device(pack_prefill([[0]], bucket, free_row), self.device)
                self._prefill_graphs.ensure(packed, 1, bucket)
        return len(self._graphs) + len(self._prefill_graphs) - before

    @torch.no_grad()
    def draft_loop(self, inputs: Tensor, k: int, choose: Choose, key: Hashable,
                   length_bound: int | None = None) -> tuple[Tensor, Tensor | None]:
        """k tokens per sequence, each chosen on the device from the logits after the one before: the draft
        loop of a draft model, in ONE CUDA graph replay when graphs are on (no host work between its passes).

            rollback   lengths = min(lengths, inputs[:, 0])
            feed       logits = pass over inputs[:, 1:3]                  one [B, 2] pass; its last row
            k choices  d_i, q_i = choose(i, logits, inputs); logits = pass over d_i   (k - 1 single-token passes)

        inputs:  [B, C] int64, any device (a host tensor is sent in one copy): column 0 the length each row
                 is rolled back to, columns 1-2 the two tokens fed first, columns 3.. whatever ``choose`` reads
        choose:  (i, logits [R, V], inputs [R, C]) -> (tokens [R] int64, probs [R, V] float32 or None); device
                 ops only, the same ones on every call (it is captured). R >= B: the graph's bucket rows.
        key:     names ``choose`` and the settings baked into it: one graph per (bucket, k, C, key).
        length_bound: for device ``inputs``, a host bound on inputs[:, 0] (the rows' lengths are rolled back to it
                 or below), so that the cache's room is judged without reading the inputs (host inputs give it).
        Returns (tokens [B, k] int64, probs [B, k, V] float32 or None), copies the caller may keep.

        Lengths advance by k + 1 from the rolled-back ones. Without graphs, past GRAPH_MAX_TOKENS drafts, or
        once MAX_DRAFT_GRAPHS loops are captured (e.g. a server seeing many distinct sampling settings), the
        same body runs eagerly."""
        cache = self._need_cache()
        if inputs.dim() != 2 or inputs.shape[0] != cache.batch_size or inputs.shape[1] < 3 or k < 1:
            raise ValueError(f"draft_loop: inputs must be [B={cache.batch_size}, >= 3] and k >= 1, got "
                             f"{tuple(inputs.shape)}, k={k}")
        if inputs.device.type == "cpu" and length_bound is None:
            length_bound = int(inputs[:, 0].max())
        if length_bound is not None:
            # the loop rolls every row back to inputs[:, 0] before it writes: bound the room by that (a host
            # value), not by the lengths before the rollback, which would refuse the last rounds of a sequence
            cache.max_len_bound = min(cache.max_len_bound, length_bound)
        self._check_room(cache, k + 1)
        batch = cache.batch_size
        rows = self.graph_rows(batch) if self.use_graphs else batch
        graph_key = ("draft", rows, k, inputs.shape[1], key)
        program = lambda static: self._draft_loop_body(static, k, choose)  # noqa: E731
        if self._draft_graph(graph_key, k):
            outputs = self._graphs.replay(graph_key, program, inputs.to(torch.long), rows)
        else:
            outputs = program(to_device(inputs, self.device, torch.long))
        cache.max_len_bound += k + 1
        tokens, probs = outputs
        return tokens[:batch].clone(), None if probs is None else probs[:batch].clone()

    def _draft_graph(self, graph_key: tuple, k: int) -> bool:
        """Whether the draft loop of ``graph_key`` runs as a graph (captured now if needed)."""
        return self.use_graphs and k <= GRAPH_MAX_TOKENS and (
            graph_key in self._graphs or self._graphs.count("draft") < MAX_DRAFT_GRAPHS)

    @torch.no_grad()
    def warm_up_draft_loop(self, max_batch_size: int, k: int, choose: Choose, key: Hashable, width: int) -> int:
        """Capture (only) the draft loops ``draft_loop(inputs [B, width], k, choose, key)`` would replay for every
        batch bucket up to ``max_batch_size``; safe while sequences run. Returns how many were captured now."""
        cache = self._need_cache()
        if not self.use_graphs or k > GRAPH_MAX_TOKENS:
            return 0
        before = len(self._graphs)
        for rows in sorted({self.graph_rows(b) for b in range(1, min(max_batch_size, cache.max_batch_size) + 1)}):
            graph_key = ("draft", rows, k, width, key)
            if self._draft_graph(graph_key, k):
                program = lambda static: self._draft_loop_body(static, k, choose)  # noqa: E731
                self._graphs.ensure(graph_key, program, torch.zeros(rows, width, dtype=torch.long), rows)
        return len(self._graphs) - before

    def _draft_loop_body(self, inputs: Tensor, k: int, choose: Choose) -> tuple[Tensor, Tensor | None]:
        # inputs [R, C] -> (tokens [R, k], probs [R, k, V] | None); the program ``draft_loop`` captures
        rows = inputs.shape[0]
        lengths = self.cache.lengths_for(rows)
        torch.minimum(inputs[:, 0], lengths, out=lengths)       # padding rows: min(x >= 0, 0) = 0
        logits = self._step(inputs[:, 1:3].contiguous())[:, -1]  # [R, V]
        tokens, probs = [], []
        for i in range(k):
            d, q = choose(i, logits, inputs)
            tokens.append(d)
            probs.append(q)
            if i < k - 1:
                logits = self._step(d[:, None])[:, 0]
        return torch.stack(tokens, dim=1), None if probs[0] is None else torch.stack(probs, dim=1)

    # ------------------------------------------------------------------------------- token trees
    @torch.no_grad()
    def append_tree(self, tokens: Tensor, parents) -> Tensor:
        """A tree pass (runtime/tree.py): tokens [B, T] are the last T nodes of each sequence's tree, whose
        ``parents[b]`` (a host sequence of N >= T ints, node 0 the root with parent -1, parents before children,
        the same N for every sequence) describe all of it; the first N - T nodes were appended before (the
        target passes a whole tree, T = N, its root the certain token). Token i goes to slot lengths[b] + i at
        position root + depth, attending the prefix before the root and its own root-to-node path; lengths
        advance by T. -> logits [B, T, V]. With graphs, the pass replays the graph of (``graph_rows(B)``, T) when
        ``warm_up_tree(..., exact=True)`` captured that width, else of (``graph_rows(B)``, ``tree.tree_width(T)``)
        with padding nodes (children of the root) after the real ones."""
        cache = self._need_cache()
        if tokens.dim() != 2 or tokens.shape[0] != cache.batch_size:
            raise ValueError(f"append_tree: tokens must be [B={cache.batch_size}, T], got {tuple(tokens.shape)}")
        if len(parents) != cache.batch_size:
            raise ValueError(f"append_tree: {len(parents)} trees for a batch of {cache.batch_size}")
        T = tokens.shape[1]
        parents = tuple(tuple(int(p) for p in row) for row in parents)
        rows = self.graph_rows(cache.batch_size) if self.use_graphs else cache.batch_size
        layout = trees.tree_layout(parents, T)
        width = T
        if self.use_graphs and self._tree_key(rows, layout) not in self._graphs:
            width = trees.tree_width(T)
        if width > T:   # padding nodes: children of the root; their K/V go to dead slots (cache.PAD_SLOTS)
            parents = tuple(row + (0,) * (width - T) for row in parents)
            tokens = torch.cat([tokens, tokens[:, -1:].expand(-1, width - T)], dim=1)
            layout = trees.tree_layout(parents, width)
        self._check_room(cache, T)
        inputs = self._tree_inputs(layout, tokens)                                 # [B, width * (2 + P)]
        return self._run_tree(inputs, rows, width, layout.path.shape[2], layout.offset, T)

    @torch.no_grad()
    def append_tree_paths(self, tokens: Tensor, depth: Tensor, path: Tensor, tree_size: int) -> Tensor:
        """``append_tree`` with the tree's layout given on the device instead of host parents: tokens [B, T], depth
        [B, T] int64 (each token's depth, the root's 0), path [B, T, P] int64 (each token's root-to-token path as
        node offsets from the root, root first, itself at index depth, entries past it repeating itself;
        ``tree.TreeLayout``'s layout), ``tree_size`` N: the tree's nodes so far, these T included (the first N - T
        were appended before; T = N: the target scores a whole tree). No host read: a drafter whose parents are device
        choices (a dynamic tree's beam, drafters/dynamic_tree.py) feeds them as they are, and the target pass of
        its tree takes the same paths (engine/tree_round.py). Graphs as ``append_tree``: the exact width T when
        ``warm_up_tree(..., exact=True)`` captured (rows, T, P, N - T), else the bucket's width with padding nodes
        (children of the root). -> logits [B, T, V]; lengths advance by T."""
        cache = self._need_cache()
        if tokens.dim() != 2 or tokens.shape[0] != cache.batch_size:
            raise ValueError(f"append_tree_paths: tokens must be [B={cache.batch_size}, T], got "
                             f"{tuple(tokens.shape)}")
        B, T = tokens.shape
        if depth.shape != (B, T) or path.dim() != 3 or path.shape[:2] != (B, T):
            raise ValueError(f"append_tree_paths: depth must be [B, T] = {(B, T)} and path [B, T, P], got "
                             f"{tuple(depth.shape)}, {tuple(path.shape)}")
        if not 1 <= T <= tree_size or tree_size > trees.MAX_TREE_TOKENS:
            raise ValueError(f"append_tree_paths: a pass appends 1..N nodes of an N-node tree (N <= "
                             f"{trees.MAX_TREE_TOKENS}), got T = {T}, N = {tree_size}")
        rows = self.graph_rows(B) if self.use_graphs else B
        P, offset, width = path.shape[2], tree_size - T, T
        if self.use_graphs and ("tree", rows, T, P, offset) not in self._graphs:
            width = trees.tree_width(T)
        dev = tokens.device
        depth, path = depth.to(dev, torch.long), path.to(dev, torch.long)
        if width > T:   # padding nodes, as append_tree's: children of the root at node offsets N, N + 1, ...
            pad, wide = width - T, max(P, width)            # tree_layout's path width at this token count
            path = torch.cat([path, path[:, :, -1:].expand(B, T, wide - P)], dim=2)
            own = torch.arange(tree_size, tree_size + pad, device=dev)[None, :, None].expand(B, pad, wide - 1)
            path = torch.cat([path, torch.cat([torch.zeros(B, pad, 1, dtype=torch.long, device=dev), own], 2)], 1)
            depth = torch.cat([depth, torch.ones(B, pad, dtype=torch.long, device=dev)], dim=1)
            tokens = torch.cat([tokens, tokens[:, -1:].expand(B, pad)], dim=1)
            P = wide
        self._check_room(cache, T)
        inputs = torch.cat([tokens.to(torch.long), depth, path.reshape(B, -1)], dim=1)   # [B, width * (2 + P)]
        return self._run_tree(to_device(inputs, self.device), rows, width, P, offset, T)

    def _run_tree(self, inputs: Tensor, rows: int, width: int, P: int, offset: int, T: int) -> Tensor:
        """The tree pass of ``inputs`` (``TreeLayout.packed``'s [B, width * (2 + P)], its last width - T tokens
        padding) through its graph or eagerly -> the T real tokens' logits [B, T, V]; lengths advance by T."""
        cache = self.cache
        program = lambda static: (self._tree_step(static, width, offset),)  # noqa: E731
        if self.use_graphs:
            (logits,) = self._graphs.replay(("tree", rows, width, P, offset), program, inputs, rows)
            logits = logits[:cache.batch_size, :T].clone()
            if width > T:
                cache.lengths.sub_(width - T)   # the graph advanced every live row by width
        else:
            logits = program(inputs)[0]
        if self.hidden_layers:   # the tokens' states, in (row, token) order of the pass's [rows, width] layout
            out = self._hidden_out(rows * width)
            self.hidden = out.view(rows, width, *out.shape[1:])[:cache.batch_size, :T]
        cache.max_len_bound += T
        return logits

    @staticmethod
    def _tree_key(rows: int, layout: "trees.TreeLayout") -> tuple:
        """The graph key of a tree pass: ("tree", rows, width, P, offset) (the program depends on all four)."""
        return ("tree", rows, layout.depth.shape[1], layout.path.shape[2], layout.offset)

    @torch.no_grad()
    def warm_up_tree(self, max_batch_size: int, parents: tuple[int, ...], num_tokens: int, exact: bool = False) -> int:
        """Capture the graphs ``append_tree(tokens [B, num_tokens], [parents] * B)`` replays for every batch
        bucket up to ``max_batch_size``, and compile the round's KV compaction (``tree.warm_accept_path``); safe while
        sequences run (as ``warm_up``). Returns how many graphs were captured.
        ``exact=True``: the graphs of exactly ``num_tokens`` tokens, which ``append_tree`` then prefers to the
        bucket's width: a drafter whose trees always have this shape (a draft model's depths, a full tree's target
        pass) pays for no padding node, which at B = 8 costs about as much as a real one."""
        cache = self._need_cache()
        trees.warm_accept_path(cache)         # the compaction after each tree round: compiled here, not in a round
        if not self.use_graphs:
            return 0
        width = num_tokens if exact else trees.tree_width(num_tokens)
        layout = trees.tree_layout((tuple(parents) + (0,) * (width - num_tokens),), width)
        offset = layout.offset
        before = len(self._graphs)
        program = lambda static: (self._tree_step(static, width, offset),)  # noqa: E731
        for rows in sorted({self.graph_rows(b) for b in range(1, min(max_batch_size, cache.max_batch_size) + 1)}):
            dummy = torch.zeros(rows, width * (2 + layout.path.shape[2]), dtype=torch.long)
            self._graphs.ensure(self._tree_key(rows, layout), program, dummy, rows)
        return len(self._graphs) - before

    def _tree_inputs(self, layout: "trees.TreeLayout", tokens: Tensor) -> Tensor:
        """The packed input of a tree pass: host tokens make one host tensor (one copy to the device), device
        tokens (a draft model's choices) join the layout copied to their device."""
        if tokens.device.type == "cpu":
            return to_device(layout.packed(tokens), self.device)
        B = tokens.shape[0]
        return torch.cat([tokens.to(torch.long), to_device(layout.depth, tokens.device),
                          to_device(layout.path.reshape(B, -1), tokens.device)], dim=1)

    def _tree_step(self, inputs: Tensor, width: int, offset: int) -> Tensor:
        # inputs [R, width * (2 + P)] -> logits [R, width, V]; the body of the tree graphs. Padding rows have
        # length 0: their root is clamped to slot 0.
        rows = inputs.shape[0]
        tokens, depth, path = trees.unpack(inputs, width)
        lengths = self.cache.lengths_for(rows)
        root = (lengths - offset).clamp(min=0)
        logits = trees.tree_pass(self.net, tokens, depth, path, root, lengths, self._rope, self.cache,
                                 self.num_active_layers, self._hidden_out(tokens.numel()), self.hidden_layers)
        lengths.add_(self.cache.live[:rows], alpha=width)
        return logits

    @torch.no_grad()
    def accept_tree_path(self, path: Tensor, num_accepted: Tensor, tree_size: int) -> None:
        """After verifying a tree of ``tree_size`` nodes (its root included) appended last: move the accepted
        nodes' K/V to the chain slots after the root and set lengths = root + 1 + num_accepted
        (``tree.accept_path``). path [B, D] (node offsets from the root, i.e. verification's path + 1; entries
        past num_accepted ignored), num_accepted [B]: device values, no sync."""
        cache = self._need_cache()
        B = cache.batch_size
        if path.dim() != 2 or path.shape[0] != B or num_accepted.shape != (B,):
            raise ValueError(f"accept_tree_path: path must be [B={B}, D] and num_accepted [B], got "
                             f"{tuple(path.shape)}, {tuple(num_accepted.shape)}")
        if not 1 <= tree_size:
            raise ValueError(f"accept_tree_path: tree_size must be >= 1, got {tree_size}")
        trees.accept_path(cache, B, to_device(path, self.device, torch.long),
                          to_device(num_accepted, self.device, torch.long), tree_size)
        # every row keeps at most 1 + D of its tree's tree_size slots: the host bound drops by the rest without a
        # read (else it would grow by a whole tree per round and read the lengths back long before capacity)
        cache.max_len_bound -= max(0, tree_size - 1 - path.shape[1])

    def decode(self, tokens: Tensor) -> Tensor:
        """tokens [B, 1] -> logits [B, 1, V]; ``append`` with k = 1."""
        if tokens.dim() != 2 or tokens.shape[1] != 1:
            raise ValueError(f"decode takes tokens [B, 1], got {tuple(tokens.shape)}")
        return self.append(tokens)

    @torch.no_grad()
    def rollback(self, new_lengths: Tensor, bound: int | None = None) -> None:
        """Set lengths (no copying). Entries past the new lengths are dead. Lengths can only shrink:
        new values are clamped to the current ones on the device (no sync). Host values (a list of ints, e.g. a
        draft model's rollback to its known history), or a host ``bound`` on device values, also lower the host
        bound of the lengths, so that the passes after them do not read the lengths back near capacity
        (``_check_room``)."""
        cache = self._need_cache()
        new = to_device(new_lengths, self.device, torch.long)
        if new.shape != cache.lengths.shape:
            raise ValueError(f"rollback: new_lengths must be [{cache.batch_size}], got {tuple(new.shape)}")
        torch.minimum(new, cache.lengths, out=cache.lengths)
        if isinstance(new_lengths, (list, tuple)) and new_lengths:
            bound = max(new_lengths)
        if bound is not None:
            cache.max_len_bound = min(cache.max_len_bound, bound)

    @torch.no_grad()
    def copy_kv(self, rows: list[int], source: "Model", source_rows: list[int], starts: list[int], width: int) -> None:
        """Copy into row rows[i] of this cache the K/V of positions [starts[i], starts[i] + width) that row
        source_rows[i] of ``source``'s cache holds (the same positions): a row takes over the entries another row
        computed for the same tokens after the same prefix instead of computing them again (SSD's branch rows).
        ``source`` shares these weights and layers (it may be this model). Like an append of those positions, each
        row's length becomes starts[i] + width (entries past it are dead until written)."""
        if source.net is not self.net or source.num_active_layers != self.num_active_layers:
            raise ValueError("copy_kv: the source model must share this model's weights and layers")
        cache, other = self._need_cache(), source._need_cache()
        if not len(rows) == len(source_rows) == len(starts) or width < 1:
            raise ValueError(f"copy_kv: rows, source_rows and starts must have one entry per row and width >= 1, "
                             f"got {len(rows)}, {len(source_rows)}, {len(starts)} and width {width}")
        if not all(0 <= r < cache.batch_size for r in rows) or not all(0 <= r < other.batch_size for r in source_rows):
            raise ValueError(f"copy_kv: rows must be in [0, {cache.batch_size}) and source rows in "
                             f"[0, {other.batch_size}), got {rows} and {source_rows}")
        if min(starts) < 0 or max(starts) + width > min(cache.capacity, other.capacity):
            raise ValueError(f"copy_kv: positions [{min(starts)}, {max(starts) + width}) outside the caches' "
                             f"{min(cache.capacity, other.capacity)} slots")
        index = torch.tensor([rows, source_rows, starts], dtype=torch.long)                  # [3, R]: one copy
        index = to_device(index, self.device, torch.long)
        positions = index[2, :, None] + torch.arange(width, device=self.device)              # [R, width]
        cache.copy_positions(index[0], other, index[1], positions)
        cache.lengths[index[0]] = index[2] + width
        cache.max_len_bound = max(cache.max_len_bound, max(starts) + width)

    @torch.no_grad()
    def keep(self, batch_indices) -> None:
        """Compact the cache to sequences ``batch_indices`` (in that order); B becomes len(batch_indices).
        Host indices (list / CPU tensor) copy only the rows that move (see ``cache.fill_order``), and of those
        only the slots below ``max_len_bound`` (no row holds K/V past it)."""
        cache = self._need_cache()
        cache.keep(batch_indices, slots=cache.max_len_bound)
        if self._prompt_hidden:   # prompt states not yet taken move with their rows
            order = torch.as_tensor(batch_indices).tolist()
            self._prompt_hidden = {new: self._prompt_hidden[old] for new, old in enumerate(order)
                                   if old in self._prompt_hidden}

    def truncated(self, num_layers: int) -> "Model":
        """A model sharing these weights that runs the first ``num_layers`` layers + final norm + LM head,
        with its own cache (self-speculative drafting)."""
        return Model(self.net, self.tokenizer, num_layers=num_layers, use_graphs=self.use_graphs)
