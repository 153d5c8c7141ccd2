"""End-to-end speculative decoding benchmarks: speedup over verispec's own autoregressive decoding.

    python benchmarks/e2e.py gpu [--peaked]    random-weight llama-3.1-8b target + llama-3.2-1b OracleDraft,
                                               alpha x K x B grid, with the analytical bound from measured times;
                                               then (unless --no-hf) the same target with a self-speculative draft
                                               (its first --hf-layers layers) side by side with HF transformers
                                               generate(assistant_model=<the same truncated target>)
    python benchmarks/e2e.py cpu [--threads N] the embedded SmolLM2-135M + PromptLookup on echo-heavy and
                                               free-form prompts, side by side with HF transformers generate()

Method (both): every configuration runs once to warm up (CUDA graphs for every batch shape it will
see; the oracle and greedy decoding are deterministic, so later runs see the same shapes), then
(GPU) once with ``timing=True`` (a synchronize around each phase) to measure the draft step and
verify pass times that feed ``verispec.analysis.speedup_from_times``, then ``--repeats`` times for
throughput without any extra sync (median). Throughput = tokens generated after the first one / decode
wall time (prefill excluded). "steady speedup" = the same ratio measured only until the first sequence
of the batch finishes (what a server that refills finished slots would see; a static batch then runs a
tail of nearly full-cost rounds for its slowest sequences).
Results go to stdout as markdown tables (paste into benchmarks/results/e2e*.md).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import environment, table_header, table_row  # noqa: E402
from verispec.analysis import expected_tokens_per_round, speedup_from_times  # noqa: E402
from verispec.bench.peaked import make_peaked  # noqa: E402
from verispec.drafters import OracleDraft, PromptLookup  # noqa: E402
from verispec.engine import SpeculativeDecoder  # noqa: E402
from verispec.runtime import load_model  # noqa: E402


def _throughput(decoder: SpeculativeDecoder, batch: int) -> float:
    s = decoder.last_stats
    return (s.new_tokens - batch) / s.decode_s


def _run(decoder, prompts, max_new, timing=False):
    decoder.timing = timing
    out = decoder.generate(prompts, max_new_tokens=max_new)
    return out, decoder.last_stats


def _median_throughput(decoder, prompts, args):
    """Median decode tok/s of ``args.repeats`` untimed runs (no extra syncs), and the last run's outputs."""
    rates = []
    for _ in range(args.repeats):
        out, _ = _run(decoder, prompts, args.max_new)
        rates.append(_throughput(decoder, len(prompts)))
    return sorted(rates)[len(rates) // 2], out


def _steady_throughput(decoder, prompts, max_new) -> float:
    """Batch tok/s until the FIRST sequence ends (from the first token on): the rate a server that refills
    finished slots would sustain. A static batch then runs a tail of rounds for the slowest sequences at
    almost the full pass cost (weight-bound), which the plain throughput includes. A sequence ends when it
    has all its tokens (max_new, or fewer when it stopped early: EOS), so the window always closes."""
    arrivals = []                              # (time, sequence, its tokens so far), one per streamed chunk
    done = [0] * len(prompts)

    def on_tokens(i, new):
        done[i] += len(new)
        arrivals.append((time.perf_counter(), i, done[i], len(new)))

    decoder.timing = False
    out = decoder.generate(prompts, max_new_tokens=max_new, on_tokens=on_tokens)
    final = [len(g.tokens) for g in out]
    t0, n = None, 0
    for now, i, total, count in arrivals:
        if total == count:                     # the prefill's token: decoding starts after the first of these
            t0 = t0 or now
            continue
        n += count
        if total == final[i]:                  # the first sequence to end closes the window
            return n / (now - t0)
    raise RuntimeError("no sequence decoded past its first token: no steady window to measure")


# ---------------------------------------------------------------------------------------------- GPU


def _pick_verify_backend(dev):
    """The default verify backend if it works on this device, else the torch reference (with a note)."""
    from verispec import verify_greedy

    logits = torch.randn(7, 1000, device=dev)
    try:
        out = verify_greedy(logits, torch.tensor([1, 2, 3, 4], device=dev), [2, 0, 2])
        ref = verify_greedy(logits, torch.tensor([1, 2, 3, 4], device=dev), [2, 0, 2], backend="torch")
        if torch.equal(out.tokens, ref.tokens):
            return None
        print("(note: the default verify backend disagrees with the reference here; using backend='torch')\n")
    except Exception as e:  # noqa: BLE001 - a benchmark should still measure the engine
        print(f"(note: the default verify backend failed here ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
              f"using backend='torch', the reference)\n")
    return "torch"


def _over_budget(args, t0, what: str) -> bool:
    if time.perf_counter() - t0 <= args.budget_s:
        return False
    print(f"\n(time budget {args.budget_s}s reached: {what} skipped)", flush=True)
    return True


def gpu(args) -> None:
    dev = torch.device(args.device)
    env = environment()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    print(f"# GPU end-to-end: {args.target} target, {args.draft} OracleDraft (random weights, bf16)\n")
    print(f"{env['device']}, torch {env['torch']}, {env['date']}; "
          f"prompt {args.prompt_len} tokens, {args.max_new} new tokens per sequence, greedy\n", flush=True)
    t0 = time.perf_counter()
    target = load_model(args.target, device=dev, dtype=dtype, seed=0)
    draft = load_model(args.draft, device=dev, dtype=dtype, seed=1)
    if args.peaked:
        make_peaked(target)
    print(f"(models built in {time.perf_counter() - t0:.0f}s)\n", flush=True)
    backend = _pick_verify_backend(dev)
    sections = [lambda: _grid(args, target, draft, backend, t0)]
    if not args.no_hf:
        sections.insert(0 if args.hf_first else 1, lambda: _hf_side_by_side(args, target, backend, t0))
    for i, section in enumerate(sections):
        if i:
            print()                                       # a blank line between the two tables
        section()
    print(f"\n(total {time.perf_counter() - t0:.0f}s)")


def _grid(args, target, draft, backend, t0) -> None:
    gen = torch.Generator().manual_seed(0)
    alphas = [float(a) for a in args.alphas.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    print("\n".join(table_header(["B", "alpha", "K", "accepted/proposed", "tok/round (E_SD)", "tok/s", "AR tok/s",
                                  "speedup", "bound", "draft step ms", "verify ms", "other ms/round", "AR step ms",
                                  "steady speedup"])), flush=True)
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = [torch.randint(0, target.config.vocab_size, (args.prompt_len,), generator=gen).tolist()
                   for _ in range(batch)]
        ar = SpeculativeDecoder(target, None, verify_backend=backend)
        _run(ar, prompts, args.max_new)                              # warm-up (CUDA graphs for every shape)
        out, st = _run(ar, prompts, args.max_new, timing=True)
        ar_step = st.target_s / st.rounds
        ar_tps, out = _median_throughput(ar, prompts, args)
        ar_steady = _steady_throughput(ar, prompts, args.max_new)
        refs = [g.tokens for g in out]
        for alpha in alphas:
            for k in ks:
                if _over_budget(args, t0, "the rest of the grid was"):
                    return
                dec = SpeculativeDecoder(target, OracleDraft(refs, alpha, cost_model=draft, seed=0), k=k,
                                         verify_backend=backend)
                _run(dec, prompts, args.max_new)                              # warm-up (graphs)
                out, st = _run(dec, prompts, args.max_new, timing=True)       # phase times
                exact = [g.tokens for g in out] == refs
                draft_step = st.draft_s / (st.rounds * k)
                verify = st.target_s / st.rounds
                # per round, what is neither a draft step nor the target pass: acceptance, the host sync,
                # commit/rollback bookkeeping and Python (phases are synchronized in the timed run)
                other = (st.decode_s - st.draft_s - st.target_s) / st.rounds
                tps, _ = _median_throughput(dec, prompts, args)
                steady = _steady_throughput(dec, prompts, args.max_new) / ar_steady
                bound = speedup_from_times(alpha, k, draft_step, verify, ar_step)
                acc = st.accepted / st.proposed
                print(table_row([batch, alpha, k, f"{acc:.2f}",
                                 f"{(st.new_tokens - batch) / st.rounds / batch:.2f} (E={expected_tokens_per_round(alpha, k):.2f})",
                                 f"{tps:.0f}", f"{ar_tps:.0f}", f"**{tps / ar_tps:.2f}x**", f"{bound:.2f}x",
                                 f"{1e3 * draft_step:.2f}", f"{1e3 * verify:.2f}", f"{1e3 * other:.2f}",
                                 f"{1e3 * ar_step:.2f}", f"{steady:.2f}x"]) + ("" if exact else " output differs from AR!"),
                      flush=True)


def _hf_side_by_side(args, target, backend, t0) -> None:
    """verispec SelfSpeculative(L) vs HF generate(assistant_model=the same first L layers), same K, greedy.

    Both drafts are the target's own first L layers + final norm + LM head (the HF assistant shares the
    runtime's tensors), so with equal greedy outputs both accept exactly the same drafts: the comparison
    is of the engines, not of the drafts. HF assisted generation is batch-1 only (B > 1: ours only).
    """
    import transformers

    from verispec.drafters import SelfSpeculative
    from verispec.runtime.loading import to_transformers

    if _over_budget(args, t0, "the HF transformers side-by-side was"):
        return
    L, n = args.hf_layers, args.hf_max_new
    hf = to_transformers(target.net)
    assistant = to_transformers(target.net, num_layers=L)
    for m in (hf, assistant):
        p = next(m.parameters())
        assert p.device == target.device and p.dtype == target.net.embed.dtype and not m.training, (p.device, p.dtype)
    cfg = assistant.generation_config
    cfg.num_assistant_tokens_schedule = "constant"
    if hasattr(cfg, "assistant_confidence_threshold"):
        cfg.assistant_confidence_threshold = 0.0          # 0 (not None, which means the default 0.4) = off
    print(f"\n## Self-speculative (first {L} of {target.config.num_layers} layers as the draft): verispec vs "
          f"HF transformers {transformers.__version__}\n")
    print(f"Prompt {args.prompt_len} random tokens, {n} new tokens, greedy, {target.net.embed.dtype}; warm-up run "
          f"first. HF: `generate(assistant_model=..., max_new_tokens={n}, min_new_tokens={n}, do_sample=False)` with "
          f"`num_assistant_tokens=K`, schedule constant, confidence threshold off; HF tok/s subtracts a 1-token "
          f"generate (prefill). passes = target forward passes incl. prefill (ours / HF). identical: ours spec = "
          f"ours AR / HF plain = ours AR / HF assisted = ours spec (HF: all but the last token).\n")
    print("\n".join(table_header(["B", "K", "accepted/proposed", "tok/round", "passes (ours / HF)", "ours AR tok/s",
                                  "ours spec tok/s", "ours speedup", "HF plain tok/s", "HF assisted tok/s", "HF speedup",
                                  "ours spec / HF assisted", "identical"])), flush=True)
    yn = lambda v: "n/a" if v is None else ("yes" if v else "NO")  # noqa: E731
    gen = torch.Generator().manual_seed(1)
    for batch in [int(b) for b in args.hf_batches.split(",")]:
        if _over_budget(args, t0, "the rest of the HF side-by-side was"):
            return
        prompts = [torch.randint(0, target.config.vocab_size, (args.prompt_len,), generator=gen).tolist()
                   for _ in range(batch)]
        ar = SpeculativeDecoder(target, None, verify_backend=backend)
        _run(ar, prompts, n)                                                  # warm-up
        out, _ = _run(ar, prompts, n)
        ar_tps = _throughput(ar, batch)
        ar_steady = _steady_throughput(ar, prompts, args.max_new)
        refs = [g.tokens for g in out]
        hp, hp_out, _ = _hf_generate(hf, prompts, n, warmup=True)
        hp_same = all(h[: n - 1] == r[: n - 1] for h, r in zip(hp_out, refs))
        for k in [int(k) for k in args.hf_ks.split(",")]:
            if _over_budget(args, t0, "the rest of the HF side-by-side was"):
                return
            dec = SpeculativeDecoder(target, SelfSpeculative(L), k=k, verify_backend=backend)
            _run(dec, prompts, n)                                             # warm-up (graphs)
            out, st = _run(dec, prompts, n)
            tps = _throughput(dec, batch)
            mine = [g.tokens for g in out]
            ha, ha_same, passes = None, None, "-"
            if batch == 1:
                cfg.num_assistant_tokens = k
                ha, ha_out, calls = _hf_generate(hf, prompts, n, warmup=True, assistant_model=assistant)
                ha_same = ha_out[0][: n - 1] == mine[0][: n - 1]
                passes = f"{st.rounds + 1} / {calls}"
            hf_assisted = (["n/a (batch-1 only)", "n/a", "n/a"] if ha is None else
                           [f"{ha:.0f}", f"{ha / hp:.2f}x", f"**{tps / ha:.2f}x**"])
            print(table_row([batch, k, f"{st.acceptance_rate:.2f}", f"{(st.new_tokens - batch) / st.rounds / batch:.2f}",
                             passes, f"{ar_tps:.0f}", f"{tps:.0f}", f"**{tps / ar_tps:.2f}x**", f"{hp:.0f}", *hf_assisted,
                             f"{yn(mine == refs)} / {yn(hp_same)} / {yn(ha_same)}"]), flush=True)


# ---------------------------------------------------------------------------------------------- CPU
ECHO = [   # copy / fix / edit given text: the output mostly repeats the prompt
    "Repeat this text exactly:\n\nThe committee met on Tuesday to review the budget for the coming year. After a "
    "long discussion about rising costs, the members agreed to postpone the final vote until the next meeting, "
    "when the updated figures from the finance office will be available. In the meantime, each department "
    "will prepare a short report describing its most important needs and the savings it could make.",
    "Fix the spelling mistakes and copy the rest unchanged:\n\nTeh quick brown fox jumpd over the lazy dog. The "
    "dog did not notise, because it was sleeping in the warm afternoon sun next to the old red barn. Later "
    "that evening the farmer came home, fed the animals, and sat on the porch to watch the sun go down.",
    "Copy this shopping list exactly, one item per line:\n- two liters of milk\n- a dozen eggs\n- fresh bread "
    "from the bakery\n- three green apples\n- a bag of rice\n- olive oil\n- tomatoes and onions\n- coffee beans"
    "\n- dish soap\n- batteries for the remote control",
    "Rewrite this Python function exactly, but rename the variable x to value:\n\ndef scale(x, factor):\n"
    "    if x is None:\n        return None\n    result = x * factor\n    print('scaled', x, 'by', factor)\n"
    "    return result",
    "Copy this paragraph exactly:\n\nOur store opens at nine in the morning and closes at six in the evening "
    "from Monday to Saturday. On Sundays and public holidays we are closed. Please bring your receipt for any "
    "returns or exchanges, which are accepted within thirty days of purchase. Thank you for shopping with us.",
    "Repeat the following sentence exactly three times, on separate lines: Speculative decoding drafts several "
    "tokens cheaply and verifies all of them in a single pass of the large model.",
]
FREE = [
    "Write a short poem about the sea.",
    "Give me three tips for learning a new language.",
    "What is the capital of France, and why is it famous?",
    "Explain in simple words how a rainbow forms.",
]


def cpu(args) -> None:
    from verispec.runtime.loading import to_transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(device="cpu", dtype=torch.float32)
    tok = model.tokenizer
    hf = to_transformers(model.net).eval()
    print(f"# CPU end-to-end: SmolLM2-135M-Instruct (embedded GGUF, fp32), greedy, chat template\n")
    env = environment()
    print(f"{env['device']}, torch {env['torch']}, {env['date']}; max_new_tokens={args.max_new}, "
          f"PromptLookup(max_ngram={args.ngram_max}, min_ngram={args.ngram_min}), k={args.k}; HF: "
          f"generate(prompt_lookup_num_tokens={args.k}, max_matching_ngram_size={args.ngram_max})\n")
    print("\n".join(table_header(["set", "prompt", "tokens", "AR tok/s", "lookup tok/s", "speedup", "accept", "tok/round",
                                  "HF plain tok/s", "HF lookup tok/s", "ours / HF lookup", "identical"])), flush=True)
    ar = SpeculativeDecoder(model, None)
    spec = SpeculativeDecoder(model, PromptLookup(max_ngram=args.ngram_max, min_ngram=args.ngram_min), k=args.k)
    ar.generate([1, 2, 3], max_new_tokens=4)
    ratios = {"echo": [], "free": []}
    for label, prompts in (("echo", ECHO), ("free", FREE)):
        for i, text in enumerate(prompts):
            ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            best = {}
            for _ in range(args.repeats):   # interleaved, best of N: this machine is shared and noisy
                a = ar.generate(ids, max_new_tokens=args.max_new)
                s = spec.generate(ids, max_new_tokens=args.max_new)
                n = len(a.tokens)
                hp, (hf_plain_out,), _ = _hf_generate(hf, [ids], n)
                hl, _, _ = _hf_generate(hf, [ids], n, prompt_lookup_num_tokens=args.k,
                                        max_matching_ngram_size=args.ngram_max)
                for key, v in (("ar", a.stats.tokens_per_s), ("spec", s.stats.tokens_per_s), ("hp", hp), ("hl", hl)):
                    best[key] = max(best.get(key, 0.0), v)
            same = a.tokens == s.tokens
            # HF's min_new_tokens masks EOS, so compare all but the last token
            hf_same = hf_plain_out[: n - 1] == a.tokens[: n - 1]
            ratios[label].append(best["spec"] / best["ar"])
            print(table_row([label, i, n, f"{best['ar']:.1f}", f"{best['spec']:.1f}",
                             f"**{best['spec'] / best['ar']:.2f}x**", f"{100 * s.stats.acceptance_rate:.0f}%",
                             f"{s.stats.tokens_per_round:.2f}", f"{best['hp']:.1f}", f"{best['hl']:.1f}",
                             f"{best['spec'] / best['hl']:.2f}x",
                             ('yes' if same else 'NO') + ('' if hf_same else ' (HF differs)')]), flush=True)
    for label, r in ratios.items():
        print(f"\n{label}: speedup over own AR min {min(r):.2f}x, geomean "
              f"{torch.tensor(r).log().mean().exp():.2f}x, max {max(r):.2f}x", end="")
    print()


def _hf_generate(hf, prompts, n, warmup=False, **kw):
    """HF generate() for exactly n new tokens per prompt (equal-length prompts, no padding).

    Returns (tok/s over the decode phase: a 1-token run's time is subtracted, the new tokens of each row,
    the target's forward calls in the n-token run). ``warmup``: one untimed n-token run first.
    """
    x = torch.tensor(prompts, device=hf.device)
    kw = dict(do_sample=False, pad_token_id=0, **kw)
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    calls = []
    with torch.inference_mode():
        if warmup:
            hf.generate(x, max_new_tokens=n, min_new_tokens=n, **kw)
        sync()
        t = time.perf_counter()
        hf.generate(x, max_new_tokens=1, min_new_tokens=1, **kw)
        sync()
        first = time.perf_counter() - t
        hook = hf.register_forward_pre_hook(lambda *_: calls.append(1))
        try:
            t = time.perf_counter()
            out = hf.generate(x, max_new_tokens=n, min_new_tokens=n, **kw)
            sync()
            total = time.perf_counter() - t
        finally:
            hook.remove()
    return len(prompts) * (n - 1) / max(total - first, 1e-9), out[:, x.shape[1]:].tolist(), len(calls)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    g = sub.add_parser("gpu")
    g.add_argument("--target", default="llama-3.1-8b")
    g.add_argument("--draft", default="llama-3.2-1b")
    g.add_argument("--alphas", default="0.5,0.7,0.8,0.9")
    g.add_argument("--ks", default="2,4,6,8")
    g.add_argument("--batches", default="1,8,32")
    g.add_argument("--prompt-len", type=int, default=64)
    g.add_argument("--max-new", type=int, default=128)
    g.add_argument("--repeats", type=int, default=3, help="throughput runs per cell; the median is reported")
    g.add_argument("--device", default="cuda")
    g.add_argument("--peaked", action="store_true", help="well-separated greedy argmax (see make_peaked)")
    g.add_argument("--budget-s", type=float, default=420.0,
                   help="skip what is left of the grid / HF side-by-side after this many seconds")
    g.add_argument("--no-hf", action="store_true", help="skip the HF transformers side-by-side")
    g.add_argument("--hf-first", action="store_true", help="run the HF side-by-side before the grid")
    g.add_argument("--hf-layers", type=int, default=4, help="self-speculative draft depth (target layers)")
    g.add_argument("--hf-ks", default="4")
    g.add_argument("--hf-max-new", type=int, default=64)
    g.add_argument("--hf-batches", default="1", help="B > 1: ours only (HF assisted generation is batch-1 only)")
    c = sub.add_parser("cpu")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--max-new", type=int, default=128)
    c.add_argument("-k", type=int, default=8)
    c.add_argument("--repeats", type=int, default=2, help="interleaved runs per prompt; the best is kept")
    c.add_argument("--ngram-max", type=int, default=3)
    c.add_argument("--ngram-min", type=int, default=2)
    args = p.parse_args(argv)
    gpu(args) if args.mode == "gpu" else cpu(args)


if __name__ == "__main__":
    sys.exit(main())
