"""``verispec serve``: its arguments and its main. Imports no web framework until the server starts, so that
``verispec --help`` works without the ``serve`` extra."""
from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys

LOOPBACK_NAMES = {"localhost"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF checkpoint dir or .gguf file (default: the embedded "
                   "SmolLM2-135M-Instruct)")
    p.add_argument("--served-model-name", default=None, help="the model name clients send (default: from --model)")
    d = p.add_mutually_exclusive_group()
    d.add_argument("--draft", metavar="MODEL", help="draft model (same tokenizer as --model)")
    d.add_argument("--draft-lookup", action="store_true", help="prompt-lookup drafting (no draft model)")
    d.add_argument("--draft-self", metavar="L", type=int, help="self-speculation with the first L layers")
    p.add_argument("-k", default="auto", help="drafts per round: an integer >= 1, or auto (default): each round, "
                   "each request's k in [0, --k-max] with the most expected tokens/s for its own acceptance")
    p.add_argument("--k-max", type=int, default=8, help="the largest k that k=auto considers (default 8)")
    p.add_argument("--cost-table", default=None, help="k=auto: JSON cost table to load, or to write after "
                   "measuring at startup when the file does not exist")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--allow-remote", action="store_true", help="allow a --host that is not a loopback address")
    p.add_argument("--max-batch-size", type=int, default=8, help="requests decoded at once (cache rows)")
    p.add_argument("--max-seq-len", type=int, default=2048, help="prompt + generated tokens per request")
    p.add_argument("--max-waiting", type=int, default=64, help="queued requests beyond which new ones get 429")
    p.add_argument("--device", default=None, help="cpu | cuda[:i] (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (default warning)")


def _die(message: str) -> None:
    print(f"verispec serve: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback
                       for info in socket.getaddrinfo(host, None))
        except OSError:
            return False


def check_args(args) -> None:
    """Refuse bad settings before loading anything."""
    if not is_loopback(args.host) and not args.allow_remote:
        _die(f"--host {args.host} is not a loopback address: the server has no authentication; pass "
             f"--allow-remote to listen there anyway")
    if args.k != "auto":
        try:
            args.k = int(args.k)
        except ValueError:
            _die(f"-k must be an integer >= 1 or 'auto', got {args.k!r}")
        if args.k < 1:
            _die(f"-k must be an integer >= 1 or 'auto', got {args.k}")
    if args.k_max < 1:
        _die(f"--k-max must be >= 1, got {args.k_max}")
    for name in ("max_batch_size", "max_seq_len", "max_waiting", "port"):
        if getattr(args, name) < (0 if name == "max_waiting" else 1):
            _die(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.threads is not None and args.threads < 1:
        _die(f"--threads must be >= 1, got {args.threads}")


def main(args) -> int:
    check_args(args)
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        _die(f"{e.name} is not installed: pip install 'verispec[serve]'")
    from .server import run_server

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    try:
        return run_server(args)
    except (ValueError, FileNotFoundError) as e:
        _die(str(e))
    return 0


def served_name(args) -> str:
    if args.served_model_name:
        return args.served_model_name
    if args.model is None:
        return "SmolLM2-135M-Instruct"
    return os.path.basename(os.path.normpath(args.model))
