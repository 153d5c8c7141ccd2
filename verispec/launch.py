"""``python -m verispec.distributed``: SSD on T target ranks (the engine, tensor-parallel when T > 1) and one
draft rank (``distributed.draft_rank.DraftServer``), then plain decoding on the same target as the baseline.

One command starts the ranks locally (spawned processes, gloo on CPU or NCCL on GPUs):
    python -m verispec.distributed --target DIR|GGUF|SHAPE --draft DIR|GGUF|SHAPE --tp 1 "a prompt" ...
or one process per rank under torchrun (WORLD_SIZE must be tp + 1):
    torchrun --nproc-per-node 2 -m verispec.distributed --target ... --draft-layers 4 --tp 1 "a prompt"

This module sits above the engine and the distributed wing (docs/architecture.md, the import rule): the target
ranks run ``SpeculativeDecoder`` with an ``SSDDrafter``; ``rank_main`` is a module-level function of an
importable module, so spawned processes can find it (a package's ``__main__`` cannot be re-imported).

Prints: each sequence's text (or token ids), SSD's tokens/s, hit rate and waits, the plain-decoding baseline's
tokens/s, and whether SSD's tokens are identical to plain decoding's (greedy; at temperature > 0 the two are
different draws of one distribution). Every argument is checked before a model loads (exit 2); a run that
fails exits 1.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from .distributed.draft_rank import DraftServer
from .distributed.group import DistributedError, check_backend, init_group, run_local
from .distributed.simulator import FANOUT_POLICIES
from .distributed.ssd import SSDConfig, SSDDrafter
from .distributed.tp import check_divisible, tensor_parallel_model
from .engine.decoder import SpeculativeDecoder


@dataclass(frozen=True)
class LaunchSpec:
    """What every rank runs (picklable: it travels to spawned processes)."""

    target: object                  # HF dir, .gguf, shape name or ModelConfig (random weights); None: embedded
    draft: object | None            # the draft model's source; None: the target's first ``draft_layers`` layers
    draft_layers: int | None
    tp: int                         # target ranks
    backend: str                    # "gloo" (CPU) or "nccl" (GPUs)
    prompts: tuple                  # texts or token-id lists
    ssd: SSDConfig
    chat: bool = False
    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float | None = None
    seed: int = 0
    stop: tuple[str, ...] = ()
    baseline: bool = True           # also run plain decoding (the speed floor and the identity check)
    dtype: str | None = None        # None: float32 on CPU, the model's default on GPUs


def _device(spec: LaunchSpec, rank: int) -> torch.device:
    if spec.backend == "nccl":
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def _load(source, spec: LaunchSpec, rank: int):
    from .device import parse_dtype
    from .runtime import load_model

    device = _device(spec, rank)
    dtype = parse_dtype(spec.dtype) if spec.dtype else (torch.float32 if device.type == "cpu" else None)
    return load_model(source, device=device, dtype=dtype)


def rank_main(rank: int, world_size: int, spec: LaunchSpec) -> dict:
    """Run this rank's part: the engine on a target rank, ``DraftServer.serve`` on the draft rank (the last)."""
    draft_rank, targets = world_size - 1, list(range(world_size - 1))
    group = dist.new_group(targets) if len(targets) > 1 else None      # every rank joins the call
    if rank == draft_rank:
        if spec.draft is None:
            model = _load(spec.target, spec, rank).truncated(spec.draft_layers)
        else:
            model = _load(spec.draft, spec, rank)
        stats = DraftServer(model, targets, spec.ssd).serve()
        return {"role": "draft", "stats": asdict(stats)}
    target = _load(spec.target, spec, rank)
    if group is not None:
        target = tensor_parallel_model(target, group)
    drafter = SSDDrafter(draft_rank, spec.ssd, leader=rank == 0)
    try:
        out = _timed(SpeculativeDecoder(target, drafter, k=spec.ssd.k, isolate_drafter=True), spec)
    finally:
        drafter.close()
    out.update(role="target", stats=asdict(drafter.stats), draft_error=drafter.error)
    if spec.baseline:
        plain = _timed(SpeculativeDecoder(target, None), spec)
        out["plain"] = plain
    return out


