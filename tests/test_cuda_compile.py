"""CPU CI for the CUDA backend: every .cu compiles for sm_90 with nvcc alone (no GPU, no torch
CUDA headers), and the loader fails with a clear message where there is no GPU.

The torch binding (binding.cpp) needs a CUDA build of torch and is only built on a GPU machine
(tests/test_cuda_parity.py runs there).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# every .cu of the package, of dev/ and of benchmarks/ (ablations), with the directories their headers live in
CUDA_DIRS = [ROOT / "verispec", ROOT / "verispec" / "verify" / "cuda", ROOT / "verispec" / "runtime" / "gemv"]
SOURCES = sorted([*ROOT.glob("verispec/**/*.cu"), *ROOT.glob("dev/**/*.cu"), *ROOT.glob("benchmarks/**/*.cu")])
NVCC = shutil.which("nvcc")


# -ptx stops before ptxas (about half the time of -c on a loaded 2-CPU CI box); set
# VERISPEC_NVCC_FULL=1 to assemble sm_90 machine code too.
FULL = os.environ.get("VERISPEC_NVCC_FULL") == "1"


def _compile(source: Path, out_dir: Path) -> subprocess.CompletedProcess:
    mode = ["-gencode=arch=compute_90,code=sm_90", "-c"] if FULL else ["-arch=sm_90", "-ptx"]
    cmd = [NVCC, *mode, "-O3", "-std=c++17", "-Werror", "all-warnings", *[f"-I{d}" for d in CUDA_DIRS],
           str(source), "-o", str(out_dir / (source.stem + (".o" if FULL else ".ptx")))]
    # a guard against a hung nvcc, not a speed check: packed.cu and benchmarks/packed_v5.cu each take ~75 s of a
    # quiet 2-CPU box, and under pytest-xdist they share it with the other worker's tests
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def test_sources_exist():
    assert {p.name for p in SOURCES} >= {"verify_greedy.cu", "verify_sample.cu", "kv_compact.cu", "gemv.cu", "invariant.cu", "packed.cu", "gemv_fused.cu"}


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH: cannot compile the CUDA sources")
def test_every_cu_compiles_for_sm90(tmp_path):
    with ThreadPoolExecutor(max_workers=len(SOURCES)) as pool:
        results = list(pool.map(lambda s: _compile(s, tmp_path), SOURCES))
    failures = [f"{s.name}:\n{r.stderr}" for s, r in zip(SOURCES, results) if r.returncode != 0]
    assert not failures, "nvcc failed:\n" + "\n".join(failures)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_loader_says_why_without_gpu():
    import verispec.runtime.gemv as gemv
    import verispec.verify.cuda as vc

    for loader in (vc.load, gemv.load):
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            loader()


# Each extension: its binding and the .cu sources it is built from (as in the loaders).
EXTENSIONS = {
    "verispec_verify": ("verispec/verify/cuda/binding.cpp", ["verispec/verify/cuda/verify_greedy.cu",
                                                             "verispec/verify/cuda/verify_sample.cu"]),
    "verispec_gemv": ("verispec/runtime/gemv/binding.cpp", ["verispec/runtime/gemv/gemv.cu",
                                                          "verispec/runtime/gemv/invariant.cu",
                                                          "verispec/runtime/gemv/packed.cu"]),
    "verispec_dev": ("dev/binding.cpp", ["dev/kv/kv_compact.cu", "dev/gemv_fused/gemv_fused.cu"]),
}


@pytest.mark.parametrize("name", sorted(EXTENSIONS))
def test_binding_declares_and_links_every_launcher(name):
    """The torch binding cannot be compiled here (no CUDA build of torch), so check what would break its
    build: every ``vs_*`` launcher the binding calls is declared in its ``extern "C"`` block and defined
    ``extern "C"`` in one of the extension's sources (or a file they include)."""
    binding, sources = EXTENSIONS[name]
    text = (ROOT / binding).read_text()
    externs = text.split('extern "C" {', 1)[1].split("\n}", 1)[0]
    declared = set(re.findall(r"\b(vs_\w+)\s*\(", externs))
    body = text.split("\n}", 1)[1]
    called = set(re.findall(r"\b(vs_\w+)\s*\(", body))
    defined = set()
    for src in sources:
        src_text = (ROOT / src).read_text()
        for inc in re.findall(r'#include "(\w+\.cu)"', src_text):   # e.g. gemv_fused.cu includes gemv.cu
            src_text += next(ROOT.glob(f"verispec/**/{inc}")).read_text()
        defined |= set(re.findall(r'extern "C"[^(]*?\b(vs_\w+)\s*\(', src_text))
    assert called <= declared, f"{binding} calls undeclared launchers: {sorted(called - declared)}"
    assert declared <= defined, f"{binding} declares launchers no source defines: {sorted(declared - defined)}"


