"""Decode / verify speed of verispec.runtime against the memory-bandwidth floor and transformers `generate`.

For each model shape (random bf16 weights) and batch size B:
  * verify(k) pass time for k = 1..8 (k = 1 is decode), median of CUDA-event timings of the public call
    (graph replay + logits clone); variants: `kernels` (the Triton decode kernels, default on CUDA), `eager`
    (the plain torch path) and `compiled` (torch path with torch.compile'd layer functions), all graphed;
  * the floor: bytes a pass must read (layer weights + final norm + LM head) / copy bandwidth
    (benchmarks/common.py); also shown with the KV-cache bytes our static-cache
    attention reads (the full capacity S, not just the live lengths);
  * transformers' greedy `generate` (DynamicCache, SDPA) on the same weights (views of ours), decode tok/s
    from (time(1 + N new tokens) - time(1 new token)) / N.
Correctness first: before timing, the graph path is checked against the eager path and against the
transformers forward (bf16, relative error printed).

  python benchmarks/decode.py                      # GPU: full table -> benchmarks/results/decode.md
  python benchmarks/decode.py --variants kernels,eager,compiled   # + the torch path, eager and compiled
  python benchmarks/decode.py                      # CPU: a tiny smoke run (no results file unless --out)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import capture_graph, copy_bandwidth, environment, environment_line, floor_s, table_header, \
    table_row, time_calls  # noqa: E402
from verispec.runtime import ModelConfig, load_model, named_shape  # noqa: E402
from verispec.runtime.loading import to_transformers  # noqa: E402

SMOKE_CFG = ModelConfig(vocab_size=512, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=128)


def ops_mod():
    from verispec.runtime import ops
    return ops


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def capacity(args) -> int:
    # prompt + every timed and warm-up call of the largest k (lengths grow during a timing loop)
    return args.prompt_len + (args.iters + 4) * max(args.ks)


def pass_bytes(model) -> tuple[int, int]:
    """(weight bytes one pass reads, KV bytes one pass reads per sequence at the cache's capacity)."""
    net, n = model.net, model.num_active_layers
    es = model.dtype.itemsize
    layer = sum(p.numel() for p in net.layers[0].parameters()) * es
    w = n * layer + net.norm.numel() * es + net.lm_head_weight.numel() * es
    c = model.config
    kv = n * 2 * c.num_kv_heads * model.cache.k[0].shape[2] * c.head_dim * es
    return w, kv


def matmul_only_ms(model, B: int, iters: int = 30, linear=None) -> float:
    """Median ms of just the pass's weight matmuls (4 per layer + LM head) for B tokens, replayed as one CUDA
    graph: what the runtime would cost if everything but the GEMVs/GEMMs were free. ``linear``: the matmul
    (default cuBLAS's F.linear; the runtime's ``ops.linear`` for its own dispatch)."""
    net, c = model.net, model.config
    dev, dt = model.device, model.dtype
    xe = torch.randn(B, c.hidden_size, device=dev, dtype=dt)
    xo = torch.randn(B, c.num_heads * c.head_dim, device=dev, dtype=dt)
    xi = torch.randn(B, c.intermediate_size, device=dev, dtype=dt)
    lin = linear or torch.nn.functional.linear

    def body():
        for L in net.layers[: model.num_active_layers]:
            lin(xe, L.wqkv), lin(xo, L.wo), lin(xe, L.w13), lin(xi, L.w2)
        lin(xe, net.lm_head_weight)

    return time_calls(capture_graph(body).replay, iters=iters) * 1e3


def profile_decode(model, tokens, base, prompt_len: int, log, top: int = 20) -> None:
    """Kernel-time breakdown of 5 decode passes (torch.profiler): where the time over the floor goes."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(5):
            model.append(tokens)
        sync()
    model.rollback(base)
    model.cache.max_len_bound = prompt_len
    cuda = torch.cuda.is_available()
    evs = [e for e in prof.key_averages() if (e.device_type.name == "CUDA") == cuda] if cuda else prof.key_averages()
    key = (lambda e: e.device_time_total) if cuda else (lambda e: e.self_cpu_time_total)  # noqa: E731
    total = sum(key(e) for e in evs) or 1.0
    groups = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for e in evs:
        n = e.key.lower()
        g = "attention" if any(w in n for w in ("attention", "fmha", "flash", "sdpa", "efficient")) else \
            "gemm" if any(w in n for w in ("gemm", "gemv", "cutlass", "sm90", "matmul", "addmm", "mm")) else "other"
        groups[g] += key(e)
    log("  profile (5 passes): " + ", ".join(f"{g} {v / total:.0%}" for g, v in groups.items())
        + f"; {sum(e.count for e in evs) // 5} kernels/pass")
    nl = model.num_active_layers
    for e in sorted(evs, key=key, reverse=True)[:top]:
        log(f"    {key(e) / 5 / 1e3:8.3f} ms/pass {key(e) / 5 / nl:7.2f} us/layer x{e.count / 5:5.1f}  {e.key[:90]}")


def probe(model, B: int = 2, prompt_len: int = 64) -> torch.Tensor:
    """Logits of a fixed prefill + verify(4) (graph path), to compare variants of the same weights."""
    ids = torch.randint(0, model.config.vocab_size, (B, prompt_len + 4), generator=torch.Generator().manual_seed(5))
    model.setup_cache(B, prompt_len + 16)
    model.prefill(ids[:, :prompt_len].tolist())
    out = model.append(ids[:, prompt_len:].to(model.device)).float()
    model.cache = None
    model._graphs.clear()
    return out


def check_correctness(model, hf, B: int, prompt_len: int, log) -> None:
    """Graph path == eager path (same kernels), and our bf16 error vs an fp32 copy of the same weights is no
    worse than transformers' bf16 error (random weights give near-flat logits, so argmax agreement means little)."""
    import copy

    from verispec.runtime.model import Model
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (B, prompt_len + 4), generator=g).to(model.device)

    def run(m):
        m.setup_cache(B, prompt_len + 16)
        m.prefill(ids[:, :prompt_len].tolist())
        out = m.append(ids[:, prompt_len:]).float()
        m.cache = None
        return out

    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()  # noqa: E731
    ours, eager = run(model), run(Model(model.net, None, use_graphs=False))
    use_kernels = model.net.use_kernels
    model.net.use_kernels = not use_kernels          # the other decode path (Triton kernels <-> torch)
    other = run(model)
    model.net.use_kernels = use_kernels
    with torch.no_grad():
        theirs = hf(ids).logits[:, prompt_len:].float()
    msg = (f"  check: graphs vs eager rel err {rel(ours, eager):.1e}; kernels vs torch path {rel(ours, other):.1e}; "
           f"ours vs transformers (both bf16) {rel(ours, theirs):.1e}")
    ref = None
    if 6 * model.config.num_params < 0.9 * torch.cuda.mem_get_info()[0]:  # an fp32 copy fits: measure all against it
        try:
            ref = run(Model(copy.deepcopy(model.net).float(), None, use_graphs=False))
            msg += (f"; vs fp32 copy: ours {rel(ours, ref):.1e}, other path {rel(other, ref):.1e}, "
                    f"transformers {rel(theirs, ref):.1e}")
        except torch.OutOfMemoryError:
            msg += "; fp32 copy: out of memory"
        torch.cuda.empty_cache()
    log(msg)
    assert rel(ours, eager) < 1e-2, "graph replay differs from the eager pass"
    if ref is not None:  # bf16 paths differ by rounding noise; neither may be much further from fp32
        assert rel(ours, ref) < 2 * rel(other, ref) + 1e-3, "one decode path is much less accurate than the other"


