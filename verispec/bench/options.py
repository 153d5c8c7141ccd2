"""What a bench run is asked to do: ``BenchOptions``, checked in full before any model is loaded.

Every bad value raises ``BenchArgumentError`` with one line naming the option; the command line turns it
into exit status 2. Sweep lists are comma-separated on the command line ("1,2,4,8").
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

STUDIES = ("kernels", "speedup", "breakdown", "window", "batch", "ssd", "trees", "heads")


class BenchArgumentError(ValueError):
    """A bad argument of a bench run (one line, names the option)."""


# Full and --quick sweeps, per device type. The GPU sweeps fit in about 6 minutes on one H100 for the
# 8B/1B shapes (graph capture included); the CPU ones in a few minutes for SmolLM2 on two cores. ``trees``: the
# trees study's shapes (children per node at each depth); the GPU ones are benchmarks/trees.py's end-to-end shapes.
SWEEPS = {
    ("cpu", False): dict(ks=(1, 2, 4, 8), alphas=(0.5, 0.7, 0.9), batches=(1, 2, 4), max_new_tokens=48,
                         rates=(1.0, 4.0), trees=((2, 2, 1), (3, 2, 1))),
    ("cpu", True): dict(ks=(1, 2), alphas=(0.6,), batches=(1, 2), max_new_tokens=8, rates=(50.0,),
                        trees=((2, 1),)),
    ("cuda", False): dict(ks=(2, 4, 8), alphas=(0.6, 0.8, 0.9), batches=(1, 8, 32), max_new_tokens=64,
                          rates=(16.0,), trees=((2, 2, 1), (2, 2, 2, 1), (3, 2, 2, 1), (4, 2, 2, 1))),
    ("cuda", True): dict(ks=(2, 4), alphas=(0.8,), batches=(1, 8), max_new_tokens=16, rates=(32.0,),
                         trees=((2, 2, 1), (4, 2, 2, 1))),
}


@dataclass
class BenchOptions:
    """One bench run. ``None`` sweep fields take the device's defaults (``SWEEPS``) in ``resolved()``."""

    studies: tuple[str, ...]
    out: Path
    model: str | None = None          # None: the embedded SmolLM2 on CPU, llama-3.1-8b random shapes on CUDA
    draft: str | None = None          # model source | lookup | self:L | oracle[:ALPHA]; None: per device
    draft_cost: str | None = None     # oracle drafts: the model whose passes they pay for (None: per device)
    device: str | None = None
    dtype: str | None = None
    quick: bool = False
    ks: tuple[int, ...] | None = None
    alphas: tuple[float, ...] | None = None
    batches: tuple[int, ...] | None = None
    rates: tuple[float, ...] | None = None   # batch study: request arrival rates (requests / s)
    trees: tuple[tuple[int, ...], ...] | None = None   # trees study: tree shapes (children per node at each depth)
    draft_head: str | None = None     # heads study: a head directory (None: the embedded SmolLM2's head, if it fits)
    max_new_tokens: int | None = None
    prompt_len: int = 32              # random-shape prompts (token ids)
    seed: int = 0
    packed: bool = False              # every .gguf model of the run kept as its GGUF blocks (load_model(packed=True))
    command: str = ""                 # the command line, for the report header
    extra: dict = field(default_factory=dict)

    def device_type(self) -> str:
        if self.device is not None:
            return "cuda" if self.device.startswith("cuda") else "cpu"
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved(self) -> "BenchOptions":
        """A copy with every None sweep and model choice filled in for the device."""
        dev = self.device_type()
        defaults = SWEEPS[(dev, self.quick)]
        o = replace(self)
        for name in ("ks", "alphas", "batches", "rates", "max_new_tokens", "trees"):
            if getattr(o, name) is None:
                setattr(o, name, defaults[name])
        if o.model is None and dev == "cuda":
            o.model = "llama-3.1-8b"
        if o.draft is None:
            o.draft = "oracle" if dev == "cuda" else "lookup"
        if o.draft.startswith("oracle") and o.draft_cost is None and dev == "cuda":
            o.draft_cost = "llama-3.2-1b"
        if o.draft.startswith("oracle:") and self.alphas is None:
            o.alphas = (float(o.draft.split(":", 1)[1]),)
        return o


# ------------------------------------------------------------------------------------------ parsing
def parse_list(text: str, kind, flag: str) -> tuple:
    """"1,2,4" -> (1, 2, 4); BenchArgumentError for an empty list or a bad item."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise BenchArgumentError(f"{flag}: the sweep is empty (give comma-separated values, e.g. {flag} 1,2,4)")
    try:
        return tuple(kind(t) for t in items)
    except ValueError:
        raise BenchArgumentError(f"{flag}: {text!r} is not a comma-separated list of {kind.__name__}s") from None


def parse_trees(text: str, flag: str = "--trees") -> tuple[tuple[int, ...], ...]:
    """"2,2,1;4,2,2,1" -> ((2, 2, 1), (4, 2, 2, 1)): tree shapes separated by ';', each the children per node at
    each depth, comma-separated; BenchArgumentError for an empty list or a bad shape (checked by ``check_trees``)."""
    shapes = [t.strip() for t in str(text).split(";") if t.strip()]
    if not shapes:
        raise BenchArgumentError(f"{flag}: no tree given (give ';'-separated shapes, e.g. {flag} '2,2,1;4,2,2,1')")
    out = []
    for shape in shapes:
        try:
            out.append(tuple(int(w) for w in shape.split(",")))
        except ValueError:
            raise BenchArgumentError(f"{flag}: {shape!r} is not comma-separated integers (children per node at "
                                     f"each depth, e.g. 4,2,2,1)") from None
    return tuple(out)


def check_trees(trees, flag: str = "--trees") -> None:
    """Every shape through the engine's own tree check (widths >= 1, at most MAX_TREE_TOKENS - 1 nodes)."""
    from ..engine.guards import check_tree

    class AnyTreeDrafter:   # the drafter is built later; every --draft kind drafts trees
        drafts_trees = True

    if not trees:
        raise BenchArgumentError(f"{flag}: no tree given")
    for t in trees:
        try:
            check_tree(t, AnyTreeDrafter())
        except (TypeError, ValueError) as e:
            raise BenchArgumentError(f"{flag}: {e}") from None


