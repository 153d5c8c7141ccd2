"""``heads``: a feature-level draft head (``FeatureHead``, EAGLE-3's shape over the target's own hidden states) vs
prompt lookup vs plain decoding.

It runs when ``--draft-head DIR`` names a head that fits the target, or, without --draft-head, when the head
shipped for the embedded SmolLM2 fits it (the target is that model: the default on a CPU, or its GGUF through
--model); for any other target every point is written as skipped, with the reason. Prompts: ``HEAD_PROMPTS``
(--quick: ``QUICK_HEAD_PROMPTS``; at least one batch) of the held-out free-form prompts of ``verispec
train-head`` (topics no training prompt mentions, verispec/training/prompts.py; random ids for a model without a
tokenizer), through the chat template when the model has one, run in static batches of the first swept batch
size, greedy, --max-new-tokens each. Points: plain decoding, then prompt lookup (n-grams 1..3) and the head at
every swept K (chains; the head's trees are measured by benchmarks/feature_head.py --trees-only, not here).

Per row: ``tokens_per_round`` (every request's tokens after its first / its rounds), ``alpha_per_position``
(accepted / tested at draft position i, all requests), ``tokens_per_s`` (decode tokens / decode seconds, summed
over the batches), ``exact`` (every output equals plain decoding's, token for token). On a GPU every batch runs
once untimed first (CUDA graph captures), on a CPU the study's first batch does (one-off allocations); every run
shares one cache length. The head's runs switch the target's hidden-state writes on (``Model.capture_hidden``);
they are switched off after them, so the other rows do not pay for those writes.
"""
from __future__ import annotations

from ...drafters import FeatureHead, PromptLookup
from ...training.prompts import prompt_ids
from ..measure import EngineRun, run_engine, sum_positions

STUDY = "heads"
HEAD_PROMPTS = 8
QUICK_HEAD_PROMPTS = 2


def points(bench) -> list[dict]:
    ks, b = bench.options.ks, bench.options.batches[0]
    return ([{"batch": b, "method": "plain"}] + [{"batch": b, "method": "lookup", "k": k} for k in ks]
            + [{"batch": b, "method": "head", "k": k} for k in ks])


def head_or_reason(bench) -> tuple[FeatureHead | None, str | None]:
    """(the head, None), or (None, why this target has none); loaded once per run."""
    if "head" not in bench.memo:
        source = bench.options.draft_head
        try:
            if source:
                head = FeatureHead.from_pretrained(source, bench.target)
            else:
                head = FeatureHead()
                head.check_fits(bench.target)
            bench.memo["head"] = (head, None)
        except (OSError, ValueError, TypeError) as e:
            what = (f"--draft-head {source}" if source else
                    "the head shipped for the embedded SmolLM2 (the target is not that model; give --draft-head DIR)")
            bench.memo["head"] = (None, f"no feature head for this target: {what}: {e}")
    return bench.memo["head"]


def prompts(bench) -> list[list[int]]:
    key = ("head-prompts",)
    if key not in bench.memo:
        n = QUICK_HEAD_PROMPTS if bench.options.quick else HEAD_PROMPTS
        # at least one full batch (the held-out texts number 144)
        bench.memo[key] = prompt_ids(bench.target, "held-out", max(n, bench.options.batches[0]))
    return bench.memo[key]


def _cache_len(bench) -> int:
    """One cache length for every run of the study (a new length would re-allocate the cache and its graphs)."""
    o = bench.options
    return max(len(p) for p in prompts(bench)) + o.max_new_tokens + max(o.ks) + 1


def grouped_run(bench, make_drafter, k: int) -> EngineRun:
    """The study's prompts in static batches of the first swept batch size (one ``run_engine`` each, same cache
    length), merged into one EngineRun: tokens, seconds, rounds and per-position counts summed, outputs in prompt
    order. On a GPU, every batch first runs once untimed (the graphs its shapes need)."""
    o, target = bench.options, bench.target
    batch, ps, cache = o.batches[0], prompts(bench), _cache_len(bench)
    groups = [ps[i:i + batch] for i in range(0, len(ps), batch)]

    def run(group):
        return run_engine(target, make_drafter(), group, k=k, max_new_tokens=o.max_new_tokens, max_seq_len=cache,
                          max_batch=batch)

    if target.device.type == "cuda":
        for g in groups:
            run(g)
    elif "heads-warm" not in bench.memo:   # the process's first engine run pays one-off costs (allocations)
        run(groups[0])
        bench.memo["heads-warm"] = True
    runs = [run(g) for g in groups]
    stats = [s for r in runs for s in r.stats]
    return EngineRun(len(ps), k, sum(r.new_tokens for r in runs), sum(r.decode_tokens for r in runs),
                     sum(r.seconds for r in runs), sum(r.rounds for r in runs), sum(r.proposed for r in runs),
                     sum(r.accepted for r in runs), {p: sum(r.phase_s[p] for r in runs) for p in runs[0].phase_s},
                     [t for r in runs for t in r.latencies_s], [out for r in runs for out in r.outputs], stats,
                     sum_positions([s.accepted_per_position for s in stats]),
                     sum_positions([s.tested_per_position for s in stats]))


def _plain(bench) -> EngineRun:
    if "head-plain" not in bench.memo:
        bench.memo["head-plain"] = grouped_run(bench, lambda: None, 0)
    return bench.memo["head-plain"]


def per_position(run: EngineRun, k: int) -> list[float | None]:
    """[i < k]: accepted / tested at draft position i over every request; None where no round tested it."""
    acc = run.accepted_per_position + [0] * k
    tested = run.tested_per_position + [0] * k
    return [acc[i] / tested[i] if tested[i] else None for i in range(k)]


def measure(bench, point: dict) -> list[dict]:
    head, reason = head_or_reason(bench)
    if head is None:
        return [{"skipped": True, "reason": reason}]
    plain = _plain(bench)
    batch, k = bench.options.batches[0], point.get("k", 0)
    if point["method"] == "plain":
        run = plain
    elif point["method"] == "lookup":
        def make():
            lookup = PromptLookup(max_ngram=3, min_ngram=1)
            lookup.attach(bench.target)
            return lookup

        run = grouped_run(bench, make, k)
    else:
        try:
            # one head for every run: its CUDA graphs live in the drafter (reserve() resets its rows)
            run = grouped_run(bench, lambda: head, k)
        finally:
            bench.target.capture_hidden(())
    rounds = sum(s.rounds for s in run.stats)
    return [{"batch": batch, "prompts": run.batch, "tokens_per_s": run.tokens_per_s,
             "plain_tokens_per_s": plain.tokens_per_s,
             "tokens_per_round": sum(s.new_tokens - 1 for s in run.stats) / max(rounds, 1),
             "alpha_measured": run.alpha, "alpha_per_position": per_position(run, k),
             "exact": run.outputs == plain.outputs}]
