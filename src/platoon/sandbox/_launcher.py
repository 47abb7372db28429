"""Runs inside a sandbox with the sandbox's own python3 (stdlib only): relays each forwarded
port on 127.0.0.1 to its unix socket, runs the agent, keeps the tails of its output and writes
how it ended to a JSON file. See `platoon.sandbox.agent`."""

import asyncio
import json
import os
import signal
import sys
import time


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, ConnectionError):
        pass


def relay(socket_path):
    async def handle(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(socket_path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        for w in (writer, up_writer):
            w.close()

    return handle


class Tail:
    """What a reader kept of a stream: its last `cap` bytes and how many it saw."""

    data = b""
    total = 0


async def tail(stream, cap, out):
    buffer = bytearray()
    total = 0
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            break
        total += len(chunk)
        buffer += chunk
        del buffer[:-cap]
    out.data = bytes(buffer)
    out.total = total


async def main(config, started):
    result: dict[str, object] = {"code": None}
    servers = []
    try:
        for forward in config["forwards"]:
            servers.append(await asyncio.start_server(relay(forward["socket"]), "127.0.0.1", forward["port"]))
    except OSError as exc:
        result["error"] = f"cannot listen for the forwarded endpoint: {exc}"
        return result
    cap = int(config["cap"])
    try:
        process = await asyncio.create_subprocess_exec(
            *config["argv"],
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=65536,
        )
    except OSError as exc:
        result["error"] = f"cannot start {config['argv'][0]!r}: {exc.strerror or exc}"
        return result
    result["startup_s"] = round(time.monotonic() - started, 4)
    out, err = Tail(), Tail()
    readers = asyncio.gather(tail(process.stdout, cap, out), tail(process.stderr, cap, err))
    code = await process.wait()
    try:  # whatever the agent left running goes with it
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        await asyncio.wait_for(readers, 2.0)
    except TimeoutError:
        pass
    for server in servers:
        server.close()
    result["code"] = code
    result["stdout"] = out.data.decode("utf-8", "replace")
    result["stderr"] = err.data.decode("utf-8", "replace")
    result["stdout_bytes"] = out.total
    result["stderr_bytes"] = err.total
    return result


if __name__ == "__main__":
    began = time.monotonic()
    with open(sys.argv[1]) as f:
        settings = json.load(f)
    outcome = asyncio.run(main(settings, began))
    with open(settings["result"], "w") as f:
        json.dump(outcome, f)
