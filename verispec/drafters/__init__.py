"""Drafters: each proposes draft tokens for the engine to verify (see ``base.Drafter``).

    DraftModel(model)                   a smaller model with the target's vocabulary
    SelfSpeculative(layers)             the target's first L layers
    PromptLookup(max_ngram, min_ngram)  copy from the history (no model)
    FeatureHead(path=None)              an EAGLE-3-style head over the target's hidden states (None: the embedded one)
    FeatureHead.from_pretrained(path, target)   also a published EAGLE-3 or EAGLE (1/2) head (published_heads.py)
    OracleDraft(continuations, alpha)   benchmarks: chosen acceptance rate, real draft cost
    SuccessorOracle(successor, alpha)   benchmarks, for a server: the same on a make_peaked model
All but SuccessorOracle and FeatureHead also draft token trees (``propose_tree``: generate(..., tree=widths)).
"""
from .base import DraftError, Drafter, Proposal, SamplingParams, TreeDraftUnsupported, TreeProposal
from .draft_model import DraftModel
from .feature_head import FeatureHead
from .oracle import OracleDraft, SuccessorOracle, make_peaked
from .prompt_lookup import PromptLookup
from .self_speculative import SelfSpeculative

__all__ = ["Drafter", "DraftError", "Proposal", "SamplingParams", "DraftModel", "FeatureHead", "OracleDraft",
           "SuccessorOracle", "make_peaked", "PromptLookup", "SelfSpeculative", "TreeProposal", "TreeDraftUnsupported"]
