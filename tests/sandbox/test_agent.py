"""An agent program in a bwrap sandbox: its run folder, home and forward sockets are its own."""

from __future__ import annotations

import shutil
import socket
import threading

import pytest

from platoon.sandbox import SandboxSpec, create_sandbox
from platoon.sandbox.agent import AGENT_HOME, RUN_DIR, Forward, run_agent

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(conn.recv(64).upper())

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


@pytest.mark.parametrize("user", [None, "nobody"])
async def test_the_agents_folders_and_sockets_are_closed_to_other_users(user):
    server, port = _echo_server()
    # Inside: the modes of the run folder, the home and the forward's socket, then a round trip
    # through the forward and a file written in the home (the agent can still use all three).
    script = (
        f"stat -c %a {RUN_DIR} {AGENT_HOME} {RUN_DIR}/fwd-0.sock && echo note > $HOME/note && "
        "python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', 7000)); "
        "s.sendall(b'ping'); print(s.recv(64).decode())\""
    )
    with server:
        async with create_sandbox(SandboxSpec(), provider="bwrap") as box:
            done = await run_agent(
                box,
                ["sh", "-c", script],
                env={},
                forwards=[Forward(port=7000, target=f"127.0.0.1:{port}")],
                user=user,
                timeout=60,
            )
    assert done.return_code == 0, (done.error, done.stderr)
    # Once 755, 777 and 777: any local user could read the run folder and relay through the socket.
    assert done.stdout.split() == ["700", "700", "600", "PING"]
