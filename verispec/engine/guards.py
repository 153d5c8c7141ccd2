"""Argument checks of ``generate`` / ``SpeculativeDecoder``: every misuse a clear error, never a wrong output.

Pure functions (no model passes, no device work), each raising ``TypeError`` for a value of the wrong
kind and ``ValueError`` for a value out of range, with a message that names the argument:

    check_prompts(prompt, vocab_size, tokenizer, chat=False) -> (token-id lists, is_batch)
    check_prompt(prompt, index, vocab_size, tokenizer, chat=False) -> token ids of one prompt
    check_max_new_tokens(max_new_tokens) -> int
    check_sampling(temperature, top_k, top_p, seed, batch) -> SamplingParams
    check_stop(stop) -> tuple of stop strings
    check_drafter(drafter)                     a Drafter or None, not a name or a bare model
    check_k(k, max_new_tokens, longest_prompt, max_positions) -> (k to use, note or None)
    check_tree(tree, drafter) -> widths (children per node at each depth), "auto", a DynamicTree or None
    parse_tree_flag(text, head=, has_drafter=, chain_drafter=) -> the same from the CLIs' --tree flag
    check_same_model(target, drafter)          target and draft must not share one KV cache
    ModelLease(*models)                        one generation per model at a time (threads, re-entry)
"""
from __future__ import annotations

import threading
from numbers import Integral

import torch
from torch import Tensor

from ..drafters.base import Drafter, SamplingParams, TreeDraftUnsupported
from ..drafters.dynamic_tree import DynamicTree, parse_tree_spec
from ..runtime.tree import MAX_TREE_TOKENS
from ..verify import rng
from ..verify.sampling import check_seed, check_temperature, check_top_k, check_top_p

DRAFTER_CLASSES = "PromptLookup(), DraftModel(model), SelfSpeculative(layers)"


# ------------------------------------------------------------------------------------------ prompts
def _where(index: int | None) -> str:
    return "prompt" if index is None else f"prompt {index}"


