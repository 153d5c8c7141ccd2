"""``python -m verispec.distributed``: SSD with a (tensor-parallel) target and a draft rank.

One command spawns the ranks locally:
    python -m verispec.distributed --target llama-3.1-8b --draft llama-3.2-1b --tp 1 --backend nccl
Under torchrun each process runs its own rank (WORLD_SIZE must be tp + 1):
    torchrun --nproc-per-node 2 -m verispec.distributed --target ... --draft ... --tp 1
Random-weight shapes have no tokenizer: the prompts are given as token ids (--prompt-ids 1,2,3;4,5 is a batch of two).
"""
from __future__ import annotations

import argparse
import os
import sys

from .group import DistributedError, check_backend, init_group, run_local
from .ssd import SSDConfig, run_ssd


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m verispec.distributed", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="HF dir, .gguf, or a shape name (random weights)")
    p.add_argument("--draft", required=True, help="HF dir, .gguf, or a shape name (random weights)")
    p.add_argument("--tp", type=int, default=1, help="target ranks (tensor-parallel degree)")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--budget", type=int, default=4, help="pre-speculated branches per round (0 = plain SD)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-ids", default="1,2,3,4",
                   help="comma-separated token ids; several prompts (a batch) separated by ';', e.g. 1,2;3,4,5")
    p.add_argument("--timeout-s", type=float, default=120.0, help="wall-clock limit of a spawned run")
    args = p.parse_args(argv)
    if args.tp < 1:
        p.error(f"--tp must be >= 1, got {args.tp}")
    return args


def parse_prompts(text: str) -> list[list[int]]:
    try:
        return [[int(t) for t in prompt.split(",")] for prompt in text.split(";")]
    except ValueError:
        raise DistributedError(f"--prompt-ids must be comma-separated integers, prompts separated by ';': "
                               f"got {text!r}") from None


def _load(source: str, rank: int, backend: str):
    import torch

    from ..runtime import load_model

    device = f"cuda:{rank % torch.cuda.device_count()}" if backend == "nccl" else "cpu"
    return load_model(source, device=device, dtype=None if backend == "nccl" else torch.float32)


def rank_main(rank: int, world_size: int, args: argparse.Namespace):
    draft_rank = world_size - 1
    target = _load(args.target, rank, args.backend) if rank != draft_rank else None
    draft = _load(args.draft, rank, args.backend) if rank == draft_rank else None
    cfg = SSDConfig(k=args.k, max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                    budget=args.budget)
    tokens, stats = run_ssd(target, draft, parse_prompts(args.prompt_ids), cfg)
    return tokens, stats


def main(argv=None) -> int:
    args = parse_args(argv)
    world = args.tp + 1
    try:
        check_backend(args.backend)
        parse_prompts(args.prompt_ids)                       # a bad prompt fails here, before any rank starts
        if "WORLD_SIZE" in os.environ:                        # launched by torchrun
            got = int(os.environ["WORLD_SIZE"])
            if got != world:
                raise DistributedError(f"WORLD_SIZE is {got} but --tp {args.tp} needs {world} processes "
                                       f"({args.tp} target ranks + 1 draft rank)")
            rank = int(os.environ["RANK"])
            init_group(rank, world, args.backend, "env://", args.timeout_s)
            results = {rank: rank_main(rank, world, args)}
        else:
            results = dict(enumerate(run_local(rank_main, world, args, backend=args.backend,
                                               timeout_s=args.timeout_s)))
    except DistributedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for rank, (tokens, stats) in sorted(results.items()):
        role = "draft" if rank == world - 1 else "target"
        for b, seq in enumerate(tokens or []):
            print(f"rank {rank} ({role}) sequence {b} tokens: {seq}")
        print(f"rank {rank} ({role}) rounds={stats.rounds} hits={stats.hits} misses={stats.misses} "
              f"hit_rate={stats.hit_rate:.2f} target_busy_s={stats.target_busy_s:.3f} "
              f"target_wait_s={stats.target_wait_s:.3f} draft_prespec_s={stats.draft_prespec_s:.3f} "
              f"draft_spot_s={stats.draft_spot_s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
