"""Verification batches handed straight to the backend="cuda" launchers (GPU tests).

The public API validates and refuses bad inputs before any kernel runs; the status-word tests need the
kernels to see them. These build the object the launchers read (``verify.api.VerifyBatch``'s attributes)
without any value check, on the GPU.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from verispec.verify import rng


def ragged_batch(target_logits, draft_tokens, num_draft, max_num_draft: int, **sampling) -> SimpleNamespace:
    """A batch over CUDA tensors with cu_num_draft computed on the device from num_draft as given (which may
    be inconsistent on purpose). ``sampling``: draft_probs, temperature, top_k, top_p, seed, offset ([B]
    tensors or None; seed may be an int, expanded as ``verify_sample`` does)."""
    num_draft = torch.as_tensor(num_draft, dtype=torch.int32).cuda()
    batch = num_draft.shape[0]
    cu_num_draft = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    cu_num_draft[1:] = torch.cumsum(num_draft, 0)
    seed = sampling.get("seed", 0)
    if not isinstance(seed, torch.Tensor):
        seed = rng.sequence_seeds(seed, batch)
    offset = sampling.get("offset")
    default = lambda value, fill, dtype: (value if value is not None  # noqa: E731
                                          else torch.full((batch,), fill, dtype=dtype)).to("cuda", dtype)
    return SimpleNamespace(
        target_logits=target_logits.cuda(), draft_tokens=torch.as_tensor(draft_tokens, dtype=torch.int64).cuda(),
        num_draft=num_draft, cu_num_draft=cu_num_draft, max_num_draft=max_num_draft,
        draft_probs=None if sampling.get("draft_probs") is None else sampling["draft_probs"].cuda(),
        temperature=default(sampling.get("temperature"), 1.0, torch.float32),
        top_k=default(sampling.get("top_k"), 0, torch.int32), top_p=default(sampling.get("top_p"), 1.0, torch.float32),
        seed=seed.to("cuda", torch.int64), offset=default(offset, 0, torch.int64),
        batch_size=batch, vocab_size=target_logits.shape[1],
    )
