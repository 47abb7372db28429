"""Running a command's async main on the command line: until it ends, or until Ctrl-C or
SIGTERM cancels it from inside, so every component and server closes in order."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import anyio
import anyio.abc

from platoon.errors import sole_error

__all__ = ["run_async"]


def run_async(main: Any, *, until_signal: bool = False) -> Any:
    """`anyio.run(main)`, raising an error from inside the run's task groups as itself, so the
    command line prints it as its one-line message rather than as an exception group.

    Ctrl-C and SIGTERM cancel `main` from inside the loop, so every component and server closes
    in order (event log flushed, hypercorn shut down), and then end it as a KeyboardInterrupt;
    for a server that runs `until_signal`, a signal is the normal end (it returns None).
    """

    async def stoppable() -> Any:
        result: list[Any] = []
        signalled: list[int] = []
        async with anyio.create_task_group() as tg:

            async def watch(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    task_status.started()  # taken before main runs: no signal falls between
                    async for number in signals:
                        signalled.append(number)
                        print("platoon: stopping ...", file=sys.stderr, flush=True)
                        tg.cancel_scope.cancel()
                        return

            if threading.current_thread() is threading.main_thread():
                await tg.start(watch)
            result.append(await main())
            tg.cancel_scope.cancel()
        if signalled and not until_signal:
            raise KeyboardInterrupt
        return result[0] if result else None

    try:
        return anyio.run(stoppable)
    except BaseExceptionGroup as group:
        error = sole_error(group)
        if isinstance(error, BaseExceptionGroup):
            raise
        raise error from None
