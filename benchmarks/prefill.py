"""Prefill speed (time to first token, B = 1) of verispec.runtime against its floors, by prompt length.

For each model shape (random weights) and prompt length T, the public ``Model.prefill([prompt])`` call
(host packing, one host -> device copy, the pass, the logits), median of CUDA-event timings:
  * old: the torch path (``net.use_kernels = False``: per-layer torch ops, RoPE in fp32 with cat, SDPA);
  * new: the fused-kernel path (``Transformer.prefill_kernels``), replayed as the CUDA graph of the prompt's
    token bucket where ``Model.prefill_bucket`` gives one, eagerly otherwise;
  * new eager: the same kernels without the graph (bucketed lengths only): what the graph pays;
  * new, cuDNN attention: the eager new path with SDPA's cuDNN backend for the attention (longer lengths
    only; ``ops.PREFILL_CUDNN_MIN_TOKENS``, off by default): whether switching it on pays;
  * floors (ms): compute = 2 * params * T / 989 TFLOP/s (dense BF16 peak of an H100 SXM; the issue's
    definition, which counts the embedding and LM head as if every token paid for them); attention =
    the causal attention's 2 * T^2 * H * D * layers FLOPs at that rate (not in the compute floor);
    weights = the bytes a decode step reads (layers, final norm, LM head) / measured copy bandwidth (every
    weight is read at least once);
  * what the parts cost alone, each as one CUDA graph: the layer matmuls at M = T (+ the LM head at M = 1,
    cuBLAS) and the attention (torch SDPA, causal, GQA, all layers): how far cuBLAS + flash alone are from
    the floor, so the rest is the kernels' and the launches' share.
Correctness first, before anything is timed: where an fp32 copy of the weights fits (lengths up to
--ref-max-len), both bf16 paths are compared with its logits and the new path may not be much further from
them than the old one (bf16 paths differ by rounding noise: ~5e-2 max-abs relative on random 8B weights, whose
logits are near-flat); at every length new vs old must also be within --max-rel-err (a wrong kernel gives ~1).

Why a script of its own (not a table in decode.py): the prefill's lengths, floors and variants share nothing
with the decode grid, and each script stays under three minutes on an H100.

  python benchmarks/prefill.py                      # GPU: 8B and 1B -> benchmarks/results/prefill.md (~1.5 min)
  python benchmarks/prefill.py --models llama-3.1-8b --lens 128,1024
  python benchmarks/prefill.py                      # CPU: a tiny smoke run of the old path (no file unless --out)
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import capture_graph, copy_bandwidth, environment, environment_line, floor_s, table_header, \
    table_row, time_calls  # noqa: E402
from benchmarks.decode import pass_bytes  # noqa: E402
from verispec.runtime import ModelConfig, load_model, named_shape, ops  # noqa: E402
from verispec.runtime.model import Model  # noqa: E402

PEAK_FLOPS = 989e12          # H100 SXM dense BF16 tensor-core peak (the issue's floor)
SMOKE_CFG = ModelConfig(vocab_size=512, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=128)
# the issue's measurements of the old path on an H100 (8B, B = 1), for the table's "before" column
ISSUE_OLD_MS = {128: 13.3, 1024: 29.0, 4096: 120.0, 32768: 1370.0}


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def iters_for(T: int, base: int) -> int:
    """Fewer timed calls for long prompts (a 32k prefill of an 8B takes over a second)."""
    return max(3, min(base, int(base * 2048 / max(T, 1))))


def floors(model, T: int, bw: float) -> dict:
    """The floors of one prefill of T tokens (ms): compute (the issue's), attention FLOPs, weight read."""
    c = model.config
    attn_flops = 2 * T * T * c.num_heads * c.head_dim * model.num_active_layers
    weight_bytes, _ = pass_bytes(model)           # layers + final norm + LM head, as a decode step reads them
    return dict(floor_ms=2 * c.num_params * T / PEAK_FLOPS * 1e3, attn_floor_ms=attn_flops / PEAK_FLOPS * 1e3,
                weight_floor_ms=floor_s(weight_bytes, bw) * 1e3)


def matmuls_alone_ms(model, T: int, iters: int) -> float:
    """Median ms of the prefill's weight matmuls alone (4 per layer at M = T, the LM head at M = 1), one graph."""
    net, c = model.net, model.config
    dev, dt = model.device, model.dtype
    xe = torch.randn(T, c.hidden_size, device=dev, dtype=dt)
    xo = torch.randn(T, c.num_heads * c.head_dim, device=dev, dtype=dt)
    xi = torch.randn(T, c.intermediate_size, device=dev, dtype=dt)

    def body():
        for L in net.layers[: model.num_active_layers]:
            F.linear(xe, L.wqkv), F.linear(xo, L.wo), F.linear(xe, L.w13), F.linear(xi, L.w2)
        F.linear(xe[-1:], net.lm_head_weight)

    graph = capture_graph(body)
    ms = time_calls(graph.replay, iters=iters) * 1e3
    del graph
    return ms


def attention_alone_ms(model, T: int, iters: int, backend: str) -> float | None:
    """Median ms of the prefill's attention alone (causal SDPA over T tokens, every layer), one graph.
    backend "flash": SDPA's default choice with GQA (what the runtime runs); "cudnn": SDPA's cuDNN backend with
    K/V repeated to H heads. None where the backend refuses the shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    c = model.config
    H, KV, D = c.num_heads, c.num_kv_heads, c.head_dim
    q = torch.randn(1, H, T, D, device=model.device, dtype=model.dtype)
    k = torch.randn(1, KV, T, D, device=model.device, dtype=model.dtype)
    v = torch.randn_like(k)
    if backend == "cudnn":
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)

    def body():
        for _ in range(model.num_active_layers):
            if backend == "cudnn":
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=H != KV)

    try:
        graph = capture_graph(body)
    except RuntimeError:       # the backend does not take this shape / device
        return None
    ms = time_calls(graph.replay, iters=iters) * 1e3
    del graph
    return ms


def random_prompt(vocab_size: int, T: int) -> list[int]:
    return torch.randint(0, vocab_size, (T,), generator=torch.Generator().manual_seed(T)).tolist()


def fp32_references(model, lens: list[int], log) -> dict[int, torch.Tensor]:
    """Last-token logits [1, V] of an fp32 copy of the weights (torch path) for each prompt length in ``lens``;
    {} where the copy does not fit in free GPU memory. The copy is freed before returning."""
    if not lens or 6 * model.config.num_params > 0.9 * torch.cuda.mem_get_info()[0]:
        log("  fp32 reference: skipped (the copy does not fit)" if lens else "  fp32 reference: no lengths")
        return {}
    ref = Model(copy.deepcopy(model.net).float(), None, use_graphs=False)
    ref.net.use_kernels = False
    ref.setup_cache(1, max(lens))
    out = {T: ref.prefill([random_prompt(model.config.vocab_size, T)]).float() for T in lens}
    del ref
    torch.cuda.empty_cache()
    return out


def check_new_path(name: str, T: int, new: torch.Tensor, old: torch.Tensor, ref: torch.Tensor | None, args,
                   row: dict) -> None:
    """Records the errors in ``row``; AssertionError if the new path is wrong (see the module docstring)."""
    row["rel_err"] = rel(new, old)
    if ref is not None:
        row["rel_err_fp32_new"], row["rel_err_fp32_old"] = rel(new, ref), rel(old, ref)
        if not row["rel_err_fp32_new"] <= 2 * row["rel_err_fp32_old"] + 1e-3:
            raise AssertionError(f"{name} T={T}: new path {row['rel_err_fp32_new']:.2e} from the fp32 logits, "
                                 f"the old path {row['rel_err_fp32_old']:.2e}")
    if not row["rel_err"] < args.max_rel_err:
        raise AssertionError(f"{name} T={T}: new vs old logits rel err {row['rel_err']:.2e} >= {args.max_rel_err}")


def timed_prefill(model, prompt: list[int], iters: int, *, kernels: bool, graphs: bool) -> tuple[float, float]:
    """(median ms of ``model.prefill([prompt])``, seconds of the first call: graph capture / compilation)."""
    model.net.use_kernels, model.use_graphs = kernels, graphs
    t = time.perf_counter()
    model.prefill([prompt])
    sync()
    first_s = time.perf_counter() - t
    return time_calls(lambda: model.prefill([prompt]), iters=iters, warmup=2) * 1e3, first_s


def cudnn_variant_ms(model, prompt: list[int], iters: int, old_logits: torch.Tensor, args) -> float | None:
    """The new path (eager) with its attention on SDPA's cuDNN backend (``ops.PREFILL_CUDNN_MIN_TOKENS = 1``),
    checked against the old path first: median ms, or None where cuDNN refuses the shape."""
    saved = ops.PREFILL_CUDNN_MIN_TOKENS
    ops.PREFILL_CUDNN_MIN_TOKENS = 1
    try:
        model.net.use_kernels, model.use_graphs = True, False
        err = rel(model.prefill([prompt]), old_logits)
        if not err < args.max_rel_err:
            raise AssertionError(f"T={len(prompt)}: the cuDNN attention variant vs old logits rel err {err:.2e}")
        return timed_prefill(model, prompt, iters, kernels=True, graphs=False)[0]
    except RuntimeError:
        return None
    finally:
        ops.PREFILL_CUDNN_MIN_TOKENS = saved


def bench_length(name, model, T: int, args, bw: float, log, ref: torch.Tensor | None) -> dict:
    cuda = model.device.type == "cuda"
    prompt = random_prompt(model.config.vocab_size, T)
    iters = iters_for(T, args.iters)
    row = dict(model=name, T=T, **floors(model, T, bw))
    kernels0, graphs0 = model.net.use_kernels, model.use_graphs
    try:
        model.net.use_kernels = False
        old_logits = model.prefill([prompt])
        row["old_ms"], _ = timed_prefill(model, prompt, iters, kernels=False, graphs=graphs0)
        if cuda and kernels0:
            model.net.use_kernels, model.use_graphs = True, graphs0
            bucket = model.prefill_bucket(1, T)
            check_new_path(name, T, model.prefill([prompt]), old_logits, ref, args, row)
            row["path"] = f"graph {bucket}" if bucket else "eager"
            row["new_ms"], row["first_call_s"] = timed_prefill(model, prompt, iters, kernels=True, graphs=graphs0)
            if bucket:
                row["new_eager_ms"], _ = timed_prefill(model, prompt, iters, kernels=True, graphs=False)
            else:
                row["new_cudnn_ms"] = cudnn_variant_ms(model, prompt, iters, old_logits, args)
            row["matmuls_ms"] = matmuls_alone_ms(model, T, iters)
            row["attn_flash_ms"] = attention_alone_ms(model, T, iters, "flash")
            row["attn_cudnn_ms"] = attention_alone_ms(model, T, iters, "cudnn")
    finally:
        model.net.use_kernels, model.use_graphs = kernels0, graphs0
    new = row.get("new_ms")
    log(f"  T={T:6d}: old {row['old_ms']:9.3f} ms ({row['old_ms'] / row['floor_ms']:5.2f}x floor)"
        + (f"  new {new:9.3f} ms ({new / row['floor_ms']:5.2f}x floor, {row['path']}, first call "
           f"{row['first_call_s']:.2f} s; rel err vs old {row['rel_err']:.1e}"
           + (f", vs fp32 new {row['rel_err_fp32_new']:.1e} old {row['rel_err_fp32_old']:.1e}"
              if "rel_err_fp32_new" in row else "") + ")" if new else "")
        + (f"  new eager {row['new_eager_ms']:.3f} ms" if "new_eager_ms" in row else "")
        + (f"  new, cuDNN attention {_ms(row['new_cudnn_ms'])} ms" if "new_cudnn_ms" in row else "")
        + f"  floors: compute {row['floor_ms']:.3f}, attention {row['attn_floor_ms']:.3f}, weights "
          f"{row['weight_floor_ms']:.3f} ms"
        + (f"; matmuls alone {row['matmuls_ms']:.3f} ms" if "matmuls_ms" in row else ""))
    return row


def bench_model(name, cfg, args, bw, log) -> list[dict]:
    model = load_model(cfg, device=args.device, dtype=args.dtype)
    log(f"{name}: {cfg.num_params / 1e9:.2f} B params")
    refs = fp32_references(model, [T for T in args.lens if T <= args.ref_max_len], log) if args.device == "cuda" \
        else {}
    rows = []
    model.setup_cache(1, max(args.lens))
    for T in args.lens:
        try:
            rows.append(bench_length(name, model, T, args, bw, log, refs.get(T)))
        except torch.OutOfMemoryError as e:     # report the miss, keep the other lengths
            log(f"  T={T}: out of memory ({str(e)[:120]})")
            rows.append(dict(model=name, T=T, error="out of memory"))
        except AssertionError as e:             # a wrong result: not timed, shown in the table and the log
            log(f"  T={T}: WRONG RESULT, not timed: {e}")
            rows.append(dict(model=name, T=T, error=f"WRONG: {e}"))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def _ms(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def write_markdown(path: Path, rows, meta):
    out = ["# Prefill speed of verispec.runtime (time to first token, B = 1)\n",
           f"{environment_line(meta, meta['bw_tb_s'] * 1e12)} Random {meta['dtype']} weights at the named public "
           f"shapes. Command: `{meta['cmd']}`.\n",
           "`old` = the torch path (`net.use_kernels = False`), `new` = the fused-kernel path "
           "(`Transformer.prefill_kernels`: Triton add+RMSNorm, RoPE + KV write, SwiGLU; cuBLAS matmuls; SDPA), "
           "a CUDA graph of the prompt's bucket (`graph T`) or eager; `new eager` = the same kernels without the "
           "graph; `new, cuDNN attention` = the eager new path with its attention on SDPA's cuDNN backend "
           "(`ops.PREFILL_CUDNN_MIN_TOKENS`, off by default; lengths past the graph buckets). All are the public `Model.prefill([prompt])` call (host packing and copy included), median of "
           "CUDA-event timings. Floors: `compute` = 2 · params · T / 989 TFLOP/s (the issue's), `attention` = "
           "2 · T² · H · D · layers FLOPs at that rate (not in `compute`), `weights` = weight bytes / copy "
           "bandwidth. `matmuls` / `attention (flash / cuDNN)` = those parts alone, each one CUDA graph (cuDNN "
           "with K/V repeated to H heads). `rel err` = max |new − old| / max |old| of the last-token logits; `vs fp32` "
           "= the same for new and old against an fp32 copy of the weights (where it fits).\n",
           *table_header(["model", "T", "old ms", "new ms", "path", "new eager ms", "new, cuDNN attention ms",
                          "compute floor ms",
                          "new / floor", "old / floor", "issue's old ms", "attention floor ms", "weights floor ms",
                          "matmuls alone ms", "attention alone ms (flash / cuDNN)", "rel err",
                          "vs fp32 (new / old)"])]
    for r in rows:
        if "error" in r:
            out.append(table_row([r["model"], r["T"], r["error"], *["–"] * 14]))
            continue
        new = r.get("new_ms")
        issue = ISSUE_OLD_MS.get(r["T"]) if r["model"] == "llama-3.1-8b" else None
        out.append(table_row([
            r["model"], r["T"], _ms(r["old_ms"]), _ms(new), r.get("path", "–"), _ms(r.get("new_eager_ms")),
            _ms(r.get("new_cudnn_ms")),
            _ms(r["floor_ms"]), f"{new / r['floor_ms']:.2f}×" if new else "–",
            f"{r['old_ms'] / r['floor_ms']:.2f}×",
            _ms(issue), _ms(r["attn_floor_ms"]), _ms(r["weight_floor_ms"]), _ms(r.get("matmuls_ms")),
            f"{_ms(r.get('attn_flash_ms'))} / {_ms(r.get('attn_cudnn_ms'))}",
            f"{r['rel_err']:.1e}" if "rel_err" in r else "–",
            f"{r['rel_err_fp32_new']:.1e} / {r['rel_err_fp32_old']:.1e}" if "rel_err_fp32_new" in r else "–"]))
    out.append("\nRaw rows (JSON):\n\n```json\n" + json.dumps(dict(meta=meta, rows=rows)) + "\n```\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="llama-3.1-8b,llama-3.2-1b")
    p.add_argument("--lens", default="16,64,128,300,512,1024,4096,32768", help="prompt lengths (tokens)")
    p.add_argument("--iters", type=int, default=20, help="timed calls at T <= 2048 (fewer above)")
    p.add_argument("--max-rel-err", type=float, default=0.15,
                   help="largest new-vs-old logits error accepted (both bf16, ~5e-2 apart; a wrong kernel gives ~1)")
    p.add_argument("--ref-max-len", type=int, default=4096, help="longest prompt checked against an fp32 copy")
    p.add_argument("--out", default=None, help="markdown path (GPU default: benchmarks/results/prefill.md)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    args.device = "cuda" if cuda else "cpu"
    args.dtype = torch.bfloat16 if cuda else torch.float32
    args.lens = [int(x) for x in args.lens.split(",")]
    models = [(m, named_shape(m)) for m in args.models.split(",")]
    if not cuda:  # smoke: a tiny model, tiny sizes, the old path only (the kernels run on CUDA in the model)
        models, args.lens, args.iters = [("smoke-tiny", SMOKE_CFG)], [8, 24], 3
    if args.out is None and cuda:
        args.out = str(Path(__file__).resolve().parent / "results" / "prefill.md")
    log = lambda s: print(s, flush=True)  # noqa: E731
    env = environment()
    bw = copy_bandwidth() if cuda else 1e10   # CPU smoke: a nominal rate, the floor columns mean nothing there
    meta = dict(env, dtype=str(args.dtype).replace("torch.", ""), bw_tb_s=bw / 1e12, peak_flops=PEAK_FLOPS,
                cmd="python benchmarks/prefill.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    log(f"{meta['device']}: copy bandwidth {bw / 1e12:.2f} TB/s")
    rows = []
    for name, cfg in models:
        t = time.perf_counter()
        rows += bench_model(name, cfg, args, bw, log)
        log(f"  ({name}: {time.perf_counter() - t:.1f} s)")
        if args.out:  # after every model, so a run cut short still leaves its numbers
            write_markdown(Path(args.out), rows, meta)
            log(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
