"""Building a CUDA header's host driver (tests/*_host.cpp) with the host C++ compiler, for the CPU tests that check
packed.cu's decoders and v3's lane layout against the torch dequantizer."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

GEMV_DIR = Path(__import__("verispec.runtime.gemv", fromlist=["_SRC"])._SRC)
CXX = shutil.which("g++") or shutil.which("c++")


def build_host_driver(source: str, out_dir: Path) -> Path:
    """Compile tests/<source> (it includes the gemv headers) into out_dir; skips the test without a C++ compiler.
    -ffp-contract=off: every product and sum rounded on its own, as the CUDA code's __fmul_rn / __fadd_rn."""
    if CXX is None:
        pytest.skip("no host C++ compiler (g++ / c++) on PATH")
    exe = out_dir / Path(source).stem
    r = subprocess.run([CXX, "-std=c++17", "-O2", "-ffp-contract=off", "-Wall", "-Wno-unknown-pragmas",
                        f"-I{GEMV_DIR}", str(Path(__file__).resolve().parent / source), "-o", str(exe)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return exe
