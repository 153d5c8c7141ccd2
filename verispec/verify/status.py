"""The status word: what a verification kernel found wrong with its inputs, one int32 per sequence.

Every backend writes ``VerifyOutput.status`` [B] int32 in the same read of the data that computes the
tokens (no second pass over the logits): 0 means sequence b's inputs were clean and its tokens are exact;
otherwise the bits below say what was wrong and that sequence's tokens must not be used. The default
public call reads the status back once (the one device->host read it makes) and raises ``raise_for_status``'s
error; the engine reads it at its one per-round sync instead.

Bits (a sequence can have several):
    NAN          a logits row of the sequence contains NaN
    POS_INF      a logits row contains +inf
    DEAD_ROW     a logits row is entirely -inf (no token can be emitted from it)
    DRAFT_ID     a draft token id is outside [0, V)
    NUM_DRAFT    k_b < 0, k_b > max_num_draft, or sum(num_draft) + B != rows of target_logits
    SCALED       a sampled row's |max logit / T| exceeds ``MAX_SCALED_LOGIT`` (float32 softmax not exact)
    SETTINGS     a per-sequence temperature / top_k / top_p given as a tensor is out of range
    DRAFT_PROBS  a draft_probs row has NaN or negative entries, does not sum to 1 (within 1e-2), or gives its
                 own draft probability 0

Which rows count: every row of the sequence (k_b draft rows and the bonus row, also those after its first
rejection) and every q row of its drafts. The one exception is the Triton sampler's wave mode (large batches
with ``check_values=False``): it never reads rows after a sequence's first rejection, which cannot change its
tokens, so it cannot check them either. SCALED is judged on rows that are otherwise clean (no NaN, no +inf, not
entirely -inf) of sequences with a valid temperature > 0; DRAFT_ID and the q(draft) test only on drafts whose
position exists. A NUM_DRAFT word is NUM_DRAFT alone: the sequence's rows are unknown, so nothing else is
judged, and any NUM_DRAFT word means the batch's layout is wrong (no sequence's tokens can be trusted).
"""
from __future__ import annotations

import torch

NAN = 1
POS_INF = 2
DEAD_ROW = 4
DRAFT_ID = 8
NUM_DRAFT = 16
SCALED = 32
SETTINGS = 64
DRAFT_PROBS = 128

MAX_SCALED_LOGIT = 2.0**30   # the largest |logit / T| a sampled row may have

# one clear sentence per bit; the error names the first bad sequence and lists up to five
MESSAGES = {
    NAN: "target_logits contains NaN",
    POS_INF: "target_logits contains +inf",
    DEAD_ROW: "a target_logits row is entirely -inf: no token can be emitted from such a row",
    DRAFT_ID: "draft_tokens must be in [0, V): is the draft on the target's tokenizer?",
    NUM_DRAFT: "num_draft does not match the inputs (k_b < 0, k_b > max_num_draft, or sum(num_draft) + B "
               "!= rows of target_logits)",
    SCALED: f"max logit / temperature is beyond 2**30 (|logit / T| must stay <= {MAX_SCALED_LOGIT:g} for the "
            f"sampled softmax to be exact in float32): raise the temperature or rescale the logits",
    SETTINGS: "a temperature / top_k / top_p tensor is out of range (temperature 0 or finite >= 1e-6, top_k >= 0, "
              "top_p in (0, 1])",
    DRAFT_PROBS: "draft_probs must be distributions (non-negative, no NaN, rows summing to 1) giving each drafted "
                 "token a positive probability: q must be the distribution the draft was sampled from",
}


def describe(word: int) -> list[str]:
    """The messages of the bits set in one status word, lowest bit first."""
    return [msg for bit, msg in MESSAGES.items() if word & bit]


def raise_for_status(status) -> None:
    """Raise ValueError naming the first bad sequence if any status word is non-zero.

    status: a list of B ints (or a [B] tensor on the host): read it back once, then call this.

    >>> raise_for_status([0, NAN | POS_INF, DRAFT_ID])
    Traceback (most recent call last):
    ...
    ValueError: sequence 1: target_logits contains NaN; target_logits contains +inf (bad sequences: [1, 2])
    """
    words = status.tolist() if isinstance(status, torch.Tensor) else status
    if not any(words):
        return
    bad = [b for b, w in enumerate(words) if w]
    first = bad[0]
    also = f" (bad sequences: {bad[:5]}{'...' if len(bad) > 5 else ''})" if len(bad) > 1 else ""
    raise ValueError(f"sequence {first}: " + "; ".join(describe(words[first])) + also)
