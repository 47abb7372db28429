"""The door every server of ours shares: keys, body caps, slow clients, where it may listen."""

from __future__ import annotations

import socket
import zlib

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from platoon.serving import BodyTooLarge, Guard, ServingError, read_body_limited, require_key, serve_asgi

pytestmark = pytest.mark.anyio


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"size": len(await request.body())})


def _app(**guard) -> Guard:
    return Guard(Starlette(routes=[Route("/{path:path}", _echo, methods=["GET", "POST"])]), **guard)


async def test_a_key_is_needed_on_every_route_and_checked_exactly():
    transport = httpx.ASGITransport(app=_app(api_key="s3cret"))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for path in ("/healthz", "/api/v1/samplers/x", "/anything"):
            assert (await client.get(path)).status_code == 401
            assert (await client.get(path, headers={"x-api-key": "s3cre"})).status_code == 401
            assert (await client.get(path, headers={"x-api-key": "s3cret"})).status_code == 200
            assert (await client.get(path, headers={"authorization": "Bearer s3cret"})).status_code == 200


async def test_bodies_over_the_cap_are_refused_declared_or_streamed():
    transport = httpx.ASGITransport(app=_app(max_body=1000))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.post("/x", content=b"a" * 1000)).json() == {"size": 1000}
        assert (await client.post("/x", content=b"a" * 1001)).status_code == 413

        async def chunks():
            for _ in range(10):
                yield b"a" * 500

        assert (await client.post("/x", content=chunks())).status_code == 413  # no content-length


def test_a_compressed_body_never_expands_past_the_limit():
    import zstandard

    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 * 2**20))
    assert len(bomb) < 64 * 1024
    with pytest.raises(BodyTooLarge, match="decompresses to over"):
        read_body_limited(bomb, "zstd", 2**20)
    gz = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    gzip_bomb = gz.compress(b"\0" * (64 * 2**20)) + gz.flush()
    with pytest.raises(BodyTooLarge):
        read_body_limited(gzip_bomb, "gzip", 2**20)
    assert read_body_limited(zstandard.ZstdCompressor().compress(b"ok"), "zstd", 10) == b"ok"
    with pytest.raises(BodyTooLarge, match="unsupported"):
        read_body_limited(b"x", "br", 10)


def test_listening_beyond_loopback_needs_a_key():
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        require_key(host, None, "it")
    for host in ("0.0.0.0", "::", "10.1.2.3", "example.org"):
        with pytest.raises(ServingError, match="no key"):
            require_key(host, None, "it")
        require_key(host, "k", "it")


async def test_a_client_that_trickles_its_headers_is_dropped():
    """Slowloris: a byte at a time, never finishing the headers; the server hangs up."""
    async with anyio.create_task_group() as tg:
        url = await tg.start(
            lambda task_status: serve_asgi(_app(), idle_timeout=0.5, task_status=task_status)
        )
        host, port = url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.setblocking(False)
        sent, closed = 0, False
        with anyio.move_on_after(20):  # a bound for a broken server; the drop comes after 0.5 s
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            while not closed:
                try:
                    closed = sock.recv(1024) == b""
                except BlockingIOError:
                    try:
                        sock.sendall(b"X")
                        sent += 1
                    except OSError:
                        closed = True
                    await anyio.sleep(0.05)
                except OSError:
                    closed = True
        sock.close()
        tg.cancel_scope.cancel()
    assert closed, f"still connected after trickling {sent} bytes"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_stop_with_connections_still_open_logs_no_traceback():
    """hypercorn cancels kept-alive connections at shutdown; on Python 3.11 asyncio reported
    each as "Exception in callback ... CancelledError" with a traceback."""
    import asyncio

    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    held = anyio.Event()

    async def hold(request: Request) -> JSONResponse:
        held.set()
        await anyio.sleep_forever()

    app = Starlette(routes=[Route("/hold", hold)])
    clients = []
    try:
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve_asgi, app)
            host, port = url.removeprefix("http://").rsplit(":", 1)
            for path in ("/hold", "/missing"):
                client = socket.create_connection((host, int(port)))
                client.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                clients.append(client)
            await held.wait()
            tg.cancel_scope.cancel()
        for _ in range(20):  # the connection tasks' done-callbacks run on the next iterations
            await asyncio.sleep(0)
    finally:
        for client in clients:
            client.close()
        loop.set_exception_handler(None)
    assert [c.get("message") for c in reported] == []


async def test_a_bodied_route_gets_the_body_the_guard_read_and_others_the_app():
    """Routes `bodied` names get the body, whole, with the guard's caps and deadline still in
    front of them; every other request goes to the app, the body replayed."""
    bodies: list[bytes] = []

    async def direct(scope, body, receive, send):
        bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"direct"})

    app = _app(max_body=1000, bodied=lambda scope: direct if scope["path"] == "/fast" else None)
    transport = httpx.ASGITransport(app=app)

    async def chunks():
        for _ in range(3):
            yield b"ab" * 100

    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.post("/fast", content=b"x" * 1000)).text == "direct"
        assert (await client.post("/fast", content=chunks())).text == "direct"  # several messages
        assert (await client.post("/fast", content=b"x" * 1001)).status_code == 413
        assert (await client.post("/slow", content=b"x" * 10)).json() == {"size": 10}
    assert bodies == [b"x" * 1000, b"ab" * 300]


async def test_a_body_that_does_not_come_in_time_is_408():
    async def receive():
        await anyio.sleep_forever()

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    guard = _app(body_timeout=0.05, bodied=lambda scope: None)
    scope = {"type": "http", "method": "POST", "path": "/x", "headers": []}
    await guard(scope, receive, send)
    assert sent[0]["status"] == 408 and guard.in_flight == 0


async def test_a_request_refused_before_its_body_is_read_closes_its_connection_and_says_so():
    """The next request of a client that kept the connection would otherwise go to a server
    that is closing it, and get no answer ("Server disconnected without sending a response")."""
    async with anyio.create_task_group() as tg:
        url = await tg.start(serve_asgi, _app(api_key="s3cret", max_body=1000))
        async with httpx.AsyncClient(base_url=url) as client:
            for _ in range(10):
                refused = await client.post("/x", content=b"a" * 900)
                assert refused.status_code == 401 and refused.headers["connection"] == "close"
                too_big = await client.post("/x", content=b"a" * 5000, headers={"x-api-key": "s3cret"})
                assert too_big.status_code == 413 and too_big.headers["connection"] == "close"
                ok = await client.post("/x", content=b"a" * 900, headers={"x-api-key": "s3cret"})
                assert ok.json() == {"size": 900} and "close" not in ok.headers.get("connection", "")
        tg.cancel_scope.cancel()
