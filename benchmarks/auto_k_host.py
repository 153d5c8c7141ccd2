"""The host time of k=auto's choice per round (``AutoK.__call__`` for chains, ``AutoK.decide`` with tree="auto"):
the Python that runs between one round's outcome and the next round's launch, so every microsecond of it is a
microsecond of the round on a GPU.

    python benchmarks/auto_k_host.py --out DIR [--write]     # CPU is enough

1. The choice per round: B greedy rows drafting against a synthetic draft (each position accepted with probability
   0.75; tree rounds cover a depth with probability 0.8), 600 rounds after 100 of warm-up, one torch thread; each
   cell the median per-round time of one run. An absolute figure for this machine: on a shared 2-core box two runs
   of the same code in fresh processes differ by up to ~35%, so no before/after is drawn from it.
2. ``RowState.alphas`` (each greedy row's estimate, every round that is not a hold) through its general loop and its
   chain-only pass, timed in one process (the two alternated, the median of 15 repeats each): the stable A/B here.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (1, 8, 32)
ROUNDS, WARM = 600, 100


def _table():
    from verispec.engine.auto_k import CostTable

    return CostTable((1, 2, 4, 8, 16, 32), (1, 2, 64), ((1.0, 1.05, 2.0),) * 6, (0.05,) * 6)


def round_us(batch: int, trees: bool) -> float:
    """Median us of one round's choice at ``batch`` greedy rows (chains, or tree="auto" over AUTO_TREES)."""
    from verispec.engine.auto_k import AUTO_TREES, AutoK, RowState
    from verispec.engine.request import Request, Sequence
    from verispec.engine.stats import Stats

    rng = random.Random(0)
    policy = AutoK(_table(), trees=AUTO_TREES if trees else ())
    seqs = [Sequence(Request([1, 2, 3], 10 ** 6, id=i, seed=i), Stats(), k_state=RowState()) for i in range(batch)]
    times = []
    for _ in range(WARM + ROUNDS):
        t = time.perf_counter()
        ks, tree = policy.decide(seqs, 8) if trees else (policy(seqs, 8), None)
        times.append(time.perf_counter() - t)
        accepted = []
        for seq, k in zip(seqs, ks):
            n, a = (len(tree) if tree else k), 0
            while a < n and rng.random() < (0.8 if tree else 0.75):
                a += 1
            seq.stats.add_round(n, a)
            accepted.append(a)
        if tree:
            policy.observe_tree(seqs, tree, [len(tree)] * batch, accepted)
    return statistics.median(times[WARM:]) * 1e6


def alphas_us() -> list[tuple[int, float, float]]:
    """(k_max, us of RowState.alphas through its general loop, us through its chain-only pass) on one row's chain
    evidence of 8 positions, in this process, the median of 15 alternated repeats of 10000 calls each. The general
    loop is taken by giving the row an empty width-2 table: every position then reads the tree tables and finds
    nothing, as every chain round did before the one-pass branch."""
    import timeit

    from verispec.engine.auto_k import RowState

    rng = random.Random(0)
    acc = [rng.uniform(0, 10) for _ in range(8)]
    tst = [a + rng.uniform(0, 10) for a in acc]
    fast = RowState(accepted=list(acc), tested=list(tst))
    general = RowState(accepted=list(acc), tested=list(tst), wide_tested={2: []}, wide_accepted={2: []})
    out = []
    for k in (4, 8, 12):
        assert fast.alphas(k, 0.9, 0.5) == general.alphas(k, 0.9, 0.5)
        times = ([], [])
        for _ in range(15):          # the two alternated: a shared CPU's drift hits both alike
            for j, st in enumerate((general, fast)):
                times[j].append(timeit.timeit(lambda: st.alphas(k, 0.9, 0.5), number=10000) / 10000 * 1e6)
        out.append((k, statistics.median(times[0]), statistics.median(times[1])))
    return out


def measure() -> dict:
    import torch

    torch.set_num_threads(1)
    return {f"{'tree' if trees else 'chain'} {b}": round_us(b, trees) for trees in (False, True) for b in BATCHES}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for auto_k_host.md")
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/auto_k_host.md")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import environment, environment_line, markdown_table, write_page

    t0 = time.perf_counter()
    now = measure()
    rows = [[key.split()[0], key.split()[1], f"{us:.0f}"] for key, us in now.items()]
    lines = ["# k=auto's host time per round", "", environment_line(environment()), "",
             f"Command: `python benchmarks/auto_k_host.py` ({time.perf_counter() - t0:.0f} s). The choice of one "
             "round (`AutoK.__call__` for chains, `AutoK.decide` for tree=\"auto\"), median us over 600 rounds, one "
             "torch thread (an absolute figure for this machine: two runs of the same code differ by up to ~35% on a "
             "shared 2-core box):", ""]
    lines += markdown_table(["shape", "greedy rows", "us a round"], rows)
    lines += ["", "RowState.alphas, one row's chain evidence (its per-row estimate, asked for every greedy row every "
              "round that is not a hold), us per call in this process, the median of 15 alternated repeats; host "
              "Python has no byte floor; the general loop, the path every chain round took before, is the peer:", ""]
    lines += markdown_table(["k_max", "general loop us", "chain-only pass us", "general / chain-only"],
                            [[k, f"{g:.2f}", f"**{f:.2f}**", f"{g / f:.1f}x"] for k, g, f in alphas_us()])
    text = "\n".join(lines) + "\n"
    write_page(text, args.out, "auto_k_host.md", args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