def _timed(decoder: SpeculativeDecoder, spec: LaunchSpec) -> dict:
    gens = decoder.generate(list(spec.prompts), max_new_tokens=spec.max_new_tokens, temperature=spec.temperature,
                            top_p=spec.top_p, seed=spec.seed, stop=list(spec.stop) or None, chat=spec.chat)
    stats = decoder.last_stats
    return {"tokens": [g.tokens for g in gens], "texts": [g.text for g in gens],
            "finish": [g.finish_reason for g in gens], "new_tokens": stats.new_tokens, "decode_s": stats.decode_s,
            "total_s": stats.total_s}


def report(result: dict, spec: LaunchSpec) -> list[str]:
    """The lines the launch prints, from target rank 0's result (its stats carry the draft rank's counts)."""
    lines = []
    for b, (text, tokens) in enumerate(zip(result["texts"], result["tokens"])):
        shown = text if text else f"token ids {tokens}"
        lines.append(f"[{b}] {shown}")
    s = result["stats"]

    def speed(r):
        return r["new_tokens"] / max(r["total_s"], 1e-9)

    lines.append(f"SSD: {result['new_tokens']} tokens in {result['total_s']:.2f} s = {speed(result):.1f} tokens/s; "
                 f"hit rate {s['hits'] / max(1, s['hits'] + s['misses']):.2f} ({s['hits']} hits, {s['misses']} "
                 f"misses, {s['rounds']} rounds); target waited for drafts {s['wait_s']:.2f} s")
    budget = (f"budget picked per round (auto): last F = {s['budget']}, changed {s['budget_changes']} times"
              if spec.ssd.budget_mode == "auto" else f"budget F = {spec.ssd.budget}")
    lines.append(f"draft rank: pre-speculating {s['prespec_s']:.2f} s (beside the target's passes), drafting on the "
                 f"spot {s['spot_s']:.2f} s; {budget}")
    if result.get("draft_error"):
        lines.append(f"the draft rank failed ({result['draft_error'].splitlines()[0]}); the rest ran as plain decoding")
    plain = result.get("plain")
    if plain is not None:
        lines.append(f"plain decoding: {plain['new_tokens']} tokens in {plain['total_s']:.2f} s = "
                     f"{speed(plain):.1f} tokens/s (SSD: {speed(result) / max(speed(plain), 1e-9):.2f}x)")
        if spec.temperature == 0:
            lines.append(f"identical to plain decoding: {'yes' if plain['tokens'] == result['tokens'] else 'no'}")
        else:
            lines.append("identical to plain decoding: n/a at temperature > 0 (both sample the target's distribution "
                         "with other draws)")
    return lines


# ------------------------------------------------------------------------------------------------ command
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m verispec.distributed", description=__doc__.split("\n")[0])
    p.add_argument("prompts", nargs="*", help="text prompts (the target needs a tokenizer); a batch if several")
    p.add_argument("--target", default=None, help="HF dir, .gguf, or a shape name (random weights); None = the "
                   "embedded SmolLM2-135M-Instruct")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--draft", help="the draft model: HF dir, .gguf, or a shape name (random weights)")
    source.add_argument("--draft-layers", type=int, help="draft with the target's first N layers (self-speculation)")
    p.add_argument("--prompt-ids", help="prompts as token ids: comma-separated, prompts separated by ';' (1,2;3,4,5)")
    p.add_argument("--chat", action="store_true", help="wrap text prompts in the model's chat template")
    p.add_argument("--tp", type=int, default=1, help="target ranks (tensor-parallel degree); world size = tp + 1")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("-k", "--k", type=int, default=4, help="drafts per round")
    p.add_argument("--budget", default="4", help="pre-speculated branches per sequence (0 = plain SD), or auto: the "
                   "draft rank picks 0..--max-budget each round from --costs and the acceptance it measures")
    p.add_argument("--max-budget", type=int, default=8, help="--budget auto: the most branches per sequence")
    p.add_argument("--costs", default=None, help="--budget auto: benchmarks/ssd_calibrate.py's JSON (pass times of "
                   "this target and draft on this machine)")
    p.add_argument("--costs-host", default=None, help="--budget auto: benchmarks/ssd_gpu_check.py's JSON, for the "
                   "draft rank's host work per pre-speculation (without it: 0, optimistic)")
    p.add_argument("--fanout-policy", default="profile", choices=FANOUT_POLICIES)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: float32 on CPU)")
    p.add_argument("--no-baseline", action="store_true", help="skip the plain-decoding run")
    p.add_argument("--recv-timeout-s", type=float, default=120.0, help="the longest wait for the other side")
    p.add_argument("--timeout-s", type=float, default=900.0, help="wall-clock limit of a spawned run")
    return p.parse_args(argv)


