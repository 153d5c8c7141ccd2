"""`verispec serve` through real HTTP vs the same engine in-process (issue: a server people can trust under load).

For each server configuration: start `verispec serve` as a subprocess on 127.0.0.1, wait for /health, drive it
with `verispec bench serve` (the official openai client, streaming), stop it; then the same prompts through
`verispec.generate` in one batch (the engine without HTTP). Writes benchmarks/results/serve_http.md only with
--write (the default writes into --out, so a run never overwrites the committed file by accident).

    python benchmarks/serve_http.py --model /path/SmolLM2.gguf --out DIR [--write]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import environment, environment_line, markdown_table  # noqa: E402

CONFIGS = {"plain": [], "lookup k=4": ["--draft-lookup", "-k", "4"], "lookup k=auto": ["--draft-lookup"]}


def _wait_health(base: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server at {base} did not come up in {timeout_s:.0f} s")


def run_config(name: str, extra: list[str], args, port: int, out: Path) -> dict:
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "verispec.cli", "serve", "--model", args.model, "--port", str(port),
                               "--max-batch-size", str(args.concurrency), *extra],
                              stdout=subprocess.DEVNULL, stderr=open(out / f"server_{port}.log", "w"))
    try:
        _wait_health(base, 600)
        label = name.replace(" ", "_").replace("=", "")
        bench = subprocess.run([sys.executable, "-m", "verispec.cli", "bench", "serve", "--url", base, "--endpoint", "chat",
                                "--num-prompts", str(args.num_prompts), "--request-rate", "inf",
                                "--max-concurrency", str(args.concurrency), "--random-input-len", "64",
                                "--random-output-len", str(args.max_tokens), "--temperature", "0",
                                "--out", str(out), "--label", label], capture_output=True, text=True, timeout=900)
        if bench.returncode != 0:
            return dict(config=name, error=bench.stderr[-600:])
        return dict(config=name, summary=json.loads((out / f"{label}.json").read_text())["summary"])
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def in_process(args) -> dict:
    """The same kind of requests through verispec.generate in one batch (no HTTP): output tok/s."""
    import torch

    from verispec import PromptLookup, generate, load_model

    model = load_model(args.model)
    words = ("the quick brown fox jumps over lazy dog while river stone light music garden winter").split()
    prompts = [" ".join(words[(i + j) % len(words)] for j in range(64)) for i in range(args.concurrency)]
    rows = {}
    for name, drafter in (("plain", None), ("lookup k=4", PromptLookup)):
        for _ in range(2):   # the second call is the warm one
            t = time.perf_counter()
            gens = generate(model, prompts, drafter=drafter() if drafter else None, k=4, max_new_tokens=args.max_tokens,
                            chat=True)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall = time.perf_counter() - t
        rows[name] = sum(len(g.tokens) for g in gens) / wall
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="what `verispec serve --model` loads (e.g. the embedded GGUF)")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/serve_http"))
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/serve_http.md")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = [run_config(name, extra, args, 8100 + i, out) for i, (name, extra) in enumerate(CONFIGS.items())]
    engine = in_process(args)
    lines = ["# `verispec serve` through HTTP vs in-process", "", environment_line(environment()), "",
             f"Command: `python benchmarks/serve_http.py --model {Path(args.model).name} --num-prompts "
             f"{args.num_prompts} --concurrency {args.concurrency} --max-tokens {args.max_tokens}`. Chat requests, "
             f"greedy, all sent at once with at most {args.concurrency} in flight (`verispec bench serve`, streaming, "
             f"the openai client); in-process = `verispec.generate` on {args.concurrency} prompts in one batch "
             f"(second call).", ""]
    rows = []
    for r in results:
        if "error" in r:
            rows.append((r["config"], "error: " + r["error"].replace("|", "/")[-160:], "", "", "", ""))
            continue
        s = r["summary"]
        rows.append((r["config"], f"{s['output_throughput']:.0f}", f"{s['p50_ttft_ms']:.0f}",
                     f"{s['p99_ttft_ms']:.0f}", f"{s['p50_tpot_ms']:.2f}", f"{s['p99_e2el_ms']:.0f}"))
    lines += markdown_table(["server", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "E2EL p99 ms"], rows)
    lines += ["", "In-process (`generate`, one batch): " + ", ".join(f"{k} {v:.0f} tok/s" for k, v in engine.items()), ""]
    text = "\n".join(lines)
    (out / "serve_http.md").write_text(text)
    if args.write:
        (Path(__file__).resolve().parent / "results" / "serve_http.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
