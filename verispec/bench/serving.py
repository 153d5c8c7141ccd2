"""``verispec bench serve --url URL``: a client-side serving benchmark in ``vllm bench serve``'s convention.

It drives any OpenAI-compatible server (``verispec serve``, vLLM, SGLang, llama.cpp) through the official
``openai`` client, streaming, and measures what a user of that server sees:

    arrivals      --num-prompts N requests; gaps drawn from a gamma distribution with shape --burstiness and
                  mean 1 / --request-rate (burstiness 1 = a Poisson process; < 1 burstier; rate inf = all at
                  once), at most --max-concurrency in flight
    lengths       prompt and output lengths uniform in [L (1 - r), L (1 + r)] (--random-input-len,
                  --random-output-len, --random-range-ratio r); prompts are random common English words
                  (about one token each; the exact count is the server's ``usage.prompt_tokens``)
    per request   TTFT (to the first chunk with content), ITL (between content chunks: a speculative server
                  sends several tokens per chunk), TPOT ((E2EL - TTFT) / (output tokens - 1)), E2EL
    per run       request, output and total token throughput; goodput: requests/s meeting every --goodput
                  SLO (e.g. ttft:500 tpot:50 e2el:3000, milliseconds); p50 / p90 / p99 of each latency;
                  speculative acceptance summed from the choices' ``speculative_decoding_stats`` when the
                  server sends them (verispec does)

Writes DIR/<label>.md (tables) and DIR/<label>.json (the summary, the options and every request's numbers)
with --out DIR; the summary is printed either way. Every argument is checked before the first request.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from .options import BenchArgumentError, check_out_dir

USAGE, FAILURE = 2, 1
BARRIER_TIMEOUT_S = 120.0      # client processes wait this long for each other to start (imports, GET /models)
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
# common English words: most are one BPE token with their leading space in every mainstream tokenizer
WORDS = ("the of and to in is was he for it with as his on be at by had are but from or have an they which one "
         "you were all her she there would their we him been has when who will no more if out so said what up "
         "its about than into them can only other time new some could these two may first then do any like my "
         "now over such our man me even most made after also did many before must through back years where "
         "much your way well down should because each just those people how too little state good very make "
         "world still own see men work long get here between both life being under never day same another know "
         "while last might us great old year off come since against go came right used take three").split()


def build_parser(parser_class, formatter_class):
    p = parser_class(prog="verispec bench serve", formatter_class=formatter_class,
                     description="A client-side serving benchmark in `vllm bench serve`'s convention, through the "
                                 "openai client, against any OpenAI-compatible server.\n\n"
                                 + "\n\n".join(__doc__.split("\n\n")[2:4]))
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000 (/v1 is added "
                   "when missing)")
    p.add_argument("--model", default=None, help="model name to send; None = the first of GET /v1/models")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions (prompt) or /v1/chat/completions (one user message)")
    p.add_argument("--num-prompts", type=int, default=100, help="requests to send, >= 1")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="mean arrivals per second, > 0; inf = every request at once")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps, > 0: 1 = "
                   "Poisson, < 1 burstier, > 1 more regular")
    p.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most; None = no limit")
    p.add_argument("--random-input-len", type=int, default=128, help="mean prompt length (words ~ tokens), >= 1")
    p.add_argument("--random-output-len", type=int, default=128, help="mean max_tokens per request, >= 1")
    p.add_argument("--random-range-ratio", type=float, default=0.0, help="lengths uniform in [L(1-r), L(1+r)], "
                   "r in [0, 1)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos=true (vLLM / SGLang: every request "
                   "runs to max_tokens; verispec ignores the field)")
    p.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS",
                   help="SLOs in milliseconds, NAME in ttft, tpot, e2el (e.g. ttft:500 tpot:50); None = no goodput")
    p.add_argument("--percentiles", default="50,90,99", help="latency percentiles to report, comma-separated")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take, > 0")
    p.add_argument("--client-processes", type=int, default=1, help="client processes, >= 1, at most --num-prompts "
                   "and --max-concurrency: the requests (round robin, each at its arrival time) and the concurrency "
                   "are split over them, each its own event loop; one summary over all. More than 1 when one "
                   "process's parsing of every chunk cannot keep up with the server")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts, lengths and arrival gaps")
    p.add_argument("--out", default=None, help="directory for <label>.md and <label>.json; None = print only")
    p.add_argument("--label", default="bench_serve", help="the result files' name")
    return p


# ------------------------------------------------------------------------------------------ checks
def check(args) -> tuple[str, dict[str, float], list[float]]:
    """(the /v1 base URL, the SLOs in seconds, the percentiles); BenchArgumentError naming a bad option."""
    url = urlparse(args.url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise BenchArgumentError(f"--url {args.url!r}: expected http(s)://HOST[:PORT][/v1]")
    base = args.url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    for flag, value, lo in (("--num-prompts", args.num_prompts, 1), ("--random-input-len", args.random_input_len, 1),
                            ("--random-output-len", args.random_output_len, 1)):
        if value < lo:
            raise BenchArgumentError(f"{flag} must be >= {lo}, got {value}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise BenchArgumentError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if args.client_processes < 1:
        raise BenchArgumentError(f"--client-processes must be >= 1, got {args.client_processes}")
    if args.client_processes > args.num_prompts:
        raise BenchArgumentError(f"--client-processes {args.client_processes} exceeds --num-prompts "
                                 f"{args.num_prompts}: a process would have no request")
    if args.max_concurrency is not None and args.client_processes > args.max_concurrency:
        raise BenchArgumentError(f"--client-processes {args.client_processes} exceeds --max-concurrency "
                                 f"{args.max_concurrency}: a process would have no request in flight")
    if not args.request_rate > 0:
        raise BenchArgumentError(f"--request-rate must be > 0 (inf = all at once), got {args.request_rate}")
    if not (args.burstiness > 0 and math.isfinite(args.burstiness)):
        raise BenchArgumentError(f"--burstiness must be a finite number > 0, got {args.burstiness}")
    if not 0.0 <= args.random_range_ratio < 1.0:
        raise BenchArgumentError(f"--random-range-ratio must be in [0, 1), got {args.random_range_ratio}")
    if not (0.0 <= args.temperature <= 2.0):
        raise BenchArgumentError(f"--temperature must be in [0, 2], got {args.temperature}")
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise BenchArgumentError(f"--timeout must be a finite number of seconds > 0, got {args.timeout}")
    slos = {}
    for item in args.goodput or []:
        name, _, ms = item.partition(":")
        try:
            value = float(ms)
        except ValueError:
            value = -1.0
        if name not in GOODPUT_METRICS or not value > 0:
            raise BenchArgumentError(f"--goodput {item!r}: expected NAME:MS with NAME in {', '.join(GOODPUT_METRICS)} "
                                     f"and MS > 0, e.g. ttft:500")
        slos[name] = value / 1e3
    try:
        percentiles = [float(x) for x in args.percentiles.split(",") if x.strip()]
    except ValueError:
        percentiles = []
    if not percentiles or not all(0 < q < 100 or q == 100 for q in percentiles):
        raise BenchArgumentError(f"--percentiles {args.percentiles!r}: comma-separated numbers in (0, 100]")
    if args.out is not None:
        check_out_dir(args.out)
    return base, slos, percentiles


# ------------------------------------------------------------------------------------------ workload
@dataclass
class Job:
    prompt: str
    max_tokens: int
    gap_s: float                 # wait after the previous arrival


def workload(args) -> list[Job]:
    rng = random.Random(args.seed)
    r = args.random_range_ratio

    def length(mean):
        return rng.randint(max(1, int(mean * (1 - r))), max(1, int(mean * (1 + r))))

    jobs = []
    for i in range(args.num_prompts):
        gap = 0.0 if i == 0 or math.isinf(args.request_rate) else \
            rng.gammavariate(args.burstiness, 1.0 / (args.request_rate * args.burstiness))
        words = [rng.choice(WORDS) for _ in range(length(args.random_input_len))]
        jobs.append(Job(" ".join(words).capitalize(), length(args.random_output_len), gap))
    return jobs


# ------------------------------------------------------------------------------------------ the client
@dataclass
class Outcome:
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    spec: dict | None = None     # speculative_decoding_stats of the choice, when the server sends them

    @property
    def tpot(self) -> float | None:
        return (self.e2el - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


async def _one(client, model: str, job: Job, args) -> Outcome:
    out = Outcome()
    kw = dict(model=model, max_tokens=job.max_tokens, temperature=args.temperature, stream=True,
              stream_options={"include_usage": True}, seed=args.seed, timeout=args.timeout)
    if args.ignore_eos:
        kw["extra_body"] = {"ignore_eos": True}
    start = time.perf_counter()
    last = None
    chunks = 0
    try:
        if args.endpoint == "chat":
            stream = await client.chat.completions.create(messages=[{"role": "user", "content": job.prompt}], **kw)
        else:
            stream = await client.completions.create(prompt=job.prompt, **kw)
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                out.prompt_tokens, out.output_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
            for choice in chunk.choices:
                extra = choice.model_extra or {}
                if extra.get("speculative_decoding_stats"):
                    out.spec = extra["speculative_decoding_stats"]
                text = choice.delta.content if args.endpoint == "chat" else choice.text
                if text or extra.get("token_ids"):
                    chunks += 1
                    if last is None:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last = now
        out.e2el = time.perf_counter() - start
        if last is None:
            out.error = "no content in the response"
        else:
            out.ok = True
            out.output_tokens = out.output_tokens or chunks     # a server without usage: chunks as tokens
    except Exception as e:  # noqa: BLE001 - one failed request is a result, not the end of the benchmark
        out.e2el = time.perf_counter() - start
        out.error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return out


async def _drive(base: str, args, jobs: list[Job], limit: int | None = None,
                 barrier=None) -> tuple[str, list[Outcome], float, float]:
    """Send ``jobs`` (at most ``limit`` in flight; None = --max-concurrency) -> (model, outcomes in job order,
    start, end): ``time.monotonic()`` readings, the same clock in every process. With ``barrier`` (a
    multiprocessing barrier) the first request waits until every client process is ready."""
    from openai import AsyncOpenAI

    limit = limit or args.max_concurrency or len(jobs)
    client = AsyncOpenAI(base_url=base, api_key="-", max_retries=0, timeout=args.timeout)
    try:
        model = args.model
        if model is None:
            models = await client.models.list()
            if not models.data:
                raise RuntimeError(f"{base}/models lists no model: pass --model")
            model = models.data[0].id
        gate = asyncio.Semaphore(limit)

        async def gated(job):
            async with gate:
                return await _one(client, model, job, args)

        if barrier is not None:
            barrier.wait(BARRIER_TIMEOUT_S)       # blocks this loop: nothing of this process runs yet
        tasks = []
        start = time.monotonic()
        for job in jobs:
            if job.gap_s:
                await asyncio.sleep(job.gap_s)
            tasks.append(asyncio.create_task(gated(job)))
        outcomes = await asyncio.gather(*tasks)
        return model, list(outcomes), start, time.monotonic()
    finally:
        await client.close()


# ------------------------------------------------------------------------------------------ several client processes
def split(jobs: list[Job], limit: int, n: int) -> list[tuple[list[int], list[Job], int]]:
    """The workload over ``n`` processes -> per process (the jobs' indices, its jobs, its concurrency). Job i goes
    to process i mod n, at the same arrival time as in one process (its gap re-measured from that process's
    previous arrival); the concurrency ``limit`` is split as evenly as it goes (the first ``limit mod n``
    processes take one more)."""
    arrivals, t = [], 0.0
    for job in jobs:
        t += job.gap_s
        arrivals.append(t)
    parts = []
    for j in range(n):
        idx = list(range(j, len(jobs), n))
        mine, last = [], 0.0
        for i in idx:
            mine.append(Job(jobs[i].prompt, jobs[i].max_tokens, arrivals[i] - last))
            last = arrivals[i]
        parts.append((idx, mine, limit // n + (j < limit % n)))
    return parts


def _client_process(base: str, args, jobs: list[Job], limit: int, barrier, conn) -> None:
    """One client process: its share of the requests -> ("ok", model, outcomes, start, end, CPU s) or
    ("error", message) through ``conn``. A failure breaks the barrier, so that the others stop waiting."""
    import openai  # noqa: F401 - imported before the CPU count starts, as in a single process (``run``)

    cpu = time.process_time()
    try:
        model, outcomes, start, end = asyncio.run(_drive(base, args, jobs, limit, barrier))
        conn.send(("ok", model, outcomes, start, end, time.process_time() - cpu))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        barrier.abort()
        conn.send(("error", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"))
    finally:
        conn.close()


def drive_processes(base: str, args, jobs: list[Job]) -> tuple[str, list[Outcome], float, float, float]:
    """``args.client_processes`` client processes (spawned, each its own event loop and openai client), started
    together -> (model, outcomes in job order, the first start, the last end, their CPU seconds summed)."""
    import multiprocessing

    n = args.client_processes
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    procs, pipes, parts = [], [], split(jobs, args.max_concurrency or len(jobs), n)
    for idx, mine, limit in parts:
        here, there = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_client_process, args=(base, args, mine, limit, barrier, there), daemon=True)
        proc.start()
        there.close()
        procs.append(proc)
        pipes.append(here)
    results = []
    try:
        for proc, pipe in zip(procs, pipes):
            try:
                results.append(pipe.recv())
            except EOFError:
                results.append(("error", f"a client process exited with code {proc.join(5) or proc.exitcode} "
                                         "before reporting"))
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
    errors = [r[1] for r in results if r[0] != "ok"]
    if errors:
        # a process that failed first breaks the barrier: the others then report BrokenBarrierError
        first = [e for e in errors if not e.startswith("BrokenBarrierError")] or errors
        raise RuntimeError(first[0])
    outcomes: list[Outcome | None] = [None] * len(jobs)
    for (idx, _, _), (_, _, mine, _, _, _) in zip(parts, results):
        for i, outcome in zip(idx, mine):
            outcomes[i] = outcome
    return (results[0][1], outcomes, min(r[3] for r in results), max(r[4] for r in results),
            sum(r[5] for r in results))


# ------------------------------------------------------------------------------------------ the numbers
def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(outcomes: list[Outcome], duration: float, slos: dict[str, float], percentiles: list[float]) -> dict:
    done = [o for o in outcomes if o.ok]
    out_tokens = sum(o.output_tokens for o in done)
    in_tokens = sum(o.prompt_tokens for o in done)
    series = {"ttft": [o.ttft for o in done], "tpot": [o.tpot for o in done if o.tpot is not None],
              "itl": [g for o in done for g in o.itl], "e2el": [o.e2el for o in done]}
    good = [o for o in done if all((o.tpot if m == "tpot" else getattr(o, m)) is not None and
                                   (o.tpot if m == "tpot" else getattr(o, m)) <= limit for m, limit in slos.items())]
    summary = {
        "completed": len(done), "failed": len(outcomes) - len(done), "duration_s": duration,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(done) / duration, "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "goodput": len(good) / duration if slos else None, "slos_ms": {k: v * 1e3 for k, v in slos.items()},
        "errors": sorted({o.error for o in outcomes if not o.ok})[:5],
    }
    for name, values in series.items():
        summary[f"mean_{name}_ms"] = 1e3 * sum(values) / len(values) if values else float("nan")
        for q in percentiles:
            summary[f"p{q:g}_{name}_ms"] = 1e3 * percentile(values, q)
    spec = [o.spec for o in done if o.spec]
    if spec:
        proposed = sum(s.get("draft_tokens_proposed", 0) for s in spec)
        accepted = sum(s.get("draft_tokens_accepted", 0) for s in spec)
        rounds = sum(s.get("rounds", 0) for s in spec)
        width = max(len(s.get("proposed_per_position", [])) for s in spec)
        per_pos = []
        for i in range(width):
            p = sum(s["proposed_per_position"][i] for s in spec if i < len(s.get("proposed_per_position", [])))
            a = sum(s["accepted_per_position"][i] for s in spec if i < len(s.get("accepted_per_position", [])))
            per_pos.append(a / p if p else float("nan"))
        summary["speculative"] = {"requests": len(spec), "draft_tokens_proposed": proposed,
                                  "draft_tokens_accepted": accepted,
                                  "acceptance_rate": accepted / proposed if proposed else 0.0,
                                  "mean_accepted_per_round": accepted / rounds if rounds else 0.0,
                                  "acceptance_rate_per_position": per_pos}
    return summary


def markdown(summary: dict, config: dict, percentiles: list[float]) -> str:
    s = summary
    lines = [f"# Serving benchmark: {config['model']} at {config['base_url']}", "",
             f"`{config['command']}`", "",
             f"{config['num_prompts']} requests ({config['endpoint']}), request rate {config['request_rate']} /s, "
             f"burstiness {config['burstiness']}, max concurrency {config['max_concurrency']}, prompt ~"
             f"{config['random_input_len']} words, max_tokens ~{config['random_output_len']} (range ratio "
             f"{config['random_range_ratio']}), temperature {config['temperature']}; {config['date']}", "",
             "| | |", "|---|---|"]
    rows = [("successful requests", s["completed"]), ("failed requests", s["failed"]),
            ("benchmark duration (s)", f"{s['duration_s']:.2f}"),
            ("total input tokens", s["total_input_tokens"]), ("total output tokens", s["total_output_tokens"]),
            ("request throughput (req/s)", f"{s['request_throughput']:.2f}"),
            ("output token throughput (tok/s)", f"{s['output_throughput']:.2f}"),
            ("total token throughput (tok/s)", f"{s['total_token_throughput']:.2f}")]
    if s["goodput"] is not None:
        slo = ", ".join(f"{k} <= {v:g} ms" for k, v in s["slos_ms"].items())
        rows.append((f"goodput (req/s; {slo})", f"{s['goodput']:.2f}"))
    lines += [f"| {k} | {v} |" for k, v in rows]
    qs = [f"p{q:g}" for q in percentiles]
    lines += ["", "| latency (ms) | mean | " + " | ".join(qs) + " |", "|---|" + "---|" * (len(qs) + 1)]
    names = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL (per chunk)", "e2el": "E2E latency"}
    for key, label in names.items():
        cells = [f"{s[f'mean_{key}_ms']:.2f}"] + [f"{s[f'{q}_{key}_ms']:.2f}" for q in qs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    spec = s.get("speculative")
    if spec:
        per = ", ".join(f"{a:.2f}" for a in spec["acceptance_rate_per_position"])
        lines += ["", f"Speculative decoding (from the responses' speculative_decoding_stats, {spec['requests']} "
                      f"requests): acceptance {spec['acceptance_rate']:.3f} ({spec['draft_tokens_accepted']}/"
                      f"{spec['draft_tokens_proposed']} drafts), {spec['mean_accepted_per_round']:.2f} accepted per "
                      f"round; per position (rounds whose draft i was accepted / rounds that proposed it): {per}"]
    if s["errors"]:
        lines += ["", "Errors (first kinds): " + "; ".join(s["errors"])]
    return "\n".join(lines) + "\n"


def _finite(x):
    """JSON has no inf / nan: those become strings ("inf": a request rate of inf; "nan": no sample)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def run(args) -> int:
    """The subcommand: 0 when every request succeeded, 1 when some failed or the server is unreachable,
    2 (one line) for a bad argument."""
    try:
        base, slos, percentiles = check(args)
    except BenchArgumentError as e:
        print(f"verispec: error: bench serve: {e}", file=sys.stderr)
        return USAGE
    try:
        import openai  # noqa: F401
    except ImportError:
        print("verispec: error: bench serve needs the openai client: pip install openai", file=sys.stderr)
        return USAGE
    jobs = workload(args)
    print(f"[verispec] bench serve: {len(jobs)} requests to {base} ...", file=sys.stderr, flush=True)
    cpu = time.process_time()
    try:
        if args.client_processes == 1:
            model, outcomes, start, end = asyncio.run(_drive(base, args, jobs))
            client_cpu = time.process_time() - cpu
        else:
            model, outcomes, start, end, client_cpu = drive_processes(base, args, jobs)
        duration = end - start
    except Exception as e:  # noqa: BLE001 - e.g. the server is not there: one line, exit 1
        print(f"verispec: error: bench serve: cannot benchmark {base}: {type(e).__name__}: "
              f"{' '.join(str(e).split())[:300]}", file=sys.stderr)
        return FAILURE
    summary = summarize(outcomes, duration, slos, percentiles)
    summary["client_cpu_s"] = client_cpu
    argv = sys.argv[1:]
    config = {**{k: v for k, v in vars(args).items()}, "model": model, "base_url": base,
              "command": "verispec " + " ".join(argv) if "serve" in argv else "verispec bench serve",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    page = markdown(summary, config, percentiles)
    print(page)
    if args.out is not None:
        out = Path(args.out)
        (out / f"{args.label}.md").write_text(page)
        record = {"summary": summary, "config": config, "requests": [asdict(o) for o in outcomes]}
        (out / f"{args.label}.json").write_text(json.dumps(_finite(record), indent=1, default=str))
        print(f"[verispec] wrote {out / (args.label + '.md')} and {args.label}.json", file=sys.stderr)
    return 0 if summary["failed"] == 0 else FAILURE
