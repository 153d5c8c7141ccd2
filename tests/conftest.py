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
