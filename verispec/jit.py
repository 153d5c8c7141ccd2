"""Building a CUDA extension on first use (``torch.utils.cpp_extension.load``), cached on disk.

verispec has two extensions, each built only when its wing first needs it: ``verispec_verify`` (the
``backend="cuda"`` verification kernels, verispec/verify/cuda/) and ``verispec_gemv`` (the runtime's
decode GEMV, verispec/runtime/gemv/). Builds go to ``$TORCH_EXTENSIONS_DIR/<name>`` (default
``~/.cache/verispec/torch_extensions/<name>``), for the GPU's own architecture only (sm_90 on H100/H200).
The .cu files are plain CUDA C++ (no torch headers), so CPU CI compiles them with nvcc alone
(tests/test_cuda_compile.py). The bottom layer, like ``verispec.device``: imports nothing of verispec.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import torch

PACKAGE_DIR = Path(__file__).resolve().parent
_LOADED: dict[str, object] = {}


def build_dir(name: str) -> Path:
    """Where the build of extension ``name`` lives."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "verispec" / "torch_extensions")
    return Path(root) / name


def is_built(name: str) -> bool:
    """Whether a previous build of ``name`` is on disk (then loading it takes a second, not minutes)."""
    return (build_dir(name) / f"{name}.so").exists()


def load_extension(name: str, sources: list[Path], include_dirs: list[Path], *, what: str, verbose: bool = False):
    """Build (first call; cached on disk afterwards) and return the extension module ``name``.

    ``include_dirs``: where the sources' headers are; verispec/ itself (jit_glue.h, cuda_dtypes.cuh) is added.
    ``what`` names the feature in errors and in the one-line build notice, e.g. "backend='cuda'".
    Raises RuntimeError with the remedy when there is no CUDA GPU or no nvcc.
    """
    if name in _LOADED:
        return _LOADED[name]
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA GPU and a CUDA build of torch (torch {torch.__version__} sees none)")
    from torch.utils.cpp_extension import CUDA_HOME, load as jit_load

    if shutil.which("nvcc") is None and CUDA_HOME is None:
        raise RuntimeError(f"{what} is compiled on first use and needs nvcc: set CUDA_HOME or put nvcc on PATH")
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    # NOTE: set the arch list so that torch adds no -gencode flags of its own for other GPUs.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
    directory = build_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    if not is_built(name):
        print(f"verispec: building {name} for {what} (first use only; about a minute) ...", file=sys.stderr, flush=True)
    module = jit_load(
        name=name,
        sources=[str(s) for s in sources],
        extra_cflags=["-O3"],
        # no --use_fast_math: division, expf and logf must round as the reference expects
        extra_cuda_cflags=["-O3", "-lineinfo", f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        extra_include_paths=[str(d) for d in (*include_dirs, PACKAGE_DIR)],
        build_directory=str(directory),
        verbose=verbose,
    )
    _LOADED[name] = module
    return module
