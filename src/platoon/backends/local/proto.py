"""Encode and decode the protobuf half of the Tinker wire format.

Forward/backward requests arrive as protobuf, and the SDK accepts forward/backward outputs
and sample results only as protobuf. The message classes are the SDK's own
(`tinker.proto.tinker_public_pb2`), so the server speaks exactly what the client expects.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec
import numpy as np
from tinker.proto import tinker_public_pb2 as pb

__all__ = [
    "MASKED",
    "Datum",
    "ForwardBackwardCall",
    "ProtoError",
    "SampledSequence",
    "Span",
    "Topk",
    "decode_forward_backward",
    "encode_forward_backward_output",
    "encode_sample_response",
    "peek_seq",
]


class ProtoError(ValueError):
    """A protobuf body this server cannot read or does not support.

    `seq` is the request's (model_id, seq_id) when the body said them, so that the server can
    still use up that place in the model's order (else every later request would wait for it).
    """

    seq: tuple[str, int] | None = None


class Span(msgspec.Struct, frozen=True):
    """A run of a datum's positions that claims to be positions [offset, offset + length) of a
    sampled sequence's prompt (`sampled` false) or of its sampled tokens (provenance)."""

    sampled: bool
    sequence_id: str
    offset: int
    length: int


class Datum(msgspec.Struct):
    """One training example: the input tokens and its per-token loss inputs (1-D, same length),
    and, when the client gave it, the provenance of its input tokens and of its targets."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray]
    spans: tuple[tuple[Span, ...], tuple[Span, ...]] | None = None


class ForwardBackwardCall(msgspec.Struct):
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float]
    forward_only: bool
    data: list[Datum]


class Topk(msgspec.Struct):
    """The k most likely tokens at each of n positions: (n, k) ids and logprobs; a row of id 0
    and logprob `MASKED` is a position with none (the first prompt token)."""

    token_ids: np.ndarray  # int32
    logprobs: np.ndarray  # float32


MASKED = -99999.0  # the SDK's sentinel for an empty top-k slot


class SampledSequence(msgspec.Struct):
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"
    topk: Topk | None = None


_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


def _tensor(name: str, msg: pb.Tensor) -> np.ndarray:
    dtype = _DTYPES.get(msg.dtype)
    if dtype is None:
        raise ProtoError(f"loss_fn_inputs[{name!r}] has unsupported dtype {msg.dtype}")
    if msg.HasField("sparse_csr"):
        raise ProtoError(f"loss_fn_inputs[{name!r}] is sparse; only dense 1-D inputs are supported")
    array = np.frombuffer(msg.dense, dtype=dtype)
    shape = list(msg.shape)
    if len(shape) > 1:
        raise ProtoError(f"loss_fn_inputs[{name!r}] has shape {shape}; only 1-D inputs are supported")
    if shape and shape[0] != array.size:
        raise ProtoError(f"loss_fn_inputs[{name!r}] declares shape {shape} but holds {array.size} values")
    return array


def _datum(index: int, msg: pb.Datum) -> Datum:
    parts = []
    for chunk in msg.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise ProtoError(f"datum {index}: model_input chunk {kind!r} is not supported (text only)")
        parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32))
    tokens = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    inputs = {name: _tensor(name, tensor) for name, tensor in msg.loss_fn_inputs.items()}
    spans = None
    if len(msg.model_input_spans) or len(msg.loss_fn_input_spans):
        spans = (_spans(index, msg.model_input_spans), _spans(index, msg.loss_fn_input_spans))
    return Datum(tokens=tokens, inputs=inputs, spans=spans)


def _spans(index: int, spans: Iterable[pb.ProvenanceSpan]) -> tuple[Span, ...]:
    out = []
    for span in spans:
        kind = span.WhichOneof("span")
        if kind is None:
            raise ProtoError(f"datum {index}: a provenance span names no kind")
        run = getattr(span, kind)
        if run.offset < 0 or run.length < 0 or not run.sequence_id:
            raise ProtoError(
                f"datum {index}: a provenance span has a negative offset or length, or no sequence_id"
            )
        out.append(Span(kind == "sampled_tokens", run.sequence_id, run.offset, run.length))
    return tuple(out)


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """Read a `ForwardBackwardRequest`; the loss config prefers the v2 map when present."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:
        raise ProtoError(f"body is not a ForwardBackwardRequest: {exc}") from None
    try:
        config: dict[str, float] = dict(msg.loss_fn_config.items())
        for key, value in msg.loss_fn_config_v2.items():
            if value.WhichOneof("value") == "text":
                raise ProtoError(f"loss_fn_config[{key!r}] is text; this server takes numbers only")
            config[key] = value.number
        data = [_datum(i, d) for i, d in enumerate(msg.data)]
    except (ProtoError, ValueError, TypeError) as exc:
        # Any body that parsed far enough to name its place keeps it (a ValueError here is,
        # for example, a tensor whose bytes are not a whole number of values).
        error = exc if isinstance(exc, ProtoError) else ProtoError(f"bad forward_backward body: {exc}")
        error.seq = (msg.model_id, msg.seq_id)
        raise error from None
    return ForwardBackwardCall(
        model_id=msg.model_id,
        seq_id=msg.seq_id,
        loss_fn=msg.loss_fn,
        config=config,
        forward_only=msg.forward_only,
        data=data,
    )


