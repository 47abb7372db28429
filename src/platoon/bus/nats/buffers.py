"""The bridge's bounded local buffers: hand items on without a checkpoint while there is room,
as the bus does, so that a burst goes out in one batch."""

from __future__ import annotations

from typing import TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

T = TypeVar("T")


async def send(stream: MemoryObjectSendStream[T], item: T) -> None:
    """Send without a checkpoint while there is room (as the bus does), else wait for room."""
    try:
        stream.send_nowait(item)
    except anyio.WouldBlock:
        await stream.send(item)


async def receive(stream: MemoryObjectReceiveStream[T]) -> T | None:
    """The next item, without a checkpoint while items are buffered; None once closed."""
    try:
        return stream.receive_nowait()
    except anyio.WouldBlock:
        try:
            return await stream.receive()
        except anyio.EndOfStream:
            return None
    except anyio.EndOfStream:
        return None