def _utf8_text(text: str, where: str) -> str:
    """``text`` unchanged if it is valid Unicode that UTF-8 can encode; ValueError naming the bad character.

    Non-UTF-8 input bytes reach Python as lone surrogates (``sys.argv``, files opened with
    ``errors="surrogateescape"``): U+DC80..U+DCFF stand for the bytes 0x80..0xFF."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = text[e.start]
        what = f"byte 0x{ord(ch) - 0xDC00:02x}" if 0xDC80 <= ord(ch) <= 0xDCFF else f"character U+{ord(ch):04X}"
        raise ValueError(f"{where} is not valid UTF-8 text: {what} at character {e.start}") from None
    return text


def check_prompt(prompt, index: int | None, vocab_size: int, tokenizer, *, chat: bool = False) -> list[int]:
    """Token ids of one prompt: a str (encoded, chat-wrapped when ``chat``), UTF-8 ``bytes``, a list/tuple
    of ints or a 1-D integer tensor. ``index`` is the prompt's position in a batch (None: a single prompt),
    quoted by every error so the user knows which prompt is bad.

    Errors: None / other types / float ids (TypeError); a 2-D tensor, an empty prompt, invalid UTF-8, ids
    outside [0, vocab_size), text without a tokenizer (ValueError).
    """
    where = _where(index)
    if prompt is None:
        raise TypeError(f"{where} is None: give a string or a list of token ids")
    if isinstance(prompt, (bytes, bytearray)):
        try:
            prompt = bytes(prompt).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{where} is not valid UTF-8: byte 0x{prompt[e.start]:02x} at offset {e.start}") from None
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"{where} is an empty string: give at least one character")
        _utf8_text(prompt, where)
        if tokenizer is None:
            raise ValueError(f"{where} is text but this model has no tokenizer (random weights?): pass token ids")
        if chat:
            ids = list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                     add_generation_prompt=True))
        else:
            ids = list(tokenizer.encode(prompt))
    elif isinstance(prompt, Tensor):
        if prompt.dim() != 1:
            raise ValueError(f"{where} is a {prompt.dim()}-D tensor {list(prompt.shape)}: give a 1-D tensor of "
                             f"token ids (for a batch, a list of them: list(tensor))")
        if prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
            raise TypeError(f"{where} must hold integer token ids, got a {prompt.dtype} tensor")
        ids = prompt.tolist()
    elif isinstance(prompt, (list, tuple)):
        ids = []
        for i, t in enumerate(prompt):
            if isinstance(t, Tensor) and t.dim() == 0 and not t.dtype.is_floating_point and t.dtype != torch.bool:
                t = int(t)
            if isinstance(t, bool) or not isinstance(t, Integral):
                raise TypeError(f"{where}: token ids must be integers, got {t!r} ({type(t).__name__}) at position {i}")
            ids.append(int(t))
    else:
        raise TypeError(f"{where} must be a string, bytes, a list of token ids or a 1-D tensor, "
                        f"got {type(prompt).__name__}")
    if not ids:
        raise ValueError(f"{where} is empty: give at least one token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{where}: token ids must be in [0, {vocab_size}), got e.g. {bad[:5]}")
    return ids


def _is_one_prompt_item(x) -> bool:
    return isinstance(x, Integral) or (isinstance(x, Tensor) and x.dim() == 0)


def check_prompts(prompt, vocab_size: int, tokenizer, *, chat: bool = False) -> tuple[list[list[int]], bool]:
    """(token ids of every prompt, is_batch). A batch is a non-empty list/tuple of prompts (str, bytes,
    id lists, 1-D tensors); a list of ints or a 1-D tensor is one prompt. Errors as ``check_prompt``,
    naming the index of the bad prompt in a batch, and for an empty batch."""
    if isinstance(prompt, (list, tuple)):
        if not prompt:
            raise ValueError("prompt is an empty list: give a string, token ids, or a list of prompts")
        if not _is_one_prompt_item(prompt[0]):
            return [check_prompt(p, i, vocab_size, tokenizer, chat=chat) for i, p in enumerate(prompt)], True
    return [check_prompt(prompt, None, vocab_size, tokenizer, chat=chat)], False


# ------------------------------------------------------------------------------------------ settings
def check_max_new_tokens(max_new_tokens) -> int:
    """``max_new_tokens`` as an int >= 1 (TypeError for non-integers, bools included)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral):
        raise TypeError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    return int(max_new_tokens)


def _per_seq(value, batch: int, name: str, default, check) -> tuple:
    """One checked value per sequence from a scalar, a list/tuple of ``batch`` values or a 0-/1-D tensor."""
    if isinstance(value, Tensor):
        if value.dim() > 1:
            raise ValueError(f"{name} must be a scalar or a list of {batch} values, got a tensor {list(value.shape)}")
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if len(value) != batch:
            raise ValueError(f"{name} has {len(value)} entries for a batch of {batch} prompts")
        return tuple(check(default if v is None else v, f"{name}[{i}]") for i, v in enumerate(value))
    return (check(default if value is None else value, name),) * batch


def check_sampling(temperature, top_k, top_p, seed, batch: int) -> SamplingParams:
    """Per-sequence sampling settings for ``batch`` prompts; each of temperature / top_k / top_p is a
    scalar (every sequence) or a list of ``batch`` values, None meaning the default (0 = greedy, 0 = no
    top-k, 1 = no top-p). ``seed``: None (drawn at random, reported in Stats) or an int S that fits 64 bits;
    sequence b gets the seed S + b (wrapped to 64 bits), so that every sequence has its own stream.

    Refused: NaN / inf / negative temperatures and ones in (0, 1e-6) (see ``sampling.MIN_TEMPERATURE``:
    they would overflow into token 0), top_p outside (0, 1], negative or non-integer top_k, float seeds
    (never truncated) and seeds outside [-2**63, 2**64).
    """
    temps = _per_seq(temperature, batch, "temperature", 0.0, check_temperature)
    ks = _per_seq(top_k, batch, "top_k", 0, check_top_k)
    ps = _per_seq(top_p, batch, "top_p", 1.0, check_top_p)
    seed = rng.seed_from(None) if seed is None else check_seed(seed)
    return SamplingParams.columns(temps, ks, ps, tuple(rng.as_int64(seed + b) for b in range(batch)))


