"""The wire form of events: msgpack through msgspec, as a tagged union of every registered type.

The same bytes go to the run's event log and over the NATS bridge, so an event written on one
machine decodes on another that registered the same types.
"""

from __future__ import annotations

from typing import Union

import msgspec

from platoon.bus.events import Event, event_types

__all__ = ["decode", "encode", "to_json"]

_encoder = msgspec.msgpack.Encoder()
_json_encoder = msgspec.json.Encoder()
_decoder: msgspec.msgpack.Decoder[Event] | None = None
_decoder_types: tuple[type[Event], ...] = ()


def _get_decoder() -> msgspec.msgpack.Decoder[Event]:
    global _decoder, _decoder_types
    types = event_types()
    if _decoder is None or types != _decoder_types:
        _decoder = msgspec.msgpack.Decoder(Union[types])  # noqa: UP007 - a runtime union of types
        _decoder_types = types
    return _decoder


def encode(event: Event) -> bytes:
    """The msgpack bytes of an event (its tag included)."""
    return _encoder.encode(event)


def decode(data: bytes | memoryview) -> Event:
    """An event back from `encode`'s bytes. Raises `msgspec.DecodeError` on unknown tags."""
    return _get_decoder().decode(data)


def to_json(event: Event) -> bytes:
    """JSON for people and tools (`platoon events`)."""
    return _json_encoder.encode(event)
