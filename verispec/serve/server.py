"""Assembling the server: the model, the drafter, the k policy, the engine thread, uvicorn, signals."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time

from fastapi import FastAPI

from ..engine import Scheduler, SchedulerConfig
from ..drafters.dynamic_tree import DynamicTree
from ..engine.guards import check_tree
from ..engine.scheduler import tree_nodes
from ..engine import auto_k
from ..engine.auto_k import AutoK, CostTable, default_batch_sizes, measure_costs
from .app import ServedModel, build_app
from .cli import served_name
from .engine import EngineLoop
from .metrics import Metrics


DRAIN_S = 1.0        # seconds the port stays open after a stop signal (or the engine's death), answering 503
# The engine thread and the event loop share the GIL. When the engine thread returns from a GPU wait it queues for
# the GIL behind the event loop's Python, for up to the interpreter's switch interval (5 ms by default: a third of
# an 8B round at 32 rows). A shorter interval hands the GIL back to the engine sooner.
GIL_SWITCH_S = 0.0005
# a path: the engine writes one JSON line per step there when the server stops (EngineLoop.trace; diagnosis only)
STEP_TRACE_ENV = "VERISPEC_STEP_TRACE"


def _log(message: str) -> None:
    print(f"[verispec serve] {message}", file=sys.stderr, flush=True)


def load_target_and_drafter(args, ssd_drafter=None):
    from ..drafters import DraftModel, FeatureHead, PromptLookup, SelfSpeculative, SuccessorOracle, make_peaked
    from ..runtime import load_model
    from ..runtime.loading import load_tokenizer
    from .cli import parse_oracle

    target = load_model(args.model, device=args.device, dtype=args.dtype)
    if args.tokenizer is not None:
        tok = load_tokenizer(args.tokenizer)
        if tok.vocab_size > target.config.vocab_size:
            raise ValueError(f"--tokenizer {args.tokenizer} has {tok.vocab_size} tokens, more than the model's "
                             f"vocabulary of {target.config.vocab_size}: its ids would index past the embedding")
        target.tokenizer = tok
    if target.tokenizer is None:
        raise ValueError(f"{args.model} has no tokenizer (random weights?): pass --tokenizer")
    alpha = parse_oracle(args.draft)
    if getattr(args, "ssd", False):
        drafter = ssd_drafter(args, target)
        _log(f"--ssd: the draft rank drafts with {args.draft or f'the first {args.draft_self} layers'}, "
             + (f"branches per request picked each round (auto, at most {args.ssd_max_budget})"
                if args.ssd_budget == "auto" else f"{args.ssd_budget} branches per request and round"))
    elif getattr(args, "draft_head", None) is not None:
        drafter = FeatureHead.from_pretrained(args.draft_head, target) if args.draft_head else FeatureHead()
    elif args.draft_lookup:
        drafter = PromptLookup()
    elif args.draft_self is not None:
        drafter = SelfSpeculative(layers=args.draft_self)
    elif alpha is not None:
        successor = make_peaked(target)
        cost = None
        if args.oracle_draft_cost is not None:
            cost = load_model(args.oracle_draft_cost, device=str(target.device), dtype=args.dtype, seed=1)
        drafter = SuccessorOracle(successor, alpha, cost_model=cost)
        _log(f"BENCHMARK ONLY: --draft {args.draft} overwrote the model's weights with a peaked function of the "
             f"last token (its text is meaningless); drafts are accepted with probability {alpha} each, paying "
             f"{args.oracle_draft_cost or 'no'} draft passes")
    elif args.draft is not None:
        drafter = DraftModel(load_model(args.draft, device=str(target.device), dtype=args.dtype))
    else:
        drafter = None
    if drafter is not None:
        drafter.attach(target)
    return target, drafter


def cost_table(args, target, drafter, k_max: int, trees: tuple = ()) -> CostTable:
    """Load ``--cost-table`` if it exists; else measure here (and save it when a path was given). ``trees``
    (``--tree auto``): their passes and a whole round of each are measured too (a table saved without them extends
    the chains' slope and prices a tree from its parts)."""
    if args.cost_table and os.path.exists(args.cost_table):
        with open(args.cost_table, encoding="utf-8") as f:
            table = CostTable.from_json(f.read())
        _log(f"k=auto: cost table from {args.cost_table}")
        return table
    _log("k=auto: measuring target passes, draft steps and whole rounds on this machine ...")
    t0 = time.perf_counter()
    table = measure_costs(target, drafter, k_max, default_batch_sizes(args.max_batch_size), trees=trees)
    _log(f"k=auto: cost table measured in {time.perf_counter() - t0:.1f} s")
    if args.cost_table:
        with open(args.cost_table, "w", encoding="utf-8") as f:
            f.write(table.to_json())
    return table


def _tree_name(tree) -> str:
    """A tree as the log names it: its widths as a list, a dynamic tree as its spelling (dyn:D,K,N)."""
    return str(tree) if isinstance(tree, DynamicTree) else str(list(tree))


def assemble(target, drafter, args) -> tuple[EngineLoop, FastAPI]:
    """The engine thread (not started) and the app over a loaded target and drafter; ``args``: verispec serve's
    settings (``cli.add_arguments``)."""
    metrics = Metrics(served_name(args))
    engine, served, after_warm_up = build_engine(target, drafter, args, metrics)
    app = build_app(engine, served, metrics, args.stream_interval / 1e3)
    app.state.after_warm_up = after_warm_up
    return engine, app


def build_engine(target, drafter, args, metrics, loop_class: type[EngineLoop] = EngineLoop):
    """The engine loop (a ``loop_class``, not started; its first scheduler built and warmed up) over a loaded target
    and drafter -> (engine, the ``ServedModel`` its handlers need, ``after_warm_up() -> (graphs, [kernel names])``:
    what was captured or compiled since the warm-up, for the stop log)."""
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and args.max_seq_len > limit:
        raise ValueError(f"--max-seq-len {args.max_seq_len} exceeds the model's max_position_embeddings {limit}")
    tree = getattr(args, "tree", None) if drafter is not None else None
    tree_auto = tree == "auto"
    auto = args.k == "auto" and (tree is None or tree_auto)
    k = 0 if drafter is None else (args.k_max if auto else args.k)
    trees = auto_k.AUTO_TREES if tree_auto else ()
    if tree is not None:
        check_tree(tree, drafter)
    # sampled requests are given the k that pays at --max-batch-size, whatever the load: their tokens depend on k
    policy = (AutoK(cost_table(args, target, drafter, k, trees), reference_batch=args.max_batch_size, trees=trees)
              if auto and drafter is not None else None)
    if tree_auto:
        chain_k, k = k, max([k] + [tree_nodes(t) for t in trees])     # the chains' K; the largest shape's lookahead
    elif tree is not None:
        chain_k = k = tree_nodes(tree)      # a tree round's lookahead: the certain token and every node
    else:
        chain_k = k
    config = SchedulerConfig(args.max_batch_size, args.max_seq_len, chain_k, args.max_waiting, tree=tree)
    name = served_name(args)

    def make_scheduler() -> Scheduler:
        # isolate_drafter: a drafter exception that names no request sets the drafter aside instead of failing
        # requests. warm_up: every graph of every batch bucket and k captured before the first request (a recovery's
        # new scheduler reuses them: the model keeps its graphs while its cache fits).
        scheduler = Scheduler(target, drafter, config, k_policy=policy, isolate_drafter=True)
        n = scheduler.warm_up()
        if n:
            _log(f"warm-up: {n} CUDA graphs captured in {scheduler.totals.warmup_s:.1f} s")
        warmed.update(graphs=_graph_captures(target, drafter), kernels=_triton_kernels())
        return scheduler

    warmed: dict[str, int] = {}       # what warm-up left captured / compiled: the stop log reports what came after
    engine = loop_class(make_scheduler, metrics)
    served = ServedModel(name, target.tokenizer, target.config.vocab_size, args.max_seq_len, k + 1)
    shape = 'tree=auto' if tree_auto else f'tree={_tree_name(tree)}' if tree else 'k=' + ('auto' if policy else str(k))
    _log(f"{name}: drafter {type(drafter).__name__ if drafter else 'none'}, {shape}, "
         f"max batch {args.max_batch_size}, max_seq_len {args.max_seq_len}")
    if os.environ.get(STEP_TRACE_ENV):
        engine.trace = []

    def after_warm_up() -> tuple[int, list[str]]:
        return (_graph_captures(target, drafter) - warmed["graphs"],
                _kernel_names(_triton_kernels() - warmed["kernels"]))

    return engine, served, after_warm_up


def run_server(args, ssd_drafter=None) -> int:
    """Serve ``args`` as ``check_args`` left them (``args.engine_process`` resolved to a bool there)."""
    if args.engine_process:
        from .engine_process import assemble_process

        engine, app = assemble_process(load_target_and_drafter, args)
        return serve(engine, app, args)
    target, drafter = load_target_and_drafter(args, ssd_drafter)
    engine, app = assemble(target, drafter, args)
    return serve(engine, app, args)


def serve(engine: EngineLoop, app: FastAPI, args) -> int:
    """Run uvicorn until SIGINT / SIGTERM (exit 0) or the engine's death (exit 1). Either way the port stays open
    ``DRAIN_S`` more seconds, answering 503 (a client sees the documented refusal, not "connection refused",
    and a load balancer has time to notice); a second signal skips the wait."""
    import uvicorn

    sys.setswitchinterval(GIL_SWITCH_S)

    class Server(uvicorn.Server):
        draining = False

        def handle_exit(self, sig, frame):
            # stop taking requests and cancel those in flight, so that open streams end and uvicorn's
            # graceful shutdown has nothing to wait for
            engine.stop()
            if self.draining:
                super().handle_exit(sig, frame)
            else:
                self.drain(lambda: super(Server, self).handle_exit(sig, frame))

        def drain(self, then) -> None:
            self.draining = True
            timer = threading.Timer(DRAIN_S, then)
            timer.daemon = True
            timer.start()

        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn's own version re-raises the signal after shutting down, which would kill the process
            # before the engine thread is joined; here the process exits through run_server's return
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    server = Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                   timeout_graceful_shutdown=10))

    def on_fatal(reason: str) -> None:
        _log(f"the engine died: {reason}; exiting after {DRAIN_S} s")
        server.drain(lambda: setattr(server, "should_exit", True))

    engine.on_fatal = on_fatal
    engine.start()
    where = "its own process" if not isinstance(engine, EngineLoop) else "a thread of this process"
    _log(f"serving on http://{args.host}:{args.port} (the engine in {where}: --engine-process)")
    try:
        server.run()
    finally:
        engine.stop()
        engine.join()
    if isinstance(engine, EngineLoop):     # an engine process reports these itself (engine_process.py)
        report_stop(engine, getattr(app.state, "after_warm_up", None))
    if engine.fatal is not None:
        _log(f"stopped: the engine died ({engine.fatal})")
        return 1
    _log("stopped")
    return 0


