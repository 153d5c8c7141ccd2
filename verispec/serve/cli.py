"""``verispec serve``: its arguments and its main. Imports no web framework until the server starts, so that
``verispec --help`` works without the ``serve`` extra."""
from __future__ import annotations

import argparse
import ipaddress
import math
import os
import socket
import sys

LOOPBACK_NAMES = {"localhost"}
MAX_SEQ_LEN = 2048         # the cache's slots per row unless --max-seq-len says otherwise


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF checkpoint dir, .gguf file, or a shape name with RANDOM weights "
                   "(e.g. llama-3.1-8b, for benchmarks: needs --tokenizer); None = the embedded "
                   "SmolLM2-135M-Instruct")
    p.add_argument("--tokenizer", default=None, help="load the tokenizer from here (HF dir with tokenizer.json or a "
                   ".gguf file) instead of from --model; None = --model's own")
    p.add_argument("--served-model-name", default=None, help="the model name clients send; None = from --model")
    d = p.add_mutually_exclusive_group()
    d.add_argument("--draft", metavar="MODEL", default=None, help="draft model (same tokenizer as --model), or "
                   "oracle:ALPHA (BENCHMARKS ONLY: see --oracle-draft-cost)")
    d.add_argument("--draft-lookup", action="store_true", help="prompt-lookup drafting (no draft model)")
    d.add_argument("--draft-self", metavar="L", type=int, default=None,
                   help="self-speculation with the first L layers")
    d.add_argument("--draft-head", metavar="DIR", nargs="?", const="", default=None,
                   help="a feature head over the model's hidden states (`verispec train-head`, or a published "
                        "EAGLE-3 head); without DIR the head shipped for the embedded SmolLM2")
    p.add_argument("--oracle-draft-cost", metavar="MODEL", default=None,
                   help="--draft oracle:ALPHA: the drafts pay the passes of this model (e.g. llama-3.2-1b); "
                        "None = free drafts")
    p.add_argument("--ssd", action="store_true", help="asynchronous speculation: the --draft / --draft-self model "
                   "drafts in a second process (the draft rank), pre-speculating each round's likely outcomes while "
                   "the target verifies; needs -k N (docs/distributed.md)")
    p.add_argument("--ssd-budget", default="4", help="--ssd: pre-speculated branches per request and round, or auto: "
                   "the draft rank picks 0..--ssd-max-budget each round from --ssd-costs and the acceptance it sees")
    p.add_argument("--ssd-max-budget", type=int, default=8, help="--ssd-budget auto: the most branches per request")
    p.add_argument("--ssd-costs", default=None, metavar="FILE", help="--ssd-budget auto: benchmarks/ssd_calibrate.py's "
                   "JSON (this target's and draft's pass times on this machine)")
    p.add_argument("--ssd-costs-host", default=None, metavar="FILE", help="--ssd-budget auto: benchmarks/"
                   "ssd_gpu_check.py's JSON (the draft rank's host work per pre-speculation; without it: 0)")
    p.add_argument("-k", default="auto", help="drafts per round: an integer >= 1, or auto: each round, each "
                   "request's k in [0, --k-max] with the most expected tokens/s for its own acceptance")
    p.add_argument("--k-max", type=int, default=8, help="the largest k that -k auto considers")
    p.add_argument("--tree", default=None, metavar="W1,W2,...|dyn:D,K,N|auto", help="draft trees instead of chains: "
                   "children per node at each depth, e.g. 4,2,2,1 (at most 63 nodes), replacing -k; or dyn:D,K,N "
                   "(--draft / --draft-self): a dynamic tree D deep, each node's top K children, the N of highest "
                   "cumulative draft probability kept per depth; or auto (with -k auto): "
                   "each round plain decoding, a chain of up to --k-max drafts or one of a few trees, whichever the "
                   "cost table predicts the most tokens/s for (trees for all-greedy batches only)")
    p.add_argument("--cost-table", default=None, help="-k auto: JSON cost table to load, or to write after "
                   "measuring at startup when the file does not exist; None = measure, keep in memory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback unless --allow-remote)")
    p.add_argument("--port", type=int, default=8000, help="TCP port, 1-65535")
    p.add_argument("--allow-remote", action="store_true", help="allow a --host that is not a loopback address "
                   "(the server has no authentication)")
    p.add_argument("--max-batch-size", type=int, default=8, help="requests decoded at once (cache rows)")
    p.add_argument("--stream-interval", type=float, default=0.0, metavar="MS", help="a stream's token chunks go at "
                   "most every MS milliseconds, each with the tokens of the rounds since the last (the first at "
                   "once; the text is the same); 0 = one chunk per round. Fewer chunks: less event-loop work "
                   "beside the engine, and fewer for the client to parse")
    p.add_argument("--max-seq-len", type=int, default=MAX_SEQ_LEN, help="prompt + generated tokens per request")
    p.add_argument("--max-waiting", type=int, default=64, help="queued requests beyond which new ones get 429")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:i; None = cuda if available, else cpu")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16; None = bf16 on cuda, fp32 on cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads; None = the physical cores that "
                   "other processes leave free")
    p.add_argument("--engine-process", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),
                   help="run the engine (model, scheduler) in a child process, the HTTP server in this one: the event "
                   "loop's Python no longer shares a GIL with the engine's launches (docs/serving.md, \"The server's "
                   "own cost\"). auto (default): on when the engine runs on a GPU, off on a CPU (where the two "
                   "processes would share the same few cores) and with --ssd; a bare --engine-process = on")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")


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


