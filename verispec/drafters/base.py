"""The one small interface every drafter implements, and the helpers drafters share.

A drafter sees each sequence's *history* h_b: its prompt, then every token emitted so far. The
last token of h_b is the round's *certain* token (emitted, but not yet in the target's cache). The
drafter's batch mirrors the engine's: rows in the same order, sequences join at the end and leave
through ``keep``:

    reserve(target, max_batch_size, max_seq_len)     once per run: size caches, start with no sequences
    warm_up(max_batch_size, k, settings, prompt_tokens)  optional: capture the CUDA graphs it will replay
    admit(seq_ids, prompts, first_tokens, sampling)  append sequences; h_b = prompt_b + [first_b]
    propose(max_num_draft) -> Proposal               up to max_num_draft[b] drafts continuing each h_b
    commit(num_accepted, emitted)                    h_b += emitted_b (accepted drafts + recovered/bonus)
    keep(batch_indices)                              only these rows go on, in this order
    prelaunch(shape, num_draft, num_accepted, tail)  optional, between a round's verification and its commit:
                                                     launch the next round's drafts (k, or a tree's widths) from
                                                     the outcome on the device (``DraftModel``); the next
                                                     propose([k] * B) / propose_tree(widths) takes them

Row b's drafts, and the draws behind them, depend on row b alone: its history, its settings and seed, its own
``max_num_draft[b]`` and its own past rounds -- never on the other rows, nor on the round's widest row (a sampled
request's tokens depend on its drafts, and must not depend on the batch). ``commit`` comes after every round, also
after one without ``propose`` (every row asked for 0 drafts): per-row state that counts rounds advances there.
Everything a drafter keeps about a row lives in one object per row, in one list in batch order (``_Row`` in
``PromptLookup`` and ``DraftModel``): ``admit`` appends objects and ``keep`` is one selection of that list, so
no field of a row can be left behind or moved alone.

``attach(target)`` runs once, when a decoder is built: it checks compatibility (vocabulary,
tokenizer) so that bad pairings fail before any work. ``seq_ids`` are the caller's ids of the
admitted sequences (``OracleDraft`` uses them to find each sequence's continuation).

Faults (the engine's rule: docs/engine.md, "Faults"): a drafter whose ``propose`` or ``commit`` fails for
some rows only finishes the other rows' work and then raises ``DraftError`` naming them; the engine fails
those requests and the others go on untouched. Any other exception names no row: the engine stops calling
the drafter until every request that was running then has ended. A row whose round failed is committed
with ``num_accepted`` 0 and ``emitted`` [] (it leaves the batch at the next ``keep``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from ..device import to_device
from ..runtime import ops
from ..verify import rng
from ..verify.sampling import filtered_probs, is_greedy


@dataclass(frozen=True)
class Sampling:
    """One sequence's sampling settings and stream seed."""

    temperature: float = 0.0        # 0 = greedy
    top_k: int = 0                  # 0 = off
    top_p: float = 1.0              # 1 = off
    seed: int = 0                   # keys the sequence's verification stream and its draft draws

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    @property
    def setting(self) -> tuple[float, int, float]:
        """(temperature, top_k, top_p): what a captured draft loop is specialized on (the seed is an input)."""
        return (self.temperature, self.top_k, self.top_p)


