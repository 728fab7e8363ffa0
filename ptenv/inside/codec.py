"""The one place tensors become JSON and back.

A tensor is {"dtype": name, "shape": [..], "data": base64 of its raw little-endian bytes}.
Decoding treats the payload as hostile: known dtypes only, exact byte count, a size cap,
and never pickle. This file is also mounted into the sandbox, so it imports only torch and the
protocol (for the cap).
"""

import base64
import binascii
import reprlib
import sys

import torch

from ptenv.inside.protocol import MAX_TENSOR_BYTES

MAX_DIMS = 64  # sizes in a shape: more than any answer has, and the skeleton of a reply stays small


DTYPES = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}

assert sys.byteorder == "little", "the tensor codec stores little-endian bytes"


class CodecError(ValueError):
    """A tensor that cannot be encoded, or a payload that is not a valid encoded tensor."""


def encode(tensor: torch.Tensor) -> dict:
    """Encode a plain CPU tensor (an nn.Parameter counts as one); refuse anything else."""
    head, raw = to_bytes(tensor)
    return {**head, "data": base64.b64encode(raw).decode("ascii")}


def to_bytes(tensor: torch.Tensor) -> tuple[dict, bytearray]:
    """A plain CPU tensor as its head ({"dtype", "shape"}) and its raw bytes; CodecError for anything else."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        raise CodecError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise CodecError(f"expected a dense tensor, got layout {tensor.layout}")
    if tensor.device.type != "cpu":
        raise CodecError(f"expected a CPU tensor, got device {tensor.device.type}")
    if tensor.dtype not in DTYPE_NAMES:
        raise CodecError(f"unsupported dtype {tensor.dtype}")
    nbytes = byte_count(DTYPE_NAMES[tensor.dtype], list(tensor.shape))  # what the host will accept
    # One copy of the bytes into a buffer we own (bytes(untyped_storage()) goes element by element:
    # 7 s for 1M), without ctypes, whose calls a function task's level-2 allowlist stubs out in the caller.
    raw = bytearray(nbytes)
    if nbytes:
        torch.frombuffer(raw, dtype=tensor.dtype).copy_(tensor.detach().reshape(-1))
    return {"dtype": DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape)}, raw


def byte_count(name, shape) -> int:
    """The bytes a tensor of dtype `name` and `shape` holds; CodecError if either is not valid or
    the tensor is over the cap (checked as it grows, so a hostile shape costs nothing). An empty
    tensor is held to the cap as if its zero sizes were ones: torch cannot build one whose other
    sizes or strides pass its 64-bit sizes, and no answer needs one."""
    if not isinstance(name, str) or name not in DTYPES:
        raise CodecError(f"unknown dtype {name!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise CodecError(f"shape must be a list of non-negative ints, got {reprlib.repr(shape)}")
    if len(shape) > MAX_DIMS:
        raise CodecError(f"shape has {len(shape)} dimensions, over the {MAX_DIMS} a tensor may have here")
    size = torch.empty((), dtype=DTYPES[name]).element_size()
    count, span = size, size
    for d in shape:
        count, span = count * d, span * max(d, 1)
        if span > MAX_TENSOR_BYTES:
            raise CodecError(f"shape {reprlib.repr(shape)} is over the {MAX_TENSOR_BYTES}-byte cap")
    return count


def decode(obj) -> torch.Tensor:
    """Rebuild a plain torch.Tensor from an encoded dict, or raise CodecError saying what is wrong."""
    if not isinstance(obj, dict) or set(obj) != {"dtype", "shape", "data"}:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise CodecError(f"expected keys ['data', 'dtype', 'shape'], got {keys}")
    name, shape, data = obj["dtype"], obj["shape"], obj["data"]
    nbytes = byte_count(name, shape)
    if not isinstance(data, str):
        raise CodecError(f"data must be a base64 string, got {type(data).__name__}")
    if len(data) > (nbytes + 2) // 3 * 4:
        raise CodecError(f"data is longer than shape {shape} of {name} needs")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise CodecError(f"data is not valid base64: {e}") from None
    if len(raw) != nbytes:
        raise CodecError(f"data has {len(raw)} bytes, shape {shape} of {name} needs {nbytes}")
    dtype = DTYPES[name]
    if dtype == torch.bool and raw.translate(None, b"\x00\x01"):
        # torch takes any nonzero byte as True; accepting only 0/1 keeps one byte string per tensor.
        raise CodecError("bool data has bytes other than 0 and 1")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)
