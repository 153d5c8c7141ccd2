"""The torch Philox equals an independent Python-integer Philox and Triton's tl.philox."""

import random

import torch
import triton
import triton.language as tl

from triton_interpreter import DEVICE
from verispec.verify import rng

M32 = 0xFFFFFFFF


def python_philox(c, key, rounds=10):
    c0, c1, c2, c3 = c
    k0, k1 = key
    for _ in range(rounds):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def test_torch_philox_equals_python_integers():
    r = random.Random(0)
    for _ in range(200):
        c = [r.getrandbits(32) for _ in range(4)]
        seed = r.getrandbits(63)
        got = rng.philox4x32(*(torch.tensor([v]) for v in c), seed)
        assert [int(w) for w in got] == list(python_philox(c, (seed & M32, seed >> 32)))


@triton.jit
def _uniform_kernel(out_ptr, seed, offset, row, purpose, N: tl.constexpr):
    col = tl.arange(0, N).to(tl.uint32)
    zero = col * 0
    x, _, _, _ = tl.philox(seed, col, zero + row, zero + offset, zero + purpose)
    tl.store(out_ptr + tl.arange(0, N), ((x >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08)


def test_torch_uniform_equals_triton_philox():
    for seed, offset, row, purpose in [(0, 0, 0, 0), (12345, 7, 3, 1), (2**40 + 77, 99, 1000, 1), (2**63 - 5, 2**31 - 1, 5, 0)]:
        out = torch.empty(64, device=DEVICE)
        _uniform_kernel[(1,)](out, seed, offset, row, purpose, N=64)
        assert torch.equal(out.cpu(), rng.uniform(seed, offset, row, torch.arange(64), purpose))


def test_uniforms_are_open_interval_and_uniform():
    u = rng.uniform(3, 0, torch.arange(200)[:, None], torch.arange(500)[None, :], rng.RACE)
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.005


def test_tensor_keys_equal_python_integers_and_triton():
    """Per-element keys (as verify_sample passes them), including keys with the top bit set,
    which int64 tensors hold as negative numbers."""
    r = random.Random(1)
    keys = [r.getrandbits(64) for _ in range(50)]
    rows = [r.getrandbits(8) for _ in keys]
    key_t = torch.tensor([rng.as_int64(k) for k in keys])
    got = rng.uniform(key_t, 7, torch.tensor(rows), 3, rng.RACE)
    for key, row, u in zip(keys, rows, got.tolist()):
        x = python_philox((3, row, 7, rng.RACE), (key & M32, key >> 32))[0]
        assert u == ((x >> 9) * 2 + 1) * 2.0**-24
    for key in keys[:4]:
        out = torch.empty(64, device=DEVICE)
        _uniform_kernel[(1,)](out, rng.as_int64(key), 7, 5, 0, N=64)
        assert torch.equal(out.cpu(), rng.uniform(rng.as_int64(key), 7, 5, torch.arange(64), 0))


def python_splitmix64(state, count):
    """The first ``count`` outputs of SplitMix64 seeded with ``state``, in Python integers."""
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) % 2**64
        z = state
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 % 2**64
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB % 2**64
        out.append(z ^ (z >> 31))
    return out


def test_sequence_seeds_are_splitmix64_on_host_and_device():
    # the published first outputs of SplitMix64 seeded with 0
    assert [k % 2**64 for k in rng.sequence_seeds(0, 3).tolist()] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    r = random.Random(2)
    for seed in [1, 2**63 - 1, 2**64 - 1, -5] + [r.getrandbits(64) for _ in range(20)]:
        host = rng.sequence_seeds(seed, 9)
        assert [k % 2**64 for k in host.tolist()] == python_splitmix64(seed % 2**64, 9)
        assert torch.equal(rng.sequence_seeds(torch.tensor(rng.as_int64(seed)), 9), host)
    assert len(set(rng.sequence_seeds(123, 1000).tolist())) == 1000


def test_uniform_stays_on_the_tensors_device_and_chunks_give_the_same_bits(monkeypatch):
    # integer arguments join the tensors' device (meta: no CUDA needed to see where the work would run)
    u = rng.uniform(torch.tensor([1, 2], device="meta")[:, None], 0, 1, torch.arange(5, device="meta")[None], rng.RACE)
    assert u.device.type == "meta" and u.shape == (2, 5)
    seed, col = torch.tensor([7, 2**62 + 3])[:, None], torch.arange(1000)[None]
    whole = rng.uniform(seed, 4, 1, col, rng.RACE)
    monkeypatch.setattr(rng, "CPU_CHUNK", 37)   # chunks that cut rows in the middle
    assert torch.equal(rng.uniform(seed, 4, 1, col, rng.RACE), whole)