def parse_oracle(draft: str | None) -> float | None:
    """--draft oracle:ALPHA -> ALPHA (None for any other --draft); _die for a bad ALPHA."""
    if draft is None or not draft.startswith("oracle"):
        return None
    _, _, alpha = draft.partition(":")
    try:
        value = float(alpha)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        _die(f"--draft {draft}: oracle:ALPHA needs an acceptance rate ALPHA in [0, 1], e.g. oracle:0.8")
    return value


def _check_port(host: str, port: int) -> None:
    """The port is in range and free here: refused now, not after the model has loaded."""
    if not 1 <= port <= 65535:
        _die(f"--port must be in 1..65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn binds it
        try:
            s.bind((host, port))
        except OSError as e:
            _die(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})")


def _check_sources(args) -> None:
    """Model, draft and tokenizer sources, from their configs only (no weights): a shape name without
    --tokenizer, a missing path, --draft-self beyond the model's layers are refused before loading."""
    from ..runtime.config import NAMED_SHAPES
    from ..runtime.loading import peek_config

    def peek(flag, source):
        try:
            return peek_config(source)
        except (ValueError, FileNotFoundError) as e:
            _die(f"{flag} {source or '(embedded SmolLM2-135M-Instruct)'}: {e}")

    cfg = peek("--model", args.model) if args.model is not None or args.draft_self is not None else None
    if args.model in NAMED_SHAPES and args.tokenizer is None:
        _die(f"--model {args.model} is a shape with random weights and no tokenizer: pass --tokenizer (an HF "
             f"directory with tokenizer.json or a .gguf file) to serve it")
    if args.tokenizer is not None:
        path = os.path.expanduser(args.tokenizer)
        if not (os.path.isdir(path) and os.path.exists(os.path.join(path, "tokenizer.json"))) and \
                not (os.path.isfile(path) and path.endswith(".gguf")):
            _die(f"--tokenizer {args.tokenizer}: expected a directory with tokenizer.json or a .gguf file")
    if args.draft_self is not None and not 1 <= args.draft_self < cfg.num_layers:
        _die(f"--draft-self {args.draft_self}: need 1 <= L < the model's {cfg.num_layers} layers")
    if args.draft is not None and parse_oracle(args.draft) is None:
        peek("--draft", args.draft)
    if args.oracle_draft_cost is not None:
        if parse_oracle(args.draft) is None:
            _die("--oracle-draft-cost needs --draft oracle:ALPHA")
        peek("--oracle-draft-cost", args.oracle_draft_cost)