def test_status_bits_match_the_kernels():
    """common.cuh's VS_STATUS_* bits and limits are verispec/verify/status.py's (the contract every backend
    shares)."""
    from verispec.verify import status

    text = (ROOT / "verispec/verify/cuda/common.cuh").read_text()
    bits = {name: int(value) for name, value in re.findall(r"#define VS_STATUS_(\w+) (\d+)", text)}
    assert bits == {name: getattr(status, name) for name in bits}
    assert sorted(bits.values()) == sorted(status.MESSAGES)
    limit = float(re.search(r"#define VS_MAX_SCALED_LOGIT ([\d.]+)f", text).group(1))
    assert limit == status.MAX_SCALED_LOGIT
    from verispec.verify.sampling import MIN_TEMPERATURE

    assert float(re.search(r"#define VS_MIN_TEMPERATURE ([\de.-]+)f", text).group(1)) == MIN_TEMPERATURE


def _param_types(params: str) -> list[str]:
    """The parameter types of a C parameter list, names and whitespace dropped:
    'const float* part_val, int n' -> ['constfloat*', 'int']."""
    types = []
    for param in filter(None, (p.strip() for p in params.replace("\n", " ").split(","))):
        param = re.sub(r"/\*.*?\*/", "", param).strip()
        types.append(re.sub(r"\s+", "", re.sub(r"\b\w+$", "", param)))
    return types


@pytest.mark.parametrize("name", sorted(EXTENSIONS))
def test_binding_declarations_match_the_definitions(name):
    """extern "C" names are not mangled, so a declaration whose parameters differ from the definition links
    and then passes garbage: compare the parameter types of each declared launcher with its definition."""
    binding, sources = EXTENSIONS[name]
    text = (ROOT / binding).read_text()
    externs = text.split('extern "C" {', 1)[1].split("\n}", 1)[0]
    declared = {fn: _param_types(params) for fn, params in re.findall(r"\b(vs_\w+)\s*\(([^)]*)\)\s*;", externs)}
    defined = {}
    for src in sources:
        src_text = (ROOT / src).read_text()
        for inc in re.findall(r'#include "(\w+\.cu)"', src_text):
            src_text += next(ROOT.glob(f"verispec/**/{inc}")).read_text()
        src_text = re.sub(r"//[^\n]*", "", src_text)  # comments may hold commas
        for fn, params in re.findall(r'extern "C"[^(;]*?\b(vs_\w+)\s*\(([^)]*)\)\s*\{', src_text):
            defined[fn] = _param_types(params)
    for fn, types in declared.items():
        assert fn in defined, f"{fn} is declared in {binding} but defined in none of {sources}"
        assert types == defined[fn], f"{fn}: {binding} declares {types}, the source defines {defined[fn]}"


def test_argmax_variant_names_match_the_kernel_table():
    """ARGMAX_VARIANTS (Python) names the versions of VS_ARGMAX_VERSIONS (verify_greedy.cu): the same codes,
    and each name says its kind, threads and loads in flight (v2 / v3 are the 256-thread chunked originals)."""
    from verispec.verify.cuda import ARGMAX_VARIANTS, DEFAULT_ARGMAX

    text = (ROOT / "verispec/verify/cuda/verify_greedy.cu").read_text()
    table = {int(code): (int(bal), int(threads), int(unroll))
             for code, bal, threads, unroll in re.findall(r"X\((\d+), (\d), (\d+), (\d+), (?:true|false)\)", text)}
    assert sorted(table) == sorted(ARGMAX_VARIANTS.values())
    for name, code in ARGMAX_VARIANTS.items():
        bal, threads, unroll = table[code]
        assert name.startswith("bal-") == bool(bal), name
        for letter, value in (("t", threads), ("u", unroll)):   # e.g. "bal-t512-u8": 512 threads, 8 loads
            said = re.search(rf"-{letter}(\d+)", name)
            assert said is None or int(said.group(1)) == value, (name, table[code])
    assert DEFAULT_ARGMAX is None or DEFAULT_ARGMAX in ARGMAX_VARIANTS
    from verispec.verify.cuda import default_argmax
    assert {default_argmax(1), default_argmax(4096)} <= set(ARGMAX_VARIANTS)