def hf_generate_tok_s(hf, B: int, prompt_len: int, new_tokens: int, vocab: int) -> float:
    ids = torch.randint(0, vocab, (B, prompt_len), generator=torch.Generator().manual_seed(1)).to(hf.device)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, eos_token_id=None)

    def gen(n):
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        sync()
        assert out.shape[1] == prompt_len + n
        return time.perf_counter() - t

    gen(2)  # warm-up
    t1 = statistics.median(gen(1) for _ in range(2))
    tn = gen(1 + new_tokens)
    return B * new_tokens / max(tn - t1, 1e-9)


def bench_variant(name, cfg, model, variant, args, bw, log):
    rows = []
    for B in args.batches:
        model.setup_cache(B, capacity(args))
        g = torch.Generator().manual_seed(B)
        prompts = torch.randint(0, cfg.vocab_size, (B, args.prompt_len), generator=g).tolist()
        model.prefill(prompts)
        base = model.lengths.clone()
        w_bytes, kv_bytes = pass_bytes(model)
        floor = floor_s(w_bytes, bw)
        floor_kv = floor_s(w_bytes + B * kv_bytes, bw)
        times = {}
        for k in args.ks:
            tokens = torch.randint(0, cfg.vocab_size, (B, k), generator=g).to(model.device)
            t0 = time.perf_counter()
            model.append(tokens)        # first call of a bucket captures its graph
            sync()
            capture_s = time.perf_counter() - t0
            model.rollback(base)
            model.cache.max_len_bound = args.prompt_len   # benchmark only: we know the true lengths
            times[k] = time_calls(lambda: model.append(tokens), iters=args.iters, warmup=2)
            model.rollback(base)
            model.cache.max_len_bound = args.prompt_len
            rows.append(dict(model=name, variant=variant, B=B, k=k, ms=times[k] * 1e3, capture_s=capture_s,
                             floor_ms=floor * 1e3, floor_kv_ms=floor_kv * 1e3))
            if args.profile and k == 1 and B == min(args.batches):
                profile_decode(model, tokens, base, args.prompt_len, log)
        t1 = times[min(args.ks)]
        if variant == args.variants[0] and torch.cuda.is_available():
            try:
                from verispec.runtime import ops
                mm = matmul_only_ms(model, B)
                gemv = ops.use_gemv(B, 1)
                ours = matmul_only_ms(model, B, linear=lambda x, w: ops.linear(
                    x, w, None, gemv, ops.gemv_config(model.config.hidden_size)))
                rows[-len(args.ks)]["matmul_only_ms"] = mm
                rows[-len(args.ks)]["matmul_ours_ms"] = ours
                log(f"  matmuls alone B={B:3d}: cuBLAS {mm:.3f} ms ({floor * 1e3 / mm:.1%} of floor), runtime's "
                    f"dispatch (gemv.cu / cuBLAS) {ours:.3f} ms ({floor * 1e3 / ours:.1%})")
            except Exception as e:  # diagnostic only
                log(f"  matmuls alone B={B:3d}: failed ({type(e).__name__}: {e})")
        log(f"  {variant:8s} B={B:3d}: decode {t1 * 1e3:7.3f} ms = {B / t1:9.1f} tok/s; floor {floor * 1e3:.3f} ms "
            f"({floor / t1:5.1%}), floor+KV {floor_kv * 1e3:.3f} ms ({floor_kv / t1:5.1%}); verify/decode k=1..: "
            + " ".join(f"{times[k] / t1:.2f}" for k in args.ks))
    return rows


