"""Serving benchmark: open-loop Poisson arrivals into the continuous-batching ``Scheduler``, in this process.

    python benchmarks/serve.py                 GPU: random-weight llama-3.1-8b target (peaked, see e2e.make_peaked)
                                               + OracleDraft (alpha 0.8) paying llama-3.2-1b passes, bf16
    python benchmarks/serve.py --cpu           the embedded SmolLM2-135M + PromptLookup, torch threads 1

Load: N requests per rate (default 200; --quick a few), inter-arrival gaps exponential (Poisson process) from
a fixed seed; prompt and output lengths uniform in fixed ranges from the same seed, so every method and rate
serves the same requests. Request i is submitted at its planned arrival time and that time is its
``submitted_at`` (queueing counts). The scheduler is driven directly (``verispec.bench.measure.run_engine``):
no HTTP server, no tokenization on the request path.

Methods: AR (no drafter), SD with a fixed K, and k="auto" (``AutoK`` over a ``CostTable`` that
``measure_costs`` measures at startup). Every run captures the CUDA graphs its rounds and admissions can replay
before its clock starts (``Scheduler.warm_up``, as ``verispec serve`` does at startup), and each method runs once
with every request at once before the sweep. Metrics per rate and method: throughput = generated tokens / (first
arrival .. last end);
TTFT = submission to first token (queue + prefill); TPOT = (end - first token) / (tokens - 1) per request;
mean accepted length = accepted drafts per round per request; mean k = the k the policy gave per round.
"identical" checks that every request's greedy tokens equal plain decoding's.

GPU only: the closed-loop steady state (exactly C requests in flight, a finished one replaced at once) at
C = 8 and 32, measured SD / AR throughput beside ``verispec.analysis.speedup_from_times`` with the step
times of the cost table.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, environment_line, markdown_table  # noqa: E402
from verispec.analysis import speedup_from_times  # noqa: E402
from verispec.bench.measure import poisson_arrivals, run_engine  # noqa: E402
from verispec.engine import Request, Scheduler, SchedulerConfig  # noqa: E402
from verispec.engine.auto_k import AutoK, default_batch_sizes, measure_costs  # noqa: E402

COLUMNS = ["method", "rate req/s", "completed", "throughput tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
           "TPOT p99 ms", "mean accepted length", "mean k", "identical"]
RESULTS = Path(__file__).resolve().parent / "results"


# ---------------------------------------------------------------------------------------------- workload
def workload(n: int, seed: int, prompt_range, output_range, vocab: int, texts=None):
    """(prompts, output lengths) of n requests: output lengths uniform in the inclusive ``output_range``;
    prompts are random tokens of a length uniform in ``prompt_range``, or (``texts``: token lists) a seeded
    choice of whole texts (cutting one would drop the passage an echo request asks to copy)."""
    rng = random.Random(seed)
    prompts, outputs = [], []
    for _ in range(n):
        length = rng.randint(*prompt_range)
        if texts:
            prompts.append(list(rng.choice(texts)))
        else:
            prompts.append([rng.randrange(vocab) for _ in range(length)])
        outputs.append(rng.randint(*output_range))
    return prompts, outputs


class RecordK:
    """A k policy that remembers the k it gave each round (the first row's: every policy here gives all
    rows the same k)."""

    def __init__(self, policy=None):
        self.policy = policy or (lambda running, k: [k] * len(running))
        self.ks: list[int] = []

    def __call__(self, running, k_max):
        ks = self.policy(running, k_max)
        self.ks.append(ks[0] if ks else 0)
        return ks


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between order statistics."""
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summarize(method: str, rate: float, run, ks: list[int], reference, n: int) -> dict:
    done = [s for s in run.stats if s.new_tokens > 0]
    ttft = [s.queue_s + s.prefill_s for s in done]
    tpot = [(s.total_s - s.queue_s - s.prefill_s) / (s.new_tokens - 1) for s in done if s.new_tokens > 1]
    rounds = sum(s.rounds for s in done)
    return dict(method=method, rate=rate, completed=len(done), n=n, throughput=run.tokens_per_s,
                ttft50=1e3 * percentile(ttft, 50), ttft99=1e3 * percentile(ttft, 99),
                tpot50=1e3 * percentile(tpot, 50), tpot99=1e3 * percentile(tpot, 99),
                accepted=sum(s.accepted for s in done) / rounds if rounds else 0.0,
                k=statistics.fmean(ks) if ks else 0.0, identical=run.outputs == reference)


