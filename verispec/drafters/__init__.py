"""Drafters: each proposes draft tokens for the engine to verify (see ``base.Drafter``).

    DraftModel(model)                   a smaller model with the target's vocabulary
    SelfSpeculative(layers)             the target's first L layers
    PromptLookup(max_ngram, min_ngram)  copy from the history (no model)
    OracleDraft(continuations, alpha)   benchmarks: chosen acceptance rate, real draft cost
"""
from .base import DraftError, Drafter, Proposal, SamplingParams
from .draft_model import DraftModel
from .oracle import OracleDraft
from .prompt_lookup import PromptLookup
from .self_speculative import SelfSpeculative

__all__ = ["Drafter", "DraftError", "Proposal", "SamplingParams", "DraftModel", "OracleDraft", "PromptLookup",
           "SelfSpeculative"]
