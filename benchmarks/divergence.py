"""How often does bf16 greedy speculative output differ from bf16 greedy AR output? (GPU)

Greedy speculative decoding is exact *for a fixed function*: it emits the target's argmax at every
position. In bf16 the target is not quite a fixed function: a verify pass over [B, K+1] tokens and a
decode step over [B, 1] use different GEMM shapes (different kernels, different summation orders),
so two logits closer than the rounding noise can swap places. This script counts how often that
changes a generation, on random-weight models whose top-2 logits are often very close (the worst
case), using the target's own first layers as the drafter (SelfSpeculative), so acceptance is real.

    PYTHONPATH=. python benchmarks/divergence.py            # writes benchmarks/results/divergence.md

For each batch size: the fraction of sequences whose speculative output differs from AR anywhere in
`--max-new` tokens, and the mean index of the first differing token. fp32 on the same GPU is the
control (expected: no differences).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import environment, table_header, table_row  # noqa: E402
from verispec import SelfSpeculative, generate, load_model  # noqa: E402


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def measure(model, batch: int, num_batches: int, prompt_len: int, max_new: int, k: int, layers: int, seed: int):
    differing, first_positions, total, accepted, proposed = 0, [], 0, 0, 0
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    for _ in range(num_batches):
        prompts = [torch.randint(0, vocab, (prompt_len,), generator=gen).tolist() for _ in range(batch)]
        ar = generate(model, prompts, drafter=None, max_new_tokens=max_new)
        spec = generate(model, prompts, drafter=SelfSpeculative(layers=layers), k=k, max_new_tokens=max_new)
        for a, s in zip(ar, spec):
            total += 1
            pos = first_difference(a.tokens, s.tokens)
            if pos is not None:
                differing += 1
                first_positions.append(pos)
            accepted += s.stats.accepted
            proposed += s.stats.proposed
    mean_first = sum(first_positions) / len(first_positions) if first_positions else float("nan")
    return differing, total, mean_first, accepted / max(proposed, 1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--sequences", type=int, default=64, help="sequences per batch size (rounded up to whole batches)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4, help="SelfSpeculative draft depth")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "divergence.md"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("divergence.py measures GPU bf16 numerics: it needs a CUDA GPU")
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        model = load_model(args.model, device="cuda", dtype=dtype, seed=0)
        for batch in [int(b) for b in args.batches.split(",")]:
            num_batches = -(-args.sequences // batch)
            differing, total, mean_first, acc = measure(
                model, batch, num_batches, args.prompt_len, args.max_new, args.k, args.layers, seed=batch)
            row = table_row([str(dtype).removeprefix('torch.'), batch, total, differing,
                             f"{100 * differing / total:.1f}%", f"{mean_first:.1f}", f"{100 * acc:.0f}%"])
            print(row, flush=True)
            rows.append(row)
        del model
        torch.cuda.empty_cache()
    env = environment()
    header = [
        "# Greedy speculative vs AR output under bf16 (benchmarks/divergence.py)", "",
        f"{env['device']}, torch {env['torch']}, {env['date']}. Random-weight `{args.model}` "
        f"(N(0, 0.02) weights: top-2 logits often within bf16 noise, the worst case), SelfSpeculative(layers="
        f"{args.layers}), k={args.k}, prompts of {args.prompt_len} random tokens, {args.max_new} new tokens.", "",
        *table_header(["dtype", "B", "sequences", "differing", "fraction", "mean first differing index", "acceptance"]),
    ]
    text = "\n".join(header + rows) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