def engine_process_wanted(args) -> bool:
    """``--engine-process`` resolved: True = the engine in a child process. ``auto`` is on where the engine runs on a
    GPU: there every millisecond the engine thread waits for the GIL the device idles (the embedded model on an H200,
    16 streams: 0.61x of the in-process rate in one process, 0.86x with the engine in its own,
    benchmarks/results/serve_http_engine_process.md); on a CPU the two processes share the same cores (no gain
    measured, results/serve_overhead.md). An already resolved value (a bool) is kept."""
    mode = getattr(args, "engine_process", "auto")
    if isinstance(mode, bool):
        return mode
    ssd = getattr(args, "ssd", False)
    if mode == "on":
        if ssd:
            _die("--engine-process does not combine with --ssd (the draft rank is launched from the engine's process)")
        return True
    if mode == "off" or ssd:
        return False
    device = getattr(args, "device", None)
    if device is not None:
        return str(device).startswith("cuda")
    import torch

    return torch.cuda.is_available()


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
    if getattr(args, "tree", None) is not None:
        from ..engine.guards import parse_tree_flag

        oracle = args.draft is not None and args.draft.startswith("oracle:")
        try:
            args.tree = parse_tree_flag(
                args.tree, head=getattr(args, "draft_head", None) is not None,
                has_drafter=bool(args.draft_lookup or args.draft or args.draft_self is not None),
                chain_drafter="the oracle drafter of the server (SuccessorOracle)" if oracle else None,
                lookup=bool(args.draft_lookup))
        except ValueError as e:
            _die(str(e))
        if args.tree == "auto" and args.k != "auto":
            _die(f"--tree auto chooses the chain's k too: leave -k at auto (--k-max bounds the chains), "
                 f"got -k {args.k}")
    for name in ("max_batch_size", "max_seq_len", "max_waiting"):
        if getattr(args, name) < (0 if name == "max_waiting" else 1):
            _die(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not (args.stream_interval >= 0 and math.isfinite(args.stream_interval)):
        _die(f"--stream-interval must be a finite number of milliseconds >= 0, got {args.stream_interval}")
    if args.threads is not None and args.threads < 1:
        _die(f"--threads must be >= 1, got {args.threads}")
    if args.draft_self is not None and args.draft_self < 1:
        _die(f"--draft-self must be >= 1 (layers), got {args.draft_self}")
    parse_oracle(args.draft)
    args.engine_process = engine_process_wanted(args)
    if args.ssd:
        if args.draft_self is None and (args.draft is None or parse_oracle(args.draft) is not None):
            _die("--ssd needs a draft model: --draft MODEL or --draft-self L")
        if args.k == "auto":
            _die("--ssd needs -k N (k=auto measures the draft's costs in this process, not on the draft rank)")
        if args.ssd_budget == "auto":
            if not args.ssd_costs:
                _die("--ssd-budget auto needs --ssd-costs FILE (benchmarks/ssd_calibrate.py's JSON)")
            if args.ssd_max_budget < 1:
                _die(f"--ssd-max-budget must be >= 1, got {args.ssd_max_budget}")
            for path in (args.ssd_costs, args.ssd_costs_host):
                if path and not os.path.isfile(path):
                    _die(f"--ssd-costs / --ssd-costs-host: {path} is not a file")
        elif not args.ssd_budget.isdigit():
            _die(f"--ssd-budget must be an integer >= 0 or auto, got {args.ssd_budget!r}")
    _check_port(args.host, args.port)
    _check_sources(args)


def main(args, ssd_drafter=None) -> int:
    """``ssd_drafter(args, target) -> Drafter``: with --ssd, starts the draft rank and returns the target's drafter
    (``verispec.launch.ssd_drafter``, passed in by verispec/cli.py: serve/ never imports the distributed wing)."""
    check_args(args)
    if args.ssd and ssd_drafter is None:
        _die("--ssd: this entry point has no launch for a draft rank (run `verispec serve --ssd`)")
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        _die(f"{e.name} is not installed: pip install 'verispec[serve]'")
    from .server import run_server

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    try:
        return run_server(args, ssd_drafter)
    except (ValueError, FileNotFoundError) as e:
        _die(str(e))
    return 0


def served_name(args) -> str:
    if args.served_model_name:
        return args.served_model_name
    if args.model is None:
        return "SmolLM2-135M-Instruct"
    return os.path.basename(os.path.normpath(args.model))
