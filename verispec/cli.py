"""The ``verispec`` command line: the front end only (all the work is in engine / drafters / runtime).

    verispec demo                                   prompt lookup on an echo-heavy prompt, the feature head on a
                                                    free-form one, each vs plain decoding
    verispec generate "PROMPT" [--draft-lookup | --draft MODEL | --draft-self L] [-k K | --tree 4,2,2,1 | --tree auto] [--compare] ...
    verispec generate - < prompt.txt                (the prompt from stdin)
    verispec verify-demo [--batch-size B --num-draft K --vocab-size V --acceptance-rate A]
    verispec serve [--model M] [--draft-lookup | --draft D | --draft-self L] [-k N|auto] [--port P] ...
    verispec serve --ssd (--draft D | --draft-self L) -k N ...   (the draft in a second process: verispec/launch.py)
    verispec quantize --model M --type Q4_K_M|Q4_0|Q8_0 --out model.gguf   (an HF dir or a shape name -> GGUF)
    verispec train-head --model M --out DIR [--tokens N] [--steps S] [--device D] [--resume]   (a feature head)
    verispec generate "PROMPT" --draft-head [DIR] [-k K | --tree 2,2,1]   (a feature head; no DIR: the embedded one)
"""
from __future__ import annotations

import argparse
import sys
import time

DEMO_PROMPT = (
    "Repeat this text exactly, word for word:\n\n"
    "Speculative decoding makes a large language model faster without changing what it writes. "
    "A cheap drafter guesses the next few tokens, and the model checks all the guesses in a single pass. "
    "Every guess that matches is kept for free, and the first wrong guess is replaced by the model's own token. "
    "Because every kept token is one the model would have chosen anyway, the output is exactly the same."
)
# The demo's second part: free-form text, which prompt lookup cannot copy, on a topic the shipped head never saw in
# training (training/prompts.py's held-out topics)
DEMO_HEAD_PROMPT = "Explain glaciers to a ten-year-old."
# A feature head's chain length by default (and the demo's): the shipped head's best measured k on a CPU (1.59x plain
# decoding vs 1.19x at k = 4) and on an H200 (1.51x vs 1.49x), benchmarks/results/feature_head_cpu.md, _trees.md
HEAD_K = 2


# ------------------------------------------------------------------------------------------ helpers
USAGE, RUNTIME, INTERRUPTED = 2, 1, 130   # exit codes: bad arguments, failure while running, Ctrl-C
VERIFY_DEMO_MAX_BYTES = 2 << 30           # verify-demo refuses workloads whose logits exceed 2 GiB


class CLIError(Exception):
    """A one-line error for the user; ``code`` is the exit status (USAGE or RUNTIME)."""

    def __init__(self, message: str, code: int = USAGE):
        super().__init__(message)
        self.code = code


def _die(message: str, code: int = USAGE) -> None:
    raise CLIError(message, code)


def _note(message: str) -> None:
    print(f"[verispec] {message}", file=sys.stderr)


def _load(source, device, dtype, what="model"):
    from .runtime import load_model

    try:
        return load_model(source, device=device, dtype=dtype)
    except (ValueError, FileNotFoundError) as e:
        _die(f"cannot load the {what} {source or '(embedded SmolLM2-135M-Instruct)'}: {e}")


class _Streamer:
    """Prints the text of one sequence as its tokens arrive: incremental detokenization (each chunk decodes
    a few tokens, not the whole output), an incomplete UTF-8 character held back until it completes."""

    def __init__(self, tokenizer, out=None):
        from .engine.detokenize import IncrementalDetokenizer

        self.detok = IncrementalDetokenizer(tokenizer.decode)
        self.eos = set(tokenizer.eos_token_ids)
        self.out = out or sys.stdout

    def __call__(self, seq_index: int, new_tokens: list[int]) -> None:
        text = self.detok.add([t for t in new_tokens if t not in self.eos])
        if text:
            self.out.write(text)
            self.out.flush()


class _Progress:
    """A throttled progress line on stderr for long runs."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.done = 0
        self.start = self.last = time.perf_counter()
        self.shown = False

    def __call__(self, seq_index: int, new_tokens: list[int]) -> None:
        self.done += len(new_tokens)
        now = time.perf_counter()
        if self.enabled and now - self.start > 2.0 and now - self.last > 1.0:
            self.last = now
            self.shown = True
            print(f"\r[verispec] {self.done}/{self.total} tokens, {self.done / (now - self.start):.1f} tok/s",
                  end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr)


def _both(*callbacks):
    callbacks = [c for c in callbacks if c is not None]
    return lambda i, toks: [c(i, toks) for c in callbacks] and None


# ------------------------------------------------------------------------------------------ generate
def _read_text(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        _die(f"{where} is not valid UTF-8: byte 0x{data[e.start]:02x} at offset {e.start} (line {line})")


def _prompt_texts(args) -> list[str]:
    """The prompt(s) as text: PROMPT, stdin for ``-``, or --batch-file's lines. One-line errors."""
    from .engine.guards import _utf8_text

    if args.batch_file is not None and args.prompt is not None:
        _die("give either a PROMPT or --batch-file FILE, not both")
    if args.batch_file is not None:
        try:
            with open(args.batch_file, "rb") as f:
                data = f.read()
        except OSError as e:
            _die(f"--batch-file {args.batch_file}: {e.strerror or e}")
        text = _read_text(data, f"--batch-file {args.batch_file}")
        prompts = [line.rstrip("\r").replace("\\n", "\n") for line in text.split("\n") if line.strip()]
        if not prompts:
            _die(f"--batch-file {args.batch_file} has no prompts (one per line)")
        return prompts
    if args.prompt is None:
        _die("give a PROMPT, - to read it from stdin, or --batch-file FILE")
    if args.prompt == "-":
        prompt = _read_text(sys.stdin.buffer.read(), "the prompt read from stdin")
        if prompt.endswith("\n"):
            prompt = prompt[:-1]
    else:
        try:
            prompt = _utf8_text(args.prompt, "PROMPT")
        except ValueError as e:
            _die(str(e))
    if not prompt.strip():
        _die("PROMPT is empty" + (" (nothing on stdin)" if args.prompt == "-" else ""))
    return [prompt]