def check_studies(names) -> tuple[str, ...]:
    """The study names, "all" expanded; BenchArgumentError naming an unknown one."""
    names = list(names)
    if not names:
        raise BenchArgumentError(f"no study given: choose from {', '.join(STUDIES)} or all")
    out = []
    for n in names:
        if n == "all":
            out += [s for s in STUDIES if s not in out]
        elif n in STUDIES:
            if n not in out:
                out.append(n)
        else:
            raise BenchArgumentError(f"unknown study {n!r}: choose from {', '.join(STUDIES)}, all (or report DIR)")
    return tuple(out)


def check_options(o: BenchOptions) -> BenchOptions:
    """Every check that needs no model; returns the resolved options. Raises BenchArgumentError."""
    o.studies = check_studies(o.studies)
    for flag, values in (("--k", o.ks), ("--batches", o.batches)):
        if values is not None:
            if not values:
                raise BenchArgumentError(f"{flag}: the sweep is empty")
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
            if bad:
                what = "k (drafts per round)" if flag == "--k" else "batch sizes"
                raise BenchArgumentError(f"{flag}: {what} must be integers >= 1, got {bad[0]!r}")
    if o.alphas is not None:
        if not o.alphas:
            raise BenchArgumentError("--alphas: the sweep is empty")
        bad = [a for a in o.alphas if not 0.0 <= a <= 1.0]
        if bad:
            raise BenchArgumentError(f"--alphas: acceptance rates must be in [0, 1], got {bad[0]}")
    if o.rates is not None:
        if not o.rates:
            raise BenchArgumentError("--rates: the sweep is empty")
        bad = [r for r in o.rates if not r > 0]
        if bad:
            raise BenchArgumentError(f"--rates: arrival rates must be > 0 requests/s, got {bad[0]}")
    if o.trees is not None:
        check_trees(o.trees)
    if o.draft_head is not None:
        _check_head_dir(o.draft_head)
    if o.max_new_tokens is not None and o.max_new_tokens < 2:
        raise BenchArgumentError(f"--max-new-tokens must be >= 2, got {o.max_new_tokens}")
    if o.prompt_len < 1:
        raise BenchArgumentError(f"--prompt-len must be >= 1, got {o.prompt_len}")
    _check_draft(o.draft)
    _check_device(o)
    resolved = o.resolved()
    if o.packed and not is_gguf_source(resolved.model):
        raise BenchArgumentError(f"--packed keeps GGUF blocks: the target must be a .gguf file (`verispec quantize` "
                                 f"makes one) or the embedded model, got {resolved.model!r}")
    check_out_dir(o.out)
    return resolved


def is_gguf_source(source) -> bool:
    """Whether a model source is a GGUF file: a path ending in .gguf, or None (the embedded SmolLM2's)."""
    return source is None or (isinstance(source, (str, os.PathLike)) and os.fspath(source).endswith(".gguf"))


def _check_draft(draft: str | None) -> None:
    if draft is None or draft == "lookup" or draft == "oracle":
        return
    if draft.startswith("self:"):
        layers = draft.split(":", 1)[1]
        if not layers.isdigit() or int(layers) < 1:
            raise BenchArgumentError(f"--draft {draft}: self:L needs a number of layers L >= 1")
        return
    if draft.startswith("oracle:"):
        try:
            alpha = float(draft.split(":", 1)[1])
        except ValueError:
            alpha = -1.0
        if not 0.0 <= alpha <= 1.0:
            raise BenchArgumentError(f"--draft {draft}: oracle:ALPHA needs an acceptance rate in [0, 1]")
        return
    from ..runtime.loading import peek_config

    try:
        peek_config(draft)
    except (ValueError, FileNotFoundError) as e:
        raise BenchArgumentError(f"--draft {draft}: {e}") from None


def _check_head_dir(path) -> None:
    """--draft-head DIR: a head directory (written by ``verispec train-head``, or a published EAGLE head); whether
    it fits the target is checked when the heads study loads both."""
    if not Path(path).is_dir() or not (Path(path) / "config.json").is_file():
        raise BenchArgumentError(f"--draft-head {path}: not a head directory (no config.json there; write one with "
                                 f"`verispec train-head --out DIR`)")


def _check_device(o: BenchOptions) -> None:
    from ..device import DTYPE_NAMES, parse_device

    if o.device is not None:
        try:
            parse_device(o.device)
        except ValueError as e:
            raise BenchArgumentError(f"--device: {e}") from None
    if o.dtype is not None and o.dtype.lower() not in DTYPE_NAMES:
        raise BenchArgumentError(f"--dtype {o.dtype!r} is not one of {sorted(DTYPE_NAMES)}")
    if o.model is not None:
        from ..runtime.loading import peek_config

        try:
            peek_config(o.model)
        except (ValueError, FileNotFoundError) as e:
            raise BenchArgumentError(f"--model {o.model}: {e}") from None


def check_out_dir(out) -> Path:
    """``out`` as a Path, created if missing; BenchArgumentError when it cannot be written."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as e:
        raise BenchArgumentError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    if not os.access(path, os.W_OK):
        raise BenchArgumentError(f"--out {out}: cannot write there (permission denied)")
    return path
