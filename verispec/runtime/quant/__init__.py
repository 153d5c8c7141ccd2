"""Quantized weights: GGUF block formats decoded and encoded in torch, and weights kept as blocks in memory.

    formats.py     the block layouts verispec reads (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K): type ids, sizes, byte maps
    dequantize.py  blocks -> fp32, bit for bit gguf-py's / ggml's dequantizer (the CPU path and the GPU oracle)
    quantize.py    fp32 -> blocks: Q4_0, Q8_0 as ggml's reference quantizers round (== gguf-py's), and dispatch
    kquants.py     fp32 -> Q4_K / Q6_K blocks: ggml's reference searches (make_qkx2_quants, make_qx_quants)
    mix.py         which type each tensor of a Q4_K_M / Q4_0 / Q8_0 file gets (llama.cpp's rule)
    export.py      ``verispec quantize``: an HF checkpoint or a random-weight shape -> a quantized GGUF file
    packed.py      ``PackedWeight``: a matrix kept as its blocks (``load_model(..., packed=True)``)

See docs/runtime.md ("Quantized weights").
"""
from .dequantize import dequantize
from .formats import FORMATS, BlockFormat, block_format
from .quantize import quantize

__all__ = ["dequantize", "quantize", "block_format", "BlockFormat", "FORMATS"]
