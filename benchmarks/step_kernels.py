"""What a decode step's helper kernels cost: the step with each removed, an upper bound for fusing it away.

    python benchmarks/step_kernels.py [--models 1b-bf16,1b-q8_0,8b-bf16,8b-q4_k_m] [--out DIR] [--write]

A B = 1 decode step (``Model._step``, one captured CUDA graph of 20 steps, context 512) runs per layer four matmuls
and six helper kernels: the residual add + RMSNorm (twice), RoPE + the K/V write, the split attention's combine,
SwiGLU (``ops.silu_mul``), and the split attention itself. This script times the step as it is and with each helper
(``ops.add_rmsnorm``, ``ops.rope_kv_write``, ``ops._attn_combine``, ``ops.silu_mul``) replaced by an allocation of
its output: the results are then wrong, the time is what the step would take if that kernel cost nothing, so
``saved`` bounds what fusing it into a neighbour can win (a fused kernel still does its work). The last column
removes all four. The floor: the step's weight bytes (the embedding table but one row not counted) / the measured
copy bandwidth. GPU only; each cell the minimum of two timed graphs (the kernels' run-to-run noise is ~1%).
Writes DIR/step_kernels.md, and benchmarks/results/step_kernels.md with --write.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402

from benchmarks.common import environment, environment_line, markdown_table, write_page  # noqa: E402

NAME = "step_kernels.md"
# model name -> (shape, weights): bf16 random weights, or random packed blocks of a GGUF type mix (issue 24's pair)
MODELS = {"1b-bf16": ("llama-3.2-1b", "bf16"), "1b-q8_0": ("llama-3.2-1b", "Q8_0"),
          "8b-bf16": ("llama-3.1-8b", "bf16"), "8b-q4_k_m": ("llama-3.1-8b", "Q4_K_M")}


def _no_norm(x, delta, weight, eps):
    return x, x


def _no_rope(qkv, rope, pos, k_cache, v_cache, T, H, KV, D, slots=None):
    return torch.empty(qkv.shape[0], H, D, device=qkv.device, dtype=k_cache.dtype)


def _no_combine(q, acc, ml, B, T, KV, G, nsplit, rows, live, live_add):
    N, H, D = q.shape
    return torch.empty(N, H * D, device=q.device, dtype=q.dtype)


def _no_silu(gu):
    return torch.empty(gu.shape[0], gu.shape[1] // 2, device=gu.device, dtype=gu.dtype)


# variant -> the ops functions replaced (by an allocation of the output: timing only)
REMOVED = {"add_rmsnorm": {"add_rmsnorm": _no_norm}, "rope_kv_write": {"rope_kv_write": _no_rope},
           "attn combine": {"_attn_combine": _no_combine}, "silu_mul": {"silu_mul": _no_silu}}
REMOVED["all four"] = {k: v for d in REMOVED.values() for k, v in d.items()}


@contextlib.contextmanager
def removed(functions: dict):
    """Inside: ``verispec.runtime.ops``' functions named in ``functions`` replaced; put back after."""
    from benchmarks.trees import _setting
    from verispec.runtime import ops

    with contextlib.ExitStack() as stack:
        for name, fn in functions.items():
            stack.enter_context(_setting(ops, name, fn))
        yield


def load(name: str):
    """``MODELS[name]`` on the GPU: random bf16 weights, or random packed blocks (the 1B's from another seed than the
    8B's, as ``round_host.load_pair`` draws them)."""
    from verispec import load_model

    shape, weights = MODELS[name]
    if weights == "bf16":
        return load_model(shape, device="cuda", dtype=torch.bfloat16)
    from benchmarks.quant import packed_random_model

    return packed_random_model(shape, weights, seed=1 << 16 if "1b" in name else 0)


def measure(name: str, bandwidth: float, context: int = 512, repeats: int = 2) -> dict:
    """One model's row: us per step as is and with each helper removed (min of ``repeats`` graphs each, in turn)."""
    from benchmarks.common import graph_us_per_call

    model = load(name)
    model.setup_cache(1, 4096)
    model.prefill([[1] * context])
    tok = torch.ones(1, 1, dtype=torch.long, device="cuda")
    lengths = torch.full((1,), context, dtype=torch.long)

    def call(i):
        model.rollback(lengths)
        return model._step(tok)

    us: dict[str, list[float]] = {}
    for _ in range(repeats):
        for variant, functions in [("step", {})] + list(REMOVED.items()):
            with removed(functions):
                us.setdefault(variant, []).append(graph_us_per_call(call, calls=20, reps=20))
    row = cell(name, model, us, bandwidth)
    del model
    torch.cuda.empty_cache()
    return row


def cell(name: str, model, us: dict[str, list[float]], bandwidth: float) -> dict:
    """A model's row from its timed graphs (``us``: variant -> us per step of each repeat)."""
    from benchmarks.quant import _decode_floor_bytes

    return dict(model=name, layers=model.config.num_layers, floor_us=_decode_floor_bytes(model) / bandwidth * 1e6,
                us={v: min(t) for v, t in us.items()})


def markdown(res: dict) -> str:
    variants = list(REMOVED)
    rows = []
    for r in res["rows"]:
        step = r["us"]["step"]
        cells = [r["model"], f"{step:.1f}", f"{r['floor_us']:.1f}", f"{r['floor_us'] / step:.0%}"]
        for v in variants:
            change = r["us"][v] - step
            cells.append(f"{r['us'][v]:.1f} ({change:+.1f} us, {change / step:+.1%})")
        rows.append(cells)
    lines = [f"# {NAME[:-3]}: what a decode step's helper kernels cost", "",
             environment_line(res["env"], res["bandwidth"]), "",
             f"Command: `{res['command']}`.", "",
             "us per B = 1 decode step (one CUDA graph of 20 steps, context 512, the minimum of two graphs); `without "
             "X`: the step with X replaced by an allocation of its output (wrong results, timing only: what fusing X "
             "away could win at most), in brackets the change against the step. Random weights; `q8_0` / "
             "`q4_k_m`: random packed blocks of that GGUF mix (issue 24's pair).", ""]
    lines += markdown_table(["model", "step us", "floor us", "% floor"] + [f"without {v}" for v in variants], rows)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated of {', '.join(MODELS)}")
    ap.add_argument("--out", default=None, help="folder for step_kernels.md (default: a temp folder)")
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/step_kernels.md")
    args = ap.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    if not names or any(m not in MODELS for m in names):
        ap.error(f"--models: {args.models!r}: use a comma-separated list of {', '.join(MODELS)}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it times captured decode steps)")
    from benchmarks.common import copy_bandwidth

    bandwidth = copy_bandwidth()
    res = dict(env=environment(), bandwidth=bandwidth,
               command="python benchmarks/step_kernels.py " + " ".join(sys.argv[1:] if argv is None else argv),
               rows=[measure(m, bandwidth) for m in names])
    out = Path(args.out) if args.out else Path(tempfile.gettempdir()) / "step_kernels"
    out.mkdir(parents=True, exist_ok=True)
    write_page(markdown(res), out, NAME, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