def row_cells(r: dict) -> list:
    return [r["method"], f"{r['rate']:g}", f"{r['completed']}/{r['n']}", f"{r['throughput']:.0f}",
            f"{r['ttft50']:.1f}", f"{r['ttft99']:.1f}", f"{r['tpot50']:.2f}", f"{r['tpot99']:.2f}",
            f"{r['accepted']:.2f}", f"{r['k']:.2f}", "yes" if r["identical"] else "NO"]


# ---------------------------------------------------------------------------------------------- runs
def sweep(target, methods, prompts, outputs, rates, args, reference) -> list[dict]:
    """Every (rate, method) open-loop run; ``methods``: (name, drafter factory, k, policy factory)."""
    rows = []
    # every run captures its graphs before its clock starts (``warm_up``), as ``verispec serve`` does at startup:
    # under Poisson arrivals k=auto meets (batch, k) shapes and draft-model prefill lengths no earlier run met, and
    # a capture inside a request is a server that was not warmed up, not the policy's cost
    for name, make_drafter, k, make_policy in methods:      # warm-up: the first run of each method's shapes
        run_engine(target, make_drafter(), prompts, k=k, max_new_tokens=outputs, k_policy=make_policy(),
                   arrivals=[0.0] * len(prompts), max_batch=args.max_batch, warm_up=True)
    for rate in rates:
        arrivals = poisson_arrivals(len(prompts), rate, args.seed + 1)
        for name, make_drafter, k, make_policy in methods:
            policy = RecordK(make_policy())
            run = run_engine(target, make_drafter(), prompts, k=k, max_new_tokens=outputs, k_policy=policy,
                             arrivals=arrivals, max_batch=args.max_batch, warm_up=True)
            row = summarize(name, rate, run, policy.ks if k else [], reference, len(prompts))
            rows.append(row)
            print(" | ".join(str(c) for c in row_cells(row)), flush=True)
    return rows


def closed_loop(target, drafter, prompts, outputs, k: int, concurrency: int):
    """(tokens/s, per-position alpha) with exactly ``concurrency`` requests in flight: a finished request is
    replaced at once by the next one; throughput counts the window in which all ``concurrency`` rows ran."""
    config = SchedulerConfig(concurrency, max(len(p) + n for p, n in zip(prompts, outputs)) + k + 1, k)
    scheduler = Scheduler(target, drafter, config)
    if len(prompts) <= concurrency:
        raise ValueError(f"closed_loop: {len(prompts)} requests cannot keep {concurrency} in flight")
    queue = list(range(len(prompts)))
    seqs = []

    def submit():
        i = queue.pop(0)
        seqs.append(scheduler.submit(Request(list(prompts[i]), outputs[i], id=i, seed=i)))

    for _ in range(concurrency):
        submit()
    start, tokens_at_start = None, 0
    while queue:
        scheduler.step()
        if start is None:
            start, tokens_at_start = time.perf_counter(), sum(len(s.generated) for s in seqs)
        for _ in range(concurrency - len(scheduler.running) - len(scheduler.waiting)):
            if queue:
                submit()
    seconds = time.perf_counter() - start
    tokens = sum(len(s.generated) for s in seqs) - tokens_at_start
    scheduler.run()
    return tokens / seconds, position_alpha([s.stats for s in seqs])


