"""What running a command-line agent in a bwrap sandbox costs per episode: a plain `exec` of
`true` against `run_agent` of `true` (launcher, relay listening, the forwarded socket) and
against an agent that makes one HTTP call through the forwarded port.

    python benchmarks/agent_sandbox.py [N]
"""

from __future__ import annotations

import statistics
import sys
import time

import anyio
import anyio.abc

from platoon.sandbox import SandboxSpec, create_sandbox
from platoon.sandbox.agent import Forward, run_agent

CALL = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:4000/', timeout=5).read()"


async def main(n: int) -> None:
    async def answer(client: anyio.abc.ByteStream) -> None:
        async with client:
            await client.receive()
            await client.send(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    forward = [Forward(port=4000, target=f"127.0.0.1:{port}")]
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, answer)
        async with create_sandbox(SandboxSpec(), "bwrap") as box:
            runs = {
                "exec true": lambda: box.exec("true"),
                "run_agent true": lambda: run_agent(box, ["true"], env={}, forwards=forward),
                "run_agent python3 + 1 call": lambda: run_agent(
                    box, ["python3", "-c", CALL], env={}, forwards=forward
                ),
            }
            for name, run in runs.items():
                times = []
                for _ in range(n):
                    start = time.perf_counter()
                    await run()
                    times.append(time.perf_counter() - start)
                print(f"{name:30s} median {statistics.median(times) * 1000:7.1f} ms  (n={n})")
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 20)
