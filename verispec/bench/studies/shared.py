"""Engine measurements that several studies use, memoized on the ``Workbench`` for the rest of the run.

Oracle drafts (``--draft oracle``) replay the target's own greedy output, so every oracle configuration
first needs the autoregressive run of the same prompts (``ar_runs``); its outputs are the continuations.
The acceptance rate reported everywhere is the *measured* one, accepted / tested drafts (``EngineRun.alpha``;
per position: ``position_alphas``): with random weights in bf16 a wide target pass can break a near-tie
differently from a one-token step, so an oracle at alpha may accept a little less than alpha, and prompt
lookup has no nominal alpha at all.
"""
from __future__ import annotations

from ..measure import EngineRun, timed_runs


def sd_k(options) -> int:
    """The fixed K of the studies that use one: the swept K closest to 4."""
    return min(options.ks, key=lambda k: (abs(k - 4), k))


def mid_alpha(options) -> float | None:
    """The oracle's alpha for the studies that use one (the middle of --alphas); None for other drafters."""
    if not options.draft.startswith("oracle"):
        return None
    alphas = sorted(options.alphas)
    return alphas[len(alphas) // 2]


def ar_runs(bench, batch: int) -> tuple[EngineRun, EngineRun]:
    """(phase run, throughput run) of autoregressive decoding of ``batch`` prompts."""
    key = ("ar", batch)
    if key not in bench.memo:
        bench.memo[key] = timed_runs(bench.target, lambda: None, bench.prompts(batch), k=0,
                                     max_new_tokens=bench.options.max_new_tokens)
    return bench.memo[key]


def drafter_factory(bench, batch: int, alpha: float | None):
    conts = [list(p) for p in ar_runs(bench, batch)[0].outputs] if bench.uses_oracle else None
    return lambda: bench.drafter(alpha, conts)


def sd_runs(bench, batch: int, k: int, alpha: float | None) -> tuple[EngineRun, EngineRun]:
    """(phase run, throughput run) of speculative decoding with K = ``k`` (oracle: at ``alpha``)."""
    key = ("sd", batch, k, alpha)
    if key not in bench.memo:
        bench.memo[key] = timed_runs(bench.target, drafter_factory(bench, batch, alpha), bench.prompts(batch), k=k,
                                     max_new_tokens=bench.options.max_new_tokens)
    return bench.memo[key]


def auto_policy_factory(bench, k_max: int, batch: int, alpha: float | None):
    """A factory of fresh k="auto" policies for this pair, or None when the engine has none.

    ``bench.auto_policy`` (a callable (bench, k_max, batch, alpha) -> factory or None) replaces the
    engine's policy, e.g. in tests."""
    custom = getattr(bench, "auto_policy", None)
    if custom is not None:
        return custom(bench, k_max, batch, alpha)
    try:
        from ...engine import auto_k
    except ImportError:
        return None
    key = ("auto-costs", k_max, batch, alpha)
    if key not in bench.memo:
        drafter = drafter_factory(bench, batch, alpha)()
        bench.memo[key] = auto_k.measure_costs(bench.target, drafter, k_max, auto_k.default_batch_sizes(batch))
    costs = bench.memo[key]
    return lambda: auto_k.AutoK(costs)


def auto_runs(bench, batch: int, k_max: int, alpha: float | None):
    """(phase run, throughput run) with k="auto" up to ``k_max``, or None when no policy exists."""
    factory = auto_policy_factory(bench, k_max, batch, alpha)
    if factory is None:
        return None
    key = ("auto", batch, k_max, alpha)
    if key not in bench.memo:
        bench.memo[key] = timed_runs(bench.target, drafter_factory(bench, batch, alpha), bench.prompts(batch),
                                     k=k_max, max_new_tokens=bench.options.max_new_tokens, policy_factory=factory)
    return bench.memo[key]


def has_auto_policy(bench) -> bool:
    if getattr(bench, "auto_policy", None) is not None:
        return True
    import importlib.util

    return importlib.util.find_spec(__package__.rsplit(".", 2)[0] + ".engine.auto_k") is not None


def phase_ms(run: EngineRun) -> dict:
    """Per-round phase times of a timed run, in ms."""
    return {f"{p}_ms": 1e3 * run.per_round(p) for p in ("draft", "target", "verification", "commit")}