def _validate_generate(args) -> None:
    """Every check that needs no model: runs before anything is loaded (loading takes seconds)."""
    from .device import DTYPE_NAMES, parse_device
    from .engine.guards import check_sampling

    if args.k is not None and args.k < 1:
        _die(f"-k must be >= 1 (drafts per round), got {args.k}")
    if args.tree is not None:
        from .engine.guards import parse_tree_flag

        try:
            args.tree = parse_tree_flag(
                args.tree, head=getattr(args, "draft_head", None) is not None,
                has_drafter=bool(args.draft_lookup or args.draft or args.draft_self is not None),
                lookup=bool(args.draft_lookup))
        except ValueError as e:
            _die(str(e))
        if args.k is not None and args.tree != "auto":
            _die("-k and --tree exclude each other: a tree's depth is its number of widths (with --tree auto, -k is "
                 "the longest chain it considers)")
    if args.threads is not None and args.threads < 1:
        _die(f"--threads must be >= 1, got {args.threads}")
    if args.max_new_tokens < 1:
        _die(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.draft_self is not None and args.draft_self < 1:
        _die(f"--draft-self must be >= 1 (layers), got {args.draft_self}")
    if not 1 <= args.ngram_min <= args.ngram_max:
        _die(f"--ngram-min / --ngram-max: need 1 <= min <= max, got {args.ngram_min}, {args.ngram_max}")
    for flag, value in (("--device", args.device), ("--draft-device", args.draft_device)):
        if value is not None:
            try:
                parse_device(value)
            except ValueError as e:
                _die(f"{flag}: {e}")
    if args.draft_device is not None and args.draft is None:
        _die("--draft-device needs --draft MODEL")
    if args.dtype is not None and args.dtype.lower() not in DTYPE_NAMES:
        _die(f"--dtype {args.dtype!r} is not one of {sorted(DTYPE_NAMES)}")
    try:
        check_sampling(args.temperature, args.top_k, args.top_p, args.seed, 1)
    except (TypeError, ValueError) as e:
        _die("--" + str(e).replace("_", "-"))
    for s in args.stop or []:
        if not s:
            _die("--stop: stop strings must be non-empty")


def _check_positions(args, what: str, source) -> None:
    """--max-new-tokens against the model's positions and --draft-self against its layers, from its config
    alone (no weights read)."""
    from .runtime.loading import peek_config

    try:
        cfg = peek_config(source)
    except (ValueError, FileNotFoundError) as e:
        _die(f"cannot load the {what} {source or '(embedded SmolLM2-135M-Instruct)'}: {e}")
    if args.max_new_tokens + 2 > cfg.max_position_embeddings:
        _die(f"--max-new-tokens {args.max_new_tokens} exceeds what the {what} can hold: it has "
             f"{cfg.max_position_embeddings} positions for the prompt and the new tokens")
    if what == "model" and args.draft_self is not None and not args.draft_self < cfg.num_layers:
        _die(f"--draft-self {args.draft_self}: need 1 <= L < the model's {cfg.num_layers} layers")


def _make_drafter(args, target):
    from .drafters import DraftModel, FeatureHead, PromptLookup, SelfSpeculative

    if args.draft_head is not None:
        try:
            return FeatureHead.from_pretrained(args.draft_head, target) if args.draft_head else FeatureHead()
        except (ValueError, FileNotFoundError) as e:
            _die(f"--draft-head {args.draft_head or '(the embedded head)'}: {e}")
    if args.draft_lookup:
        return PromptLookup(max_ngram=args.ngram_max, min_ngram=args.ngram_min)
    if args.draft_self is not None:
        return SelfSpeculative(layers=args.draft_self)
    if args.draft is not None:
        device = args.draft_device or str(target.device)
        return DraftModel(_load(args.draft, device, args.dtype, what="draft model"))
    return None


def _encode_prompts(texts: list[str], target, chat: bool) -> list[list[int]]:
    from .engine.guards import check_prompts

    tok = target.tokenizer
    if tok is None:   # random-weight shapes have no tokenizer: feed UTF-8 bytes as token ids
        _note("this model has no tokenizer: using the prompt's UTF-8 bytes as token ids")
        vocab = target.config.vocab_size
        return [[b % vocab for b in t.encode("utf-8")] for t in texts]
    try:
        ids, _ = check_prompts(list(texts), target.config.vocab_size, tok, chat=chat)
    except (TypeError, ValueError) as e:
        _die(str(e))
    return ids


def _run_generate(args, *, banner: str | None = None) -> int:
    from .device import apply_cpu_thread_policy
    from .engine import SpeculativeDecoder
    from .engine.guards import check_k
    from .runtime.config import random_weights_note

    _validate_generate(args)
    texts = _prompt_texts(args)
    for flag, source in (("--model", args.model), ("--draft", args.draft)):
        note = random_weights_note(source) if source is not None else None
        if note:
            _note(f"{flag} {note}")
    _check_positions(args, "model", args.model)
    if args.draft is not None:
        _check_positions(args, "draft model", args.draft)
    threads = apply_cpu_thread_policy(args.threads)
    target = _load(args.model, args.device, args.dtype)
    if target.device.type == "cpu" and args.verbose:
        _note(f"{threads} CPU thread(s)")
    tok = target.tokenizer
    chat = args.chat
    if chat is None:
        chat = tok is not None and bool(getattr(tok, "chat_template", None))
    prompts = _encode_prompts(texts, target, chat and tok is not None)
    k = args.k
    drafter = None
    try:
        drafter = _make_drafter(args, target)
        if drafter is not None and args.tree in (None, "auto"):
            k, note = check_k(k, args.max_new_tokens, max(len(p) for p in prompts),
                              getattr(target.config, "max_position_embeddings", None))
            if note:
                _note(note)
        spec = SpeculativeDecoder(target, drafter, k=k or 4, tree=args.tree if drafter is not None else None)
        plain = SpeculativeDecoder(target, None)
    except (TypeError, ValueError) as e:
        _die(str(e))
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
              top_p=args.top_p, seed=args.seed, stop=args.stop or None, chat=False)
    batch = len(prompts) > 1
    runs = [("speculative" if drafter is not None else "target-only", spec)]
    if args.compare and drafter is not None:
        runs.append(("target-only", plain))
    if args.tree == "auto" and drafter is not None:
        # the cost table --tree auto chooses by, measured once here (seconds) and outside the timings below
        _note("--tree auto: measuring target passes, draft steps and rounds on this machine ...")
        spec.costs_for(len(prompts), k)
    if target.device.type == "cuda":
        # warm-up on a two-token prompt, never the user's: compiles kernels and captures CUDA graphs for
        # this batch size so that the timings below measure decoding only
        for _, decoder in runs:
            decoder.generate([[1, 2]] * len(prompts), **{**kw, "max_new_tokens": min(4, args.max_new_tokens),
                                                          "stop": None})
    if banner:
        print(banner, file=sys.stderr)
    results = []
    for i, (name, decoder) in enumerate(runs):
        stream = i == 0 and not batch and tok is not None and not args.quiet
        progress = _Progress(args.max_new_tokens * len(prompts), enabled=not stream and sys.stderr.isatty())
        streamer = _Streamer(tok) if stream else None
        partial = _Collector(len(prompts))
        if i == 1:
            _note(f"running {name} decoding for comparison ...")
        t0 = time.perf_counter()
        try:
            out = decoder.generate(prompts if batch else prompts[0],
                                   on_tokens=_both(streamer, progress, partial), **kw)
        except KeyboardInterrupt:
            progress.close()
            _interrupted(partial, tok, streamed=stream, args=args)
            return INTERRUPTED
        except (TypeError, ValueError) as e:
            _die(str(e))
        wall = time.perf_counter() - t0
        progress.close()
        out = out if batch else [out]
        if stream:
            print()
        elif i == 0 and not args.quiet:
            for j, g in enumerate(out):
                print(f"--- [{j}] " + (g.text if tok is not None else " ".join(map(str, g.tokens))))
        results.append((name, out, wall, decoder.last_stats))
    _report(results, args)
    _hint_if_speculation_lost(results, args)
    return 0