@dataclass(frozen=True)
class SamplingParams:
    """The sampling settings of a batch: one ``Sampling`` per row, in batch order.

    The rows are the state; ``temperature``, ``top_k``, ``top_p`` and ``seed`` are the same values as
    columns (tuples of length B, what the verification API and the draft draws take), derived once.
    ``select`` and ``+`` move whole rows, so a row's settings and seed cannot come apart.
    """

    rows: tuple[Sampling, ...] = ()

    def __post_init__(self):
        rows = tuple(self.rows)
        object.__setattr__(self, "rows", rows)
        for name in ("temperature", "top_k", "top_p", "seed"):
            object.__setattr__(self, name, tuple(getattr(r, name) for r in rows))

    @staticmethod
    def columns(temperature, top_k, top_p, seed) -> "SamplingParams":
        """From columns of equal length (row b = (temperature[b], top_k[b], top_p[b], seed[b]))."""
        cols = [tuple(temperature), tuple(top_k), tuple(top_p), tuple(seed)]
        if len({len(c) for c in cols}) != 1:
            raise ValueError(f"SamplingParams.columns: columns of lengths {[len(c) for c in cols]} (one per row)")
        return SamplingParams(tuple(Sampling(*row) for row in zip(*cols)))

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def all_greedy(self) -> bool:
        return all(r.greedy for r in self.rows)

    def select(self, batch_indices: list[int]) -> "SamplingParams":
        return SamplingParams(tuple(self.rows[i] for i in batch_indices))

    def __add__(self, other: "SamplingParams") -> "SamplingParams":
        """The settings of this batch followed by ``other``'s (sequences admitted at the end)."""
        return SamplingParams(self.rows + other.rows)

    @staticmethod
    def empty() -> "SamplingParams":
        return SamplingParams()


@dataclass
class Proposal:
    """Drafts for one round.

    draft_tokens: [B, K] int64, any device; row b is valid in [:num_draft[b]], the rest is padding
    num_draft:    B host ints k_b <= K (K = max k_b, may be 0)
    draft_probs:  [sum k_b, V] float32, the distribution q each valid draft was drawn from, rows in
                  (b, i) order; None = point-mass drafts (prompt lookup, oracle)
    """

    draft_tokens: Tensor
    num_draft: list[int]
    draft_probs: Tensor | None = None


@dataclass
class TreeProposal:
    """Draft trees for one round (``Drafter.propose_tree``), in the layout of ``verispec.verify_tree_greedy``.

    draft_tokens: [sum n_b] int64, any device: sequence b's nodes, in node order, after sequence b - 1's
    parents:      sum n_b host ints, node j's parent local to its sequence (-1 = the root: the certain token);
                  parents come before their children
    num_nodes:    B host ints n_b (0 allowed: that row's round is a plain decode step)
    paths:        optional [B, n, D + 1] int64 on the nodes' device, when every row has n nodes: node j's
                  root-to-node path as node offsets from the root (root 0 first, node j at j + 1, entries past its depth
                  repeating itself: ``runtime.tree``'s layout). The same tree as ``parents``; given, the target's tree
                  pass takes it as it is (``Model.append_tree_paths``) instead of building the layout on the host from
                  parents (a dynamic tree's per-row shapes rarely repeat, so no layout cache would hold them)
    e.g. widths (2, 1) for one row: nodes [a, b, a', b'] with parents [-1, -1, 0, 1].
    Every tree drafter proposes deterministic nodes (no draft_probs): ``verify_tree_sample`` is exact for them.
    """

    draft_tokens: Tensor
    parents: tuple[int, ...]
    num_nodes: list[int]
    paths: Tensor | None = None


@functools.lru_cache(maxsize=64)
def full_tree(widths: tuple[int, ...]) -> tuple[int, ...]:
    """The local parents (``TreeProposal``'s layout: -1 = the root) of the full tree of widths[d] children per node
    at depth d, in node order: depth by depth, the children of a depth's i-th node at that depth's next level
    indices i * w .. i * w + w - 1 (the order every tree drafter uses). e.g. (2, 1) -> (-1, -1, 0, 1)."""
    parents: list[int] = []
    level = [-1]
    for w in widths:
        nxt = []
        for p in level:
            for _ in range(w):
                nxt.append(len(parents))
                parents.append(p)
        level = nxt
    return tuple(parents)


class TreeDraftUnsupported(TypeError):
    """The drafter has no tree drafting: it would only draft a chain (``generate(..., tree=...)`` refuses it)."""


class DraftError(RuntimeError):
    """``propose`` or ``commit`` failed for the rows in ``failed`` (batch row -> reason) only.

    Raised after the drafter finished every other row's work, so its state stays valid for them. From
    ``propose``, ``proposal`` holds the other rows' drafts (the failed rows with 0 drafts), or None: the
    round then runs without drafts."""

    def __init__(self, failed: dict[int, str], proposal: Proposal | None = None):
        super().__init__("; ".join(f"row {b}: {why}" for b, why in sorted(failed.items())))
        self.failed = dict(failed)
        self.proposal = proposal


