"""A GGUF file's header — its metadata and tensor table — read in a fraction of a second.

gguf's ``GGUFReader`` builds a numpy view for every part of every field, which for a tokenizer of 49k tokens
and 49k merges takes seconds (6.5 s for the embedded SmolLM2 on this project's CPU). What a front end needs
before loading (the config, the tokenizer) is plain data, parsed here with ``struct`` straight from the file's
bytes. Layout (GGUF v2/v3, little-endian):

    "GGUF"  version u32  tensor_count u64  kv_count u64
    kv_count x   key (u64 length + UTF-8)  value_type u32  value
    tensor_count x   name  n_dims u32  dims u64[n_dims]  ggml_type u32  offset u64 (from the data start)
    data start = the end of the tensor table, rounded up to general.alignment (32)

A value is a scalar, a string (u64 length + UTF-8) or an array (element type u32, count u64, elements).
Errors name the file and what is wrong (``GGUFFileError``): a truncated header, a wrong magic, a tensor that does
not fit in the file. ``tensor_data`` maps the tensors' bytes (numpy views of the file, nothing read until used):
with ``read_header`` it is all the loader needs, where gguf's reader takes seconds on a big tokenizer.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


class GGUFFileError(ValueError):
    """A GGUF file whose tensors do not fit in it (truncated) or disagree with their own header."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int               # bytes from the data start


@dataclass(frozen=True)
class GGUFHeader:
    meta: dict                # key -> str | int | float | bool | list (as GGUFReader's ``contents()``)
    tensors: list[TensorInfo]
    data_start: int


class _Cursor:
    def __init__(self, buf):
        self.buf, self.at = buf, 0

    def unpack(self, fmt: str):
        value = struct.unpack_from(fmt, self.buf, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.at + n > len(self.buf):
            raise EOFError(f"a string of {n} bytes runs past the end")
        s = bytes(self.buf[self.at:self.at + n]).decode("utf-8")
        self.at += n
        return s

    def value(self, kind: int):
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item == STRING:
                return [self.string() for _ in range(count)]
            if item not in _NUMPY:
                raise ValueError(f"array of unknown value type {item}")
            import numpy as np

            width = np.dtype(_NUMPY[item]).itemsize
            if self.at + count * width > len(self.buf):
                raise EOFError(f"an array of {count} values runs past the end")
            values = np.frombuffer(self.buf, dtype=_NUMPY[item], count=count, offset=self.at).tolist()
            self.at += count * width
            return values
        if kind not in _SCALARS:
            raise ValueError(f"unknown value type {kind}")
        return self.unpack(_SCALARS[kind])


def read_header(path) -> GGUFHeader:
    """The metadata and tensor table of the GGUF file at ``path``; GGUFFileError if it is not a readable GGUF
    file or a tensor does not lie wholly inside it."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    view = memoryview(buf)
    try:
        c = _Cursor(view)
        try:
            magic = bytes(c.buf[:4])
            if magic != b"GGUF":
                raise ValueError(f"GGUF magic invalid: expected b'GGUF', got {magic!r}")
            c.at = 4
            version, n_tensors, n_kv = c.unpack("<I"), c.unpack("<Q"), c.unpack("<Q")
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version} is not supported (2, 3)")
            meta = {}
            for _ in range(n_kv):
                key = c.string()
                meta[key] = c.value(c.unpack("<I"))
            tensors = []
            for _ in range(n_tensors):
                name = c.string()
                dims = tuple(c.unpack("<Q") for _ in range(c.unpack("<I")))
                tensors.append(TensorInfo(name, dims, c.unpack("<I"), c.unpack("<Q")))
        except (struct.error, EOFError, ValueError, UnicodeDecodeError, OverflowError) as e:
            raise GGUFFileError(f"{path} ({size} bytes) is not a readable GGUF file: the file is truncated or corrupt "
                                f"(its header could not be parsed: {e})") from None
        alignment = int(meta.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-c.at // alignment) * alignment
        for t in tensors:
            try:
                qtype = GGMLQuantizationType(t.ggml_type)
            except ValueError:
                raise GGUFFileError(f"{path}: inconsistent GGUF file: tensor {t.name!r} has unknown type "
                                    f"{t.ggml_type}") from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            n_elems = 1
            for d in t.dims:
                n_elems *= d
            row = t.dims[0] if t.dims else 1        # blocks run along a row (ne0); a row never splits one
            if row % block:
                raise GGUFFileError(f"{path}: inconsistent GGUF file: tensor {t.name!r} {list(t.dims)} has rows of "
                                    f"{row} weights, not a multiple of {qtype.name}'s block of {block}")
            expected, offset = n_elems * type_size // block, data_start + t.offset
            if offset + expected > size:
                raise GGUFFileError(f"{path}: the file is truncated: tensor {t.name!r} expects {expected} bytes "
                                    f"at offset {offset}, file has {size} bytes")
        return GGUFHeader(meta, tensors, data_start)
    finally:
        view.release()           # the map can close only once no view of it is left
        if size:
            buf.close()


def tensor_data(path, header: GGUFHeader) -> dict:
    """{name: uint8 numpy view of the tensor's bytes in the file}, shaped [..., rows, bytes per row] (a GGUF tensor
    of dims (ne0, ne1, ...) -> (..., ne1, ne0 / QK * type_size)). The views map the file read-only; ``read_header``
    has checked that each lies inside it."""
    import numpy as np
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for t in header.tensors:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
        shape = (*reversed(t.dims[1:]), t.dims[0] // block * type_size) if t.dims else (type_size,)
        start = header.data_start + t.offset
        out[t.name] = raw[start:start + int(np.prod(shape))].reshape(shape)
    return out
