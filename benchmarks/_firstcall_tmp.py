import cProfile, pstats, io, sys, os, time, torch
sys.path.insert(0, os.getcwd())
from verispec import load_model, SpeculativeDecoder, PromptLookup
m = load_model("llama-3.2-1b", device="cuda", dtype=torch.bfloat16)
prompt = list(range(100, 140)) * 3
for kind in ("plain", "lookup"):
    for call in (1, 2):
        d = None if kind == "plain" else PromptLookup()
        dec = SpeculativeDecoder(m, d, k=8)
        pr = cProfile.Profile() if call == 1 else None
        t = time.perf_counter()
        if pr: pr.enable()
        g = dec.generate(prompt, max_new_tokens=64)
        if pr: pr.disable()
        torch.cuda.synchronize()
        s = dec.last_stats
        print(kind, call, "run ms", round(s.total_s * 1e3, 1), "warmup", round(s.warmup_s, 2), "tok/s", round(g.stats.tokens_per_s), "tokens", len(g.tokens), flush=True)
        if pr:
            out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("cumulative").print_stats(25); print(out.getvalue()[-4500:])
