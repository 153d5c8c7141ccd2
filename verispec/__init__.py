"""verispec: exact speculative decoding with fast batched verification.

    from verispec import verify_greedy, verify_sample      # verification of drafts (verispec.verify)
    from verispec import verify_tree_greedy, verify_tree_sample   # ... of draft trees
    from verispec import load_model, generate              # the runtime and the engine
    from verispec.drafters import PromptLookup, DraftModel, SelfSpeculative

The map of the package (its wings and which may import which): docs/architecture.md.
"""

from . import analysis
from .drafters import DraftModel, PromptLookup, SelfSpeculative
from .engine import Generation, GenerationError, SpeculativeDecoder, Stats, generate
from .runtime import HFModel, Model, ModelConfig, load_model
from .verify import (TreeVerifyOutput, VerifyOutput, verify_greedy, verify_sample, verify_tree_greedy,
                     verify_tree_sample, workloads)

__all__ = [
    "VerifyOutput", "verify_greedy", "verify_sample", "TreeVerifyOutput", "verify_tree_greedy", "verify_tree_sample",
    "load_model", "Model", "HFModel", "ModelConfig",
    "generate", "SpeculativeDecoder", "Generation", "GenerationError", "Stats",
    "DraftModel", "PromptLookup", "SelfSpeculative",
    "analysis", "workloads",
]