def budget_settings(args: argparse.Namespace) -> dict:
    """SSDConfig's budget fields from --budget N|auto, --max-budget, --costs, --costs-host (ValueError naming the
    problem)."""
    import json

    from .distributed.simulator import SSDCosts

    if args.budget != "auto":
        try:
            budget = int(args.budget)
        except ValueError:
            raise ValueError(f"--budget must be an integer >= 0 or auto, got {args.budget!r}") from None
        if budget < 0:
            raise ValueError(f"--budget must be an integer >= 0 or auto, got {budget}")
        if args.costs or args.costs_host:
            raise ValueError("--costs and --costs-host are read only with --budget auto")
        return dict(budget=budget)
    if args.max_budget < 1:
        raise ValueError(f"--max-budget must be >= 1 with --budget auto, got {args.max_budget}")
    if not args.costs:
        raise ValueError("--budget auto needs --costs (benchmarks/ssd_calibrate.py's JSON: the pass times it picks "
                         "the budget from)")

    def read(path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read {path}: {e}") from None

    costs = SSDCosts.from_results(read(args.costs), read(args.costs_host) if args.costs_host else None)
    return dict(budget=args.max_budget, budget_mode="auto", costs=costs)


def parse_prompt_ids(text: str) -> list[list[int]]:
    try:
        prompts = [[int(t) for t in prompt.split(",")] for prompt in text.split(";")]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated integers, prompts separated by ';': got {text!r}") \
            from None
    return prompts


def check_spec(args: argparse.Namespace) -> LaunchSpec:
    """Every argument checked against the models' configurations before anything loads; ValueError naming the
    problem otherwise."""
    from .runtime.loading import load_tokenizer, peek_config

    if args.tp < 1:
        raise ValueError(f"--tp must be >= 1, got {args.tp}")
    check_backend(args.backend)
    if args.backend == "nccl" and torch.cuda.device_count() < args.tp + 1 and "WORLD_SIZE" not in os.environ:
        print(f"note: {args.tp + 1} ranks share {torch.cuda.device_count()} GPU(s): no speed claim from this run",
              file=sys.stderr)
    if bool(args.prompts) == bool(args.prompt_ids):
        raise ValueError("give text prompts or --prompt-ids (one of the two)")
    target_cfg = peek_config(args.target)
    try:
        check_divisible(target_cfg, args.tp)
    except ValueError as e:
        raise ValueError(f"--tp {args.tp}: {e}") from None
    if args.draft is not None:
        draft_cfg = peek_config(args.draft)
        if draft_cfg.vocab_size != target_cfg.vocab_size:
            raise ValueError(f"draft vocab {draft_cfg.vocab_size} != target vocab {target_cfg.vocab_size}: the draft "
                             f"model must share the target's tokenizer")
    elif not 1 <= args.draft_layers < target_cfg.num_layers:
        raise ValueError(f"--draft-layers {args.draft_layers}: need 1 <= N < the target's {target_cfg.num_layers} "
                         f"layers")
    if args.prompts and load_tokenizer(args.target) is None:
        raise ValueError(f"{args.target} has no tokenizer: give the prompts as --prompt-ids")  # (a loader may say so)
    prompts = tuple(args.prompts) if args.prompts else tuple(parse_prompt_ids(args.prompt_ids))
    ssd = SSDConfig(k=args.k, fanout_policy=args.fanout_policy, recv_timeout_s=args.recv_timeout_s,
                    **budget_settings(args))
    return LaunchSpec(args.target, args.draft, args.draft_layers, args.tp, args.backend, prompts, ssd,
                      chat=args.chat, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                      top_p=args.top_p, seed=args.seed, stop=tuple(args.stop), baseline=not args.no_baseline,
                      dtype=args.dtype)


def main(argv=None) -> int:
    args = parse_args(argv)
    world = args.tp + 1
    try:
        spec = check_spec(args)
        if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) != world:
            raise ValueError(f"WORLD_SIZE is {os.environ['WORLD_SIZE']} but --tp {args.tp} needs {world} processes "
                             f"({args.tp} target ranks + 1 draft rank)")
    except (ValueError, FileNotFoundError, DistributedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if "WORLD_SIZE" in os.environ:                                   # torchrun: this process is one rank
            rank = int(os.environ["RANK"])
            init_group(rank, world, args.backend, "env://", args.recv_timeout_s)
            try:
                results = {rank: rank_main(rank, world, spec)}
            finally:
                dist.destroy_process_group()
        else:
            results = dict(enumerate(run_local(rank_main, world, spec, backend=args.backend,
                                               timeout_s=args.timeout_s,
                                               collective_timeout_s=args.recv_timeout_s)))
    except DistributedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if 0 in results:
        for line in report(results[0], spec):
            print(line)
    return 0


# ------------------------------------------------------------------------------------ verispec serve --ssd
@dataclass(frozen=True)
class DraftRankSpec:
    """What the draft rank of ``verispec serve --ssd`` loads and serves (picklable)."""

    source: object                  # the draft model's source, or the target's when ``layers`` is set
    layers: int | None              # draft with the first ``layers`` layers of ``source``
    device: str
    dtype: str | None
    ssd: SSDConfig


IDLE_FOREVER_S = 10 ** 7            # a server's draft rank waits for the next request however long it takes


def serve_draft_rank(init_method: str, spec: DraftRankSpec) -> None:
    """The draft rank process of ``verispec serve --ssd`` (rank 1 of 2): serves until the server closes or dies."""
    from .device import parse_dtype
    from .runtime import load_model

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    init_group(1, 2, "gloo", init_method, spec.ssd.recv_timeout_s)
    dtype = parse_dtype(spec.dtype) if spec.dtype else None
    model = load_model(spec.source, device=spec.device, dtype=dtype)
    if spec.layers is not None:
        model = model.truncated(spec.layers)
    try:
        DraftServer(model, [0], spec.ssd).serve(idle_timeout_s=IDLE_FOREVER_S)
    except DistributedError as e:
        print(f"[verispec serve --ssd] draft rank: {e}", file=sys.stderr, flush=True)


def ssd_drafter(args, target) -> SSDDrafter:
    """``verispec serve --ssd``: spawn the draft rank (its own process; the next GPU when there is one, else the
    target's device), join it as rank 0 and return the target's drafter. The process exits with the server."""
    import torch.multiprocessing as mp

    from .distributed.group import free_port

    device = target.device
    if device.type == "cuda" and torch.cuda.device_count() > 1:
        device = torch.device("cuda", (device.index or 0) + 1 if (device.index or 0) + 1 < torch.cuda.device_count()
                              else 0)
    budget = argparse.Namespace(budget=str(args.ssd_budget), max_budget=getattr(args, "ssd_max_budget", 8),
                                costs=getattr(args, "ssd_costs", None), costs_host=getattr(args, "ssd_costs_host", None))
    config = SSDConfig(k=args.k, recv_timeout_s=120.0, **budget_settings(budget))
    source = args.draft if args.draft_self is None else args.model
    spec = DraftRankSpec(source, args.draft_self, str(device), args.dtype, config)
    init_method = f"tcp://127.0.0.1:{free_port()}"
    process = mp.get_context("spawn").Process(target=serve_draft_rank, args=(init_method, spec), daemon=True)
    process.start()
    init_group(0, 2, "gloo", init_method, config.recv_timeout_s)
    return SSDDrafter(1, config, leader=True)


def run_spec(spec: LaunchSpec, *, timeout_s: float = 120.0) -> list[dict]:
    """Every rank's result of ``spec`` run in spawned local processes (tests, scripts)."""
    return run_local(rank_main, spec.tp + 1, spec, backend=spec.backend, timeout_s=timeout_s,
                     collective_timeout_s=spec.ssd.recv_timeout_s)

