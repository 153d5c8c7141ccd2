"""The ``verispec`` command line: the front end only (all the work is in engine / drafters / runtime).

    verispec demo                                   prompt lookup on an echo-heavy prompt, vs plain decoding
    verispec generate "PROMPT" [--draft-lookup | --draft MODEL | --draft-self L] [-k K] [--compare] ...
    verispec verify-demo [--batch-size B --num-draft K --vocab-size V --acceptance-rate A]
    verispec serve [--model M] [--draft-lookup | --draft D | --draft-self L] [-k N|auto] [--port P] ...
"""
from __future__ import annotations

import argparse
import os
import sys
import time

DEMO_PROMPT = (
    "Repeat this text exactly, word for word:\n\n"
    "Speculative decoding makes a large language model faster without changing what it writes. "
    "A cheap drafter guesses the next few tokens, and the model checks all the guesses in a single pass. "
    "Every guess that matches is kept for free, and the first wrong guess is replaced by the model's own token. "
    "Because every kept token is one the model would have chosen anyway, the output is exactly the same."
)


# ------------------------------------------------------------------------------------------ helpers
def _die(message: str) -> None:
    print(f"verispec: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _load(source, device, dtype, what="model"):
    import torch

    from .runtime import load_model

    if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
        _die(f"--device {device} was asked for but CUDA is not available here; use --device cpu")
    from .device import DTYPE_NAMES

    if dtype is not None and dtype not in DTYPE_NAMES:
        _die(f"--dtype {dtype!r} is not one of {sorted(DTYPE_NAMES)}")
    try:
        return load_model(source, device=device, dtype=dtype)
    except (ValueError, FileNotFoundError) as e:
        _die(f"cannot load the {what} {source or '(embedded SmolLM2-135M-Instruct)'}: {e}")


class _Streamer:
    """Prints the text of one sequence as its tokens arrive (holds back incomplete UTF-8)."""

    def __init__(self, tokenizer, out=None):
        self.tokenizer, self.out = tokenizer, out or sys.stdout
        self.tokens: list[int] = []
        self.printed = 0

    def __call__(self, seq_index: int, new_tokens: list[int]) -> None:
        self.tokens += new_tokens
        eos = set(self.tokenizer.eos_token_ids)
        text = self.tokenizer.decode([t for t in self.tokens if t not in eos])
        if text.endswith("\ufffd"):
            return
        self.out.write(text[self.printed:])
        self.out.flush()
        self.printed = len(text)


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
def _make_drafter(args, target):
    from .drafters import DraftModel, PromptLookup, SelfSpeculative

    if args.draft_lookup:
        return PromptLookup(max_ngram=args.ngram_max, min_ngram=args.ngram_min)
    if args.draft_self is not None:
        return SelfSpeculative(layers=args.draft_self)
    if args.draft is not None:
        device = args.draft_device or str(target.device)
        return DraftModel(_load(args.draft, device, args.dtype, what="draft model"))
    return None


def _prompts(args, tokenizer) -> list:
    if args.batch_file:
        with open(args.batch_file, encoding="utf-8") as f:
            prompts = [line.rstrip("\n").replace("\\n", "\n") for line in f if line.strip()]
        if not prompts:
            _die(f"{args.batch_file} has no prompts (one per line)")
    else:
        if args.prompt is None:
            _die("give a PROMPT (or --batch-file FILE)")
        prompts = [args.prompt]
    if tokenizer is None:   # random-weight shapes have no tokenizer: feed UTF-8 bytes as token ids
        print("[verispec] this model has no tokenizer: using the prompt's UTF-8 bytes as token ids",
              file=sys.stderr)
        return [list(p.encode("utf-8")) or [0] for p in prompts]
    return prompts


def _run_generate(args, *, banner: str | None = None) -> int:
    from .engine import SpeculativeDecoder

    if args.k < 1:
        _die(f"-k must be >= 1, got {args.k}")
    if args.threads is not None:
        import torch

        if args.threads < 1:
            _die(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    target = _load(args.model, args.device, args.dtype)
    tok = target.tokenizer
    prompts = _prompts(args, tok)
    chat = args.chat
    if chat is None:
        chat = tok is not None and bool(getattr(tok, "chat_template", None))
    try:
        drafter = _make_drafter(args, target)
        spec = SpeculativeDecoder(target, drafter, k=args.k)
        plain = SpeculativeDecoder(target, None)
    except ValueError as e:
        _die(str(e))
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
              top_p=args.top_p, seed=args.seed, stop=args.stop or None, chat=chat and tok is not None)
    batch = len(prompts) > 1
    runs = [("speculative" if drafter is not None else "target-only", spec)]
    if args.compare and drafter is not None:
        runs.append(("target-only", plain))
    try:
        for _, decoder in runs:   # warm-up: thread pools, kernels, CUDA graphs for the shapes used
            decoder.generate(prompts if batch else prompts[0], **{**kw, "max_new_tokens": min(4, args.max_new_tokens)})
    except ValueError as e:
        _die(str(e))
    if banner:
        print(banner, file=sys.stderr)
    results = []
    for i, (name, decoder) in enumerate(runs):
        stream = i == 0 and not batch and tok is not None and not args.quiet
        progress = _Progress(args.max_new_tokens * len(prompts), enabled=not stream and sys.stderr.isatty())
        streamer = _Streamer(tok) if stream else None
        if i == 1:
            print(f"[verispec] running {name} decoding for comparison ...", file=sys.stderr)
        t0 = time.perf_counter()
        out = decoder.generate(prompts if batch else prompts[0], on_tokens=_both(streamer, progress), **kw)
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
    return 0


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
        (_, spec, _, s1), (_, base, _, s0) = results
        same = [a.tokens == b.tokens for a, b in zip(spec, base)]
        speed = s1.tokens_per_s / s0.tokens_per_s if s0.tokens_per_s else float("nan")
        print(f"[verispec] speedup: {speed:.2f}x", file=err)
        if all(same):
            print("[verispec] outputs identical: yes", file=err)
        elif args.temperature and args.temperature > 0:
            print("[verispec] outputs identical: no (expected when sampling: speculative sampling is exact in "
                  "distribution, not token for token)", file=err)
        else:
            print(f"[verispec] outputs identical: NO ({sum(same)}/{len(same)} sequences match)", file=err)


# ------------------------------------------------------------------------------------------ verify-demo
def _run_verify_demo(args) -> int:
    import torch

    from . import verify_greedy
    from .verify.workloads import greedy_workload

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        _die(f"--device {device} was asked for but CUDA is not available here; use --device cpu")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(args.dtype or "float32")
    if dtype is None:
        _die(f"--dtype {args.dtype!r} is not one of float32, bfloat16, float16")
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
def _generate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF checkpoint dir, .gguf file or a random-weight shape name "
                   "(e.g. llama-3.2-1b); default: the embedded SmolLM2-135M-Instruct")
    d = p.add_mutually_exclusive_group()
    d.add_argument("--draft", metavar="MODEL", help="draft model (same tokenizer as --model)")
    d.add_argument("--draft-lookup", action="store_true", help="prompt-lookup drafting (no draft model)")
    d.add_argument("--draft-self", metavar="L", type=int, help="self-speculation with the first L layers")
    p.add_argument("-k", type=int, default=None, help="draft tokens per round (default 8 for lookup, else 4)")
    p.add_argument("--ngram-max", type=int, default=3)
    p.add_argument("--ngram-min", type=int, default=2)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the chat template (default: on when the model has one)")
    p.add_argument("--batch-file", help="one prompt per line (\\n for newlines): generate them as one batch")
    p.add_argument("--compare", action="store_true", help="also run target-only decoding; compare speed and output")
    p.add_argument("--device", default=None, help="cpu | cuda[:i] (default: cuda if available)")
    p.add_argument("--draft-device", default=None, help="device of the --draft model (default: the target's)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bf16 on cuda, fp32 on cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("-q", "--quiet", action="store_true", help="no generated text, only the summary")
    p.add_argument("-v", "--verbose", action="store_true", help="per-phase timings")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="verispec", description="Exact speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text (speculatively with a drafter)")
    g.add_argument("prompt", nargs="?")
    _generate_args(g)
    dm = sub.add_parser("demo", help="prompt lookup vs plain decoding on the embedded model (< 1 min on 2 CPUs)")
    dm.add_argument("--max-new-tokens", type=int, default=120)
    dm.add_argument("--device", default=None)
    dm.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: all, or 1 when this small machine is already busy)")
    v = sub.add_parser("verify-demo", help="verify a synthetic batch with known answers")
    v.add_argument("--batch-size", type=int, default=8)
    v.add_argument("--num-draft", type=int, default=4)
    v.add_argument("--vocab-size", type=int, default=32000)
    v.add_argument("--acceptance-rate", type=float, default=0.7)
    v.add_argument("--device", default=None)
    v.add_argument("--dtype", default=None)
    v.add_argument("--seed", type=int, default=0)
    from .serve.cli import add_arguments as serve_arguments

    serve_arguments(sub.add_parser("serve", help="an OpenAI-compatible server (continuous batching)"))
    args = parser.parse_args(argv)

    if args.command == "serve":
        from .serve.cli import main as serve_main

        return serve_main(args)

    if args.command == "verify-demo":
        return _run_verify_demo(args)
    if args.command == "demo":
        threads = args.threads
        if threads is None and (os.cpu_count() or 1) <= 4 and os.getloadavg()[0] >= 0.75:
            # NOTE: with every core's OpenMP thread and another process on one of the cores, torch's CPU
            # kernels stall on the preempted thread (measured 3-4x slower here); one thread does not.
            threads = 1
            print(f"[verispec] this machine is busy (load {os.getloadavg()[0]:.1f}): using 1 CPU thread",
                  file=sys.stderr)
        demo = parser.parse_args(["generate", DEMO_PROMPT, "--draft-lookup", "--compare", "-k", "8",
                                  "--max-new-tokens", str(args.max_new_tokens)]
                                 + (["--device", args.device] if args.device else [])
                                 + (["--threads", str(threads)] if threads else []))
        print("[verispec] demo: the embedded SmolLM2-135M-Instruct, prompt-lookup drafting (k=8), greedy; "
              "then the same request with plain decoding", file=sys.stderr)
        print(f"[verispec] prompt: {DEMO_PROMPT[:90]!r}...", file=sys.stderr)
        return _run_generate(demo)
    if args.k is None:
        args.k = 8 if args.draft_lookup else 4
    return _run_generate(args)


if __name__ == "__main__":
    raise SystemExit(main())