def report_stop(engine: EngineLoop, after_warm_up) -> None:
    """The stop log of a stopped engine loop: k=auto's measured rounds, the step trace, what was captured or compiled
    after the warm-up (``after_warm_up``: ``build_engine``'s, or None)."""
    _log_k_auto(engine.scheduler.k_policy)
    _write_trace(engine)
    if after_warm_up is not None:
        graphs, kernels = after_warm_up()
        _log(f"after warm-up: {graphs} CUDA graphs captured, {len(kernels)} Triton kernels compiled (each one inside "
             f"a request){': ' + ', '.join(kernels) if kernels else ''}")


def _write_trace(engine: EngineLoop) -> None:
    """The engine's step trace as JSON lines to $VERISPEC_STEP_TRACE (a diagnosis aid: which steps were slow, at which
    load and k)."""
    path = os.environ.get(STEP_TRACE_ENV)
    if not path or engine.trace is None:
        return
    keys = ("start_s", "seconds", "rows_before", "waiting_before", "rows_after", "k")
    try:
        with open(path, "w") as f:
            for record in engine.trace:
                f.write(json.dumps(dict(zip(keys, record))) + "\n")
    except OSError as e:
        _log(f"{STEP_TRACE_ENV}: could not write the step trace to {path}: {e.strerror or e}")
        return
    _log(f"step trace ({len(engine.trace)} steps) written to {path}")