class _Collector:
    """Keeps every sequence's tokens as they arrive, for the partial result after Ctrl-C."""

    def __init__(self, batch: int):
        self.tokens: list[list[int]] = [[] for _ in range(batch)]

    def __call__(self, seq_index: int, new_tokens: list[int]) -> None:
        self.tokens[seq_index] += new_tokens


def _interrupted(partial: _Collector, tok, *, streamed: bool, args) -> None:
    """After Ctrl-C: the text generated so far (already on stdout when streamed), then a one-line note."""
    if streamed:
        print()
    elif not args.quiet:
        for j, ids in enumerate(partial.tokens):
            text = tok.decode(ids) if tok is not None else " ".join(map(str, ids))
            print(f"--- [{j}] {text}")
    done = sum(len(t) for t in partial.tokens)
    _note(f"interrupted (Ctrl-C) after {done} generated token(s); the output above is partial")


def _speculation_lost(results) -> float | None:
    """The measured speedup (< 1 = lost) from --compare, else a conservative estimate from the stats:
    a plain decode step costs at most one target pass of the round (a pass over k + 1 tokens costs
    at least as much as over 1), so seconds per token above seconds per pass means speculation lost."""
    if len(results) == 2:
        s1, s0 = results[0][3], results[1][3]
        return s1.tokens_per_s / s0.tokens_per_s if s0.tokens_per_s else None
    stats = results[0][3]
    if not stats.proposed or stats.rounds < 4 or stats.new_tokens < 2 or stats.decode_s <= 0:
        return None
    per_token = stats.decode_s / (stats.new_tokens - 1)
    per_plain_step = stats.target_s / stats.rounds
    return per_plain_step / per_token if per_token > per_plain_step else None


