"""Where the Triton tests run, and the interpreter settings (conftest.py sets TRITON_INTERPRET first)."""
from __future__ import annotations

import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# the interpreter runs kernels on CPU tensors; compiled kernels need CUDA tensors
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"


def speed_up_interpreter() -> None:
    """Skip two interpreter-only costs that change no result (about 2x faster Triton tests on 2 CPUs):
    - integer-overflow sanitizing of every add/mul (compiled kernels skip it unless debug=True);
    - re-patching triton.language on every nested @jit call (tl.sum, tl.philox, ...): done once
      per launch instead, as the patches are identical until the launch restores them.
    """
    import dataclasses
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    patch, restore, patched = interpreter._patch_lang, interpreter._LangPatchScope.restore, set()

    def patch_once(fn):
        langs = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
        if langs in patched:
            return interpreter._LangPatchScope()
        patched.add(langs)
        return patch(fn)

    def restore_all(scope):
        patched.clear()
        restore(scope)

    interpreter._patch_lang = patch_once
    interpreter._LangPatchScope.restore = restore_all


def apply() -> None:
    """``speed_up_interpreter`` where this triton version allows it, else run at normal speed."""
    try:
        speed_up_interpreter()
    except (AttributeError, TypeError):  # the private interpreter API of another triton version
        pass