def each_row(fn, num_rows: int) -> tuple[list, dict[int, str]]:
    """[fn(b) for b in range(num_rows)], except that an exception in row b's call becomes b's failure
    (``failed[b]`` = its reason, its result None) and the other rows still run: the building block of a
    ``DraftError``."""
    results, failed = [], {}
    for b in range(num_rows):
        try:
            results.append(fn(b))
        except Exception as e:  # noqa: BLE001 - one sequence's failure is its own
            results.append(None)
            failed[b] = f"{type(e).__name__}: {e}"
    return results, failed


class Drafter:
    """Base class of the drafter interface (see the module docstring). Subclasses override all five."""

    # prompt tokens this drafter has run through a model's prefill so far (``DraftModel`` prefills a row's prompt in
    # the first round it drafts): a round in which the count grew paid a one-time prefill, which the scheduler keeps
    # out of k=auto's measured round costs
    prefill_tokens: int = 0
    # catch-up passes run so far (``DraftModel``: the pass that feeds a row's tokens emitted while it did not draft):
    # also one-time work of the round that ran it, kept out of the measured round costs like a prefill
    catch_up_passes: int = 0

    def draft_debt(self) -> tuple[list[int], int] | None:
        """The one-time work the running rows owe before they next draft: (prompt tokens row b has not yet run through
        the draft model's prefill, [B]; the tokens per row of the catch-up pass the next drafting round runs), or
        None when drafting owes nothing (no draft model, or one prefilled at admission and never behind). k=auto
        charges it to the choice that would make the rows draft (``AutoK``, "Draft debt")."""
        return None

    def attach(self, target) -> None:
        """Check that this drafter can serve ``target``; raise ValueError otherwise."""

    def reserve(self, target, max_batch_size: int, max_seq_len: int) -> None:
        raise NotImplementedError

    def warm_up(self, max_batch_size: int, k: int, settings: list[tuple[float, int, float]],
                prompt_tokens: int = 0) -> int:
        """Capture, before any request runs, the CUDA graphs ``propose`` and ``admit`` will replay for batches of
        up to ``max_batch_size`` rows, ``k`` drafts, rows sampling under ``settings`` ((temperature, top_k, top_p)
        each; greedy = temperature 0) and prompts of up to ``prompt_tokens`` tokens. Returns the number captured;
        drafters without graphs do nothing."""
        return 0

    def admit(self, seq_ids: list[int], prompts: list[list[int]], first_tokens: list[int],
              sampling: SamplingParams) -> None:
        raise NotImplementedError

    def propose(self, max_num_draft: list[int]) -> Proposal:
        raise NotImplementedError

    def commit(self, num_accepted: list[int], emitted: list[list[int]]) -> None:
        raise NotImplementedError

    def keep(self, batch_indices: list[int]) -> None:
        raise NotImplementedError

    def prelaunch(self, shape: int | tuple[int, ...], num_draft: list[int], num_accepted: Tensor,
                  tail: Tensor) -> bool:
        """Launch the next round's drafting now, before the host has read this round's outcome: k = ``shape`` drafts
        for every row, or the tree of widths ``shape``, from the outcome on the device, so that on a GPU they run
        while the host reads the outcome and commits it (the device would otherwise wait for the host between the
        verification and the next draft). Called after this round's verification, before ``commit``: num_draft [B]
        this round's drafts per row (host), num_accepted [B] and tail [B, K + 2] on the device, tail = the row's
        certain token before this round, then verification's tokens, so that the row's history after the commit
        ends with tail[b, a_b], tail[b, a_b + 1]. Returns whether it launched; if it did, the next ``propose`` that
        asks k of every row of the same batch (or ``propose_tree`` of those widths) returns those drafts (after a
        ``keep``, the rows that go on keep theirs), and anything else first (``admit``, another shape, a round
        without drafts) drops them, with the same drafts as if nothing had been launched. Drafters that need the
        host's view of the outcome to draft launch nothing (the default)."""
        return False

    @staticmethod
    def _prelaunch_counts(rows: int, num_draft: list[int], num_accepted: Tensor, tail: Tensor) -> Tensor:
        """``prelaunch``'s inputs checked against a batch of ``rows`` rows (ValueError naming the one that does not fit:
        a wrong shape would index out of range on the device) -> the accepted counts as int64 on ``tail``'s device,
        clamped to what ``tail`` holds (a failed row's count means nothing either; it leaves before the next round)."""
        if len(num_draft) != rows:
            raise ValueError(f"prelaunch: num_draft has {len(num_draft)} entries for a batch of {rows} rows")
        if tuple(num_accepted.shape) != (rows,):
            raise ValueError(f"prelaunch: num_accepted must be [{rows}], got {tuple(num_accepted.shape)}")
        width = max(num_draft, default=0) + 2
        if tail.dim() != 2 or tail.shape[0] != rows or tail.shape[1] < width:
            raise ValueError(f"prelaunch: tail must be [{rows}, >= {width}] (the certain token, then verification's "
                             f"tokens), got {tuple(tail.shape)}")
        return num_accepted.to(tail.device, torch.long).clamp(0, tail.shape[1] - 2)

    # Token trees (``generate(..., tree=widths)``): a drafter that drafts trees overrides both.
    drafts_trees = False
    # ``propose_tree`` also takes a ``DynamicTree`` (drafters/dynamic_tree.py: nodes kept by cumulative draft
    # probability; DraftModel and SelfSpeculative)
    drafts_dynamic_trees = False

    def propose_tree(self, widths: tuple[int, ...]) -> TreeProposal:
        """A draft tree per row continuing each h_b: at most widths[d] children per node at depth d (the root,
        the certain token, at depth 0); ``commit`` follows as after ``propose``."""
        raise TreeDraftUnsupported(f"{type(self).__name__} does not draft trees: use tree=None (a chain), or a "
                                   f"drafter that does (DraftModel, SelfSpeculative, PromptLookup, OracleDraft, "
                                   f"FeatureHead)")

    def warm_up_tree(self, max_batch_size: int, widths: tuple[int, ...], prompt_tokens: int = 0) -> int:
        """Capture the CUDA graphs ``propose_tree(widths)`` and ``admit`` (prompts of up to ``prompt_tokens``
        tokens) replay (as ``warm_up``); returns how many."""
        return 0

    @property
    def graph_captures(self) -> int:
        """CUDA graphs this drafter has captured so far (its models' and its own): a server compares the count after
        its warm-up with the count at its stop, so a graph first needed inside a request is seen."""
        return 0

    def tree_accepted(self, path: Tensor, num_accepted: Tensor) -> None:
        """After verification of its trees, before ``commit``: path [B, D] (node offsets from the root, i.e.
        verification's path + 1) and num_accepted [B] on the target's device, for a drafter whose cache holds
        its tree (it keeps the accepted path, ``Model.accept_tree_path``). Others need nothing."""


