"""Quantized weights on the GPU: packed.cu against the bf16 path and the byte floor, a whole 8B Q4_K_M model, its
prefill, speculation on it, and the embedded SmolLM2 from its packed blocks.

Four parts, each writing ``<out>/quant_<part>.json`` and its markdown section (``quant_<part>.md``, also printed);
``report`` joins the sections present into ``<out>/quant.md`` (and, with ``--write``, ``benchmarks/results/quant.md``):

    python benchmarks/quant.py kernel --out DIR   the 8B shape classes (q/o, k/v, gate+up, down, LM head) x Q4_K, Q6_K,
                                                  Q4_0, Q8_0, Q4_1: packed.cu's variants (--variants, default 1,2) us
                                                  at M = 1, 2, 4, 8, 9, 16 vs invariant.cu on bf16 weights vs the
                                                  packed-byte floor; each variant's rows == alone, v2 == v1 bits, v3 vs
                                                  the reference; the prefill's dequantizer (us, == the torch one)
    python benchmarks/quant.py model --out DIR    llama-3.1-8b in Q4_K_M (random blocks, llama.cpp's type mix) vs bf16:
                                                  decode ms/token at B = 1 (--model-variants, default 2,1;
                                                  --dequant-pass), tok/s, % of floor; verify passes of 2..9 tokens vs
                                                  decode; a k-token pass == k decode steps (bits, the first variant);
                                                  decode at B = 1, 8, 32 (--batches: ms/step, tok/s, % of the floor of
                                                  weights + KV cache); prefill of 128 and 1024 tokens vs bf16
    python benchmarks/quant.py spec --out DIR     speculation on llama-3.1-8b Q4_K_M (random blocks, make_peaked: the
                                                  head keeps its blocks) with an OracleDraft (alpha 0.8, 0.9) whose
                                                  draft steps are passes of a llama-3.2-1b Q8_0, B = 1 and 32 (--batches),
                                                  chain K = 2, 3, 4, 6 (the fastest marked) vs plain decoding of the
                                                  same model in the same run; the analytical bound from measured pass
                                                  costs beside each cell; every output == plain decoding's
    python benchmarks/quant.py smollm --out DIR   the embedded SmolLM2-135M (Q4_1 + Q8_0) packed on the GPU vs its dense
                                                  bf16 load: tok/s, greedy text packed vs dense, speculative greedy ==
                                                  plain greedy on the packed model (prompt lookup, self-speculation, a
                                                  draft model)
    python benchmarks/quant.py report DIR [--write]

Random blocks: the quantized bytes are uniform random, the scale fields (d, dmin, sub-block scales) copied from real
quantizations of N(0, 0.02) rows, so every weight is finite and of a trained model's size, and no 8B quantization is
needed (its K-quant search would take minutes). Speed does not depend on the values. Timings: median over CUDA-graph
replays (benchmarks/common.py); matmul weights rotate over copies that exceed L2.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import (bit_check_table, capture_graph, copy_bandwidth, environment, environment_line,  # noqa: E402
                               graph_us_per_call, markdown_table, time_calls)

RESULTS = Path(__file__).resolve().parent / "results"
TYPES = ("Q4_K", "Q6_K", "Q4_0", "Q8_0", "Q4_1")
# llama-3.1-8b's matmul classes: (name, N, K)
SHAPES = (("q/o", 4096, 4096), ("k/v", 1024, 4096), ("gate+up", 28672, 4096), ("down", 4096, 14336),
          ("lm_head", 128256, 4096))


def matmul_shapes(name: str) -> tuple:
    """A named model shape's matmul classes (name, N, K), as SHAPES for llama-3.1-8b."""
    from verispec.runtime.config import named_shape

    c = named_shape(name)
    hd = c.hidden_size // c.num_heads
    return (("q/o", c.num_heads * hd, c.hidden_size), ("k/v", c.num_kv_heads * hd, c.hidden_size),
            ("gate+up", 2 * c.intermediate_size, c.hidden_size), ("down", c.hidden_size, c.intermediate_size),
            ("lm_head", c.vocab_size, c.hidden_size))
MS = (1, 2, 4, 8, 9, 16)
# Quoted, not measured here: the peer figures (H100, Llama-3.1-8B, batch 1).
PEERS = ("torchao int4 weight-only: 241 tok/s (torchao README; quoted in issue 24, not measured here); "
         "llama.cpp Q4_K_M: about 190 tok/s on a 9B (quoted in issue 24, not measured here)")
# Each format's scale fields within a block (byte ranges): copied from real quantizations, the rest random.
HEADER = {"Q4_0": ((0, 2),), "Q4_1": ((0, 4),), "Q8_0": ((0, 2),), "Q4_K": ((0, 16),), "Q6_K": ((192, 210),)}


