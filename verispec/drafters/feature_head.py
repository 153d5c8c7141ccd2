"""``FeatureHead``: an EAGLE-3-style head that drafts from the target's own hidden states (head_net.py: the network).

The target writes the chosen layers' states for every token it scores (``Model.capture_hidden``, switched on by
``reserve``), in the same pass. The head keeps one KV cache row per sequence; per row on the host (``_Row``):
the history h_b (L_b = len(h_b), the certain token h_b[-1]) and ``valid`` = the entries fed with the target's
own states. Entry j pairs the target's states at position j with token h_b[j + 1] (head_net.py), so the target
states of h_b[:-1] make entries 0..L_b - 2 and ``valid`` = L_b - 1 between rounds; ``last`` (on the device)
holds entry L_b - 2's output, which predicts the first draft.

    admit    the prompt's states (``Model.take_prompt_hidden``) -> entries 0..P-1, one head pass per prompt
    propose  d_1 from ``last``; then k - 1 single-entry passes on the head's own outputs (entries L-1, L, ...:
             written past ``valid``, dead after the round); k = max_b k_b, row b proposes its first k_b
    commit   the round's target states (``Model.hidden``: rows 0..a_b are the certain token and the accepted
             drafts) with the emitted tokens -> entries L-1 .. L-1+a_b, one pass of width max_b(a_b + 1),
             overwriting the speculative ones; ``last`` = the output of entry L-1+a_b
    keep     rows move whole (host rows, the cache rows, ``last``)
    trees    ``propose_tree(widths)``: depth 1 = the top-w_1 of ``last``'s logits; each node of depths 1..D-1 is an
             entry (its parent's output, its token) at its chain position L - 2 + depth, in slot L - 1 + i (i: its
             index among those nodes, past ``valid``), attending the valid entries and its ancestors' slots only
             (``_tree_body``: one head pass per depth); ``tree_accepted`` gathers the target's states of the root
             and the accepted path from the tree pass (``Model.hidden`` [B, T, C, E]), which ``commit`` feeds as a
             chain round's rows 0..a_b

e.g. prompt of 5 tokens, first token x5: entries 0..4 (states of t0..t4 with tokens t1..x5), ``valid`` = 5;
k = 3: d1 from out_4, entry 5 = (out_4, d1) -> d2, entry 6 = (out_5, d2) -> d3; 2 accepted, recovered r:
commit feeds target states of x5, d1, d2 with tokens d1, d2, r as entries 5, 6, 7; ``valid`` = 8 = L' - 1.

Row b's drafts depend on row b alone: its own cache row and states, its draws from its own DRAFT stream
(``base.draw``, counter advanced by its own k_b), and matmuls whose rows do not depend on the batch (head_net.py's
``_linear``).

The draft loop (``_draft_body``: the logits of ``last``, then k choices and k - 1 head passes) reads everything from
buffers that never move -- the head's KV cache, ``last`` (rows of ``_last_buf``, the size of the cache's batch) and
one int64 input tensor [R, 3] per round, row b = [L_b - 1, seed_b, step_b] -- so on a target with CUDA graphs it
runs as ONE graph replay per round, one graph per (batch bucket R = ``Model.graph_rows(B)``, k, sampling key), with
the choice on the device (``draft_model._choose``: argmax, or filtered_probs + the race on the DRAFT stream at
(seed_b, step_b + i), which ``draw`` computes alike). Padding rows B..R-1 draft from position ``max_seq_len`` of
their own (dead) cache rows, past anything a live row holds. Batches whose rows sample under several settings, and
k > GRAPH_MAX_TOKENS, run the same body eagerly with ``draw``. ``commit``'s pass is a graph too (``_commit_body``, one
per (bucket, width W)): one host tensor [R, W + 3] (the emitted tokens, L_b - 1, a_b, whether row b emitted) and one
device copy of the round's states into a buffer of the head's (``_commit_states_buf``: the target's own buffer
changes layout with the bucket of its pass). On a CPU the graph path runs both bodies eagerly on the padded buffers
(``GraphCache``'s capture-free path), which the CPU tests exercise. A tree's passes are one graph too (one per
(bucket, widths), the same [R, 3] input; padding rows' slots are clamped to the cache's last, dead).

Prelaunch (``prelaunch``, captured loops, before a chain round): the engine may have the head run this round's
commit pass and the next round's draft loop from the outcome on the device, before the host reads it. The commit's
input rows are built there exactly as ``commit`` builds them (the emitted tokens tail[b, 1:a_b + 2], verification's
-1 padding past them becoming the same padding token 0; L_b - 1; a_b), so the entries and ``last`` are the host
commit's bit for bit; ``commit`` then only updates the host rows. The draft loop reads [L_b + a_b, seed_b, step_b];
the next ``propose`` of that k for every row of the same batch takes its drafts, anything else drops them (they
wrote entries past ``valid`` only).
"""
from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor

from ..device import to_device
from ..runtime.cache import StaticKVCache
from ..runtime.graphs import GraphCache
from ..runtime.model import GRAPH_MAX_TOKENS, MAX_DRAFT_GRAPHS
from ..runtime.transformer import rope_table
from ..verify.sampling import is_greedy
from .base import Drafter, Proposal, Sampling, SamplingParams, TreeProposal, draw, full_tree, one_setting
from .draft_model import Prelaunch, _choose
from .head_net import HeadNet

GREEDY_KEY = ("greedy",)


@dataclass
class _Row:
    """Everything the head keeps about one sequence on the host; its K/V are row b of the head's cache and its last
    output row b of ``FeatureHead._last`` (both moved by ``keep`` with the same indices)."""

    history: list[int]          # h_b
    valid: int                  # entries fed with the target's states (L_b - 1 between rounds)
    sampling: Sampling
    step: int = 0               # DRAFT-stream counter: its next draw uses step, step + 1, ...


def embedded_head_dir() -> Path:
    """The head shipped for the embedded SmolLM2 (package data, trained by ``verispec train-head``)."""
    return Path(str(resources.files("verispec.drafters") / "heads" / "smollm2"))


class FeatureHead(Drafter):
    """Draft with a feature-level head. ``FeatureHead()`` = the head shipped for the embedded SmolLM2;
    ``FeatureHead(path)`` loads a directory written by ``verispec train-head`` (or ``HeadNet.save``);
    ``FeatureHead.from_pretrained(path, target)`` also loads a published EAGLE-3 head (published_heads.py);
    ``FeatureHead(net)`` uses a ``HeadNet`` in memory (tests, training's evaluation)."""

    def __init__(self, head: "str | os.PathLike | HeadNet | None" = None):
        if head is None:
            head = embedded_head_dir()
            if not (head / "config.json").is_file():
                raise FileNotFoundError(f"no embedded feature head at {head}: train one with `verispec train-head "
                                        f"--out DIR` and pass FeatureHead(DIR)")
        if isinstance(head, HeadNet):
            self.net, self.meta = head, {}
        elif isinstance(head, (str, os.PathLike)):
            self.net, self.meta = HeadNet.load(head)
        else:
            raise TypeError(f"FeatureHead(head) takes a directory or a HeadNet, got {type(head).__name__}")
        self.cfg = self.net.cfg
        self.target = None
        self._rows: list[_Row] = []
        self._last_buf: Tensor | None = None      # [max rows, E]: row b's last entry output in row b (``_last``)
        self.cache: StaticKVCache | None = None
        self._rope: Tensor | None = None
        # None: draft loops as CUDA graphs whenever the target runs graphs; False: always eagerly (tests compare)
        self.use_graphs: bool | None = None
        self._graphs = GraphCache(_no_step, lambda rows: self.cache.lengths_for(rows))
        self._commit_states: Tensor | None = None   # the captured commits' copy of the target's states
        self._tree_tables: dict[tuple[int, ...], Tensor] = {}   # widths -> ``_tree_table``'s device table
        self._tree_states: Tensor | None = None     # [B, D + 1, C, E]: the tree round's accepted path's states
        self._commits = 0                           # commits so far
        self._committed_ahead = -1                  # the commit whose pass ``prelaunch`` ran already (its index)
        self._prelaunched: Prelaunch | None = None  # the next round's drafts ``prelaunch`` launched
        self.prelaunches = 0                        # draft loops launched from a round's outcome (``prelaunch``)
        self.prelaunches_taken = 0                  # of those, the ones a ``propose`` took

    @classmethod
    def from_pretrained(cls, path: "str | os.PathLike", target) -> "FeatureHead":
        """A head from a directory: a published EAGLE-3 head (config.json + model.safetensors, published_heads.py;
        ``target``, a runtime Model or its ModelConfig, gives the layers it reads and the shapes it is checked
        against) or one written by ``verispec train-head`` (checked against ``target`` too)."""
        from .published_heads import is_published_head, load_published_head

        if is_published_head(path):
            return cls(load_published_head(path, target))
        head = cls(path)
        head.check_fits(target)
        return head

    # ------------------------------------------------------------------------------------ setup
    def check_fits(self, target) -> None:
        """ValueError naming every way the head does not fit ``target`` (a runtime Model or its ModelConfig)."""
        from ..runtime.config import ModelConfig

        c, t = self.cfg, (target if isinstance(target, ModelConfig) else target.config)
        problems = []
        if c.hidden_size != t.hidden_size:
            problems.append(f"hidden size {c.hidden_size} != the target's {t.hidden_size}")
        if c.vocab_size != t.vocab_size:
            problems.append(f"vocabulary {c.vocab_size} != the target's {t.vocab_size}")
        if max(c.target_layers) >= t.num_layers:
            problems.append(f"reads target layers {list(c.target_layers)} but the target runs {t.num_layers}")
        elif c.target_num_layers and c.target_num_layers != t.num_layers:
            problems.append(f"trained on a {c.target_num_layers}-layer target, this one has {t.num_layers}")
        if not isinstance(target, ModelConfig) and not hasattr(target, "capture_hidden"):
            problems.append("the target cannot return hidden states (it needs verispec's runtime Model)")
        if problems:
            raise ValueError("feature head does not fit this target: " + "; ".join(problems))

    def attach(self, target) -> None:
        self.check_fits(target)
        self.net = self.net.to(device=target.device, dtype=target.dtype).eval()
        self.net.requires_grad_(False)
        self.net.read_d2t_order()   # here, before any graph capture of the draft loop needs it
        if self.net.eagle1:   # it reads the target's states after the target's own final norm
            self.net.feature_norm.copy_(target.net.norm)
            self.net.feature_norm_eps = target.config.rms_norm_eps

    def reserve(self, target, max_batch_size: int, max_seq_len: int) -> None:
        if self.target is not target:
            self.attach(target)
            self.target = target
            self._graphs.clear()   # captured with another target's weights (and the head's cast for it)
        target.capture_hidden(self.cfg.target_layers)
        mc = self.cfg.model_config()
        if self.cache is None or not self.cache.fits(max_batch_size, max_seq_len) or self.cache.k[0].device != \
                target.device or self.cache.k[0].dtype != target.dtype:
            self._graphs.clear()   # they read and write the buffers made here
            self.cache = StaticKVCache(mc, max_batch_size, max_seq_len, target.device, target.dtype)
            self._rope = rope_table(mc, self.cache.capacity, target.device)
            self._last_buf = torch.zeros(self.cache.max_batch_size, self.cfg.hidden_size, device=target.device,
                                     dtype=target.dtype)
            self._commit_states = None
            self._tree_tables = {}
        self.cache.reset(0, max_seq_len)
        self._rows = []
        self._tree_states = None
        self._prelaunched = None

    @property
    def _last(self) -> Tensor:
        """[B, E]: each live row's last entry output (a view of ``_last_buf``)."""
        return self._last_buf[:len(self._rows)]

    @property
    def _sampling(self) -> SamplingParams:
        return SamplingParams(tuple(r.sampling for r in self._rows))

    def _feed(self, first_row: int, states: Tensor, tokens: Tensor, pos: Tensor, invariant: bool = True) -> Tensor:
        """One head pass over cache rows [first_row, first_row + n): states [n, T, C, E] or fused features
        [n, T, E] (the head's own outputs), tokens [n, T], pos [n, T] -> out [n, T, E]. ``invariant``: batch-invariant
        matmuls (every pass over the batch's rows; an admission's pass over one prompt alone need not be)."""
        feats = self.net.fuse(states, invariant) if states.dim() == 4 else states
        n = feats.shape[0]
        k = self.cache.k[0][first_row:first_row + n]
        v = self.cache.v[0][first_row:first_row + n]
        return self.net.cached(feats, tokens, pos, self.target.net.embed, k, v, self._rope, invariant)

    # ------------------------------------------------------------------------------------ interface
    @torch.no_grad()
    def admit(self, seq_ids, prompts, first_tokens, sampling) -> None:
        first = len(self._rows)
        device = self.target.device
        for j, (prompt, token) in enumerate(zip(prompts, first_tokens, strict=True)):
            states = self.target.take_prompt_hidden(first + j)                              # [P, C, E]
            P = len(prompt)
            if states.shape[0] != P:
                raise RuntimeError(f"feature head: the target's states of row {first + j} cover {states.shape[0]} "
                                   f"tokens, its prompt has {P}")
            tokens = to_device([list(prompt[1:]) + [token]], device, torch.long)            # [1, P]: t_{j+1}
            pos = torch.arange(P, device=device)[None]
            out = self._feed(first + j, states[None], tokens, pos, invariant=False)         # [1, P, E]
            self._last_buf[first + j] = out[0, -1]
        self.cache.admit([len(p) for p in prompts])
        self._rows += [_Row(list(p) + [t], len(p), s) for p, t, s in zip(prompts, first_tokens, sampling.rows)]
        self._prelaunched = None

    # ------------------------------------------------------------------------------------ the draft loop
    def _graphs_on(self) -> bool:
        return self.use_graphs is not False and bool(getattr(self.target, "use_graphs", False))

    def _loop_key(self, k: int) -> tuple | None:
        """The key of the captured draft loop for this batch, or None to run it eagerly (no graphs, k past
        GRAPH_MAX_TOKENS, rows sampling under several settings, or MAX_DRAFT_GRAPHS loops captured already)."""
        if not self._graphs_on() or k > GRAPH_MAX_TOKENS:
            return None
        sampling = self._sampling
        setting = None if sampling.all_greedy else one_setting(sampling)
        if not sampling.all_greedy and setting is None:
            return None
        key = GREEDY_KEY if sampling.all_greedy else ("sample", *setting)
        graph_key = ("draft", self.target.graph_rows(len(self._rows)), k, key)
        if graph_key in self._graphs or self._graphs.count("draft") < MAX_DRAFT_GRAPHS:
            return key
        return None

    def _inputs(self, rows: int) -> Tensor:
        """The loop's host input [rows, 3]: row b = [L_b - 1 (the entry its first head pass writes), seed_b,
        step_b]; padding rows past the batch draft from slot ``max_seq_len`` (dead) of their own cache rows."""
        live = [[r.valid, r.sampling.seed, r.step] for r in self._rows]
        return torch.tensor(live + [[self.cache.max_seq_len, 0, 0]] * (rows - len(live)), dtype=torch.long)

    def _draft_body(self, inputs: Tensor, k: int, choose) -> tuple[Tensor, "Tensor | None"]:
        """The draft loop over the first R = inputs.shape[0] rows (the program a graph captures: device ops only).
        inputs [R, 3] int64 on the device (``_inputs``); choose(i, logits [R, V], inputs) -> (tokens [R], q [R, V]
        | None), or None for greedy rows (``HeadNet.greedy``: no V-wide logits) -> (drafts [R, k] int64, q [R, k, V]
        float32 | None). d_1 from ``last``; entry L-1+i = (the previous output, d_{i+1}) -> d_{i+2}, written past
        ``valid`` (dead after the round)."""
        R = inputs.shape[0]
        lm_head = self.target.net.lm_head_weight
        base = inputs[:, 0]
        out = self._last_buf[:R][:, None]                                                   # [R, 1, E]
        tokens, probs = [], []
        for i in range(k):
            if i:
                out = self._feed(0, out, tokens[-1][:, None], (base + i - 1)[:, None])
            if choose is None:
                d, q = self.net.greedy(out[:, 0], lm_head), None
            else:
                d, q = choose(i, self.net.logits(out[:, 0], lm_head, invariant=True), inputs)
            tokens.append(d)
            probs.append(q)
        return torch.stack(tokens, dim=1), None if probs[0] is None else torch.stack(probs, dim=1)

    @property
    def graph_captures(self) -> int:
        return self._graphs.captures

    def warm_up(self, max_batch_size: int, k: int, settings: list[tuple[float, int, float]],
                prompt_tokens: int = 0) -> int:
        """The captured draft loops of every batch bucket up to ``max_batch_size`` for 1..``k`` drafts (a round drafts
        fewer near its rows' end, or under k=auto) and each setting (all greedy rows share one), and the commits of
        1..k+1 tokens a row. Captures only; their warm-up passes
        write dead slots (position max_seq_len) and keep every row's ``last``, so it is safe while sequences run."""
        if self.cache is None or not self._graphs_on() or not 1 <= k <= GRAPH_MAX_TOKENS:
            return 0
        keys = sorted({GREEDY_KEY if is_greedy(t) else ("sample", t, tk, tp) for t, tk, tp in settings}, key=repr)
        before = len(self._graphs)
        dead = self.cache.max_seq_len
        for rows in sorted({self.target.graph_rows(b) for b in range(1, min(max_batch_size,
                                                                                self.cache.max_batch_size) + 1)}):
            for steps, key in itertools.product(range(1, k + 1), keys):
                graph_key = ("draft", rows, steps, key)
                if graph_key in self._graphs or self._graphs.count("draft") >= MAX_DRAFT_GRAPHS:
                    continue
                choose = _head_choose(key)
                dummy = torch.tensor([[dead, 0, 0]] * rows, dtype=torch.long)
                self._graphs.ensure(graph_key, lambda static, steps=steps, choose=choose:
                                    self._draft_body(static, steps, choose), dummy, rows)
            for width in range(1, k + 2):   # the commits of 1..k+1 emitted tokens (dummy rows emit nothing)
                dummy = torch.tensor([[0] * width + [dead, 0, 0]] * rows, dtype=torch.long)
                self._graphs.ensure(("commit", rows, width), self._commit_program(width), dummy, rows)
        return len(self._graphs) - before

    @torch.no_grad()
    def propose(self, max_num_draft: list[int]) -> Proposal:
        B, k = len(self._rows), max(max_num_draft)
        if k == 0:
            return Proposal(torch.zeros(B, 0, dtype=torch.long), [0] * B, None)
        device = self.target.device
        pre, self._prelaunched = self._prelaunched, None
        if pre is not None and pre.serves(k, B, self._commits, max_num_draft):
            self.prelaunches_taken += 1
            for r in self._rows:
                r.step += k
            return Proposal(*_flat_q(pre.drafts, pre.probs, list(max_num_draft), device))
        key = self._loop_key(k)
        if key is not None:   # one graph replay: the inputs go in one copy
            rows = self.target.graph_rows(B)
            choose = _head_choose(key)
            draft_tokens, q = self._graphs.replay(("draft", rows, k, key),
                                                  lambda static: self._draft_body(static, k, choose),
                                                  self._inputs(rows), rows)
            draft_tokens, q = draft_tokens[:B].clone(), None if q is None else q[:B].clone()
        else:
            sampling, steps = self._sampling, [r.step for r in self._rows]
            draft_tokens, q = self._draft_body(
                to_device(self._inputs(B), device), k,
                None if sampling.all_greedy else lambda i, logits, inputs: draw(logits, sampling,
                                                                                [s + i for s in steps]))
        for r, n in zip(self._rows, max_num_draft):
            r.step += n
        return Proposal(*_flat_q(draft_tokens, q, list(max_num_draft), device))

    @torch.no_grad()
    def prelaunch(self, shape: int | tuple[int, ...], num_draft: list[int], num_accepted: Tensor,
                  tail: Tensor) -> bool:
        """This round's commit pass and the next round's draft loop of k = ``shape`` drafts, both launched from the
        outcome on the device before the host reads it (``Drafter.prelaunch``; a chain only, captured loops only).
        The commit's inputs are built there as ``commit`` builds them on the host: row b feeds the emitted tokens
        tail[b, 1:a_b + 2] (verification's -1 padding past them becomes ``commit``'s padding token 0) at entries
        L_b - 1 .., its ``last`` from entry L_b - 1 + a_b; ``commit`` then only updates the host rows. The draft loop
        reads [L_b + a_b, seed_b, step_b]."""
        self._prelaunched = None
        B = len(self._rows)
        counts = self._prelaunch_counts(B, num_draft, num_accepted, tail)                      # [B]
        if isinstance(shape, tuple) or not shape or not B or not self._graphs_on():
            return False
        key, width = self._loop_key(shape), max(num_draft) + 1
        states = self.target.hidden if self._tree_states is None else self._tree_states
        if (key is None or width > GRAPH_MAX_TOKENS + 1 or states is None or states.shape[0] != B
                or states.shape[1] < width):
            return False
        device, rows, dead = self.target.device, self.target.graph_rows(B), self.cache.max_seq_len
        a = counts.to(device)[:, None]                                                          # [B, 1]
        host = to_device([[r.valid, r.sampling.seed, r.step] for r in self._rows] +
                         [[dead, 0, 0]] * (rows - B), device, torch.long)                     # [rows, 3]
        # a failed row's tokens mean nothing (it leaves before the next round): keep them inside the vocabulary
        tokens = tail[:, 1:width + 1].to(device, torch.long).clamp(0, self.target.config.vocab_size - 1)   # [B, W]
        live = torch.cat([tokens, host[:B, :1], a, torch.ones_like(a)], dim=1)              # [B, W + 3]
        pad = torch.cat([torch.zeros(rows - B, width, dtype=torch.long, device=device), host[B:, :1],
                         torch.zeros(rows - B, 2, dtype=torch.long, device=device)], dim=1)   # dead, emit nothing
        self._commit_states_buf()[:B, :width].copy_(states[:, :width])
        self._graphs.replay(("commit", rows, width), self._commit_program(width), torch.cat([live, pad]), rows)
        self._committed_ahead = self._commits
        inputs = torch.cat([torch.cat([host[:B, :1] + a + 1, host[:B, 1:]], dim=1), host[B:]])   # [rows, 3]
        choose = _head_choose(key)
        drafts, q = self._graphs.replay(("draft", rows, shape, key),
                                        lambda static: self._draft_body(static, shape, choose), inputs, rows)
        self._prelaunched = Prelaunch(shape, B, self._commits, drafts[:B].clone(), None if q is None else q[:B].clone())
        self.prelaunches += 1
        return True

    @torch.no_grad()
    def commit(self, num_accepted: list[int], emitted: list[list[int]]) -> None:
        width = max((len(e) for e in emitted), default=0)
        ahead, self._committed_ahead, self._commits = self._committed_ahead == self._commits, -1, self._commits + 1
        if width == 0 or ahead:       # nothing to feed, or ``prelaunch`` ran this pass from the device's outcome
            self._tree_states = None
            for r, e in zip(self._rows, emitted):
                r.valid += len(e)
                r.history.extend(e)
            return
        # a tree round's accepted path (``tree_accepted``), else the chain pass's rows: [B, K+1, C, E]
        states, self._tree_states = (self.target.hidden if self._tree_states is None else self._tree_states), None
        B = len(self._rows)
        if states is None or states.shape[0] != B or states.shape[1] < width:
            raise RuntimeError("feature head: the target's last pass left no hidden states for this round "
                               f"(got {None if states is None else tuple(states.shape)})")
        # one host tensor, one copy: row b = its emitted tokens (padded with 0) | L_b - 1 | its last entry's
        # index in the feed (a_b) | whether it emitted anything (a row whose round failed keeps its ``last``)
        live = [(e + [0] * width)[:width] + [r.valid, max(len(e) - 1, 0), int(bool(e))]
                for e, r in zip(emitted, self._rows, strict=True)]
        if self._graphs_on() and width <= GRAPH_MAX_TOKENS + 1:
            rows = self.target.graph_rows(B)
            self._commit_states_buf()[:B, :width].copy_(states[:, :width])
            self._graphs.replay(("commit", rows, width), self._commit_program(width), self._commit_inputs(live, rows),
                                rows)
        else:
            self._commit_body(to_device(torch.tensor(live, dtype=torch.long), self.target.device), states[:, :width])
        for r, e in zip(self._rows, emitted):
            r.valid += len(e)
            r.history.extend(e)

    def _commit_inputs(self, live: list[list[int]], rows: int) -> Tensor:
        """``commit``'s host input [rows, W + 3]; padding rows feed dead slots (position max_seq_len) and keep their
        ``last`` (they emitted nothing)."""
        width = len(live[0]) - 3 if live else 0
        pad = [0] * width + [self.cache.max_seq_len, 0, 0]
        return torch.tensor(live + [pad] * (rows - len(live)), dtype=torch.long)

    def _commit_states_buf(self) -> Tensor:
        """The static [max rows, GRAPH_MAX_TOKENS + 1, C, E] buffer the captured commits read the target's states
        from (made with the cache; the target's own buffer changes layout with its pass's bucket). One copy a round
        fills it: e.g. SmolLM2, 8 rows, bf16: 8 x 17 x 3 x 576 x 2 B = 0.5 MB."""
        if self._commit_states is None:
            self._commit_states = torch.zeros(self.cache.max_batch_size, GRAPH_MAX_TOKENS + 1,
                                              len(self.cfg.target_layers), self.cfg.hidden_size,
                                              dtype=self.target.dtype, device=self.target.device)
        return self._commit_states

    def _commit_program(self, width: int):
        """The captured commit of ``width`` emitted tokens a row: reads the first rows of ``_commit_states_buf``."""
        return lambda static: self._commit_body(static, self._commit_states_buf()[:static.shape[0], :width])

    def _commit_body(self, inputs: Tensor, states: Tensor) -> tuple[Tensor]:
        """``commit``'s pass over the first R rows (what a graph captures): inputs [R, W + 3] int64 on the device
        (``_commit_inputs``'s layout), states [R, W, C, E] -> entries L_b - 1 .. L_b - 1 + W - 1 of each row written,
        row b's ``last`` = the output of its entry L_b - 1 + a_b (unchanged where it emitted nothing). Running it twice
        writes the same (a capture's warm-up does)."""
        R, width = inputs.shape[0], inputs.shape[1] - 3
        tokens, base, idx, has = (inputs[:, :width], inputs[:, width], inputs[:, width + 1],
                                  inputs[:, width + 2].bool())
        pos = base[:, None] + torch.arange(width, device=inputs.device)                      # [R, W]
        out = self._feed(0, states, tokens, pos)                                              # [R, W, E]
        fresh = out[torch.arange(R, device=inputs.device), idx]                               # [R, E]
        last = self._last_buf[:R]
        last.copy_(torch.where(has[:, None], fresh, last))
        return (last,)

    # ------------------------------------------------------------------------------------ trees
    drafts_trees = True

    @torch.no_grad()
    def propose_tree(self, widths: tuple[int, ...]) -> TreeProposal:
        """The full tree of ``widths``: the top-w_d children of each node by the head's logits (deterministic
        proposals, in greedy and sampled rounds alike), one head pass per depth but the last over all of that
        depth's nodes (``_tree_body``); on a target with graphs ONE replay per round, a graph per (batch bucket,
        widths). Every row proposes the full tree."""
        widths = tuple(int(w) for w in widths)
        if not widths or min(widths) < 1:
            raise ValueError(f"propose_tree: widths must be >= 1 at every depth, got {list(widths)}")
        self._prelaunched = None
        B = len(self._rows)
        table = self._tree_table(widths)
        if self._graphs_on():
            rows = self.target.graph_rows(B)
            (nodes,) = self._graphs.replay(("tree", rows, widths), self._tree_program(widths, table),
                                           self._inputs(rows), rows)
            nodes = nodes[:B].clone()
        else:
            nodes = self._tree_body(to_device(self._inputs(B), self.target.device), widths, table)
        return TreeProposal(nodes.reshape(-1), full_tree(widths) * B, [nodes.shape[1]] * B)

    def _tree_table(self, widths: tuple[int, ...]) -> Tensor:
        """[M, D - 1] int64 on the target's device, M = the nodes of every depth but the last (the nodes the head
        feeds, node order): row i = node i's ancestors' indices, root-most first, itself at index depth - 1, padded
        by repeating itself (a scatter of the row is then harmless). Built once per widths, outside any capture.
        e.g. (2, 2, 1): nodes 0, 1 (depth 1), 2..5 (depth 2): [[0, 0], [1, 1], [0, 2], [0, 3], [1, 4], [1, 5]]."""
        table = self._tree_tables.get(widths)
        if table is None:
            parents = full_tree(widths)
            fed = len(parents) - math.prod(widths)                 # every node but the last depth's
            rows = []
            for i in range(fed):
                path = [i]
                while parents[path[0]] >= 0:
                    path.insert(0, parents[path[0]])
                rows.append(path + [i] * (len(widths) - 1 - len(path)))
            table = to_device(torch.tensor(rows, dtype=torch.long).view(fed, max(len(widths) - 1, 0)),
                              self.target.device, torch.long)
            self._tree_tables[widths] = table
        return table

    def _tree_program(self, widths: tuple[int, ...], table: Tensor):
        """The captured tree passes of ``widths`` (``_tree_body``) as a graph program."""
        return lambda static: (self._tree_body(static, widths, table),)

    def _tree_body(self, inputs: Tensor, widths: tuple[int, ...], table: Tensor) -> Tensor:
        """The tree's passes over the first R = inputs.shape[0] rows (what a graph captures: device ops only).
        inputs [R, 3] (``_inputs``: column 0 = L_b - 1, the first entry past ``valid``), table ``_tree_table``'s
        -> nodes [R, N] int64 in node order (``full_tree``).

        Depth d + 1's nodes are the top-w children of each depth-d node's logits (the root's from ``last``). A node
        of depth d < D is fed as entry (its parent's output -- ``last`` for depth 1 --, its token) at RoPE position
        L_b - 2 + d, exactly a chain's entry for the same path, in slot L_b - 1 + i (i its index among the fed
        nodes: slots past ``valid``, dead after the round); it attends to the row's valid entries and to its own
        ancestors' slots and its own, so each root-to-node path computes what a chain of that path computes. Padding
        rows (L_b - 1 = ``max_seq_len``) write slots clamped to the cache's last one (dead)."""
        R = inputs.shape[0]
        device = inputs.device
        lm_head = self.target.net.lm_head_weight
        S = self.cache.capacity
        base = inputs[:, 0]                                                                 # [R]
        out = self._last_buf[:R, None]                                                      # [R, 1, E]
        levels, start = [], 0
        for d, w in enumerate(widths):
            # each node's top-w children, in node order (w = 1: the argmax, the chain's choice)
            new = self.net.top_children(out.reshape(-1, out.shape[-1]), w, lm_head).view(R, -1)
            levels.append(new)                                                              # [R, n_{d+1}]
            if d == len(widths) - 1:
                break
            n = new.shape[1]
            feats = out[:, :, None].expand(-1, -1, w, -1).reshape(R, n, -1)                # [R, n, E]: parents'
            slots = (base[:, None] + torch.arange(start, start + n, device=device)).clamp(max=S - 1)   # [R, n]
            pos = (base + d)[:, None].expand(R, n)
            visible = (torch.arange(S, device=device)[None, None, :] < base[:, None, None]).expand(R, n, S).clone()
            ancestors = (base[:, None, None] + table[start:start + n][None, :, :d + 1]).clamp(max=S - 1)
            visible.scatter_(2, ancestors, True)                                             # [R, n, S]
            k = self.cache.k[0][:R]
            v = self.cache.v[0][:R]
            out = self.net.cached(feats, new, pos, self.target.net.embed, k, v, self._rope, True, slots, visible)
            start += n
        return torch.cat(levels, dim=1)

    def warm_up_tree(self, max_batch_size: int, widths: tuple[int, ...], prompt_tokens: int = 0) -> int:
        """The captured tree passes of ``widths`` for every batch bucket up to ``max_batch_size`` and the commits of
        1..depth + 1 tokens a row (as ``warm_up``: captures only, dead slots, every row's ``last`` kept)."""
        widths = tuple(int(w) for w in widths)
        if self.cache is None or not self._graphs_on() or len(widths) + 1 > GRAPH_MAX_TOKENS + 1:
            return 0
        before = len(self._graphs)
        dead = self.cache.max_seq_len
        table = self._tree_table(widths)
        for rows in sorted({self.target.graph_rows(b) for b in range(1, min(max_batch_size,
                                                                                self.cache.max_batch_size) + 1)}):
            dummy = torch.tensor([[dead, 0, 0]] * rows, dtype=torch.long)
            self._graphs.ensure(("tree", rows, widths), self._tree_program(widths, table), dummy, rows)
            for width in range(1, len(widths) + 2):   # the commits of 1..D + 1 emitted tokens
                dummy = torch.tensor([[0] * width + [dead, 0, 0]] * rows, dtype=torch.long)
                self._graphs.ensure(("commit", rows, width), self._commit_program(width), dummy, rows)
        return len(self._graphs) - before

    @torch.no_grad()
    def tree_accepted(self, path: Tensor, num_accepted: Tensor) -> None:
        """Keep the target's states of the root and of the accepted path's nodes from the tree pass (``Model.hidden``
        [B, T, C, E], row j + 1 = node j): [B, D + 1, C, E], rows past num_accepted are the root's (never read:
        ``commit`` feeds them to dead entries). ``commit`` reads them in place of a chain pass's states."""
        states = self.target.hidden
        B = len(self._rows)
        if states is None or states.shape[0] != B:
            raise RuntimeError("feature head: the target's tree pass left no hidden states for this round "
                               f"(got {None if states is None else tuple(states.shape)})")
        path = to_device(path, states.device, torch.long)                                     # [B, D]
        index = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=states.device), path], dim=1)
        self._tree_states = states.gather(1, index[:, :, None, None].expand(-1, -1, *states.shape[2:]))

    def keep(self, batch_indices) -> None:
        order = list(batch_indices)
        # the rows that go on keep their prelaunched drafts (their cache rows and ``last`` move with them)
        self._prelaunched = self._prelaunched.kept(order) if self._prelaunched is not None and order else None
        self.cache.keep(order)
        n = len(order)
        self._last_buf[:n] = self._last_buf[to_device(order, self._last_buf.device, torch.long)]
        self._rows = [self._rows[i] for i in order]


def _flat_q(drafts: Tensor, q: Tensor | None, max_num_draft: list[int], device) -> tuple:
    """(drafts, max_num_draft, q as ``Proposal`` wants it: [sum k_b, V] float32, rows (b, i < k_b), or None)."""
    if q is None:
        return drafts, max_num_draft, None
    k = drafts.shape[1]
    q = q.flatten(0, 1).float()                                                             # [B*k, V], rows (b, i)
    if any(n != k for n in max_num_draft):   # ragged: rows i < k_b (host indices: no sync)
        rows_kept = [b * k + i for b, n in enumerate(max_num_draft) for i in range(n)]
        q = q[to_device(rows_kept, device, torch.long)]
    return drafts, max_num_draft, q


def _head_choose(key: tuple):
    """``draft_model._choose`` for the head's draft loop: None (``HeadNet.greedy``) for the greedy key."""
    return None if key == GREEDY_KEY else _choose(key, seed_column=1)


def _no_step(tokens: Tensor) -> Tensor:
    raise RuntimeError("the feature head's graph cache holds draft loops only (no target step)")