def _graph_captures(target, drafter) -> int:
    """CUDA graphs captured so far by the target and the drafter."""
    return getattr(target, "graph_captures", 0) + (drafter.graph_captures if drafter is not None else 0)


def _triton_kernels() -> set[str]:
    """Entries of Triton's on-disk kernel cache: one more for each kernel compiled on this machine (a kernel another
    process compiled before is loaded from there, not counted)."""
    root = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    try:
        return set(os.listdir(root))
    except OSError:
        return set()


def _kernel_names(entries: set[str]) -> list[str]:
    """The kernel each Triton cache entry holds (its files are named after it), for the stop log."""
    root = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    names = set()
    for entry in entries:
        try:
            files = os.listdir(os.path.join(root, entry))
        except OSError:
            continue
        names.update(f.split(".")[0] for f in files if not f.startswith("__grp__") and f.endswith(".json"))
    return sorted(names)


def _log_k_auto(policy) -> None:
    """k=auto's measured round costs against its table, per batch bucket and k (what priced the greedy rows'
    choices: docs/serving.md), on stop."""
    if not isinstance(policy, AutoK) or not policy.measured_s:
        return
    costs = policy.costs
    # keys: (bucket, k) of a chain round, (bucket, widths) of a tree round (--tree auto)
    items = sorted(policy.measured_s.items(), key=lambda item: (item[0][0], isinstance(item[0][1], tuple), item[0][1]))
    cells = [f"B<={costs.batch_sizes[b]} {f'tree={list(k)}' if isinstance(k, tuple) else f'k={k}'}: {1e3 * s:.2f} ms "
             f"(table {1e3 * policy.table_round(costs.batch_sizes[b], k):.2f})" for (b, k), s in items]
    _log("k=auto rounds measured vs table: " + "; ".join(cells))
    _log(f"k=auto greedy probes: {policy.probes} drafted, {policy.probes_declined} holds renewed (not worth a probe); "
         f"draft debt measured / predicted {policy.debt_scale:.2f}")