PEEK_BYTES = 4096  # the ids lead a request: a model id of up to a few hundred bytes, a varint


def peek_seq(prefix: bytes) -> tuple[str, int] | None:
    """(model_id, seq_id) read from the start of a `ForwardBackwardRequest` too large to parse.

    The SDK writes fields in number order, so the two ids (fields 1 and 2) lead the body; a
    refused oversized request can then still give up its place in the model's order. Only the
    first `PEEK_BYTES` are read: a body of zeros (a decompression bomb) is not walked to its end.
    """
    prefix = prefix[:PEEK_BYTES]
    model_id: str | None = None
    seq_id: int | None = None
    pos = 0

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            if pos >= len(prefix) or shift > 63:
                raise IndexError
            byte = prefix[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    try:
        while pos < len(prefix) and (model_id is None or seq_id is None):
            tag = varint()
            field, wire = tag >> 3, tag & 7
            if field == 0:  # no message has a field 0: this is not a request
                return None
            if wire == 0:
                value = varint()
                if field == 2:
                    seq_id = value
            elif wire == 2:
                size = varint()
                if field == 1:
                    model_id = prefix[pos : pos + size].decode()
                pos += size
            else:
                return None
    except (IndexError, UnicodeDecodeError):
        return None
    return (model_id, seq_id) if model_id is not None and seq_id is not None else None


def encode_forward_backward_output(logprobs: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """Per-datum target logprobs as one batched float32 record, plus `name:reduction` metrics."""
    arrays = [np.asarray(lp, dtype=np.float32) for lp in logprobs]
    offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype=np.int64)
    data = b"".join(a.tobytes() for a in arrays)
    record = pb.ArrayRecord(
        type_tag="ArrayRecord",
        num_datums=len(arrays),
        fields={
            "logprobs": pb.BatchedTensor(
                data=data, offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32, trailing_shape=[]
            )
        },
    )
    out = pb.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record], metrics=metrics
    )
    return out.SerializeToString()


def _topk(topk: Topk) -> pb.TopkLogprobs:
    n, k = topk.token_ids.shape
    return pb.TopkLogprobs(
        token_ids=np.ascontiguousarray(topk.token_ids, dtype=np.int32).tobytes(),
        logprobs=np.ascontiguousarray(topk.logprobs, dtype=np.float32).tobytes(),
        k=k,
        length=n,
    )


def encode_sample_response(
    sequences: list[SampledSequence],
    prompt_logprobs: list[float | None] | None,
    topk_prompt: Topk | None = None,
    cache_hit_tokens: int = 0,
) -> bytes:
    """A `SampleResponse`; missing prompt logprobs (position 0) travel as NaN."""
    msg = pb.SampleResponse()
    for seq in sequences:
        out = msg.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(seq.logprobs, dtype=np.float32).tobytes(),
        )
        if seq.topk is not None:
            out.topk_sampled_logprobs.CopyFrom(_topk(seq.topk))
    if prompt_logprobs is not None:
        values = [math.nan if v is None else v for v in prompt_logprobs]
        msg.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    if topk_prompt is not None:
        msg.topk_prompt_logprobs.CopyFrom(_topk(topk_prompt))
    if cache_hit_tokens:
        msg.prompt_cache_hit_tokens = cache_hit_tokens
    return msg.SerializeToString()