def bench_model(name, cfg, args, bw, log):
    rows, hf_rows = [], []
    model = load_model(cfg, device=args.device, dtype=args.dtype)
    hf = to_transformers(model.net) if args.hf_tokens else None
    if hf is not None and torch.cuda.is_available():
        check_correctness(model, hf, B=2, prompt_len=64, log=log)
    if hf is not None:
        for B in args.batches:
            tok_s = hf_generate_tok_s(hf, B, args.prompt_len, args.hf_tokens, cfg.vocab_size)
            hf_rows.append(dict(model=name, B=B, tok_s=tok_s))
            log(f"  transformers generate B={B:3d}: {tok_s:9.1f} tok/s")
    del hf
    for variant in args.variants:
        t = time.perf_counter()
        model.net.use_kernels = variant in ("kernels", "kernels-cublas")
        ops_mod().CUDA_GEMV = variant == "kernels" and not args.no_gemv
        if variant == "compiled":
            before = probe(model)
            model.net.compile()
            try:
                after = probe(model)
                err = ((after - before).abs().max() / before.abs().max()).item()
                log(f"  torch.compile'd layer functions: rel err vs eager {err:.1e} (probe incl. compile "
                    f"{time.perf_counter() - t:.1f} s)")
            except Exception as e:
                log(f"  compiled probe FAILED: {type(e).__name__}: {e}")
                continue
        try:
            rows += bench_variant(name, cfg, model, variant, args, bw, log)
            log(f"  ({variant}: {time.perf_counter() - t:.1f} s including graph captures / compilation)")
        except Exception as e:  # keep the other variant's numbers if one fails (e.g. a compile error)
            log(f"  {variant} FAILED: {type(e).__name__}: {e}")
        model.cache = None
        model._graphs.clear()
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows, hf_rows


