"""verispec: exact speculative decoding with fast batched verification.

    from verispec import verify_greedy, verify_sample      # verification of drafts (verispec.verify)
    from verispec import verify_tree_greedy, verify_tree_sample   # ... of draft trees
    from verispec import load_model, generate              # the runtime and the engine
    from verispec.drafters import PromptLookup, DraftModel, SelfSpeculative

The map of the package (its wings and which may import which): docs/architecture.md.
"""

# Each name is imported on first use (PEP 562), not here: importing torch and the wings takes seconds, and
# `verispec --help` (which imports this package) should not pay for what it does not use.
_LAZY = {
    "analysis": ".analysis", "workloads": ".verify.workloads",      # modules
    "DraftModel": "drafters", "PromptLookup": "drafters", "SelfSpeculative": "drafters",
    "Generation": "engine", "GenerationError": "engine", "SpeculativeDecoder": "engine", "Stats": "engine",
    "generate": "engine",
    "HFModel": "runtime", "Model": "runtime", "ModelConfig": "runtime", "load_model": "runtime",
    "VerifyOutput": "verify", "verify_greedy": "verify", "verify_sample": "verify",
    "TreeVerifyOutput": "verify", "verify_tree_greedy": "verify", "verify_tree_sample": "verify",
}

__all__ = [
    "VerifyOutput", "verify_greedy", "verify_sample", "TreeVerifyOutput", "verify_tree_greedy", "verify_tree_sample",
    "load_model", "Model", "HFModel", "ModelConfig",
    "generate", "SpeculativeDecoder", "Generation", "GenerationError", "Stats",
    "DraftModel", "PromptLookup", "SelfSpeculative",
    "analysis", "workloads",
]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    where = _LAZY[name]
    value = importlib.import_module(where if where.startswith(".") else f".{where}", __name__)
    if not where.startswith("."):
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