def position_alpha(stats) -> float:
    """Acceptance per draft position actually tested, pooled over ``stats`` (0 with no drafts): a round tests
    draft i only if it accepted drafts 0..i-1 (``Stats.tested_per_position``), so accepted / proposed (which
    counts the untested positions after a rejection as failures) would understate the alpha of verispec.analysis."""
    accepted = sum(sum(st.accepted_per_position) for st in stats)
    tested = sum(sum(st.tested_per_position) for st in stats)
    return accepted / tested if tested else 0.0


# ---------------------------------------------------------------------------------------------- plot
def plot(rows, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["rate"])
        pts = [(r["throughput"], r["tpot50"], r["rate"]) for r in mine]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
        for x, y, rate in pts:
            ax.annotate(f"{rate:g}/s", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("throughput (generated tokens/s)")
    ax.set_ylabel("TPOT p50 (ms per output token)")
    import textwrap

    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)   # long model descriptions wrap, never clip
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- modes
def setup_gpu(args, target=None, draft=None):
    from benchmarks.e2e import make_peaked
    from verispec.drafters import OracleDraft
    from verispec.runtime import load_model

    dev = torch.device("cuda")
    target = target or load_model(args.target, device=dev, dtype=torch.bfloat16, seed=0)
    draft = draft or load_model(args.draft, device=dev, dtype=torch.bfloat16, seed=1)
    make_peaked(target)
    prompts, outputs = workload(args.requests, args.seed, (16, 128), (16, 128), target.config.vocab_size)
    continuations = run_engine(target, None, prompts, k=0, max_new_tokens=outputs, max_batch=args.max_batch).outputs

    def make_drafter():   # keyed by request id = prompt index (run_engine numbers requests 0..n-1)
        drafter = OracleDraft(continuations, args.alpha, cost_model=draft, seed=args.seed)
        drafter.attach(target)
        return drafter

    desc = (f"target {args.target} (random bf16 weights, peaked argmax), OracleDraft alpha {args.alpha} paying "
            f"{args.draft} passes")
    return target, make_drafter, prompts, outputs, continuations, desc


def setup_cpu(args, target=None):
    from verispec.drafters import PromptLookup
    from verispec.runtime import load_model

    torch.set_num_threads(1)
    target = target or load_model(device="cpu", dtype=torch.float32)
    texts = None
    if target.tokenizer is not None:
        from verispec.bench.workbench import TEXT_PROMPTS
        texts = [target.tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
                 for t in TEXT_PROMPTS]
    prompts, outputs = workload(args.requests, args.seed, (24, 64), (12, 32), target.config.vocab_size, texts)
    reference = run_engine(target, None, prompts, k=0, max_new_tokens=outputs, max_batch=args.max_batch).outputs
    def make_drafter():
        drafter = PromptLookup()
        drafter.attach(target)
        return drafter

    return target, make_drafter, prompts, outputs, reference, "SmolLM2-135M (fp32) + PromptLookup"