def write_markdown(path: Path, rows, hf_rows, meta):
    out = [f"# Decode / verify speed of verispec.runtime\n",
           f"{environment_line(meta, meta['bw_tb_s'] * 1e12)} Random {meta['dtype']} weights at the named public "
           f"shapes; prompt length {meta['prompt_len']}, cache capacity {meta['capacity']}. Command: `{meta['cmd']}`.\n",
           "Floor = (layer weights + final norm + LM head bytes) / copy bandwidth. Floor+KV adds the KV bytes the "
           "static-cache attention reads (full capacity per sequence). `ms` is the median of the public "
           "`verify` call (graph replay + logits clone), CUDA events.\n",
           "## Decode (k = 1)\n",
           *table_header(["model", "variant", "B", "ms/step", "tok/s", "floor ms", "% of floor", "% of floor+KV",
                          "matmuls alone ms (cuBLAS / ours)", "transformers tok/s", "speed-up"])]
    hf = {(r["model"], r["B"]): r["tok_s"] for r in hf_rows}
    for r in rows:
        if r["k"] != 1:
            continue
        tok_s = r["B"] / (r["ms"] / 1e3)
        h = hf.get((r["model"], r["B"]))
        mm = f"{r['matmul_only_ms']:.3f} / {r['matmul_ours_ms']:.3f}" if "matmul_only_ms" in r else "–"
        hf_cells = [f"{h:.1f}", f"{tok_s / h:.1f}×"] if h else ["–", "–"]
        out.append(table_row([r['model'], r['variant'], r['B'], f"{r['ms']:.3f}", f"{tok_s:.1f}", f"{r['floor_ms']:.3f}",
                              f"{r['floor_ms'] / r['ms']:.1%}", f"{r['floor_kv_ms'] / r['ms']:.1%}", mm, *hf_cells]))
    ks = sorted({r["k"] for r in rows})
    out += ["\n## Verify pass time (ms) by k, and ratio to decode (k = 1)\n",
            *table_header(["model", "variant", "B", *(f"k={k}" for k in ks), "k=4 / k=1"])]
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["variant"], r["B"]), {})[r["k"]] = r["ms"]
    for (m, v, B), t in groups.items():
        ratio = f"{t[4] / t[1]:.2f}" if 4 in t and 1 in t else "–"
        out.append(table_row([m, v, B, *(f"{t[k]:.3f}" for k in ks), ratio]))
    out.append("\nRaw rows (JSON):\n\n```json\n" + json.dumps(dict(meta=meta, rows=rows, hf=hf_rows)) + "\n```\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="llama-3.1-8b,llama-3.2-1b")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--hf-tokens", type=int, default=32, help="new tokens per transformers generate (0: skip)")
    p.add_argument("--variants", default="kernels",
                   help="comma list of: kernels (the default path on CUDA: Triton decode kernels, gemv.cu / cuBLAS "
                        "matmuls), kernels-cublas (the same with cuBLAS for every matmul), eager (the plain torch "
                        "path: use_kernels=False), compiled (torch path with torch.compile'd layers)")
    p.add_argument("--compile", choices=["off", "on", "both"], default=None,
                   help="old spelling: off = eager, on = compiled, both = eager,compiled (torch path)")
    p.add_argument("--profile", action="store_true", help="kernel-time breakdown of decode at the smallest B")
    p.add_argument("--no-gemv", action="store_true", help="kernels variant: cuBLAS for every matmul (no gemv.cu)")
    p.add_argument("--gemv-config", default=None, help="ROWSxSPLIT of the fixed gemv.cu configuration of every model (default: ops.gemv_config's rule)")
    p.add_argument("--out", default=None, help="markdown path (GPU default: benchmarks/results/decode.md)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    args.device = "cuda" if cuda else "cpu"
    args.dtype = torch.bfloat16 if cuda else torch.float32
    args.variants = ({"off": ["eager"], "on": ["compiled"], "both": ["eager", "compiled"]}[args.compile]
                     if args.compile else args.variants.split(","))
    if not cuda:  # the Triton kernels are CUDA-only in the model
        args.variants = [v for v in args.variants if not v.startswith("kernels")] or ["eager"]
    args.batches = [int(x) for x in args.batches.split(",")]
    args.ks = [int(x) for x in args.ks.split(",")]
    models = [(m, named_shape(m)) for m in args.models.split(",")]
    ops_mod().CUDA_GEMV = not args.no_gemv
    if args.gemv_config:
        rows, split = (int(v) for v in args.gemv_config.lower().split("x"))
        ops_mod().GEMV_CONFIG = (rows, split)
    if not cuda:  # smoke: a tiny model, tiny sizes, so the script itself is tested on CPU
        models, args.batches, args.ks = [("smoke-tiny", SMOKE_CFG)], [1, 2], [1, 2]
        args.prompt_len, args.iters, args.hf_tokens = 16, 3, min(args.hf_tokens, 4)
    if args.out is None and cuda:
        args.out = str(Path(__file__).resolve().parent / "results" / "decode.md")
    log = lambda s: print(s, flush=True)  # noqa: E731
    env = environment()
    if env["transformers"] == "not installed":
        args.hf_tokens = 0
    bw = copy_bandwidth() if cuda else 1e10   # CPU smoke: a nominal rate, the floor columns mean nothing there
    meta = dict(env, dtype=str(args.dtype).replace("torch.", ""), prompt_len=args.prompt_len, capacity=capacity(args),
                bw_tb_s=bw / 1e12, cmd="python benchmarks/decode.py " + " ".join(argv or sys.argv[1:]))
    log(f"{meta['device']}: copy bandwidth {bw / 1e12:.2f} TB/s")
    rows, hf_rows = [], []
    for name, cfg in models:
        log(f"{name}: {cfg.num_params / 1e9:.2f} B params")
        r, h = bench_model(name, cfg, args, bw, log)
        rows += r
        hf_rows += h
        if args.out:  # after every model, so a run cut short still leaves its numbers
            write_markdown(Path(args.out), rows, hf_rows, meta)
            log(f"wrote {args.out}")
    return rows, hf_rows


if __name__ == "__main__":
    main()
