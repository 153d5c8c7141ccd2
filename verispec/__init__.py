"""verispec: exact speculative decoding with fast batched verification.

    from verispec import verify_greedy, verify_sample      # the verification kernels' API
    from verispec import load_model, generate              # the runtime and the engine
    from verispec.drafters import PromptLookup, DraftModel, SelfSpeculative
"""

from . import analysis, workloads
from .drafters import DraftModel, OracleDraft, PromptLookup, SelfSpeculative
from .engine import Generation, SpeculativeDecoder, Stats, generate
from .reference import VerifyOutput
from .runtime import HFModel, Model, ModelConfig, load_model
from .verify import verify_greedy, verify_sample

__all__ = [
    "VerifyOutput", "verify_greedy", "verify_sample",
    "load_model", "Model", "HFModel", "ModelConfig",
    "generate", "SpeculativeDecoder", "Generation", "Stats",
    "DraftModel", "PromptLookup", "SelfSpeculative", "OracleDraft",
    "analysis", "workloads",
]