def _hint_if_speculation_lost(results, args) -> None:
    stats = results[0][3]
    if not stats.proposed:
        return
    speed = _speculation_lost(results)
    if speed is None or speed >= 1.0:
        return
    how = "measured" if len(results) == 2 else "at most"
    _note(f"hint: speculation was slower than plain decoding here ({how} {speed:.2f}x; "
          f"{100 * stats.acceptance_rate:.0f}% of drafts accepted): try another drafter "
          f"(--draft-lookup for echo-heavy prompts, --draft MODEL for a small model of the same family), "
          f"a smaller -k, or no drafter")


def _report(results, args) -> None:
    err = sys.stderr
    for name, out, wall, stats in results:
        new = sum(len(g.tokens) for g in out)
        line = f"[verispec] {name:12s} {new} tokens in {wall:.2f}s: {stats.tokens_per_s:.1f} tok/s decode"
        if stats.proposed:
            line += (f", accepted {stats.accepted}/{stats.proposed} drafts ({100 * stats.acceptance_rate:.0f}%), "
                     f"{stats.tokens_per_round:.2f} tokens per target pass")
        print(line, file=err)
        if args.verbose:
            print(f"[verispec]   {stats.summary()}", file=err)
    if len(results) == 2:
        (_, spec, wall1, s1), (_, base, wall0, s0) = results
        same = [a.tokens == b.tokens for a, b in zip(spec, base)]
        speed = s1.tokens_per_s / s0.tokens_per_s if s0.tokens_per_s else float("nan")
        # two ratios, both named: decoding alone (what speculation changes) and the whole call, whose prompt
        # prefill is the same in both runs (so the wall-time ratio is the smaller one)
        print(f"[verispec] speedup: {speed:.2f}x decode rate (tok/s decode), {wall0 / wall1:.2f}x wall time "
              f"(whole call, prefill included)", file=err)
        if all(same):
            print("[verispec] outputs identical: yes", file=err)
        elif args.temperature and args.temperature > 0:
            print("[verispec] outputs identical: no (expected when sampling: speculative sampling is exact in "
                  "distribution, not token for token)", file=err)
        else:
            print(f"[verispec] outputs identical: NO ({sum(same)}/{len(same)} sequences match)", file=err)


# ------------------------------------------------------------------------------------------ quantize
def _run_quantize(args) -> int:
    """``verispec quantize``: every argument checked before any weight is read, one line per written file."""
    import os
    from pathlib import Path

    from .device import parse_device
    from .runtime.config import NAMED_SHAPES, random_weights_note
    from .runtime.quant.export import write_quantized_gguf

    out = Path(args.out).expanduser()
    if out.suffix != ".gguf":
        _die(f"--out must name a .gguf file, got {args.out!r}")
    if not out.parent.is_dir():
        _die(f"--out: directory {str(out.parent)!r} does not exist")
    if out.exists() and not args.force:
        _die(f"--out {str(out)!r} exists; pass --force to overwrite it")
    model = Path(args.model).expanduser()
    if not model.is_dir() and args.model not in NAMED_SHAPES:
        _die(f"--model {args.model!r} is neither an HF checkpoint directory nor a shape name "
             f"({', '.join(sorted(NAMED_SHAPES))})")
    if args.device is not None:
        try:
            parse_device(args.device)
        except ValueError as e:
            _die(f"--device: {e}")
    note = random_weights_note(args.model) if not model.is_dir() else None
    if note:
        _note(note)
    if model.is_dir() and (model / "tokenizer.json").exists():
        _note("the tokenizer is not written into the GGUF: the file loads with weights only (serve it with "
              "--tokenizer DIR)")
    start = time.perf_counter()
    try:
        report = write_quantized_gguf(os.fspath(model) if model.is_dir() else args.model, out, args.type,
                                      device=args.device, seed=args.seed, log=print if args.verbose else None)
    except (ValueError, FileNotFoundError) as e:
        _die(f"cannot quantize {args.model}: {e}", RUNTIME)
    print(f"{report.summary()} in {time.perf_counter() - start:.1f} s")
    return 0


QUANT_TYPES = ("Q4_0", "Q4_K_M", "Q8_0")    # runtime/quant/mix.py's MIXES (not imported here: it imports torch)


