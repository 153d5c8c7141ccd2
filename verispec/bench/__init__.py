"""verispec.bench: the ``verispec bench`` studies, importable from Python.

    options.py     BenchOptions, the sweeps per device and every argument check
    workbench.py   the shared models, drafters and prompts of one run (loaded on first use)
    measure.py     engine runs through the Scheduler (static batches, timed arrivals), pass times
    studies/       one module per study: points(bench) and measure(bench, point) -> rows
    store.py       DIR/<study>.jsonl rows and resume
    plots.py       the PNGs (matplotlib, Agg)
    markdown.py    DIR/<study>.md pages and the gathered DIR/report.md
    runner.py      run studies into a directory
    command.py     the CLI subcommand (the only thing verispec/cli.py imports)

    from verispec.bench import BenchOptions, check_options, run_studies
    run_studies(check_options(BenchOptions(studies=("window",), out="out", quick=True)))
"""
from .options import STUDIES, BenchArgumentError, BenchOptions, check_options

_LAZY = {"run_studies": "runner", "run_study": "studies", "Workbench": "workbench"}


def __getattr__(name):
    # the runner pulls in matplotlib and the models: load it only when used, so that `verispec --help` stays fast
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["STUDIES", "BenchArgumentError", "BenchOptions", "check_options", "run_studies", "run_study", "Workbench"]