def check_same_vocab(target, draft, what: str = "draft model") -> None:
    """Raise a clear ValueError unless ``draft`` scores the same token ids as ``target``."""
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise ValueError(f"{what} vocab {dv} != target vocab {tv}: the {what} must share the target's "
                         f"tokenizer and vocabulary")
    ttok, dtok = target.tokenizer, draft.tokenizer
    if ttok is not None and dtok is not None and ttok is not dtok:
        tsize, dsize = getattr(ttok, "vocab_size", None), getattr(dtok, "vocab_size", None)
        probe = "Speculative decoding, 2026: 0123456789 ÅÉ!"
        if tsize != dsize or ttok.encode(probe) != dtok.encode(probe):
            raise ValueError(f"{what} tokenizer (vocab {dsize}) differs from the target's (vocab {tsize}): "
                             f"the {what} must use the target's tokenizer")


def greedy_tokens(logits: Tensor, index_map: Tensor | None = None) -> Tensor:
    """``logits.argmax(dim=-1)`` [...] int64, the same index (the first maximum; NaN counts as the maximum, as in
    torch); with ``index_map`` [V] int64, index_map of it (a draft vocabulary's ids to the target's). On CUDA one
    Triton program a row (``ops.argmax_rows``): torch's argmax reduces a long row in one block, ~30 us for 128256
    logits on an H200."""
    if logits.is_cuda and ops.AVAILABLE and logits.numel():
        V = logits.shape[-1]
        return ops.argmax_rows(logits.reshape(-1, V), index_map).view(logits.shape[:-1])
    ids = logits.argmax(dim=-1)
    return ids if index_map is None else index_map[ids]


