"""The tensor codec: exact round trips for every supported dtype, strict rejection of bad payloads."""

import base64
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ptenv.inside import codec
from ptenv.inside.codec import CodecError

SHAPES = st.lists(st.integers(0, 4), max_size=3)


@st.composite
def tensors(draw, dtypes=tuple(codec.DTYPES)):
    """Any bit pattern of any supported dtype (NaN payloads included), 0-dim and empty shapes included."""
    dtype = codec.DTYPES[draw(st.sampled_from(dtypes))]
    shape = draw(SHAPES)
    numel = torch.Size(shape).numel()
    if dtype == torch.bool:
        return torch.tensor(draw(st.lists(st.booleans(), min_size=numel, max_size=numel)), dtype=torch.bool).reshape(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = draw(st.binary(min_size=numel * itemsize, max_size=numel * itemsize))
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape) if numel else torch.empty(shape, dtype=dtype)


def raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's logical bytes in row-major order, read without the codec."""
    return bytes(torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1).view(torch.uint8).tolist())


def assert_identical(a: torch.Tensor, b: torch.Tensor):
    assert type(b) is torch.Tensor and b.dtype == a.dtype and b.shape == a.shape
    assert raw_bytes(a) == raw_bytes(b)


@settings(max_examples=200, deadline=None)
@given(tensors())
def test_round_trip_is_exact_through_json(t):
    back = codec.decode(json.loads(json.dumps(codec.encode(t))))
    assert_identical(t, back)


@settings(max_examples=100, deadline=None)
@given(tensors(), st.sampled_from(["transpose", "step", "expand"]))
def test_non_contiguous_views_encode_their_logical_values(t, how):
    if t.dim() == 0:
        t = t.reshape(1)
    view = {"transpose": lambda: t.unsqueeze(-1).transpose(0, -1),
            "step": lambda: t[::2],
            "expand": lambda: t.unsqueeze(0).expand(3, *t.shape)}[how]()
    assert_identical(view, codec.decode(codec.encode(view)))


def test_bytes_are_little_endian_and_follow_row_major_order():
    enc = codec.encode(torch.tensor([[1, 2], [3, 4]], dtype=torch.int16).T)
    assert enc["dtype"] == "int16" and enc["shape"] == [2, 2]
    assert base64.b64decode(enc["data"]) == b"\x01\x00\x03\x00\x02\x00\x04\x00"


def test_zero_dim_bfloat16_and_bool_examples():
    for t in (torch.tensor(2.5), torch.tensor([1.0078125, -3.0], dtype=torch.bfloat16), torch.tensor([True, False])):
        assert_identical(t, codec.decode(codec.encode(t)))


def test_parameter_and_requires_grad_encode_as_plain_values():
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    back = codec.decode(codec.encode(p * 2))
    assert type(back) is torch.Tensor and not back.requires_grad and back.tolist() == [2.0, 4.0]


def good(**override):
    enc = codec.encode(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    enc.update(override)
    return enc


@pytest.mark.parametrize("payload, message", [
    (good(dtype="float8"), "unknown dtype 'float8'"),
    (good(dtype=7), "unknown dtype 7"),
    (good(shape=[2, 2]), "data is longer than shape [2, 2] of float32 needs"),
    (good(shape=[3, 3]), "data has 24 bytes, shape [3, 3] of float32 needs 36"),
    (good(shape=[2, -3]), "shape must be a list of non-negative ints"),
    (good(shape=[2.0, 3]), "shape must be a list of non-negative ints"),
    (good(shape=[True, 6]), "shape must be a list of non-negative ints"),
    (good(shape="2,3"), "shape must be a list of non-negative ints"),
    (good(data="!!!!" * 8), "data is not valid base64"),
    (good(data=123), "data must be a base64 string"),
    (good(shape=[1 << 40]), "over the 33554432-byte cap"),
    (good(shape=[1 << 20, 1 << 20]), "over the 33554432-byte cap"),
    (good(shape=[4, 3]), "data has 24 bytes, shape [4, 3] of float32 needs 48"),
    ({"dtype": "float32", "shape": [1]}, "expected keys ['data', 'dtype', 'shape'], got ['dtype', 'shape']"),
    ({**good(), "extra": 1}, "expected keys ['data', 'dtype', 'shape'], got ['data', 'dtype', 'extra', 'shape']"),
    ([1, 2], "expected keys ['data', 'dtype', 'shape'], got list"),
    ({"dtype": "bool", "shape": [2], "data": base64.b64encode(b"\x01\x02").decode()}, "bool data has bytes other than 0 and 1"),
    # Empty, but torch could not build it: its other sizes and strides pass 64 bits.
    (good(shape=[0, 10 ** 50], data=""), "shape [0, 100000000000000000...0000000000000000000] is over the 33554432-byte cap"),
    (good(shape=[0, 1 << 62, 1 << 62], data=""), "is over the 33554432-byte cap"),
    (good(shape=[1] * 65, data=""), "shape has 65 dimensions, over the 64 a tensor may have here"),
])
def test_strict_decode_rejects_with_one_line_message(payload, message):
    with pytest.raises(CodecError) as err:
        codec.decode(payload)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.sampled_from(sorted(codec.DTYPES)), st.lists(st.one_of(st.integers(0, 3), st.integers(0)), max_size=70))
def test_any_shape_decodes_to_a_tensor_of_that_shape_or_is_refused(name, shape):
    # What a hostile interpreter may declare: torch must never be the one to refuse it.
    try:
        nbytes = codec.byte_count(name, shape)
    except CodecError:
        return
    data = base64.b64encode(bytes(nbytes)).decode()
    assert list(codec.decode({"dtype": name, "shape": shape, "data": data}).shape) == shape


def test_over_cap_payload_is_rejected_before_decoding_base64():
    # A payload longer than its shape could need is refused without decoding it.
    with pytest.raises(CodecError, match="longer than shape"):
        codec.decode({"dtype": "uint8", "shape": [3], "data": "A" * (8 << 20)})


class Sub(torch.Tensor):
    pass


@pytest.mark.parametrize("make, message", [
    (lambda: torch.zeros(3).as_subclass(Sub), "expected a torch.Tensor, got Sub"),
    (lambda: torch.zeros(3, device="meta"), "expected a CPU tensor, got device meta"),
    (lambda: torch.zeros(3).to_sparse(), "expected a dense tensor"),
    (lambda: [1.0, 2.0], "expected a torch.Tensor, got list"),
    (lambda: torch.zeros(3, dtype=torch.uint16), "unsupported dtype torch.uint16"),
])
def test_encode_refuses_anything_but_a_plain_dense_cpu_tensor(make, message):
    with pytest.raises(CodecError, match=message):
        codec.encode(make())