def _quantize_parser(sub) -> None:
    q = sub.add_parser("quantize", help="write a model as a quantized GGUF file (llama.cpp's types and layout)",
                       formatter_class=_Formatter,
                       description="Quantize an HF checkpoint or a random-weight shape to a GGUF file: llama.cpp's "
                                   "tensor names, Q/K layout and type mix (Q4_K_M: Q4_K with Q6_K for the LM head "
                                   "and some attn_v / ffn_down). The file has no tokenizer.")
    q.add_argument("--model", required=True, help="HF checkpoint directory, or a shape name (random weights)")
    q.add_argument("--type", required=True, choices=QUANT_TYPES, help="the quantization mix")
    q.add_argument("--out", required=True, help="the .gguf file to write")
    q.add_argument("--device", default=None, help="where to quantize: cpu | cuda | cuda:i; None = cuda if "
                   "available (the K-quant search runs ~2 M weights/s on a small CPU)")
    q.add_argument("--seed", type=int, default=0, help="shape names: the seed of the random weights")
    q.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    q.add_argument("-v", "--verbose", action="store_true", help="one line per tensor: name, shape, type")
    q.set_defaults(run_command=_run_quantize)


# ------------------------------------------------------------------------------------------ train-head
def _run_train_head(args) -> int:
    from .device import apply_cpu_thread_policy
    from .training import TrainConfig, train_head

    for name in ("tokens", "steps", "max_new_tokens", "ttt_steps", "batch_tokens", "draft_vocab", "head_intermediate",
                 "held_out_tokens", "distill_batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            _die(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not args.lr > 0:
        _die(f"--lr must be > 0, got {args.lr}")
    if args.time_limit is not None and not args.time_limit > 0:
        _die(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    if args.eval_every < 1:
        _die(f"--eval-every must be >= 1, got {args.eval_every}")
    from pathlib import Path

    if args.resume and not (Path(args.out) / "train_state.pt").is_file():
        _die(f"--resume: {Path(args.out) / 'train_state.pt'} does not exist (no run to continue in {args.out})")
    save_dtype = None
    if args.save_dtype is not None:
        from .device import DTYPE_NAMES

        if args.save_dtype.lower() not in DTYPE_NAMES:
            _die(f"--save-dtype {args.save_dtype!r} is not one of {sorted(DTYPE_NAMES)}")
        save_dtype = str(DTYPE_NAMES[args.save_dtype.lower()]).removeprefix("torch.")
    init_from = None
    if args.init is not None:
        from .drafters.feature_head import embedded_head_dir

        for flag, value in (("--draft-vocab", args.draft_vocab), ("--head-intermediate", args.head_intermediate)):
            if value is not None:
                _die(f"--init takes the head's shape from the head it starts from: drop {flag}")

        init_from = str(embedded_head_dir()) if args.init == "embedded" else args.init
        if not (Path(init_from) / "config.json").is_file():
            _die(f"--init {args.init}: no trained head there (config.json + head.safetensors, written by "
                 f"`verispec train-head`)")
    threads = apply_cpu_thread_policy(args.threads)
    target = _load(args.model, args.device, args.dtype)
    if init_from is not None:
        from .drafters.feature_head import FeatureHead

        try:
            FeatureHead(init_from).check_fits(target)
        except (ValueError, FileNotFoundError) as e:
            _die(f"--init {args.init}: {e}")
    if target.device.type == "cpu":
        _note(f"training on the CPU with {threads} thread(s)")
    held_out = args.held_out_tokens if args.held_out_tokens is not None else max(200, args.tokens // 10)
    cfg = TrainConfig(out=args.out, tokens=args.tokens, held_out_tokens=held_out, distill_batch=args.distill_batch,
                      steps=args.steps, batch_tokens=args.batch_tokens, max_new_tokens=args.max_new_tokens,
                      ttt_steps=args.ttt_steps, lr=args.lr, eval_every=args.eval_every, seed=args.seed,
                      resume=args.resume, time_limit_s=args.time_limit, draft_vocab=args.draft_vocab,
                      intermediate_size=args.head_intermediate, save_dtype=save_dtype, init_from=init_from)
    start = time.perf_counter()
    try:
        result = train_head(target, cfg, log=lambda msg, transient=False: None if transient else _note(msg))
    except FileNotFoundError as e:
        _die(str(e))
    acc = ", ".join(f"{a:.3f}" for a in result.get("acc", []))
    untrained = result.get("untrained") or {}
    print(f"head written to {args.out} after step {result['step']} ({time.perf_counter() - start:.0f} s): held-out "
          f"loss {result.get('loss', float('nan')):.3f} ({'at the start' if init_from else 'untrained'} "
          f"{untrained.get('loss', float('nan')):.3f}), "
          f"acceptance by depth [{acc}], tau {result.get('tau', float('nan')):.2f}")
    return 0


def _train_head_parser(sub) -> None:
    t = sub.add_parser("train-head", help="train a feature head (EAGLE-3 style drafter) for a model",
                       formatter_class=_Formatter,
                       description="Self-distillation: the model answers built-in prompts with its own distribution, "
                                   "then a one-layer head learns its next-token distribution from its hidden states, "
                                   "with EAGLE-3's training-time test (several draft steps on the head's own "
                                   "outputs). Writes config.json + head.safetensors (usable at every checkpoint), "
                                   "train_state.pt and corpus.pt (for --resume).")
    t.add_argument("--model", default=None, help="HF checkpoint dir, .gguf file or shape name; None = the embedded "
                   "SmolLM2-135M-Instruct")
    t.add_argument("--out", required=True, help="the head's directory")
    t.add_argument("--tokens", type=int, default=20000, help="training tokens to distill (prompt + answer)")
    t.add_argument("--held-out-tokens", type=int, default=None, help="held-out tokens to distill (prompts on topics "
                   "the training never sees); None = a tenth of --tokens, at least 200")
    t.add_argument("--distill-batch", type=int, default=None, help="prompts the model answers at once while "
                   "distilling; None = 64 on a GPU, 16 on a CPU")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps; None = 3 passes over the tokens")
    t.add_argument("--batch-tokens", type=int, default=2048, help="tokens per optimizer step")
    t.add_argument("--max-new-tokens", type=int, default=96, help="answer length per prompt")
    t.add_argument("--ttt-steps", type=int, default=3, help="unrolled draft steps per entry (training-time test)")
    t.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    t.add_argument("--draft-vocab", type=int, default=None, help="a draft vocabulary of this many ids (the ones the "
                   "model predicts most often in the corpus) with its own LM head; None = the model's LM head, shared")
    t.add_argument("--save-dtype", default=None, help="the head file's dtype (bf16 halves it); None = float32")
    t.add_argument("--head-intermediate", type=int, default=None, help="the head's MLP width; None = the model's")
    t.add_argument("--eval-every", type=int, default=50, help="steps between held-out evaluations / checkpoints")
    t.add_argument("--time-limit", type=float, default=None, help="stop training (with a checkpoint) after this "
                   "many seconds of training; --resume continues")
    t.add_argument("--resume", action="store_true", help="continue the run in --out (its corpus and state)")
    t.add_argument("--init", default=None, metavar="DIR", help="start from a trained head (a train-head directory, or "
                   "'embedded' for the head shipped for SmolLM2): its shape, draft vocabulary and weights; None = a "
                   "fresh head")
    t.add_argument("--seed", type=int, default=0, help="seed of the data order, the sampled answers and the init")
    t.add_argument("--device", default=None, help="cpu | cuda | cuda:i; None = cuda if available, else cpu")
    t.add_argument("--dtype", default=None, help="the model's dtype; None = bf16 on cuda, fp32 on cpu (the head "
                   "trains in fp32)")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads; None = the free physical cores")
    t.set_defaults(run_command=_run_train_head)


# ------------------------------------------------------------------------------------------ verify-demo
def _validate_verify_demo(args):
    """(device, dtype) after checking every argument, and the workload's size, before allocating."""
    import torch

    from .device import parse_device

    for flag, value in (("--batch-size", args.batch_size), ("--vocab-size", args.vocab_size)):
        if value < 1:
            _die(f"{flag} must be >= 1, got {value}")
    if args.num_draft < 0:
        _die(f"--num-draft must be >= 0, got {args.num_draft}")
    if not 0.0 <= args.acceptance_rate <= 1.0:   # False for NaN too
        _die(f"--acceptance-rate must be in [0, 1], got {args.acceptance_rate}")
    try:
        device = str(parse_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu")))
    except ValueError as e:
        _die(f"--device: {e}")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    dtype = dtypes.get(args.dtype or "float32")
    if dtype is None:
        _die(f"--dtype {args.dtype!r} is not one of {sorted(dtypes)}")
    rows = args.batch_size * (args.num_draft + 1)
    size = rows * args.vocab_size * 4    # the logits are drawn in float32, then cast
    if size > VERIFY_DEMO_MAX_BYTES:
        _die(f"--batch-size {args.batch_size} x (--num-draft {args.num_draft} + 1) x --vocab-size "
             f"{args.vocab_size} needs {size / 2**30:.1f} GiB of logits (limit {VERIFY_DEMO_MAX_BYTES >> 30} GiB)")
    return device, dtype


def _run_verify_demo(args) -> int:
    import torch

    from . import verify_greedy
    from .verify.workloads import greedy_workload

    device, dtype = _validate_verify_demo(args)
    if device == "cpu":
        from .device import apply_cpu_thread_policy

        apply_cpu_thread_policy()
    try:
        w = greedy_workload(args.batch_size, args.num_draft, args.vocab_size, args.acceptance_rate,
                            dtype=dtype, device=device, seed=args.seed)
    except ValueError as e:
        _die(str(e))
    out = verify_greedy(w.target_logits, w.draft_tokens, w.num_draft)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    reps = 20
    for _ in range(reps):
        out = verify_greedy(w.target_logits, w.draft_tokens, w.num_draft)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / reps
    ok = torch.equal(out.tokens.cpu(), w.expected.tokens.cpu()) and \
        torch.equal(out.num_accepted.cpu(), w.expected.num_accepted.cpu())
    acc = out.num_accepted.float()
    print(f"verify-demo: B={args.batch_size} sequences x k={args.num_draft} drafts, V={args.vocab_size}, "
          f"alpha={args.acceptance_rate}, {dtype} on {device}")
    print(f"  accepted per sequence: mean {acc.mean():.2f} (i.i.d. model: "
          f"{sum(args.acceptance_rate ** i for i in range(1, args.num_draft + 1)):.2f}), "
          f"min {int(acc.min())}, max {int(acc.max())}")
    print(f"  emitted tokens: {int(out.num_emitted.sum())} for {args.batch_size} sequences")
    for b in range(min(3, args.batch_size)):
        row = [t for t in out.tokens[b].tolist() if t >= 0]
        print(f"  seq {b}: accepted {int(out.num_accepted[b])}, emitted {row}")
    print(f"  matches the known answer: {'yes' if ok else 'NO'}")
    print(f"  verify_greedy: {dt * 1e6:.0f} us per call")
    return 0 if ok else 1


# ------------------------------------------------------------------------------------------ main
REPORT_HELP = """\
the summary lines on stderr:
  N tokens in W s        every generated token, wall time of the whole call (prefill included)
  X tok/s decode         tokens after the first one, per second from the end of the prompt's
                         prefill to the last token (the speed of decoding, prompt processing excluded)
  accepted a/p drafts    drafts the target agreed with / drafts proposed
  tokens per target pass tokens emitted per verification pass of the target (1.00 = plain decoding)
  speedup (--compare)    the decode-rate ratio (tok/s decode) and the wall-time ratio of the whole
                         calls (prefill included, so closer to 1)

exit status: 0 ok, 1 failure while running, 2 bad arguments or input, 130 interrupted (Ctrl-C:
the text generated so far is printed first)"""


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the epilog's layout and appends each flag's default to its help."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors as one line (exit 2) like every other error of the CLI."""

    def error(self, message):
        raise CLIError(f"{self.prog}: {message}", USAGE)


def _generate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF checkpoint dir, .gguf file, or a shape name with RANDOM weights "
                   "(e.g. llama-3.2-1b, for speed tests); None = the embedded SmolLM2-135M-Instruct")
    d = p.add_mutually_exclusive_group()
    d.add_argument("--draft", metavar="MODEL", default=None,
                   help="draft with this model (same tokenizer as --model; path or shape name)")
    d.add_argument("--draft-lookup", action="store_true",
                   help="prompt-lookup drafting: copy what followed earlier occurrences of the last n-gram")
    d.add_argument("--draft-self", metavar="L", type=int, default=None,
                   help="self-speculation: the model's first L layers draft for it")
    d.add_argument("--draft-head", metavar="DIR", nargs="?", const="", default=None,
                   help="a feature head (EAGLE-3 style) reading the model's hidden states: a directory written by "
                        "`verispec train-head` or a published EAGLE-3 head (config.json + model.safetensors); without DIR "
                        "the head shipped for the embedded SmolLM2")
    p.add_argument("-k", type=int, default=None, help="draft tokens per round, >= 1; None = 8 for --draft-lookup, "
                   f"{HEAD_K} for --draft-head's chains, else 4; capped at --max-new-tokens - 1 and the model's "
                   "positions")
    p.add_argument("--tree", default=None, metavar="W1,W2,...|dyn:D,K,N|auto",
                   help="draft trees instead of chains: children per node at each depth, e.g. 4,2,2,1 (at most 63 "
                        "nodes; excludes -k); or dyn:D,K,N (--draft / --draft-self): a dynamic tree D deep, each "
                        "node's top K children, the N of highest cumulative draft probability kept per depth; or auto: each round plain decoding, a chain of up to -k drafts or one "
                        "of a few trees, by a cost table measured at startup (trees for greedy batches only)")
    p.add_argument("--ngram-max", type=int, default=3, help="--draft-lookup: longest n-gram matched")
    p.add_argument("--ngram-min", type=int, default=2, help="--draft-lookup: shortest n-gram matched")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (output identical to plain decoding); > 0 samples (>= 1e-6)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens; 0 or None = off")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling in (0, 1]; 1 or None = off")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling stream (any 64-bit integer)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens to generate at most, >= 1")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable): stop after it appears")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the model's chat template; None = on when the model has one")
    p.add_argument("--batch-file", default=None,
                   help="UTF-8 file, one prompt per line (\\n for newlines): generate them as one batch")
    p.add_argument("--compare", action="store_true",
                   help="also run plain decoding; report the speedup and whether outputs are identical")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:i; None = cuda if available, else cpu")
    p.add_argument("--draft-device", default=None, help="device of the --draft model; None = the target's")
    p.add_argument("--dtype", default=None,
                   help="float32 | bfloat16 | float16 (or fp32, bf16, fp16); None = bf16 on cuda, fp32 on cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads; None = the physical cores "
                   "that other processes leave free (OMP_NUM_THREADS, when set, wins)")
    p.add_argument("-q", "--quiet", action="store_true", help="no generated text, only the summary")
    p.add_argument("-v", "--verbose", action="store_true", help="per-phase timings; tracebacks on internal errors")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="verispec", description="Exact speculative decoding.", formatter_class=_Formatter,
                     epilog=REPORT_HELP)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="generate text (speculatively with a drafter)", formatter_class=_Formatter,
                       description="Generate text; with a drafter, speculatively (greedy output is identical "
                                   "to plain decoding).", epilog=REPORT_HELP)
    g.add_argument("prompt", nargs="?", default=None, help="the prompt text; - reads it from stdin")
    _generate_args(g)
    dm = sub.add_parser("demo", help="prompt lookup and the feature head vs plain decoding on the embedded model "
                        "(about 1 min on 2 CPUs)",
                        formatter_class=_Formatter, epilog=REPORT_HELP)
    dm.add_argument("--max-new-tokens", type=int, default=120, help="tokens to generate, >= 1")
    dm.add_argument("--device", default=None, help="cpu | cuda | cuda:i; None = cuda if available, else cpu")
    dm.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads; None = the physical cores that other processes leave free")
    v = sub.add_parser("verify-demo", help="verify a synthetic batch with known answers", formatter_class=_Formatter)
    v.add_argument("--batch-size", type=int, default=8, help="sequences B, >= 1")
    v.add_argument("--num-draft", type=int, default=4, help="drafts per sequence k, >= 0")
    v.add_argument("--vocab-size", type=int, default=32000, help="vocabulary V, >= 1 (B x (k+1) x V <= 2 GiB "
                   "of float32 logits)")
    v.add_argument("--acceptance-rate", type=float, default=0.7, help="chance each draft matches, in [0, 1]")
    v.add_argument("--device", default=None, help="cpu | cuda | cuda:i; None = cuda if available, else cpu")
    v.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16; None = float32")
    v.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload, in [0, 2**63)")
    from .serve.cli import add_arguments as serve_arguments

    serve_arguments(sub.add_parser("serve", help="an OpenAI-compatible server (continuous batching)",
                                   formatter_class=_Formatter))
    from .bench.command import add_bench_parser

    add_bench_parser(sub)
    _quantize_parser(sub)
    _train_head_parser(sub)
    return parser


