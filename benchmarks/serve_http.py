"""`verispec serve` through real HTTP vs the same engine in-process (issue: a server people can trust under load).

For each server configuration: start `verispec serve` as a subprocess on 127.0.0.1, wait for /health, drive it
with `verispec bench serve` (the official openai client, streaming), stop it; then the same requests through
the engine in-process (`run_engine`: one Scheduler, the same rows, all submitted at once; no HTTP). Writes benchmarks/results/serve_http.md only with
--write (the default writes into --out, so a run never overwrites the committed file by accident).

    python benchmarks/serve_http.py --model /path/SmolLM2.gguf --out DIR [--write]
    python benchmarks/serve_http.py --model llama-3.1-8b --tokenizer /path/SmolLM2.gguf --oracle 0.8 \
        --oracle-draft-cost llama-3.2-1b --rates 10,20,40,80,inf --num-prompts 200 --out DIR [--write]

The second form (a random-weight shape; `verispec serve --draft oracle:ALPHA`, benchmarks only) serves AR, K=2,
K=4 and k=auto, each as one server process swept over the request rates (Poisson arrivals, `--max-concurrency`
bounding the requests in flight), and puts beside them the same engine in-process at saturation
(`run_engine`: the same number of requests, prompt and output lengths, all submitted at once, the same rows).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import environment, environment_line, markdown_table, wait_health, write_page  # noqa: E402
from verispec.serve.cli import MAX_SEQ_LEN  # noqa: E402  (the server's cache length: the bound runs the same cache)

CONFIGS = {"plain": [], "lookup k=4": ["--draft-lookup", "-k", "4"], "lookup k=auto": ["--draft-lookup"]}


def oracle_configs(args) -> dict[str, list[str]]:
    """AR, K=2, K=4 and k=auto (up to --k-max 8) with the benchmark-only oracle draft (the server makes the model
    peaked; AR serves the random weights as they are: the same cost per pass)."""
    draft = ["--draft", f"oracle:{args.oracle}"]
    if args.oracle_draft_cost:
        draft += ["--oracle-draft-cost", args.oracle_draft_cost]
    costs = ["--cost-table", str(Path(args.out) / "cost_table.json")]     # measured once, by the first auto server
    return {"AR": [], "K=2": draft + ["-k", "2"], "K=4": draft + ["-k", "4"],
            "k=auto": draft + costs}


def run_config(name: str, extra: list[str], args, port: int, out: Path) -> list[dict]:
    """One server process for ``name``, driven at each of ``args.rates`` in turn: one result per rate."""
    base = f"http://127.0.0.1:{port}"
    model = ["--model", args.model] + (["--tokenizer", args.tokenizer] if args.tokenizer else [])
    server = subprocess.Popen([sys.executable, "-m", "verispec.cli", "serve", *model, "--port", str(port),
                               "--max-batch-size", str(args.concurrency),
                               # the first burst queues all C + QUEUED requests before a row runs: none gets a 429
                               "--max-waiting", str(max(64, args.concurrency + args.queued)), *extra],
                              stdout=subprocess.DEVNULL, stderr=open(out / f"server_{port}.log", "w"),
                              env=dict(os.environ, VERISPEC_STEP_TRACE=str(out / f"trace_{port}.jsonl")))
    results = []
    try:
        wait_health(base, 600, poll_s=0.5)
        for rate in args.rates:
            label = f"{name}_{rate}".replace(" ", "_").replace("=", "").replace('"', "")
            bench = subprocess.run([sys.executable, "-m", "verispec.cli", "bench", "serve", "--url", base,
                                    "--endpoint", "chat", "--num-prompts", str(args.num_prompts),
                                    "--request-rate", rate, "--max-concurrency", str(args.concurrency + args.queued),
                                    "--random-input-len", str(args.input_len),
                                    "--random-output-len", str(args.max_tokens), "--temperature", "0",
                                    "--client-processes", str(min(args.client_processes, args.num_prompts,
                                                                  args.concurrency + args.queued)),
                                    "--out", str(out), "--label", label], capture_output=True, text=True, timeout=900)
            if bench.returncode != 0:
                results.append(dict(config=name, rate=rate, error=bench.stderr[-600:]))
            else:
                results.append(dict(config=name, rate=rate,
                                    summary=json.loads((out / f"{label}.json").read_text())["summary"]))
            r = results[-1].get("summary")
            print(name, rate, results[-1]["error"][-300:] if r is None else
                  f"{r['output_throughput']:.0f} tok/s TTFT p50/p99 {r['p50_ttft_ms']:.0f}/{r['p99_ttft_ms']:.0f} ms "
                  f"TPOT p50/p99 {r['p50_tpot_ms']:.2f}/{r['p99_tpot_ms']:.2f} ms "
                  f"accepted/round {r['speculative']['mean_accepted_per_round']:.2f}", flush=True)
        return results
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def chat_prompts(args, tok) -> tuple[list[list[int]], list[int]]:
    """The HTTP runs' requests as the server sees them: ``verispec bench serve``'s workload (seed 0) through
    ``tok``'s chat template -> (prompt ids, max_tokens each)."""
    from types import SimpleNamespace

    from verispec.bench.serving import workload

    jobs = workload(SimpleNamespace(seed=0, random_range_ratio=0.0, num_prompts=args.num_prompts,
                                    request_rate=float("inf"), burstiness=1.0, random_input_len=args.input_len,
                                    random_output_len=args.max_tokens))
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": j.prompt}], add_generation_prompt=True))
               for j in jobs]
    return prompts, [j.max_tokens for j in jobs]


