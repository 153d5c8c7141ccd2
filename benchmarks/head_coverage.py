"""Top-w coverage of a feature head: how often the target's next token is among the head's w most likely tokens, at
each draft depth, on held-out prompts. It is what a tree node of w children covers, and the shape of the prior that
``tree="auto"`` starts each row from (``verispec.engine.auto_k``, ``COVERAGE_EXPONENT``): the miss rate at width w
is close to the chain's miss rate times w^-x, and the page fits x per depth.

    python benchmarks/head_coverage.py --out DIR [--write]        # the embedded SmolLM2 and its shipped head
    python benchmarks/head_coverage.py --corpus OUT/corpus.pt ...  # a train-head corpus's held-out split, not
                                                                   # distilled again
    python benchmarks/head_coverage.py --head DIR --model X.gguf   # another head / target

The held-out split (verispec/training/prompts.py: topics the head never trained on) is answered by the target
(``distill``: greedy, then sampled at T = 0.8 for repeats) unless ``--corpus`` gives one; the head reads the target's
states as in training (``verispec.training.train.top_w_coverage``: step s of its unrolled draft, s = depth - 1).
"""
from __future__ import annotations

import argparse
import json
import math
import pickle
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import environment, environment_line, markdown_table  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def fit_exponent(coverage: list[float]) -> float:
    """x of miss(w) = miss(1) w^-x, least squares on log(miss(w) / miss(1)) = -x log w over w >= 2.

    >>> round(fit_exponent([1 - 0.5 * w ** -0.4 for w in range(1, 9)]), 6)
    0.4
    """
    miss1 = 1.0 - coverage[0]
    pairs = [(math.log(w), math.log((1.0 - c) / miss1)) for w, c in enumerate(coverage[1:], start=2)
             if 0 < 1.0 - c and miss1 > 0]
    if not pairs:
        return float("nan")
    return -sum(a * b for a, b in pairs) / sum(a * a for a, _ in pairs)


def held_out_corpus(target, layers, args, log):
    """The held-out corpus: ``--corpus``'s held split, or distilled now from the held-out prompts."""
    from verispec.training.distill import distill
    from verispec.training.prompts import prompt_ids
    from verispec.training.train import _corpus_from

    if args.corpus:
        try:
            d = torch.load(args.corpus, map_location=target.device)["held"]
        except (OSError, RuntimeError, KeyError, TypeError, pickle.UnpicklingError) as e:
            raise SystemExit(f"--corpus {args.corpus}: not a train-head corpus.pt with a held-out split ({str(e).splitlines()[0]})")
        if tuple(d["layers"]) != tuple(layers):
            raise SystemExit(f"--corpus {args.corpus}: recorded for layers {d['layers']}, the head reads "
                             f"{list(layers)}")
        return _corpus_from(d, target), f"the held-out split of {args.corpus}"
    prompts = prompt_ids(target, "held-out", args.prompts)
    t0 = time.perf_counter()
    corpus = distill(target, prompts, layers, max_new_tokens=args.max_new_tokens,
                     progress=lambda n: log(f"distill: {n} tokens"))
    return corpus, (f"{len(prompts)} held-out prompts answered by the target now ({args.max_new_tokens} new tokens "
                    f"each, {time.perf_counter() - t0:.0f} s)")


def measure(args, log=print) -> dict:
    from verispec.drafters import FeatureHead
    from verispec.runtime import load_model
    from verispec.training.train import top_w_coverage

    dtype = dict(bf16=torch.bfloat16, fp32=torch.float32)[args.dtype]
    target = load_model(args.model, device=args.device, dtype=dtype)
    head = FeatureHead(args.head) if args.head else FeatureHead()
    head.check_fits(target)
    vocab = head.cfg.draft_vocab or target.config.vocab_size
    if args.max_width > vocab:      # before distilling: top_w_coverage would refuse it only after
        raise SystemExit(f"--max-width {args.max_width} exceeds the head's vocabulary of {vocab} tokens")
    net = head.net.float().to(target.device)
    corpus, source = held_out_corpus(target, head.cfg.target_layers, args, log)
    coverage, entries = top_w_coverage(net, target, corpus, args.steps, args.max_width)
    return dict(env=environment(), command=" ".join(sys.argv), head=args.head or "embedded", source=source,
                entries=entries, coverage=coverage, exponents=[fit_exponent(row) for row in coverage])


def markdown(res: dict) -> str:
    W = len(res["coverage"][0])
    rows = []
    for s, (row, x) in enumerate(zip(res["coverage"], res["exponents"])):
        rows.append([s + 1, *(f"{c:.3f}" for c in row), f"{x:.2f}"])
        rows.append([f"{s + 1}: 1 - (1 - a) w^-{x:.2f}", *(f"{1 - (1 - row[0]) * w ** -x:.3f}"
                                                          for w in range(1, W + 1)), ""])
        rows.append([f"{s + 1}: 1 - (1 - a)^w", *(f"{1 - (1 - row[0]) ** w:.3f}" for w in range(1, W + 1)), ""])
    from verispec.engine.auto_k import COVERAGE_EXPONENT

    lines = ["# Top-w coverage of a feature head (what a tree node of w children covers)", "",
             environment_line(res["env"]), "", f"Command: `{res['command']}`.", "",
             f"Head: {res['head']}. Data: {res['source']}; {res['entries']} answer positions. Coverage at depth d, "
             f"width w: how often the target's argmax at a position is among the head's w most likely tokens at its "
             f"unrolled step d - 1 (width 1: the chain's acceptance at that depth once the drafts before it were "
             f"accepted). Under each measured row, the power law fitted to it (miss rate (1 - a) w^-x, least "
             f"squares over w >= 2) and the independent-tries rule 1 - (1 - a)^w.", ""]
    lines += markdown_table(["depth", *(f"w={w}" for w in range(1, W + 1)), "x"], rows)
    lines += ["", f"Reading: the miss rate falls as a power of the width (x = "
                  f"{', '.join(f'{x:.2f}' for x in res['exponents'])} at depths 1..{len(res['exponents'])}), far "
                  f"slower than independent tries: at depth 1, 4 children cover {res['coverage'][0][min(3, W - 1)]:.3f}"
                  f" where independent tries would give {1 - (1 - res['coverage'][0][0]) ** min(4, W):.3f}. "
                  f"tree=\"auto\" starts each width's coverage from this power law, with x = {COVERAGE_EXPONENT} "
                  f"(``verispec.engine.auto_k.COVERAGE_EXPONENT``) for every depth.", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="the target (default: the embedded SmolLM2)")
    ap.add_argument("--head", default=None, help="a head directory (default: the embedded head)")
    ap.add_argument("--corpus", default=None, help="a train-head corpus.pt: measure on its held-out split")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="the target's dtype while distilling")
    ap.add_argument("--prompts", type=int, default=None, help="held-out prompts to answer (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--steps", type=int, default=3, help="draft depths")
    ap.add_argument("--max-width", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch threads on the CPU")
    ap.add_argument("--out", default=None, help="folder for head_coverage.json and .md")
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/head_coverage.md")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.max_width < 2:
        ap.error("--steps must be >= 1 and --max-width >= 2")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    if args.prompts is not None and args.prompts < 1:
        ap.error(f"--prompts must be >= 1, got {args.prompts}")
    if args.threads:
        torch.set_num_threads(args.threads)
    res = measure(args)
    text = markdown(res)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "head_coverage.json").write_text(json.dumps(res, indent=1))
        (out / "head_coverage.md").write_text(text)
    if args.write:
        (RESULTS / "head_coverage.md").write_text(text)


if __name__ == "__main__":
    main()