def main(argv=None, target=None, draft=None) -> list[dict]:
    """Run the benchmark; ``target`` replaces the embedded model (--cpu) or the --target shape, ``draft`` the
    --draft shape (tests: tiny models on the CPU)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="SmolLM2 + PromptLookup on the CPU")
    p.add_argument("--quick", action="store_true", help="few requests, few rates (a smoke run)")
    p.add_argument("--requests", type=int, default=None, help="requests per rate (default 200 GPU, 8 CPU)")
    p.add_argument("--rates", default=None, help="comma-separated request rates (req/s)")
    p.add_argument("-k", type=int, default=None, help="fixed K of the SD method and the cap of k=auto")
    p.add_argument("--max-batch", type=int, default=None, help="scheduler rows (default 32 GPU, 4 CPU)")
    p.add_argument("--alpha", type=float, default=0.8)
    p.add_argument("--target", default="llama-3.1-8b")
    p.add_argument("--draft", default="llama-3.2-1b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    cpu = args.cpu
    if not cpu and target is None and not torch.cuda.is_available():
        p.error("no CUDA device: use --cpu")
    args.requests = args.requests or (4 if args.quick else 8 if cpu else 200)
    args.max_batch = args.max_batch or (4 if cpu else 32)
    args.k = args.k or 4
    default_rates = ("2,8" if args.quick else "0.5,1,2" if cpu else "10,20,40,80,160")
    rates = [float(r) for r in (args.rates or default_rates).split(",")]
    if min(rates) <= 0 or args.requests < 1:
        p.error("rates and --requests must be positive")
    command = "python benchmarks/serve.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.perf_counter()
    setup = setup_cpu(args, target) if cpu else setup_gpu(args, target, draft)
    target, make_drafter, prompts, outputs, reference, desc = setup
    costs = measure_costs(target, make_drafter(), args.k, default_batch_sizes(args.max_batch))
    methods = [("AR", lambda: None, 0, lambda: None),
               (f"SD K={args.k}", make_drafter, args.k, lambda: None),
               ('k="auto"', make_drafter, args.k, lambda: AutoK(costs))]
    print(" | ".join(COLUMNS), flush=True)
    rows = sweep(target, methods, prompts, outputs, rates, args, reference)
    steady = []
    if not cpu:
        write(args, rows, steady, desc, command, time.perf_counter() - t0)   # kept if the steady state is cut short
        for c in (c for c in (8, 32) if len(prompts) >= 2 * c):   # a steady window needs a queue behind C
            ar_tps, _ = closed_loop(target, None, prompts, outputs, 0, c)
            sd_tps, alpha = closed_loop(target, make_drafter(), prompts, outputs, args.k, c)
            bound = speedup_from_times(alpha, args.k, costs.draft(c), costs.target(c, args.k + 1), costs.target(c, 1))
            steady.append((c, ar_tps, sd_tps, alpha, bound))
    write(args, rows, steady, desc, command, time.perf_counter() - t0)
    return rows


def write(args, rows, steady, desc, command, seconds) -> None:
    name = "serve_cpu" if args.cpu else "serve"
    args.out.mkdir(parents=True, exist_ok=True)
    plot(rows, args.out / f"{name}.png", f"{desc}: TPOT p50 vs throughput (label: request rate)")
    env = environment()
    lines = [f"# Serving benchmark: {desc}", "", environment_line(env), "",
             f"Command: `{command}` ({seconds:.0f} s in all).", "",
             f"Open-loop Poisson arrivals, {args.requests} requests per rate, scheduler rows {args.max_batch}, "
             f"greedy; same requests for every method and rate (seed {args.seed}). The scheduler is driven "
             "in-process (verispec.bench.measure.run_engine): the GPU machine has no fastapi/uvicorn, so no "
             "HTTP server is in the path. Each number is one run (no repeats): the median per request is "
             "TTFT/TPOT p50. See the docstring of benchmarks/serve.py for the definitions.", "",
             *markdown_table(COLUMNS, [row_cells(r) for r in rows]), "", f"![TPOT vs throughput]({name}.png)", ""]
    if steady:
        lines += ["## Steady state (closed loop: exactly C requests in flight)", "",
                  *markdown_table(["C", "AR tok/s", f"SD K={args.k} tok/s", "measured speedup",
                                   "alpha (per tested position)",
                                   "bound (analysis, measured step times)", "measured / bound"],
                                  [[c, f"{a:.0f}", f"{s:.0f}", f"{s / a:.2f}x", f"{al:.2f}", f"{b:.2f}x",
                                    f"{s / a / b:.2f}"] for c, a, s, al, b in steady]), ""]
    lines += ["## Published figures", "",
              "None are placed beside ours: we found no vLLM / SGLang serving-with-speculation figures at a "
              "comparable load (8B target, 1B-class draft, alpha 0.8, Poisson rates) that we could cite precisely "
              "from a source we read; any such figure would not be from the same run.", ""]
    (args.out / f"{name}.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
