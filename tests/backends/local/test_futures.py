"""Futures: seq_id ordering, deduplication, long-poll timeouts; and the server under trio."""

import anyio
import anyio.lowlevel
import pytest

from platoon.backends.local.futures import FutureStore, SeqError, SeqQueue, SyncJob, json_outcome


@pytest.mark.anyio
async def test_jobs_run_in_seq_id_order_whatever_the_arrival_order():
    queue = SeqQueue(first=1)
    ran: list[int] = []

    def job(n: int):
        async def run() -> None:
            ran.append(n)

        return run

    async with anyio.create_task_group() as tg:
        tg.start_soon(queue.run)
        for seq_id in (3, 4, 2):
            queue.submit(seq_id, f"r{seq_id}", job(seq_id))
        await anyio.sleep(0.01)
        assert ran == []  # waiting for seq_id 1
        queue.submit(1, "r1", job(1))
        queue.submit(6, "r6", job(6))
        await anyio.sleep(0.01)
        assert ran == [1, 2, 3, 4]
        with pytest.raises(SeqError):
            queue.submit(2, "again", job(2))
        queue.close()
    assert ran == [1, 2, 3, 4]


@pytest.mark.anyio
async def test_left_over_jobs_are_reported_when_closed():
    queue = SeqQueue(first=1)
    queue.submit(3, "r3", lambda: anyio.lowlevel.checkpoint())
    queue.close()
    assert await queue.run() == ["r3"]


@pytest.mark.anyio
async def test_store_deduplicates_and_long_polls():
    store = FutureStore()
    first, new = store.create(("train", "m", 1))
    again, new_again = store.create(("train", "m", 1))
    assert new and not new_again and first == again
    assert await store.wait(first, 0.01) is None  # still pending: the poll times out
    store.resolve(first, json_outcome({"ok": 1}))
    store.resolve(first, json_outcome({"ok": 2}))  # answered once
    outcome = await store.wait(first, 1)
    assert outcome is not None and outcome.body == b'{"ok":1}'
    with pytest.raises(KeyError):
        await store.wait("nope", 0)


def test_server_runs_under_trio(tiny_model, tmp_path):
    import httpx
    from anyio.from_thread import start_blocking_portal

    from platoon.backends.local import running_server

    with (
        start_blocking_portal(backend="trio") as portal,
        portal.wrap_async_context_manager(
            running_server(str(tiny_model), checkpoint_dir=tmp_path, device="cpu")
        ) as url,
    ):
        assert httpx.get(f"{url}/api/v1/healthz").json() == {"status": "ok"}
        caps = httpx.get(f"{url}/api/v1/get_server_capabilities").json()
        assert caps["supported_models"][0]["trainable"] is True


@pytest.mark.anyio
async def test_consecutive_sync_jobs_share_one_hand_off():
    """A forward_backward and the optim_step behind it run in one trip to the worker thread;
    an async job between them breaks the chain, and order holds throughout."""
    calls: list[list[int]] = []

    async def run_group(fn):
        calls.append([])
        return await anyio.to_thread.run_sync(fn)

    queue = SeqQueue(first=1, run_group=run_group)
    ran: list[int] = []
    finished: list[tuple[int, str]] = []

    def sync(n: int) -> SyncJob:
        def compute() -> str:
            ran.append(n)
            calls[-1].append(n)
            return f"out{n}"

        return SyncJob(compute, lambda result: finished.append((n, result)))

    async def three() -> None:
        ran.append(3)

    for seq_id, job in ((2, sync(2)), (3, three), (4, sync(4)), (1, sync(1))):
        queue.submit(seq_id, f"r{seq_id}", job)
    queue.close()
    async with anyio.create_task_group() as tg:
        tg.start_soon(queue.run)
    assert ran == [1, 2, 3, 4]
    assert calls == [[1, 2], [4]]
    assert finished == [(1, "out1"), (2, "out2"), (4, "out4")]