@functools.lru_cache(maxsize=None)
def _real_blocks(name: str, K: int, device: str) -> torch.Tensor:
    """uint8 [16, row bytes]: 16 rows of N(0, 0.02) weights quantized to ``name`` (once per type and row length)."""
    from verispec.runtime.quant import quantize

    if name == "Q4_1":          # verispec does not quantize to Q4_1: d, m of a 4-bit grid over [-0.02, 0.02]
        d = torch.full((16, K // 32), 0.04 / 15, device=device).half()
        m = torch.full((16, K // 32), -0.02, device=device).half()
        return torch.cat([d.view(torch.uint8).view(16, -1, 2), m.view(torch.uint8).view(16, -1, 2),
                          torch.zeros(16, K // 32, 16, dtype=torch.uint8, device=device)], dim=2).view(16, -1)
    gen = torch.Generator(device=device).manual_seed(K)
    return quantize(torch.randn(16, K, device=device, generator=gen) * 0.02, name)


def random_blocks(name: str, N: int, K: int, seed: int = 0, device="cuda") -> torch.Tensor:
    """uint8 [N, row bytes] blocks of ``name``: random quantized bytes, scale fields of 16 real rows (tiled)."""
    from verispec.runtime.quant.formats import BY_NAME

    fmt = BY_NAME[name]
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks = torch.randint(0, 256, (N, fmt.row_bytes(K)), dtype=torch.uint8, device=device, generator=gen)
    real = _real_blocks(name, K, str(device))                                                # [16, row bytes]
    nb = K // fmt.block_size
    view, rview = blocks.view(N, nb, fmt.type_size), real.view(16, nb, fmt.type_size)
    rows = torch.arange(N, device=device) % 16
    for a, b in HEADER[name]:
        view[:, :, a:b] = rview[rows, :, a:b]
    return blocks


def _save_partial(args, out: dict) -> None:
    """What a part has measured so far, to <out>/quant_<part>.partial.json (kept if the part dies later)."""
    Path(args.partial).write_text(json.dumps(out, indent=1))


# ------------------------------------------------------------------------------------------------ kernel
def kernel_part(args) -> dict:
    from verispec.runtime import gemv as vg
    from verispec.runtime.quant import dequantize
    from verispec.runtime.quant.formats import BY_NAME

    bw = copy_bandwidth()
    out = dict(env=environment(), bandwidth=bw, rows=[], checks=[], dequant=[], shape=args.kernel_shape)
    types = args.types.split(",")
    ms = [int(m) for m in args.ms.split(",")]
    variants = _variants(args.variants)
    for shape, N, K in matmul_shapes(args.kernel_shape):
        # bf16 reference path: invariant.cu on dense weights (what a bf16 model's pass runs)
        w16 = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
        copies = max(2, -(-args.rotate_mb * 2**20 // (N * K * 2)))
        w16s = [w16] + [w16.clone() for _ in range(copies - 1)]
        bf16_us = {}
        for M in ms:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            bf16_us[M] = graph_us_per_call(lambda i: vg.invariant_matmul(x, w16s[i % copies]), args.calls, args.reps)
        del w16s, w16
        torch.cuda.empty_cache()
        for name in types:
            fmt = BY_NAME[name]
            blocks = random_blocks(name, N, K, seed=N + K)
            nbytes = blocks.numel()
            qtype = fmt.ggml_type
            # checks: each variant's rows of a max(ms)-row pass == the same rows in every smaller pass and alone;
            # v2 == v1 bit for bit; v3 against the torch dequantizer + fp32 matmul on 256 rows (its own order: error
            # in units of |x| @ |W|^T); the dequantizer == torch's
            x = torch.randn(max(ms), K, device="cuda", dtype=torch.bfloat16)
            ys = {v: vg.packed_matmul(x, blocks, qtype, variant=v) for v in variants}
            alone = all(torch.equal(vg.packed_matmul(x[:M], blocks, qtype, variant=v), ys[v][:M]) for v in variants
                        for M in ms) and \
                all(torch.equal(vg.packed_matmul(x[i:i + 1], blocks, qtype, variant=v), ys[v][i:i + 1])
                    for v in variants for i in (0, 5) if i < len(x))
            head = blocks[:256]                                  # the torch dequantizer on 256 rows (memory)
            ref = dequantize(head, qtype)
            deq_ok = all(torch.equal(vg.packed_dequantize(head, qtype, K, torch.float32, variant=v), ref) and
                         torch.equal(vg.packed_dequantize(head, qtype, K, torch.bfloat16, variant=v),
                                     ref.bfloat16()) for v in (1, 2))
            finite = all(bool(torch.isfinite(y).all()) for y in ys.values())
            check = dict(shape=shape, type=name, N=N, K=K, alone=alone, dequant_equals_torch=deq_ok, finite=finite)
            if 1 in ys and 2 in ys:
                bad = [M for M in ms if not torch.equal(ys[2][:M], ys[1][:M])]
                check.update(v2_equals_v1=not bad, bad_m=bad)
            for v in (4, 5):            # v3's bits, with and without PDL
                if 3 in ys and v in ys:
                    check[f"v{v}_equals_v3"] = torch.equal(ys[v], ys[3]) and torch.equal(
                        vg.packed_matmul(x, blocks, qtype, variant=v, pdl=True), ys[3])
            if 3 in ys:
                exact = x.float() @ ref.T                                                     # [max(ms), 256]
                scale = x.float().abs() @ ref.abs().T
                check["v3_err"] = float(((ys[3][:, :256].float() - exact).abs() - exact.abs() * 2.0 ** -8).clamp(min=0)
                                        .div(scale).max())                                # beyond bf16's rounding
            out["checks"].append(check)
            print("check", json.dumps(check), flush=True)
            del ys, ref
            copies = max(2, -(-args.rotate_mb * 2**20 // nbytes))
            bs = [blocks] + [blocks.clone() for _ in range(copies - 1)]
            calls = args.calls if nbytes < 2**28 else max(2, args.calls // 3)     # the LM head: fewer, longer calls
            for M in ms:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                row = dict(shape=shape, type=name, N=N, K=K, M=M, packed_mb=nbytes / 1e6, floor_us=nbytes / bw * 1e6,
                           bf16_floor_us=N * K * 2 / bw * 1e6, bf16_us=bf16_us[M])
                for v in variants:
                    row[f"v{v}_us"] = graph_us_per_call(
                        lambda i: vg.packed_matmul(x, bs[i % copies], qtype, variant=v), calls, args.reps)
                if 4 in variants:        # v4 launched with PDL: each call's weight copies start under the previous call
                    row["v4pdl_us"] = graph_us_per_call(
                        lambda i: vg.packed_matmul(x, bs[i % copies], qtype, variant=4, pdl=True), calls, args.reps)
                out["rows"].append(row)
                print("time", json.dumps(row), flush=True)
            # the prefill's dequantizer: blocks -> bf16 [N, K] (reads the packed bytes, writes 2 bytes a weight)
            dq = {}
            for v in (1, 2):
                dq[v] = graph_us_per_call(lambda i: vg.packed_dequantize(bs[i % copies], qtype, K, torch.bfloat16,
                                                                         variant=v), 4, args.reps)
            moved = nbytes + N * K * 2
            out["dequant"].append(dict(shape=shape, type=name, N=N, K=K, v1_us=dq[1], v2_us=dq[2],
                                       floor_us=moved / bw * 1e6))
            print("dequant", json.dumps(out["dequant"][-1]), flush=True)
            del bs, blocks
            torch.cuda.empty_cache()
            _save_partial(args, out)
    return out


def _variants(spec: str) -> list[int]:
    """``--variants`` "2,3" -> [2, 3] (packed.cu's variants, gemv.PACKED_VARIANTS)."""
    from verispec.runtime.gemv import PACKED_VARIANTS

    out = [int(v) for v in spec.split(",")]
    if not out or any(v not in PACKED_VARIANTS for v in out):
        raise SystemExit(f"--variants: a comma list of {PACKED_VARIANTS}, got {spec!r}")
    return out


def kernel_markdown(res: dict) -> list[str]:
    timed = sorted({int(k[1:-3]) for r in res["rows"] for k in r if re.fullmatch(r"v\d+_us", k)})
    names = [f"v{v}" for v in timed] + (["v4pdl"] if any("v4pdl_us" in r for r in res["rows"]) else [])
    lines = [f"## The matmul: packed.cu vs invariant.cu on bf16 weights ({res.get('shape', 'llama-3.1-8b')} shapes)", "",
             environment_line(res["env"], res["bandwidth"]), "",
             f"Checks, per shape and type, for packed.cu {', '.join(names)}: each variant's rows of a 16-row product == "
             "the same rows in every smaller product timed and rows 0 and 5 computed alone (`alone == in pass`); v2 == "
             "v1 bit for bit where both ran; v3 (its own order) against the torch dequantizer + fp32 matmul on 256 "
             "rows: the largest error beyond bf16's output rounding, in units of |x| @ |W|^T (tests/test_quant_gpu.py "
             "bounds it by 2^-14 = 6.1e-05); the prefill's dequantizer (v1 and v2, fp32 and bf16) == the torch "
             "dequantizer (quant/dequantize.py, itself gguf-py's bit for bit) on 256 rows; v4 / v5 == v3 bit for bit (with "
             "and without PDL) where both ran. `v4pdl`: v4 launched with programmatic dependent launch (its weight copies "
             "start while the previous call finishes).", ""]
    head = ["shape", "type", "N x K", "alone == in pass"]
    has12 = any("v2_equals_v1" in c for c in res["checks"])
    has3 = any("v3_err" in c for c in res["checks"])
    same3 = [v for v in (4, 5) if any(f"v{v}_equals_v3" in c for c in res["checks"])]
    head += (["v2 == v1"] if has12 else []) + (["v3 error"] if has3 else []) + [f"v{v} == v3" for v in same3] + \
        ["dequantizer == torch", "finite"]
    rows = []
    for c in res["checks"]:
        row = [c["shape"], c["type"], f"{c['N']}x{c['K']}", "yes" if c["alone"] else "NO"]
        if has12:
            row.append("-" if "v2_equals_v1" not in c else "yes" if c["v2_equals_v1"] else f"NO {c['bad_m']}")
        if has3:
            row.append(f"{c['v3_err']:.1e}" if "v3_err" in c else "-")
        for v in same3:
            key = f"v{v}_equals_v3"
            row.append("-" if key not in c else "yes" if c[key] else "NO")
        rows.append((*row, "yes" if c["dequant_equals_torch"] else "NO", "yes" if c["finite"] else "NO"))
    lines += markdown_table(head, rows)
    lines += ["", "us per call (CUDA graph of back-to-back calls on rotating copies: weights from HBM). floor = packed "
              "bytes / copy bandwidth; `% floor` = floor / the fastest variant; bf16 = invariant.cu on the dense bf16 "
              "matrix (the bf16 model's path), its own floor is 2 bytes a weight.",
              ""]
    trows = []
    for r in res["rows"]:
        best = min(r[f"{n}_us"] for n in names)
        trows.append((r["shape"], r["type"], r["M"], f"{r['packed_mb']:.1f}", f"{r['floor_us']:.1f}",
                      *(f"{r[f'{n}_us']:.1f}" for n in names), f"{r['floor_us'] / best:.0%}",
                      f"{r['bf16_us']:.1f}", f"{r['bf16_us'] / best:.2f}x"))
    lines += markdown_table(["shape", "type", "M", "packed MB", "floor", *names, "best % floor", "bf16 invariant",
                             "bf16 / best packed"], trows)
    lines += ["", "The prefill's dequantizer (blocks -> bf16 [N, K]; floor = packed bytes read + 2 bytes a weight "
              "written):", ""]
    lines += markdown_table(["shape", "type", "floor us", "v1 us", "v2 us", "v2 % floor"],
                            [(d["shape"], d["type"], f"{d['floor_us']:.1f}", f"{d['v1_us']:.1f}", f"{d['v2_us']:.1f}",
                              f"{d['floor_us'] / d['v2_us']:.0%}") for d in res["dequant"]])
    return lines


# ------------------------------------------------------------------------------------------------ model
def packed_random_model(shape, mix_name: str = "Q4_K_M", seed: int = 0, device="cuda", dtype=torch.bfloat16):
    """A Model of ``shape`` (a name or a ModelConfig) whose matrices are PackedWeights of random blocks
    (``random_blocks``) in ``mix_name``'s type mix (llama.cpp's rule, quant/mix.py), unit norms, no tokenizer."""
    from verispec.runtime.config import named_shape
    from verispec.runtime.loading import FUSED_GGUF, _empty_net
    from verispec.runtime.model import Model
    from verispec.runtime.quant.formats import BY_NAME
    from verispec.runtime.quant.mix import get_mix, tensor_type
    from verispec.runtime.quant.packed import PackedWeight

    cfg = named_shape(shape) if isinstance(shape, str) else shape
    E, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    rows = {"token_embd": (cfg.vocab_size, E), "output": (cfg.vocab_size, E), "attn_q": (cfg.num_heads * D, E),
            "attn_k": (cfg.num_kv_heads * D, E), "attn_v": (cfg.num_kv_heads * D, E),
            "attn_output": (E, cfg.num_heads * D), "ffn_gate": (I, E), "ffn_up": (I, E), "ffn_down": (E, I)}
    mix = get_mix(mix_name)
    packed, n = {}, 0
    for attr, names in FUSED_GGUF.items():
        if attr == "lm_head" and cfg.tie_word_embeddings:
            continue
        for i in range(cfg.num_layers) if "{i}" in attr else [None]:
            parts = []
            for gname in names:
                gname = gname.format(i=i)
                N, K = rows[gname.split(".")[-2]]
                t = tensor_type(gname, (K, N), mix, cfg.num_layers, cfg.tie_word_embeddings)
                parts.append((BY_NAME[t].ggml_type, random_blocks(t, N, K, seed=seed + n, device=device)))
                n += 1
            packed[attr.format(i=i)] = PackedWeight(parts, rows[names[0].split('.')[-2]][1], dtype)
    with torch.no_grad():
        net = _empty_net(cfg, torch.device(device), dtype, packed)
        for name, p in net.named_parameters():
            p.fill_(1.0)                                   # what is left dense: the norms
    return Model(net, None)


def _decode_floor_bytes(model) -> int:
    """Bytes a B = 1 decode step must read: the weights but the embedding table (one row of it is read)."""
    from verispec.runtime.quant.packed import PackedWeight

    e = model.net.embed
    embed = e.nbytes if isinstance(e, PackedWeight) else e.numel() * e.element_size()
    tied = model.net.lm_head is None
    return model.weight_bytes - (0 if tied else embed)


def _prefill_ms(model, T: int, reps: int) -> float:
    """Median ms of one captured ``prefill_kernels`` of one T-token prompt into cache row 0."""
    V = model.config.vocab_size
    tokens = torch.randint(0, V, (1, T), device="cuda")
    last = torch.tensor([T - 1], device="cuda")
    row = torch.zeros(1, dtype=torch.long, device="cuda")
    graph = capture_graph(lambda: model.net.prefill_kernels(tokens, last, model._rope, model.cache,
                                                            model.num_active_layers, row), 1)
    ms = time_calls(graph.replay, iters=reps, warmup=2) * 1e3
    del graph
    return ms


CONTEXT = 512       # tokens each sequence holds when a decode / verify pass is timed


def _kv_bytes_per_token(model) -> int:
    """Bytes of one token's K and V over every active layer (what a decode step reads per token of context)."""
    cfg = model.config
    return model.num_active_layers * 2 * cfg.num_kv_heads * cfg.head_dim * model.cache.k[0].element_size()


def _model_timings(model, label: str, tokens: list[int], prefill: list[int], reps: int, variants: dict,
                   batches: list[int] = (1,)) -> dict:
    """Decode / verify pass ms at B = 1 for each setting in ``variants`` ({name: (ops attribute, value)}), decode ms
    at each B of ``batches`` (every sequence at CONTEXT tokens), and prefill ms."""
    from benchmarks.exact import _pass_ms
    from verispec.runtime import ops

    entry = dict(model=label, weight_bytes=model.weight_bytes, floor_bytes=_decode_floor_bytes(model), passes={},
                 decode={}, context=CONTEXT, prefill={})
    model.setup_cache(max(batches), max(prefill + [0]) + 600, empty=True)
    gen = torch.Generator().manual_seed(0)
    model.admit([torch.randint(0, model.config.vocab_size, (CONTEXT,), generator=gen).tolist()
                 for _ in range(max(batches))])
    entry["kv_bytes_per_token"] = _kv_bytes_per_token(model)
    for vname, settings in variants.items():
        saved = {k: getattr(ops, k) for k in settings}
        for k, v in settings.items():
            setattr(ops, k, v)
        entry["passes"][vname] = {T: _pass_ms(model, 1, T, reps) for T in tokens}
        # B = 1 is the passes' 1-token pass when timed there: the same graph at the same context
        entry["decode"][vname] = {B: entry["passes"][vname][1] if B == 1 and 1 in tokens
                                  else _pass_ms(model, B, 1, reps) for B in batches}
        for k, v in saved.items():
            setattr(ops, k, v)
        print("pass", label, vname, json.dumps(entry["passes"][vname]), "decode", json.dumps(entry["decode"][vname]),
              flush=True)
    for T in prefill:
        entry["prefill"][T] = _prefill_ms(model, T, max(5, reps // 4))
        print("prefill", label, T, f"{entry['prefill'][T]:.2f} ms", flush=True)
    return entry


def model_part(args) -> dict:
    from benchmarks.exact import _pass_bit_checks
    from verispec import load_model
    from verispec.runtime import ops

    bw = copy_bandwidth()
    out = dict(env=environment(), bandwidth=bw, models=[], shape=args.shape)
    tokens = [int(t) for t in args.tokens.split(",")]
    prefill = [int(t) for t in args.prefill.split(",") if t]
    t0 = time.time()
    model = packed_random_model(args.shape, "Q4_K_M")
    out["build_s"] = time.time() - t0
    print(f"built {args.shape} Q4_K_M (random blocks) in {out['build_s']:.1f} s: {model.weight_bytes / 1e9:.2f} GB",
          flush=True)
    variants = {f"v{v}": dict(PACKED_VARIANT=v) for v in _variants(args.model_variants)}
    if args.dequant_pass:
        variants["dequantize per pass"] = dict(PACKED_GEMV=False)
    batches = _batches(args.batches or "1,8,32")
    entry = _model_timings(model, f"{args.shape} Q4_K_M (packed)", tokens, prefill, args.reps, variants, batches)
    out["models"].append(entry)
    _save_partial(args, out)
    first = next(iter(variants))                          # the bit checks run the first variant listed
    saved, ops.PACKED_VARIANT = ops.PACKED_VARIANT, variants[first]["PACKED_VARIANT"]
    entry["bit_checks"] = _pass_bit_checks(model, ops)
    entry["bit_variant"] = first
    ops.PACKED_VARIANT = saved
    _save_partial(args, out)
    del model
    torch.cuda.empty_cache()
    model = load_model(args.shape, device="cuda", dtype=torch.bfloat16)
    out["models"].append(_model_timings(model, f"{args.shape} bf16", tokens, prefill, args.reps,
                                        {"invariant": dict(MATMUL="invariant")}, batches))
    del model
    torch.cuda.empty_cache()
    return out


def decode_batches_markdown(res: dict) -> list[str]:
    """The decode step at each B timed (``--batches``): ms, tok/s, % of its floor (weights + the batch's KV cache)."""
    bw = res["bandwidth"]
    rows = []
    for m in res["models"]:
        for vname, per_b in m.get("decode", {}).items():
            for B, ms in sorted((int(b), ms) for b, ms in per_b.items()):
                floor_ms = (m["floor_bytes"] + B * m["context"] * m["kv_bytes_per_token"]) / bw * 1e3
                rows.append((m["model"], vname, B, f"{ms:.2f}", f"{B * 1e3 / ms:.0f}", f"{floor_ms:.2f}",
                             f"{floor_ms / ms:.0%}"))
    if not rows:
        return []
    context = res["models"][0]["context"]
    return ["", f"Decode steps at batch B (one token for each of B sequences of {context} tokens; tok/s = B / step). "
            f"floor = (the weights a step reads + the B sequences' KV cache, {context} tokens each) / copy "
            "bandwidth.", ""] + markdown_table(["model", "matmuls", "B", "ms / step", "tok/s", "floor ms", "% floor"],
                                               rows)


def model_markdown(res: dict) -> list[str]:
    bw = res["bandwidth"]
    lines = [f"## The whole model: {res['shape']} in Q4_K_M vs bf16 (random weights, context {CONTEXT})", "",
             environment_line(res["env"], bw), "",
             "ms per `Transformer.append` of T tokens at B = 1 (one CUDA graph, median of replays). Q4_K_M: "
             "llama.cpp's type mix (Q4_K; Q6_K for the LM head and half the attn_v / ffn_down), random blocks with "
             "real scales. floor = the bytes a step reads (every weight but the embedding table) / copy bandwidth. "
             "`dequantize per pass`: VERISPEC_PACKED_GEMV=0 (each matrix dequantized to bf16, then invariant.cu: "
             "memory savings only).", ""]
    rows = []
    for m in res["models"]:
        floor_ms = m["floor_bytes"] / bw * 1e3
        for vname, passes in m["passes"].items():
            one = passes.get("1") or passes.get(1)
            cells = {int(t): ms for t, ms in passes.items()}
            rows.append((m["model"], vname, f"{m['floor_bytes'] / 1e9:.2f}", f"{floor_ms:.2f}", f"{one:.2f}",
                         f"{1e3 / one:.0f}", f"{floor_ms / one:.0%}",
                         ", ".join(f"{T}: {ms / one:.2f}" for T, ms in sorted(cells.items()) if T > 1)))
    lines += markdown_table(["model", "matmuls", "GB read", "floor ms", "decode ms", "tok/s", "% floor",
                             "T tokens: pass / decode"], rows)
    lines += decode_batches_markdown(res)
    lines += ["", f"Peers (not this run): {PEERS}.", ""]
    pre = {m["model"]: {int(t): ms for t, ms in m["prefill"].items()} for m in res["models"]}
    names = list(pre)
    if len(names) == 2 and pre[names[0]]:
        lines += ["Prefill of one prompt (`prefill_kernels`, one CUDA graph): packed = each matrix dequantized to bf16 "
                  "(packed.cu's dequantizer) then cuBLAS, the LM head on the last token through packed.cu.", ""]
        lines += markdown_table(["tokens", f"{names[0]} ms", f"{names[1]} ms", "packed / bf16"],
                                [(T, f"{pre[names[0]][T]:.2f}", f"{pre[names[1]][T]:.2f}",
                                  f"{pre[names[0]][T] / pre[names[1]][T]:.2f}x") for T in sorted(pre[names[0]])])
        lines.append("")
    for m in res["models"]:
        if "bit_checks" in m:
            via = f", packed.cu {m['bit_variant']}" if "bit_variant" in m else ""
            lines += [f"Bit checks on {m['model']} (Model.append, graphs and width buckets on{via}): a k-token pass vs k "
                      "single-token passes, and the same sequence's rows inside a batch of 3 ragged sequences:", ""]
            lines += bit_check_table(m["bit_checks"])
            lines.append("")
    return lines


# ------------------------------------------------------------------------------------------------ spec
SPEC_KS = (2, 3, 4, 6)
SPEC_ALPHAS = (0.8, 0.9)


def spec_costs(target, draft, B: int, ks, context: int, max_seq_len: int, pass_ms) -> dict:
    """ms of the passes the analytical bound needs at batch B, every sequence at ``context`` tokens: the target's
    decode step (1 token each), its verify pass of k + 1 tokens for each k of ``ks`` at the width the engine runs it
    (``Model.graph_width``: the smallest graph bucket of >= k + 1 tokens, e.g. 5 for k = 3), and a draft step (1 token
    each). ``pass_ms(model, B, T)`` times one pass of T tokens for each of the model's first B sequences (``_pass_ms``
    on a GPU: one CUDA graph, median of replays)."""
    gen = torch.Generator().manual_seed(B)
    for model in (target, draft):
        model.setup_cache(B, max_seq_len, empty=True)
        model.admit([torch.randint(0, model.config.vocab_size, (context,), generator=gen).tolist() for _ in range(B)])
    width = {k: target.graph_width(k + 1) or k + 1 for k in ks}
    return dict(B=B, context=context, decode_ms=pass_ms(target, B, 1), verify_width=width,
                verify_ms={k: pass_ms(target, B, width[k]) for k in ks}, draft_ms=pass_ms(draft, B, 1))


def spec_cells(target, draft, batches, alphas, ks, prompt_tokens: int, new_tokens: int, pass_ms,
               synchronize=lambda: None, progress=lambda res: None) -> dict:
    """Speculation on ``target`` with ``OracleDraft`` (acceptance alpha, each draft step paid by ``draft``'s passes)
    vs plain decoding of the same model, at each batch size: each alpha x chain K, its tok/s and its speedup over
    plain decoding in the same run (``benchmarks/trees.e2e_cells``: a warm-up call of the same shapes, then the timed
    call), the analytical bound from the measured pass costs (``spec_costs``) beside it, and whether the output equals
    plain decoding's. The best K of each (B, alpha) by measured tok/s is marked ``best``. ``progress(res)`` after
    each (B, alpha): what is measured so far."""
    from benchmarks.trees import e2e_cells
    from verispec.analysis import expected_tokens_per_round, speedup_from_times
    from verispec.runtime.tree import MAX_TREE_TOKENS

    out = dict(batches=list(batches), alphas=list(alphas), ks=list(ks), prompt_tokens=prompt_tokens,
               new_tokens=new_tokens, costs=[], cells=[])
    for B in batches:
        # the costs at the mean context of a generation, in a cache of e2e_cells' size (no re-allocation after)
        cost = spec_costs(target, draft, B, ks, prompt_tokens + new_tokens // 2,
                          prompt_tokens + new_tokens + MAX_TREE_TOKENS + 1, pass_ms)
        out["costs"].append(cost)
        print("spec costs", json.dumps(cost), flush=True)
        plain = None
        for alpha in alphas:
            configs = ([("plain", None, None)] if plain is None else []) + [(f"chain k={k}", k, None) for k in ks]
            cells = e2e_cells(target, draft, [B], prompt_tokens, new_tokens, configs, synchronize, rates={1: alpha})
            for (_, k, _), cell in zip(configs, cells):
                if k is None:
                    plain = cell
                    cell.update(alpha=None, k=0)
                else:
                    cell.update(alpha=alpha, k=k, expected_tokens_per_round=expected_tokens_per_round(alpha, k),
                                bound=speedup_from_times(alpha, k, cost["draft_ms"], cost["verify_ms"][k],
                                                         cost["decode_ms"]))
                cell["speedup"] = cell["tok_s"] / plain["tok_s"]
            chains = [c for c in cells if c["k"]]
            best = max(chains, key=lambda c: c["tok_s"])
            for c in chains:
                c["best"] = c is best
            out["cells"] += cells
            progress(out)
    return out


def spec_part(args) -> dict:
    from benchmarks.exact import _pass_ms
    from verispec.drafters import make_peaked
    from verispec.engine import generate

    t0 = time.time()
    target = packed_random_model(args.shape, "Q4_K_M")
    successor = make_peaked(target)      # the head keeps its blocks: a step's bytes are the unpeaked model's
    draft = packed_random_model(args.draft_shape, "Q8_0", seed=1 << 16)
    build_s = time.time() - t0
    print(f"built {args.shape} Q4_K_M (a step reads {_decode_floor_bytes(target) / 1e9:.2f} GB, peaked) and "
          f"{args.draft_shape} Q8_0 ({_decode_floor_bytes(draft) / 1e9:.2f} GB) in {build_s:.1f} s", flush=True)
    # the peaking holds: plain greedy follows the successor chain. NOTE: its wide margins make the `exact` column a
    # check of the engine's token bookkeeping (acceptance, rollback, batching), not of the passes' bits: a small
    # numerical difference between a verify pass and a decode step flips no peaked token. The model part's bit
    # checks (a k-token pass == k decode steps, torch.equal on the logits) are that check.
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, target.config.vocab_size, (args.prompt_tokens,), generator=gen).tolist()
    probe = generate(target, [prompt], max_new_tokens=32)[0].tokens
    follows = sum(b == successor[a] for a, b in zip(probe, probe[1:])) / (len(probe) - 1)
    print(f"plain greedy follows the successor chain on {follows:.0%} of 32 steps", flush=True)
    meta = dict(env=environment(), shape=args.shape, draft=args.draft_shape, target_bytes=_decode_floor_bytes(target),
                draft_bytes=_decode_floor_bytes(draft), build_s=build_s, follows_successor=follows)
    res = spec_cells(target, draft, _batches(args.batches or "1,32"), [float(a) for a in args.alphas.split(",")],
                     [int(k) for k in args.ks.split(",")], args.prompt_tokens, args.new_tokens,
                     lambda model, B, T: _pass_ms(model, B, T, args.reps), torch.cuda.synchronize,
                     lambda res: _save_partial(args, {**meta, **res}))
    return {**meta, **res}


def _batches(spec: str) -> list[int]:
    """``--batches`` "1,8,32" -> [1, 8, 32]."""
    try:
        out = [int(b) for b in spec.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise SystemExit(f"--batches: a comma list of batch sizes >= 1, got {spec!r}")
    return out


def _at(d: dict, k: int):
    """d[k] for a dict with int keys, or str keys once read back from JSON."""
    return d[k] if k in d else d[str(k)]


def _spec_best(res: dict, B: int, alpha: float) -> dict | None:
    return next((c for c in res["cells"] if c["B"] == B and c.get("alpha") == alpha and c.get("best")), None)


def spec_markdown(res: dict) -> list[str]:
    lines = [f"## Speculation on the quantized target: {res['shape']} Q4_K_M + OracleDraft paid by a "
             f"{res['draft']} Q8_0", "", environment_line(res["env"]), "",
             f"Random packed blocks (a target step reads {res['target_bytes'] / 1e9:.2f} GB, a draft step "
             f"{res['draft_bytes'] / 1e9:.2f} GB: every draft step is one pass of the draft model, fed the oracle's "
             f"tokens), the target's greedy argmax peaked by `make_peaked` (the LM head keeps its blocks; plain greedy "
             f"followed its successor chain on {res['follows_successor']:.0%} of a probe's steps), "
             f"greedy, prompts of {res['prompt_tokens']} random tokens, {res['new_tokens']} new tokens each. tok/s = "
             "new tokens of the batch / seconds of `generate` after a warm-up call of the same shapes and cache size, "
             "less the call's own warm-up (`benchmarks/trees.py` e2e_cells; `captured` = graphs the timed call "
             "captured); speedup = tok/s / plain decoding's tok/s of the same model in the same run. bound = "
             "`verispec.analysis.speedup_from_times`: E_SD(alpha, K) x decode / (K x draft step + verify(K + 1)), "
             "from the pass costs below (one CUDA graph each, median of replays, at the generation's mean context; "
             "a verify pass at the graph width the engine runs it, a draft step of one token a sequence). "
             "`exact` = the output equals plain decoding's token for token (on a peaked model a check of the engine's "
             "acceptance, rollback and batching; the passes' bit identity is the model part's bit checks). **best** = "
             "the fastest K of its (B, alpha) measured.", ""]
    lines += markdown_table(["B", "context", "decode ms", "verify ms (K: ms at its width, / decode)", "draft step ms",
                             "draft / decode"],
                            [(c["B"], c["context"], f"{c['decode_ms']:.2f}",
                              ", ".join(f"{k}: {ms:.2f} @ {_at(c['verify_width'], k)} ({ms / c['decode_ms']:.2f})"
                                        for k, ms in sorted((int(k), ms) for k, ms in c["verify_ms"].items())),
                              f"{c['draft_ms']:.2f}", f"{c['draft_ms'] / c['decode_ms']:.2f}") for c in res["costs"]])
    lines.append("")
    for B in res["batches"]:
        cells = [c for c in res["cells"] if c["B"] == B]
        if not cells:
            continue
        rows = []
        for c in cells:
            if not c["k"]:
                rows.append(("plain", "-", f"{c['tok_s']:.0f}", "1.00x", "-", f"{c['tokens_per_round']:.2f}", "-",
                             c["captured"], "yes" if c["exact"] else "NO"))
                continue
            mark = "**" if c.get("best") else ""
            rows.append((c["alpha"], f"{mark}{c['k']}{mark}", f"{c['tok_s']:.0f}", f"{mark}{c['speedup']:.2f}x{mark}",
                         f"{c['bound']:.2f}x", f"{c['tokens_per_round']:.2f}", f"{c['expected_tokens_per_round']:.2f}",
                         c["captured"], "yes" if c["exact"] else "NO"))
        lines += [f"### B = {B}", ""]
        lines += markdown_table(["alpha", "K", "tok/s", "speedup", "bound", "tokens / round", "E_SD", "captured",
                                 "exact"], rows) + [""]
    return lines


def spec_summary(res: dict) -> list[str]:
    """The goal line (>= 1.5x at B = 1, alpha 0.8) and the exactness count, for ``summary_markdown``."""
    lines = []
    for B in res["batches"]:
        for alpha in res["alphas"]:
            best = _spec_best(res, B, alpha)
            if best is None:
                continue
            goal = " (goal >= 1.5x)" if B == 1 and alpha == 0.8 else ""
            lines.append(f"- speculation on {res['shape']} Q4_K_M, B = {B}, alpha {alpha}: best K = {best['k']}, "
                         f"{best['speedup']:.2f}x plain decoding{goal} ({best['tok_s']:.0f} tok/s; bound "
                         f"{best['bound']:.2f}x).")
    bad = [c for c in res["cells"] if not c["exact"]]
    lines.append(f"- speculation on the quantized target: output == plain decoding in "
                 f"{len(res['cells']) - len(bad)} of {len(res['cells'])} cells (goal: all).")
    return lines


# ------------------------------------------------------------------------------------------------ smollm
def smollm_part(args) -> dict:
    from benchmarks.exact import HELD_OUT, _drafters
    from verispec import generate, load_model

    out = dict(env=environment(), runs=[], exact=[])
    prompts = HELD_OUT[:args.prompts]
    models = {"dense bf16": load_model(None, device="cuda"), "packed": load_model(None, device="cuda", packed=True)}
    plain = {}
    for label, model in models.items():
        generate(model, prompts[0], max_new_tokens=16, chat=True)                 # warm-up: graphs, extension
        t = time.perf_counter()
        gens = [generate(model, p, max_new_tokens=args.max_new, chat=True) for p in prompts]
        wall = time.perf_counter() - t
        plain[label] = [g.tokens for g in gens]
        rate = sorted(g.stats.tokens_per_s for g in gens)[len(gens) // 2]
        out["runs"].append(dict(model=label, weight_mb=model.weight_bytes / 1e6, median_tok_s=rate,
                                tokens=sum(len(g.tokens) for g in gens), wall_s=wall))
        print("smollm", json.dumps(out["runs"][-1]), flush=True)
    same = [i for i, (a, b) in enumerate(zip(plain["packed"], plain["dense bf16"])) if a == b]
    out["packed_equals_dense"] = dict(same=len(same), of=len(prompts),
                                      first_diff=[next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
                                                  for a, b in zip(plain["packed"], plain["dense bf16"])])
    model = models["packed"]
    for kind in ("lookup", "self", "draft"):
        for k in (4, 8):
            gens = generate(model, prompts, drafter=_drafters(model, kind), k=k, max_new_tokens=args.max_new,
                            chat=True)
            differ = [i for i, g in enumerate(gens) if g.tokens != plain["packed"][i]]
            alone = generate(model, prompts[0], drafter=_drafters(model, kind), k=k, max_new_tokens=args.max_new,
                             chat=True)
            cell = dict(drafter=kind, k=k, differ_batch=differ, alone_equal=alone.tokens == plain["packed"][0],
                        alone_tok_s=alone.stats.tokens_per_s, tokens_per_round=gens[0].stats.tokens_per_round)
            out["exact"].append(cell)
            print("exact", json.dumps(cell), flush=True)
            _save_partial(args, out)
    return out


def smollm_markdown(res: dict) -> list[str]:
    lines = ["## The embedded SmolLM2-135M (Q4_1 + Q8_0) from its packed blocks", "", environment_line(res["env"]), "",
             "Plain greedy decoding, one prompt at a time (chat template), median tok/s over the prompts "
             "(`Stats.tokens_per_s`, after a warm-up generation).", ""]
    lines += markdown_table(["model", "weights MB", "median tok/s", "tokens", "wall s"],
                            [(r["model"], f"{r['weight_mb']:.1f}", f"{r['median_tok_s']:.0f}", r["tokens"],
                              f"{r['wall_s']:.1f}") for r in res["runs"]])
    p = res["packed_equals_dense"]
    lines += ["", f"Greedy tokens, packed vs dense bf16: {p['same']} of {p['of']} prompts identical (not expected to "
              f"be all: the dense model's matmuls use weights rounded to bf16, packed.cu the exact fp32 weights); "
              f"first differing position per prompt: {p['first_diff']}.", "",
              "Speculative greedy on the packed model vs plain greedy on the packed model (must be identical: the "
              "product's promise): all prompts in one batch, and prompt 0 alone.", ""]
    lines += markdown_table(["drafter", "k", "batch: prompts that differ", "alone identical", "alone tok/s",
                             "tokens/round"],
                            [(c["drafter"], c["k"], ", ".join(map(str, c["differ_batch"])) or "none",
                              "yes" if c["alone_equal"] else "NO", f"{c['alone_tok_s']:.0f}",
                              f"{c['tokens_per_round']:.2f}") for c in res["exact"]])
    return lines


# ------------------------------------------------------------------------------------------------ summary
def summary_markdown(parts: dict) -> list[str]:
    """The issue's goals against the measurements present (computed, not typed)."""
    lines = ["## Goals vs measured", ""]
    if "model" in parts:
        res = parts["model"]
        packed = res["models"][0]
        bf16 = res["models"][1] if len(res["models"]) > 1 else None       # absent from a part cut short
        one = {v: {int(t): ms for t, ms in p.items()} for v, p in packed["passes"].items()}
        best = min(one, key=lambda v: one[v][1])
        d = one[best][1]
        floor_ms = packed["floor_bytes"] / res["bandwidth"] * 1e3
        versus = ""
        if bf16 is not None:
            b16 = {int(t): ms for t, ms in bf16["passes"]["invariant"].items()}
            versus = f"bf16 {b16[1]:.2f} ms = {1e3 / b16[1]:.0f} tok/s; speedup over bf16 {b16[1] / d:.2f}x. "
        lines.append(f"- {res['shape']} Q4_K_M decode, B = 1 ({best}): {d:.2f} ms = {1e3 / d:.0f} tok/s = "
                     f"{floor_ms / d:.0%} of its packed-byte floor ({floor_ms:.2f} ms) (goal >= 70%, about 430 tok/s); "
                     f"{versus}Peers, quoted: {PEERS}.")
        if 5 in one[best]:
            others = [f"{v} {one[v][5] / one[v][1]:.2f}" for v in one if v != best and 5 in one[v]]
            lines.append(f"- verify(k = 4) / decode = {one[best][5] / d:.2f} (goal <= 1.10); k = 8: "
                         f"{one[best].get(9, float('nan')) / d:.2f}" +
                         (f"; k = 4 with the other matmuls: {', '.join(others)}." if others else "."))
        bits = packed.get("bit_checks", [])
        ok = sum(1 for c in bits if c["pass_equals_steps"] and c["batch_equals_alone"])
        via = f" ({packed['bit_variant']})" if "bit_variant" in packed else ""
        lines.append(f"- bit identity on the packed model{via}: {ok} of {len(bits)} k values with the k-token pass == k "
                     f"decode steps and == the same rows in a ragged batch of 3 (goal: all).")
        for B in sorted({int(b) for v in packed.get("decode", {}).values() for b in v} - {1}):
            p_ms = min(v[str(B)] if str(B) in v else v[B] for v in packed["decode"].values())
            b_ms = [v.get(str(B), v.get(B)) for v in (bf16 or {}).get("decode", {}).values()]
            versus = f" vs bf16 {B * 1e3 / b_ms[0]:.0f} tok/s ({b_ms[0] / p_ms:.2f}x)" if b_ms and b_ms[0] else ""
            lines.append(f"- decode at B = {B}: packed {B * 1e3 / p_ms:.0f} tok/s ({p_ms:.2f} ms a step){versus}.")
        pre = {int(t): ms for t, ms in packed["prefill"].items()}
        pre16 = {int(t): ms for t, ms in bf16["prefill"].items()} if bf16 is not None else {}
        if 1024 in pre and 1024 in pre16:
            lines.append(f"- prefill of 1024 tokens: {pre[1024]:.1f} ms packed vs {pre16[1024]:.1f} ms bf16 = "
                         f"{pre[1024] / pre16[1024]:.2f}x (goal <= 1.5x).")
    if "kernel" in parts:
        checks = parts["kernel"]["checks"]
        bad = [f"{c['shape']} {c['type']}" for c in checks
               if not (c.get("v2_equals_v1", True) and c["alone"] and c["dequant_equals_torch"]
                       and c.get("v3_err", 0.0) <= 2.0 ** -14 and c.get("v4_equals_v3", True)
                       and c.get("v5_equals_v3", True))]
        said = (["v2 == v1"] if any("v2_equals_v1" in c for c in checks) else []) + \
            (["v3 within 2^-14 of the reference"] if any("v3_err" in c for c in checks) else []) + \
            [f"v{v} == v3" for v in (4, 5) if any(f"v{v}_equals_v3" in c for c in checks)]
        lines.append(f"- packed.cu: every variant's rows the same bits alone and in every pass width, "
                     f"{', '.join(said + ['the dequantizer == torch'])}, on every shape and type: "
                     f"{'yes' if not bad else 'NO: ' + ', '.join(bad)}.")
    if "spec" in parts:
        lines += spec_summary(parts["spec"])
    if "smollm" in parts:
        bad = [c for c in parts["smollm"]["exact"] if c["differ_batch"] or not c["alone_equal"]]
        lines.append(f"- SmolLM2 packed: speculative greedy == plain greedy in {len(parts['smollm']['exact']) - len(bad)}"
                     f" of {len(parts['smollm']['exact'])} (drafter, k) cells (goal: all).")
    return lines


# ------------------------------------------------------------------------------------------------ main
PARTS = {"kernel": (kernel_part, kernel_markdown), "model": (model_part, model_markdown),
         "spec": (spec_part, spec_markdown), "smollm": (smollm_part, smollm_markdown)}


def report(src: Path, write: bool) -> Path:
    """quant.md in ``src`` from the quant_<part>.json files there (and benchmarks/results/quant.md with ``write``)."""
    parts, cut = {}, []
    for name in PARTS:                 # a part that died (or was timed out) left only its partial file
        for suffix in ("json", "partial.json"):
            if (src / f"quant_{name}.{suffix}").exists():
                parts[name] = json.loads((src / f"quant_{name}.{suffix}").read_text())
                cut += [name] if suffix == "partial.json" else []
                break
    if not parts:
        raise SystemExit(f"no quant_<part>.json in {src}")
    lines = ["# Quantized weights on the GPU (issue 24)", "",
             "Written by `benchmarks/quant.py report` from the parts below; commands: "
             + "; ".join(f"`{p['command']}`" for p in parts.values() if "command" in p) + "."
             + (f" Cut short (partial results): {', '.join(cut)}." if cut else ""), ""]
    lines += summary_markdown(parts) + [""]
    for name, (_, md) in PARTS.items():
        if name in parts:
            lines += md(parts[name]) + [""]
    text = "\n".join(lines)
    (src / "quant.md").write_text(text)
    if write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "quant.md").write_text(text)
    return RESULTS / "quant.md" if write else src / "quant.md"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=[*PARTS, "report"])
    ap.add_argument("dir", nargs="?", help="report: the folder holding quant_<part>.json files")
    ap.add_argument("--out", default=None, help="folder for quant_<part>.json and quant.md (default: $OUT or /tmp)")
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/quant.md")
    ap.add_argument("--types", default=",".join(TYPES), help="kernel: block types")
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="kernel: rows M to time")
    ap.add_argument("--variants", default="1,2", help="kernel: packed.cu variants to time and check (e.g. 2,3)")
    ap.add_argument("--model-variants", default="2,1",
                    help="model: packed.cu variants to time, the first also running the bit checks (e.g. 3,2)")
    ap.add_argument("--calls", type=int, default=10, help="kernel: calls per captured graph")
    ap.add_argument("--reps", type=int, default=15, help="replays per timing")
    ap.add_argument("--rotate-mb", type=int, default=256, help="kernel: rotate weight copies over at least this")
    ap.add_argument("--shape", default="llama-3.1-8b", help="model: the named shape")
    ap.add_argument("--kernel-shape", default="llama-3.1-8b", help="kernel: the named shape whose matmuls are timed")
    ap.add_argument("--tokens", default="1,2,3,5,9", help="model: tokens per pass (k + 1)")
    ap.add_argument("--prefill", default="128,1024", help="model: prefill lengths")
    ap.add_argument("--dequant-pass", action="store_true", help="model: also time VERISPEC_PACKED_GEMV=0")
    ap.add_argument("--batches", default=None,
                    help="model: decode batch sizes (default 1,8,32); spec: batch sizes (default 1,32)")
    ap.add_argument("--draft-shape", default="llama-3.2-1b", help="spec: the draft cost model's shape (Q8_0)")
    ap.add_argument("--alphas", default=",".join(map(str, SPEC_ALPHAS)), help="spec: the oracle's acceptance rates")
    ap.add_argument("--ks", default=",".join(map(str, SPEC_KS)), help="spec: chain draft lengths K")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="spec: prompt length")
    ap.add_argument("--new-tokens", type=int, default=128, help="spec: new tokens per sequence")
    ap.add_argument("--prompts", type=int, default=8, help="smollm: held-out prompts")
    ap.add_argument("--max-new", type=int, default=96, help="smollm: new tokens per prompt")
    args = ap.parse_args(argv)
    if args.part == "report":
        print("wrote", report(Path(args.dir), args.write))
        return
    if not torch.cuda.is_available():
        sys.exit("benchmarks/quant.py measures a GPU: no CUDA device is available")
    torch.set_num_threads(1)
    out_dir = Path(args.out or os.environ.get("OUT") or "/tmp")
    out_dir.mkdir(parents=True, exist_ok=True)
    run, md = PARTS[args.part]
    args.partial = out_dir / f"quant_{args.part}.partial.json"
    t0 = time.time()
    res = run(args)
    res["command"] = "python benchmarks/quant.py " + " ".join(argv if argv is not None else sys.argv[1:])
    res["seconds"] = time.time() - t0
    (out_dir / f"quant_{args.part}.json").write_text(json.dumps(res, indent=1))
    (out_dir / f"quant_{args.part}.md").write_text("\n".join(md(res)) + "\n")      # the part's section alone
    print("\n".join(md(res)))
    print("wrote", report(out_dir, args.write))


if __name__ == "__main__":
    main()
