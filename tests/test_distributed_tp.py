"""Tensor-parallel target on gloo: 2 spawned ranks; logits equal the single-process model's (fp32)."""
import os

import pytest
import torch

from verispec.distributed.group import DistributedError, run_local
from verispec.distributed.tp import shard_transformer
from verispec.runtime import ModelConfig, load_model, ops

CFG = dict(vocab_size=97, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
           intermediate_size=48, max_position_embeddings=128)


def tp_logits_worker(rank, world_size, configs):
    return [tp_logits_one(c) for c in configs]


def tp_logits_one(cfg_kwargs):
    from verispec.distributed.tp import tensor_parallel_model

    full = load_model(ModelConfig(**cfg_kwargs), device="cpu", dtype=torch.float32, seed=3)
    tp = tensor_parallel_model(full)
    prompts = [[5, 6, 7, 8, 9], [11, 12]]
    steps = [torch.tensor([[1], [2]]), torch.tensor([[3, 4, 5], [6, 7, 8]]), torch.tensor([[9], [10]])]
    diffs = []
    for m in (full, tp):
        m.setup_cache(2, 32)
    diffs.append((full.prefill(prompts) - tp.prefill(prompts)).abs().max().item())
    for tokens in steps:
        diffs.append((full.append(tokens) - tp.append(tokens)).abs().max().item())
    back = torch.tensor([7, 4])                      # rollback then verify again on both
    full.rollback(back)
    tp.rollback(back)
    diffs.append((full.append(steps[1]) - tp.append(steps[1])).abs().max().item())
    kv_heads = tp.cache.k[0].shape[1]
    return diffs, kv_heads


def test_tp_logits_equal_single_process():
    # prefill, decode, verify, rollback + verify; plain Llama and Qwen-style biases + qk-norm; one spawn
    configs = [CFG, {**CFG, "attention_bias": True, "attention_out_bias": True, "qk_norm": True}]
    results = run_local(tp_logits_worker, 2, configs, timeout_s=60, collective_timeout_s=20)
    for per_config in results:
        for diffs, kv_heads in per_config:
            assert kv_heads == CFG["num_kv_heads"] // 2
            assert len(diffs) == 5 and max(diffs) < 1e-5, diffs


def tp_kernels_worker(rank, world_size):
    """The Triton decode-kernel path of the sharded net (its all-reduces after the o / down matmuls) against the
    full model's kernel path: max |logits difference| over a decode and a verify step."""
    from verispec.distributed.tp import tensor_parallel_model

    cfg = {**CFG, "head_dim": 16}                    # the kernels need head_dim a power of two >= 16
    full = load_model(ModelConfig(**cfg), device="cpu", dtype=torch.float32, seed=4)
    tp = tensor_parallel_model(full)
    assert tp.net.use_kernels
    diffs = []
    for m in (full, tp):
        m.setup_cache(2, 32)
        m.prefill([[5, 6, 7, 8, 9], [11, 12]])
    for tokens in (torch.tensor([[1], [2]]), torch.tensor([[3, 4, 5], [6, 7, 8]])):
        logits = [m.net.append_kernels(tokens, m.cache.lengths, m._rope, m.cache, m.num_active_layers)
                  for m in (full, tp)]
        diffs.append((logits[0] - logits[1]).abs().max().item())
        for m in (full, tp):
            m.cache.lengths.add_(tokens.shape[1])
    return diffs


@pytest.mark.skipif(not ops.AVAILABLE or os.environ.get("TRITON_INTERPRET") != "1",
                    reason="gloo ranks on CPU tensors: the Triton kernels must run in the interpreter (on a GPU "
                           "machine the NCCL test below covers the kernel path)")
def test_tp_kernel_path_equals_single_process_kernels():
    for diffs in run_local(tp_kernels_worker, 2, timeout_s=90, collective_timeout_s=30):
        assert len(diffs) == 2 and max(diffs) < 1e-5, diffs


def test_shard_refuses_indivisible_heads():
    net = load_model(ModelConfig(**{**CFG, "num_kv_heads": 1}), device="cpu", dtype=torch.float32).net
    with pytest.raises(ValueError, match="num_kv_heads divisible by 2"):
        shard_transformer(net, 0, 2)


def failing_worker(rank, world_size):
    import torch.distributed as dist

    if rank == 1:
        raise SystemExit(3)                          # dies before the collective
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def test_dead_rank_is_a_clear_error_not_a_hang():
    with pytest.raises(DistributedError, match="rank"):
        run_local(failing_worker, 2, timeout_s=30, collective_timeout_s=3)


def tp_graphs_worker(rank, world_size):
    """On CUDA: the tensor-parallel Model (kernels + CUDA graphs with the NCCL all-reduces captured) against the
    plain Model, fp32, over decode and verify steps."""
    from verispec.distributed.tp import tensor_parallel_model

    cfg = {**CFG, "head_dim": 16}
    full = load_model(ModelConfig(**cfg), device="cuda", dtype=torch.float32, seed=4, use_graphs=True)
    tp = tensor_parallel_model(full, use_graphs=True)
    diffs = []
    for m in (full, tp):
        m.setup_cache(2, 32)
        m.prefill([[5, 6, 7, 8, 9], [11, 12]])
    for tokens in (torch.tensor([[1], [2]]), torch.tensor([[3, 4, 5], [6, 7, 8]]), torch.tensor([[9], [10]])):
        diffs.append((full.append(tokens) - tp.append(tokens)).abs().max().item())
    return diffs, len(tp._graphs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NCCL, CUDA graphs)")
def test_tp_under_cuda_graphs_on_nccl_equals_the_plain_model():
    [(diffs, graphs)] = run_local(tp_graphs_worker, 1, backend="nccl", timeout_s=120, collective_timeout_s=60)
    assert graphs >= 2 and max(diffs) < 1e-4, (diffs, graphs)