def in_process(args) -> dict:
    """The HTTP runs' requests in-process: the same prompts (``verispec bench serve``'s workload, seed 0) through
    the model's chat template, the same max_tokens, EOS ending a request as in the server, all submitted at once
    to one ``Scheduler`` of ``concurrency`` rows (``run_engine``) with the server's cache length (``--max-seq-len``'s
    default: attention and retirements see the same capacity). Output tok/s over the whole run (the second, warm
    one), measured like the client's: tokens / wall seconds from the first submission to the last token."""
    from verispec import PromptLookup, load_model
    from verispec.bench.measure import run_engine

    model = load_model(args.model)
    prompts, limits = chat_prompts(args, model.tokenizer)
    rows = {}
    for name, drafter, k in (("plain", None, 0), ("lookup k=4", PromptLookup, 4)):
        if args.configs and name not in args.configs:
            continue
        for _ in range(2):   # the second run is the warm one
            run = run_engine(model, drafter() if drafter else None, prompts, k=k, max_new_tokens=limits,
                             arrivals=[0.0] * len(prompts), max_batch=args.concurrency, max_seq_len=MAX_SEQ_LEN)
        rows[name] = run.tokens_per_s
    return rows


def in_process_oracle(args) -> dict:
    """The oracle configurations through ``run_engine`` at saturation (all requests at once, ``concurrency``
    rows, the server's cache length): output tok/s per configuration, on the model the server makes (peaked, same
    successor oracle)."""
    import random

    import torch

    from verispec.bench.measure import run_engine
    from verispec.drafters import SuccessorOracle, make_peaked
    from verispec.engine.auto_k import AutoK, CostTable
    from verispec.runtime import load_model

    target = load_model(args.model, device="cuda", dtype=torch.bfloat16)
    successor = make_peaked(target)
    cost = load_model(args.oracle_draft_cost, device="cuda", dtype=torch.bfloat16, seed=1) \
        if args.oracle_draft_cost else None
    if args.tokenizer:      # the server's prompts: its chat template over the same workload (the prefill buckets match)
        from verispec.runtime.loading import load_tokenizer
        prompts, _ = chat_prompts(args, load_tokenizer(args.tokenizer))
    else:
        rng = random.Random(0)
        prompts = [[rng.randrange(49152) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    table_path = Path(args.out) / "cost_table.json"
    rows = {}
    for name, k in (("AR", 0), ("K=2", 2), ("K=4", 4), ("k=auto", 8)):
        if args.configs and name not in args.configs:
            continue
        policy = None
        if name == "k=auto":
            if not table_path.exists():
                continue
            policy = AutoK(CostTable.from_json(table_path.read_text()), reference_batch=args.concurrency)
        for _ in range(2):      # the second run is the warm one
            drafter = SuccessorOracle(successor, args.oracle, cost_model=cost) if k else None
            if drafter is not None:
                drafter.attach(target)
            run = run_engine(target, drafter, prompts, k=k, max_new_tokens=args.max_tokens, k_policy=policy,
                             arrivals=[0.0] * len(prompts), max_batch=args.concurrency, max_seq_len=MAX_SEQ_LEN)
        rows[name] = run.tokens_per_s
    return rows


def server_log_lines(order: list[tuple[str, list[str]]], out: Path) -> list[str]:
    """What each server's stop log says about its warm-up (graphs captured and Triton kernels compiled inside
    requests) and k=auto's measured rounds, one bullet per line."""
    lines = []
    for i, (name, _) in enumerate(order):
        log = out / f"server_{8100 + i}.log"
        said = [ln.split("] ", 1)[-1].strip() for ln in (log.read_text().splitlines() if log.exists() else [])
                if "after warm-up:" in ln or "k=auto rounds measured" in ln or "k=auto greedy probes" in ln]
        lines += [f"- {name}: {s}" for s in said]
    return (["Server stop logs:", ""] + lines + [""]) if lines else []


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="what `verispec serve --model` loads (the embedded GGUF, or a "
                    "shape such as llama-3.1-8b with --tokenizer and --oracle)")
    ap.add_argument("--tokenizer", default=None, help="`verispec serve --tokenizer` (for a shape)")
    ap.add_argument("--oracle", type=float, default=None, help="serve AR, K=2, K=4, k=auto with --draft oracle:ALPHA")
    ap.add_argument("--oracle-draft-cost", default=None, help="the model whose passes the oracle's drafts pay")
    ap.add_argument("--rates", default="inf", help="comma-separated request rates (req/s; inf = all at once)")
    ap.add_argument("--input-len", type=int, default=64, help="mean prompt length in words")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--queued", type=int, default=0, help="the client keeps --concurrency + QUEUED requests in flight "
                    "(the server --concurrency rows): a queue refills a row the moment one ends, as in the in-process "
                    "run (all at once); with 0 each row waits a client turnaround per request. The servers take "
                    "--max-waiting max(64, concurrency + QUEUED), so the first burst is queued, not refused")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--stream-interval", type=float, default=0.0, metavar="MS", help="also serve each "
                    "configuration with `verispec serve --stream-interval MS` (a stream's chunks at most every MS ms), "
                    "named '<config> stream-interval MS'")
    ap.add_argument("--client-processes", type=int, default=4, help="`verispec bench serve --client-processes`: "
                    "the requests split over this many client processes (the openai client costs about 0.4 ms of "
                    "CPU per chunk on the 2-core dev CPU; 16 streams of the embedded model on an H100 make about "
                    "8900 chunks/s)")
    ap.add_argument("--configs", default=None, help="comma-separated configurations to serve (default: all; e.g. AR)")
    ap.add_argument("--engine-process", action="store_true", help="serve each configuration twice: the engine as a "
                    "thread of the server's process (`--engine-process off`, named '<config>') and in its own process "
                    "(`--engine-process on`, '<config> engine-process'); without it, the server's default (on a GPU: "
                    "its own process)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/serve_http"))
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/serve_http.md")
    args = ap.parse_args(argv)
    args.rates = args.rates.split(",")
    args.configs = args.configs.split(",") if args.configs else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    configs = oracle_configs(args) if args.oracle is not None else CONFIGS
    if args.configs:
        unknown = sorted(set(args.configs) - set(configs))
        if unknown:
            ap.error(f"--configs: no configuration {unknown} (there are {list(configs)})")
        configs = {name: extra for name, extra in configs.items() if name in args.configs}
    if args.engine_process:
        configs = {**{name: extra + ["--engine-process", "off"] for name, extra in configs.items()},
                   **{f"{name} engine-process": extra + ["--engine-process", "on"] for name, extra in configs.items()}}
    if args.stream_interval:
        configs = {**configs, **{f"{name} stream-interval {args.stream_interval:g}":
                                 extra + ["--stream-interval", str(args.stream_interval)]
                                 for name, extra in configs.items()}}
    # the auto server first: it measures the cost table that the in-process k=auto reads
    order = sorted(configs.items(), key=lambda kv: kv[0] != "k=auto")
    results = [r for i, (name, extra) in enumerate(order) for r in run_config(name, extra, args, 8100 + i, out)]
    results.sort(key=lambda r: (list(configs).index(r["config"]), args.rates.index(r["rate"])))
    # the page is written once the HTTP runs are done and again with the in-process bound: a run cut short in the
    # in-process part (a device's time running out) keeps its HTTP figures
    write(args, results, None, order, out, t0, echo=False)
    engine = in_process_oracle(args) if args.oracle is not None else in_process(args)
    write(args, results, engine, order, out, t0)


