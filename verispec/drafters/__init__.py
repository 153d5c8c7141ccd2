"""Drafters: each proposes draft tokens for the engine to verify (see ``base.Drafter``).

    DraftModel(model)                   a smaller model with the target's vocabulary
    SelfSpeculative(layers)             the target's first L layers
    PromptLookup(max_ngram, min_ngram)  copy from the history (no model)
    OracleDraft(continuations, alpha)   benchmarks: chosen acceptance rate, real draft cost
    SuccessorOracle(successor, alpha)   benchmarks, for a server: the same on a make_peaked model
All but SuccessorOracle also draft token trees (``propose_tree``: generate(..., tree=widths)).
"""
from .base import DraftError, Drafter, Proposal, SamplingParams, TreeDraftUnsupported, TreeProposal
from .draft_model import DraftModel
from .oracle import OracleDraft, SuccessorOracle, make_peaked
from .prompt_lookup import PromptLookup
from .self_speculative import SelfSpeculative

__all__ = ["Drafter", "DraftError", "Proposal", "SamplingParams", "DraftModel", "OracleDraft", "SuccessorOracle",
           "make_peaked", "PromptLookup", "SelfSpeculative", "TreeProposal", "TreeDraftUnsupported"]