def draw(logits: Tensor, sampling: SamplingParams, step: list[int]) -> tuple[Tensor, Tensor | None]:
    """Draw one token per row of ``logits`` [B, V] under each row's settings.

    Returns (tokens [B] int64, q [B, V] float32 or None). q is the exact distribution each token was
    drawn from (``verispec.verify.sampling.filtered_probs``; one-hot for greedy rows); it is None when every
    row is greedy (greedy verification never reads q). Row b's randomness is a pure function of
    (sampling.seed[b], step[b]): the Philox stream of ``verispec.verify.rng`` with purpose DRAFT, so a
    sequence draws the same drafts whatever else shares its batch.
    """
    if sampling.all_greedy:
        return greedy_tokens(logits), None
    setting = one_setting(sampling)
    if setting is not None:   # the common case, and exactly what a captured draft loop computes
        q = filtered_probs(logits, *setting)
    else:
        q = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)  # [B, V]
        groups: dict[tuple, list[int]] = {}
        for b, row in enumerate(sampling.rows):
            groups.setdefault(row.setting, []).append(b)
        for (temp, top_k, top_p), rows in groups.items():  # one call per distinct setting
            idx = to_device(rows, logits.device, torch.long)
            q[idx] = filtered_probs(logits[idx], temp, top_k, top_p)
    seed = to_device(list(sampling.seed), logits.device, torch.int64)
    return race(q, seed, to_device(list(step), logits.device, torch.int64)), q


def one_setting(sampling: SamplingParams) -> tuple[float, int, float] | None:
    """(temperature, top_k, top_p) when every row of the batch uses that one setting, else None."""
    settings = {r.setting for r in sampling.rows}
    return settings.pop() if len(settings) == 1 else None


def race(q: Tensor, seed: Tensor, step: Tensor) -> Tensor:
    """Sample each row of q [B, V] by the exponential race: argmax_v q_v / E_v, E_v ~ Exp(1) from the
    DRAFT stream of seed[b] at step[b] (``draft_uniforms``); one-hot rows give their argmax. Device ops
    only (a captured draft loop runs it). seed, step: [B] int64 on q's device. -> tokens [B] int64.

    On a GPU one Triton kernel (``race.race_triton``), elsewhere the torch composition (``race_torch``): each
    device always takes the same one, so every loop on it draws the same drafts."""
    if q.device.type == "cuda":
        from .race import race_triton   # Triton only where it compiles

        return race_triton(q.contiguous(), seed, step)
    return race_torch(q, seed, step)


def race_torch(q: Tensor, seed: Tensor, step: Tensor) -> Tensor:
    """``race`` in torch ops: the reference of ``race.race_triton``."""
    e = -torch.log(draft_uniforms(seed, step, q.shape[1]))
    return (q / e).argmax(dim=-1)


def draft_uniforms(seed: Tensor, step: Tensor, vocab: int) -> Tensor:
    """[B, V] float32 uniforms in (0, 1): row b from Philox keyed by seed[b] at counter
    (col = vocab id, row = step[b], offset = 0, purpose = DRAFT). seed, step: [B] int64 on one device."""
    row = step[:, None] & 0xFFFFFFFF                                                  # [B, 1]
    col = torch.arange(vocab, device=seed.device, dtype=torch.int64)[None, :]          # [1, V]
    row, col = torch.broadcast_tensors(row, col)
    zero = torch.zeros_like(row)
    x, _, _, _ = rng.philox4x32(col, row, zero, zero + DRAFT_PURPOSE, seed[:, None])
    return ((x >> 9) * 2 + 1).to(torch.float32) * rng.UNIFORM_SCALE


DRAFT_PURPOSE = 2   # verispec.verify.rng's purposes 0 and 1 belong to verification
