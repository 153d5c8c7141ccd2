"""The stop log names the Triton kernels compiled after warm-up (each one a stall inside a request)."""
from verispec.serve.server import _kernel_names, _triton_kernels


def test_kernels_compiled_after_warm_up_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    (tmp_path / "a1").mkdir()
    (tmp_path / "a1" / "_greedy_kernel.json").write_text("{}")
    warmed = _triton_kernels()
    for entry, files in (("b2", ["_prefill_attention.json", "_prefill_attention.cubin", "__grp___prefill_attention.json"]),
                         ("c3", ["_greedy_kernel.json"])):
        (tmp_path / entry).mkdir()
        for f in files:
            (tmp_path / entry / f).write_text("{}")
    assert _kernel_names(_triton_kernels() - warmed) == ["_greedy_kernel", "_prefill_attention"]


def test_no_cache_directory_is_no_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "missing"))
    assert _triton_kernels() == set() and _kernel_names({"x"}) == []
