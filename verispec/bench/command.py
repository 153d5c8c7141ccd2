"""The ``verispec bench`` subcommand: ``add_bench_parser(subparsers)`` registers it on the CLI's parser.

    verispec bench STUDY [STUDY ...] --out DIR [--model M] [--draft D] [--quick] [--k 1,2,4] ...
    verispec bench trees --out DIR --trees '2,2,1;4,2,2,1'     (the best chains vs these tree shapes)
    verispec bench heads --out DIR [--draft-head DIR]         (a feature head vs prompt lookup vs plain)
    verispec bench all --out DIR
    verispec bench report DIR

Every argument is checked before any model loads; a bad one ends with one line on stderr and exit 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .options import (STUDIES, BenchArgumentError, BenchOptions, check_options, check_studies, parse_list,
                      parse_trees)

USAGE = 2


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="measure which drafter and K pay off, with the analytical model and plots; or a server "
                      "(bench serve --url URL)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Run benchmark studies into --out DIR (DIR/<study>.md, .jsonl rows, .png plots; rows already "
                    "in DIR are kept and skipped), or gather them: `verispec bench report DIR`. Studies: "
                    + ", ".join(STUDIES) + ", all. A running OpenAI-compatible server (verispec serve, vLLM, "
                    "SGLang, llama.cpp): `verispec bench serve --url URL` (see `verispec bench serve --help`).")
    p.add_argument("study", nargs="+", help=f"one or more of {', '.join(STUDIES)}, all; or: report DIR")
    p.add_argument("--out", default=None, help="directory for the reports, rows and plots (created if missing)")
    p.add_argument("--model", default=None, help="target: HF dir, .gguf, or a shape name (random weights); "
                   "None = the embedded SmolLM2 on CPU, llama-3.1-8b on CUDA")
    p.add_argument("--draft", default=None, help="lookup | self:L | oracle[:ALPHA] | a model source; None = lookup "
                   "on CPU, oracle on CUDA")
    p.add_argument("--draft-cost", default=None, help="oracle drafts pay the passes of this model (None = "
                   "llama-3.2-1b on CUDA, free on CPU)")
    p.add_argument("--quick", action="store_true", help="tiny sweeps (seconds)")
    p.add_argument("--k", dest="ks", default=None, help="K sweep, comma-separated integers >= 1; None = the "
                   "device's sweep (cpu 1,2,4,8; cuda 2,4,8; --quick: 1,2 / 2,4)")
    p.add_argument("--alphas", default=None, help="oracle acceptance rates, comma-separated in [0, 1]; None = "
                   "0.5,0.7,0.9 on cpu, 0.6,0.8,0.9 on cuda")
    p.add_argument("--batches", default=None, help="batch sizes, comma-separated integers >= 1; None = 1,2,4 on "
                   "cpu, 1,8,32 on cuda")
    p.add_argument("--rates", default=None, help="batch study: arrival rates in requests/s, comma-separated; "
                   "None = 1,4 on cpu, 16 on cuda")
    p.add_argument("--trees", default=None, help="trees study: tree shapes, ';'-separated, each the children per "
                   "node at each depth, comma-separated (e.g. '2,2,1;4,2,2,1'); None = 2,2,1;3,2,1 on cpu, "
                   "2,2,1;2,2,2,1;3,2,2,1;4,2,2,1 on cuda (--quick: 2,1 / 2,2,1;4,2,2,1)")
    p.add_argument("--draft-head", default=None, metavar="DIR", help="heads study: a feature-head directory "
                   "(verispec train-head, or a published EAGLE head); None = the head shipped for the embedded "
                   "SmolLM2, used when the target is that model (other targets skip the study)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens generated per request; None = 48 "
                   "on cpu, 64 on cuda (8 / 16 with --quick)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens for models without a tokenizer")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:i")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16")
    p.add_argument("--seed", type=int, default=0, help="seed of prompts, oracle and random weights")
    p.add_argument("--packed", action="store_true", help="keep every .gguf model of the run (the target: a .gguf "
                   "or the embedded model) as its GGUF blocks: Q4_K_M / Q4_0 / Q8_0 ... decoded by packed.cu on CUDA")
    p.set_defaults(run_command=run_bench_command)
    return p


def options_from_args(args, argv_line: str = "") -> BenchOptions:
    """BenchOptions from parsed arguments, checked and resolved (BenchArgumentError on any bad value)."""
    studies = check_studies(args.study)
    if args.out is None:
        raise BenchArgumentError("--out DIR is required (where the reports, rows and plots go)")
    o = BenchOptions(
        studies=studies, out=Path(args.out), model=args.model, draft=args.draft, draft_cost=args.draft_cost,
        device=args.device, dtype=args.dtype, quick=args.quick,
        ks=parse_list(args.ks, int, "--k") if args.ks is not None else None,
        alphas=parse_list(args.alphas, float, "--alphas") if args.alphas is not None else None,
        batches=parse_list(args.batches, int, "--batches") if args.batches is not None else None,
        rates=parse_list(args.rates, float, "--rates") if args.rates is not None else None,
        trees=parse_trees(args.trees) if args.trees is not None else None, draft_head=args.draft_head,
        max_new_tokens=args.max_new_tokens, prompt_len=args.prompt_len, seed=args.seed, packed=args.packed,
        command=argv_line)
    return check_options(o)


def run_bench_command(args) -> int:
    """The subcommand's body: 0 on success, 2 (one line on stderr) for bad arguments."""
    from . import markdown
    from .runner import run_studies

    argv = sys.argv[1:]
    argv_line = "verispec " + " ".join(argv[argv.index("bench"):] if "bench" in argv else ["bench", *args.study])
    try:
        if args.study[0] == "report":
            if len(args.study) > 2 or (len(args.study) == 1 and args.out is None):
                raise BenchArgumentError("usage: verispec bench report DIR")
            where = Path(args.study[1] if len(args.study) == 2 else args.out)
            if not where.is_dir():
                raise BenchArgumentError(f"report: {where} is not a directory")
            try:
                path = markdown.gather(where)
            except FileNotFoundError as e:
                raise BenchArgumentError(f"report: {e}") from None
            print(f"[verispec] wrote {path}", file=sys.stderr)
            return 0
        options = options_from_args(args, argv_line)
    except BenchArgumentError as e:
        print(f"verispec: error: bench: {e}", file=sys.stderr)
        return USAGE
    for page in run_studies(options):
        print(f"[verispec] wrote {page}", file=sys.stderr)
    return 0
