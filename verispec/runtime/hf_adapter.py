"""``HFModel``: any transformers causal LM behind the ``Model`` interface (the slow, general path).

Cache layout: one transformers ``DynamicCache`` whose slots are *physical*: every pass appends its T tokens
at the same physical slots for all sequences. A per-sequence boolean ``valid`` mask [B, P] says which slots
hold live tokens; positions (RoPE) are logical, ``lengths[b] + i``, passed as ``position_ids``. Rollback
clears the newest live slots of each sequence in ``valid`` (logical position = cumsum(valid) - 1) and crops
physical slots that no sequence uses any more. e.g. lengths=[3, 2] after ragged prefill:
  valid = [[1,1,1], [1,1,0]]; verify 2 tokens -> [[1,1,1,1,1], [1,1,0,1,1]], positions [[3,4],[2,3]].
This path syncs with the host (cropping, the model's own mask building); it exists for generality.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor


class HFModel:
    def __init__(self, model, tokenizer=None, *, device=None, dtype=None):
        from .loading import default_device_dtype

        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM

            path = Path(model)
            device, dtype = default_device_dtype(device, dtype)
            if not (path / "config.json").exists():
                raise FileNotFoundError(f"{path / 'config.json'} not found: HFModel needs a transformers checkpoint dir")
            try:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            except TypeError:  # transformers < 4.56 spells it torch_dtype
                model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype)
            model = model.to(device)
            if tokenizer is None and (path / "tokenizer.json").exists():
                import json

                from .tokenizer import tokenizer_from_hf_dir
                tokenizer = tokenizer_from_hf_dir(path, json.loads((path / "config.json").read_text()))
        self.hf = model.eval()
        self.tokenizer = tokenizer
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.config = model.config
        self._cache = None
        self._valid: Tensor | None = None          # [B, P] bool
        self._lengths: Tensor | None = None        # [B] int64
        self.max_seq_len = 0

    @property
    def lengths(self) -> Tensor:
        return self._lengths

    def setup_cache(self, batch_size: int, max_seq_len: int, *, empty: bool = False) -> None:
        from transformers import DynamicCache

        self._cache = DynamicCache()
        self._valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=self.device)
        self._lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self.max_seq_len = max_seq_len

    def _forward(self, tokens: Tensor, valid_new: Tensor, positions: Tensor) -> Tensor:
        self._valid = torch.cat([self._valid, valid_new], dim=1)
        out = self.hf(input_ids=tokens, attention_mask=self._valid.long(), position_ids=positions,
                      past_key_values=self._cache, use_cache=True)
        self._cache = out.past_key_values
        return out.logits.to(self.dtype)

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]]) -> Tensor:
        B = self._valid.shape[0]
        if len(prompts) != B:
            raise ValueError(f"prefill got {len(prompts)} prompts but the cache holds {B} sequences")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if max(len(p) for p in prompts) > self.max_seq_len:
            raise ValueError(f"a prompt is longer than max_seq_len {self.max_seq_len}")
        self.setup_cache(B, self.max_seq_len)
        T = max(len(p) for p in prompts)
        tokens = torch.zeros(B, T, dtype=torch.long)
        for b, p in enumerate(prompts):
            tokens[b, : len(p)] = torch.as_tensor(p)
        lens = torch.tensor([len(p) for p in prompts], device=self.device)
        ar = torch.arange(T, device=self.device)
        logits = self._forward(tokens.to(self.device), ar[None] < lens[:, None], ar[None].expand(B, T))
        self._lengths = lens.clone()
        return logits[torch.arange(B, device=self.device), lens - 1]

    def admit(self, prompts: list[list[int]]) -> Tensor:
        """Only into an empty batch (= ``prefill``): this adapter's physical-slot cache cannot let sequences
        join mid-generation. Use a ``verispec.runtime.Model`` for continuous batching."""
        if self._lengths is not None and self._lengths.numel() and self._valid.shape[1]:
            raise NotImplementedError("HFModel cannot admit sequences into a running batch; load the model with "
                                      "verispec.runtime.load_model for continuous batching")
        self.setup_cache(len(prompts), self.max_seq_len)
        return self.prefill(prompts)

    @torch.no_grad()
    def append(self, tokens: Tensor) -> Tensor:
        B, k = tokens.shape
        if int(self._lengths.max()) + k > self.max_seq_len:
            raise ValueError(f"cache full: {k} more tokens would exceed max_seq_len {self.max_seq_len}")
        pos = self._lengths[:, None] + torch.arange(k, device=self.device)
        logits = self._forward(tokens.to(self.device), torch.ones(B, k, dtype=torch.bool, device=self.device), pos)
        self._lengths = self._lengths + k
        return logits

    def decode(self, tokens: Tensor) -> Tensor:
        return self.append(tokens)

    @torch.no_grad()
    def rollback(self, new_lengths: Tensor) -> None:
        new = torch.minimum(torch.as_tensor(new_lengths, device=self.device).long(), self._lengths)
        logical = self._valid.long().cumsum(1) - 1                       # [B, P]
        self._valid = self._valid & (logical < new[:, None])
        self._lengths = new
        live = self._valid.any(0).nonzero()
        keep_slots = int(live.max()) + 1 if live.numel() else 0
        if keep_slots < self._valid.shape[1]:
            self._cache.crop(keep_slots - self._valid.shape[1])  # negative = drop that many (4.x and 5.x)
            self._valid = self._valid[:, :keep_slots]

    @torch.no_grad()
    def keep(self, batch_indices: Tensor) -> None:
        idx = torch.as_tensor(batch_indices, device=self.device).long()
        if hasattr(self._cache, "batch_select_indices"):
            self._cache.batch_select_indices(idx)
        else:
            for layer in self._cache.layers:
                layer.keys, layer.values = layer.keys[idx], layer.values[idx]
        self._valid, self._lengths = self._valid[idx], self._lengths[idx]

    def truncated(self, num_layers: int):
        raise NotImplementedError("HFModel cannot run a layer prefix; load the model with "
                                  "verispec.runtime.load_model to get Model.truncated")
