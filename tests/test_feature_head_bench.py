"""benchmarks/feature_head.py's floor line: the target's weights a decode step reads (as loaded) over the measured
copy bandwidth, and plain decoding's share of it (a tiny model and a stated bandwidth stand in for the GPU's)."""
from __future__ import annotations

import pytest
import torch

from benchmarks import feature_head
from verispec.runtime import ModelConfig, load_model

CFG = ModelConfig(vocab_size=97, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                  intermediate_size=48, max_position_embeddings=128)


def test_the_floor_is_the_weights_over_the_bandwidth(monkeypatch):
    model = load_model(CFG, device="cpu", dtype=torch.bfloat16, seed=0)
    tied = model.net.lm_head is None
    nbytes = model.weight_bytes - (0 if tied else model.net.embed.numel() * 2)
    monkeypatch.setattr(feature_head, "load_model", lambda source: model)
    monkeypatch.setattr(feature_head, "copy_bandwidth", lambda: 1e9)
    line = feature_head.floor_note(None, plain_tps=1000.0)
    floor_s = nbytes / 1e9
    assert f"({nbytes / 1e6:.1f} MB as loaded)" in line and "(0.00 TB/s)" in line
    assert f"= {floor_s * 1e6:.1f} us a step, {1 / floor_s:.0f} tok/s" in line
    assert line.endswith(f"plain decoding here: {1000.0 * floor_s:.1%} of it.")
    assert 1000.0 * floor_s == pytest.approx(nbytes / 1e6)
