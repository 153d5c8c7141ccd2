"""The accuracy bound every decode-GEMV test checks (runtime gemv.cu and the dev fused variants)."""
import torch


def gemv_inputs(M, N, K, dtype, bias, seed):
    """x [M, K], w [N, K] (scaled so that y is O(1)), b [N] or None, on CUDA."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", generator=g).to(dtype)
    w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).to(dtype)
    b = torch.randn(N, device="cuda", generator=g).to(dtype) if bias else None
    return x, w, b


def assert_gemv_close(y, x, w, b):
    """|y - ref| <= eps(dtype) |ref| + 1e-4 sum_k |x w| (ref: F.linear in fp32 accumulation)."""
    ref = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    scale = torch.nn.functional.linear(x.float().abs(), w.float().abs(), None if b is None else b.float().abs())
    err = (y.float() - ref).abs()
    bound = torch.finfo(y.dtype).eps * ref.abs() + 1e-4 * scale + 1e-6
    assert bool((err <= bound).all()), f"max error {err.max().item():.3e} ({(err > bound).sum().item()} over the bound)"