def check_stop(stop) -> tuple[str, ...]:
    """Stop strings as a tuple: None -> (), a str -> (str,), a list/tuple of non-empty str."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)):
        raise TypeError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    for i, s in enumerate(stop):
        if not isinstance(s, str):
            raise TypeError(f"stop must be a string or a list of strings, got {s!r} ({type(s).__name__}) at "
                            f"index {i} (stop strings are text; token ids are not supported)")
        if not s:
            raise ValueError(f"stop[{i}] is an empty string: stop strings must be non-empty")
    return tuple(stop)


# ------------------------------------------------------------------------------------------ drafters
def check_drafter(drafter) -> None:
    """None or a ``Drafter`` instance; a TypeError naming the drafter classes otherwise (a name such as
    ``"lookup"``, a drafter class instead of an instance, or a bare model meant for ``DraftModel``)."""
    if drafter is None or isinstance(drafter, Drafter):
        return
    if isinstance(drafter, str):
        raise TypeError(f"drafter={drafter!r} is a string: pass a drafter object, one of {DRAFTER_CLASSES} "
                        f"(from verispec.drafters)")
    if isinstance(drafter, type) and issubclass(drafter, Drafter):
        raise TypeError(f"drafter={drafter.__name__} is a class: pass an instance, e.g. {drafter.__name__}(...)")
    if hasattr(drafter, "append") and hasattr(drafter, "setup_cache"):
        raise TypeError("drafter is a model: wrap it as drafter=DraftModel(model)")
    raise TypeError(f"drafter must be None or one of {DRAFTER_CLASSES}, got {type(drafter).__name__}")


def check_tree(tree, drafter) -> tuple[int, ...] | str | DynamicTree | None:
    """``tree``: None (chains of k drafts), "auto" (each round plain decoding, a chain or a tree, by the cost model:
    engine/auto_k.py), the children per node at each depth, e.g. [4, 2, 2, 1] (4 children of the root, 2 of each
    of those, ...): integers >= 1, or a dynamic tree "dyn:D,K,N" / ``DynamicTree`` (drafters/dynamic_tree.py; -> the
    ``DynamicTree``); at most MAX_TREE_TOKENS - 1 nodes in all (the tree pass holds the certain token too). The
    drafter must draft trees (dynamic ones: ``drafts_dynamic_trees``): one that cannot is refused, never run as a
    chain."""
    if tree is None:
        return None
    if isinstance(tree, str) and tree == "auto":
        _check_tree_drafter(drafter)
        return "auto"
    dynamic = parse_tree_spec(tree)        # "dyn:D,K,N" or a DynamicTree (ValueError naming a bad spelling)
    if dynamic is not None:
        if dynamic.num_nodes > MAX_TREE_TOKENS - 1:
            raise ValueError(f"dynamic tree {dynamic} has {dynamic.num_nodes} nodes (per depth "
                             f"{list(dynamic.level_sizes)}); a tree pass holds at most {MAX_TREE_TOKENS - 1} (plus the "
                             f"certain token): use a smaller depth or fewer nodes per depth")
        _check_tree_drafter(drafter)
        if not getattr(drafter, "drafts_dynamic_trees", False):
            raise TreeDraftUnsupported(f"{type(drafter).__name__} does not draft dynamic trees ({dynamic}: they rank "
                                       f"nodes by draft probability): use a static tree such as [4, 2, 2, 1], or "
                                       f"DraftModel or SelfSpeculative")
        return dynamic
    if isinstance(tree, (str, bytes, Integral)) or not hasattr(tree, "__iter__"):
        raise TypeError(f"tree must be a list of children per node at each depth, e.g. [4, 2, 2, 1], \"auto\", a "
                        f"dynamic tree \"dyn:DEPTH,TOP_K,NODES\" (e.g. \"dyn:4,2,8\") or None, got {tree!r}")
    widths = tuple(tree)
    if not widths:
        raise ValueError("tree must name at least one depth, e.g. [4] (4 alternatives for the next token)")
    for d, w in enumerate(widths):
        if isinstance(w, bool) or not isinstance(w, Integral):
            raise TypeError(f"tree[{d}] must be an integer (children per node at depth {d + 1}), got {w!r}")
        if w < 1:
            raise ValueError(f"tree[{d}] must be >= 1 (children per node at depth {d + 1}), got {w}")
    nodes, level = 0, 1
    for w in widths:
        level *= w
        nodes += level
    if nodes > MAX_TREE_TOKENS - 1:
        raise ValueError(f"tree {list(widths)} has {nodes} nodes; a tree pass holds at most {MAX_TREE_TOKENS - 1} "
                         f"(plus the certain token): use fewer or narrower depths")
    _check_tree_drafter(drafter)
    return tuple(int(w) for w in widths)


def _check_tree_drafter(drafter) -> None:
    if drafter is None:
        raise ValueError("tree= needs a drafter (drafter=None is plain decoding: there is nothing to draft)")
    if not getattr(drafter, "drafts_trees", False):
        raise TreeDraftUnsupported(f"{type(drafter).__name__} does not draft trees: use tree=None (a chain), or "
                                   f"DraftModel, SelfSpeculative, PromptLookup, FeatureHead or OracleDraft")


class _TreeCapable:
    """Stands for the drafter in ``check_tree`` before any is built (the CLIs check --tree before loading)."""

    drafts_trees = True
    drafts_dynamic_trees = True


def parse_tree_flag(text: str, *, head: bool, has_drafter: bool, chain_drafter: str | None = None,
                    lookup: bool = False) -> list[int] | str | DynamicTree:
    """``--tree W1,W2,...``, ``--tree dyn:D,K,N`` or ``--tree auto`` of ``verispec generate`` and ``verispec serve``
    -> the widths, the ``DynamicTree`` (or "auto": each round's shape chosen by the cost model), checked before any
    model is loaded. ``head``: --draft-head
    was given; ``has_drafter``: --draft-lookup, --draft or --draft-self was;
    ``chain_drafter``: the name of the chosen drafter when it drafts chains only (serve's oracle); ``lookup``: the
    drafter is prompt lookup (--draft-lookup), which drafts static trees only.
    ValueError with the message the CLI prints."""
    auto = text.strip().lower() == "auto"
    try:
        widths = "auto" if auto else parse_tree_spec(text) or [int(w) for w in text.split(",")]
    except ValueError as e:
        if text.strip().lower().startswith("dyn:"):
            raise ValueError(f"--tree: {e}") from None
        raise ValueError(f"--tree must be comma-separated integers (children per node at each depth), e.g. 4,2,2,1, "
                         f"dyn:DEPTH,TOP_K,NODES (a dynamic tree, e.g. dyn:4,2,8) or auto, got {text!r}") from None
    if not (has_drafter or head):
        raise ValueError("--tree needs a drafter: --draft-lookup, --draft MODEL, --draft-self L or --draft-head [DIR]")
    if head and isinstance(widths, DynamicTree):
        raise ValueError(f"--tree {widths}: the feature head (--draft-head) drafts static trees (e.g. 4,2,2,1) and "
                         f"chains, not dynamic trees: use --draft MODEL or --draft-self L for dyn:")
    if chain_drafter is not None:
        raise ValueError(f"--tree: {chain_drafter} does not draft trees")
    if lookup and isinstance(widths, DynamicTree):
        raise ValueError(f"--tree {widths}: prompt lookup (--draft-lookup) does not draft dynamic trees (they rank "
                         f"nodes by draft probability): use a static tree such as 4,2,2,1, or --draft MODEL or "
                         f"--draft-self L")
    try:
        check_tree(widths, _TreeCapable())
    except (TypeError, ValueError) as e:
        raise ValueError(f"--tree: {e}") from None
    return widths


def check_k(k, max_new_tokens: int, longest_prompt: int, max_positions: int | None) -> tuple[int, str | None]:
    """(the k to use, a one-line note when it was capped, else None).

    k must be an int >= 1. It is capped (a note says so) at:
      * max_new_tokens - 1: the first token comes from the prefill, and a round never emits more than
        the remaining tokens, so more drafts are pure waste (a draft model pays a pass per draft);
      * max_positions - longest_prompt - max_new_tokens - 1: the lookahead of a round (certain token + k
        drafts) must fit the model's positions.
    ValueError when not even k = 1 fits the positions (the prompt + max_new_tokens are too long).
    """
    if isinstance(k, bool) or not isinstance(k, Integral):
        raise TypeError(f"k must be an integer >= 1 (drafts per round), got {k!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1 (drafts per round), got {k}")
    cap, why = max(max_new_tokens - 1, 1), f"max_new_tokens - 1 = {max(max_new_tokens - 1, 1)}"
    if max_positions is not None:
        room = max_positions - longest_prompt - max_new_tokens - 1
        if room < 1:
            raise ValueError(f"prompt ({longest_prompt} tokens) + max_new_tokens {max_new_tokens} + lookahead 2 "
                             f"exceeds the model's max_position_embeddings {max_positions}: shorten the prompt or "
                             f"max_new_tokens")
        if room < cap:
            cap, why = room, f"the room left in the model's {max_positions} positions"
    if k <= cap:
        return int(k), None
    return cap, f"k={k} capped to {cap} ({why}): more drafts per round could never be used"


def check_same_model(target, drafter) -> None:
    """ValueError when ``drafter`` drafts with the very object ``target`` is: the two would share one KV
    cache and corrupt each other (wrong tokens or a bogus "cache full"). ``DraftModel.attach`` already
    swaps in a twin with its own cache when it can; this is the backstop for any other drafter."""
    model = getattr(drafter, "model", None)
    if model is not None and model is target:
        raise ValueError("the draft model is the target model object, and the two would share one KV cache: "
                         "use DraftModel(target.truncated(n)) (shared weights, own cache), SelfSpeculative(n), "
                         "or a second load_model(...)")


# ------------------------------------------------------------------------------------------ ownership
class ModelLease:
    """``with ModelLease(target, draft_model): ...`` marks the models as in use for one generation.

    A model's KV cache holds one generation's state, so a second generation on the same model, from
    another thread or re-entered from a callback, would interleave writes into that cache and produce
    wrong text silently. Entering a lease on a model that is already leased raises RuntimeError (never
    blocks: waiting could deadlock a re-entrant call). None entries and repeated models are ignored.
    """

    _registry_lock = threading.Lock()
    _in_use: dict[int, str] = {}   # id(model) -> a description of the holder (held models stay alive)

    def __init__(self, *models):
        unique = {}
        for m in models:
            if m is not None:
                unique[id(m)] = m
        self.models = list(unique.values())
        self._held: list[int] = []

    def __enter__(self) -> "ModelLease":
        holder = f"thread {threading.current_thread().name!r}"
        with self._registry_lock:
            for m in self.models:
                if id(m) in self._in_use:
                    raise RuntimeError(
                        f"{m!r} is already generating (held by {self._in_use[id(m)]}): a model serves one "
                        f"generation at a time; use one model per thread (load_model again), a lock around "
                        f"generate, or batch the prompts into one call")
            for m in self.models:
                self._in_use[id(m)] = holder
                self._held.append(id(m))
        return self

    def __exit__(self, *exc) -> None:
        with self._registry_lock:
            for key in self._held:
                self._in_use.pop(key, None)
            self._held = []