def write(args, results: list[dict], engine: dict | None, order, out: Path, t0: float, echo: bool = True) -> None:
    """The page (``write_page``: into ``out``, and into benchmarks/results with --write) from the HTTP runs'
    ``results`` and the in-process bound ``engine`` (configuration -> tok/s; None: not measured yet)."""
    name = ("serve_http_8b" if args.oracle is not None else "serve_http") + ("_engine_process" if args.engine_process else "")
    model = Path(args.model).name if os.path.exists(args.model) else args.model
    command = (f"python benchmarks/serve_http.py --model {model} --num-prompts {args.num_prompts} --concurrency "
               f"{args.concurrency} --max-tokens {args.max_tokens} --input-len {args.input_len} --rates "
               f"{','.join(args.rates)}" + (f" --queued {args.queued}" if args.queued else "")
               + (f" --configs {','.join(args.configs)}" if args.configs else "")
               + (" --engine-process" if args.engine_process else "")
               + f" --client-processes {args.client_processes}"
               + (f" --stream-interval {args.stream_interval:g}" if args.stream_interval else "") + (f" --tokenizer {Path(args.tokenizer).name} --oracle {args.oracle} "
                                            f"--oracle-draft-cost {args.oracle_draft_cost}" if args.oracle is not None
                                            else ""))
    lines = ["# `verispec serve` through HTTP vs in-process", "", environment_line(environment()), "",
             f"Command: `{command}` ({time.perf_counter() - t0:.0f} s in all). Chat requests, greedy, "
             f"{args.num_prompts} per rate, Poisson arrivals at each rate (inf: all at once), at most "
             f"{args.concurrency + args.queued} in flight for {args.concurrency} rows (`verispec bench serve`, streaming, "
             f"the openai client in {args.client_processes} process(es)); one server "
             "process per configuration, its CUDA graphs captured at startup. Each cell is one run (percentiles over "
             "its requests); no peer server is measured here (none is installed on the device): the in-process line "
             "is the bound.", ""]
    if args.oracle is not None:
        lines += [f"Model: {args.model} with random weights made peaked by the server (`--draft oracle:{args.oracle}`,"
                  " benchmarks only: the text is meaningless, the cost is the model's); drafts accepted with "
                  f"probability {args.oracle} each, paying {args.oracle_draft_cost or 'no'} draft passes. "
                  "A peaked model's greedy chain meets EOS about once in 128k tokens: requests run to their max_tokens.", ""]
    rows = []
    for r in results:
        if "error" in r:
            rows.append((r["config"], r["rate"], "error: " + r["error"].replace("|", "/").replace("\n", " ")[-160:],
                         "", "", "", "", ""))
            continue
        s = r["summary"]
        rows.append((r["config"], r["rate"], f"{s['output_throughput']:.0f}", f"{s['p50_ttft_ms']:.0f}",
                     f"{s['p99_ttft_ms']:.0f}", f"{s['p50_tpot_ms']:.2f}", f"{s['p99_tpot_ms']:.2f}",
                     f"{s['p99_e2el_ms']:.0f}"))
    lines += markdown_table(["server", "rate req/s", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
                             "TPOT p99 ms", "E2EL p99 ms"], rows)
    where = "`run_engine`: the same requests all at once, the same rows, the warm second run"
    bound = "not measured (the run stopped before it)" if engine is None else \
        ", ".join(f"{k} {v:.0f} tok/s" for k, v in engine.items())
    lines += ["", f"In-process ({where}): {bound}", ""]
    lines += server_log_lines(order, out)
    write_page("\n".join(lines), out, f"{name}.md", args.write, echo)


if __name__ == "__main__":
    main()