def _main(argv) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "serve"]:     # its own options (a client of any OpenAI-compatible server)
        from .bench.serving import build_parser, run

        return run(build_parser(_Parser, _Formatter).parse_args(argv[2:]))
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        from .serve.cli import main as serve_main

        if getattr(args, "ssd", False):
            from .launch import ssd_drafter

            return serve_main(args, ssd_drafter)
        return serve_main(args)
    if hasattr(args, "run_command"):
        return args.run_command(args)
    if args.command == "verify-demo":
        if not 0 <= args.seed < 2**63:
            _die(f"--seed must be in [0, 2**63), got {args.seed}")
        return _run_verify_demo(args)
    if args.command == "demo":
        if args.max_new_tokens < 1:
            _die(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
        common = ["--compare", "--max-new-tokens", str(args.max_new_tokens)] \
            + (["--device", args.device] if args.device else []) \
            + (["--threads", str(args.threads)] if args.threads else [])
        _note("demo 1/2: the embedded SmolLM2-135M-Instruct, prompt-lookup drafting (k=8), greedy; "
              "then the same request with plain decoding")
        _note(f"prompt: {DEMO_PROMPT[:90]!r}...")
        status = _run_generate(parser.parse_args(["generate", DEMO_PROMPT, "--draft-lookup", "-k", "8"] + common))
        if status:
            return status
        _note(f"demo 2/2: free-form text (nothing to copy) drafted by the feature head shipped for SmolLM2 (one "
              f"decoder layer over the model's own hidden states, trained by `verispec train-head`; k={HEAD_K}), "
              f"on a topic it never saw in training; then plain decoding")
        _note(f"prompt: {DEMO_HEAD_PROMPT!r}")
        return _run_generate(parser.parse_args(["generate", DEMO_HEAD_PROMPT, "--draft-head", "-k", str(HEAD_K)]
                                               + common))
    if args.k is None and (args.tree is None or args.tree.strip().lower() == "auto"):
        head_chain = getattr(args, "draft_head", None) is not None and args.tree is None
        args.k = 8 if args.draft_lookup else HEAD_K if head_chain else 4
    return _run_generate(args)


def main(argv=None) -> int:
    """The entry point: every error ends as one line on stderr and an exit status (see REPORT_HELP)."""
    verbose = "-v" in (argv if argv is not None else sys.argv[1:]) or \
        "--verbose" in (argv if argv is not None else sys.argv[1:])
    try:
        return _main(argv)
    except CLIError as e:
        print(f"verispec: error: {e}", file=sys.stderr)
        raise SystemExit(e.code) from None
    except KeyboardInterrupt:
        print("\nverispec: interrupted (Ctrl-C)", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    except (RuntimeError, OSError, MemoryError) as e:
        if verbose:
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"verispec: error: {type(e).__name__}: {message[:500]} (run with -v for the traceback)",
              file=sys.stderr)
        raise SystemExit(RUNTIME) from None


if __name__ == "__main__":
    raise SystemExit(main())
