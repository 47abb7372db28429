"""Faults of the embedded server: a refused request never wedges its client; a restart says
how to resume, and the checkpoints it left load again."""

import contextlib
import socket

import httpx
import msgspec
import numpy as np
import pytest
import tinker
import zstandard
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

pytestmark = pytest.mark.torch

LR = types.AdamParams(learning_rate=1e-2)
TOKENS = [3, 4, 5, 6, 7, 8]


def datum(tokens: list[int]) -> types.Datum:
    inputs = {"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


@contextlib.contextmanager
def server(model, checkpoint_dir, **options):
    from anyio.from_thread import start_blocking_portal

    from platoon.backends.local import running_server

    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            running_server(str(model), checkpoint_dir=checkpoint_dir, device="cpu", **options)
        ) as url,
    ):
        yield url


def raw_fwd_bwd(model_id: str, seq_id: int, *, ragged: bool = False, tokens: int = 4) -> bytes:
    """A ForwardBackwardRequest as the SDK would send it; `ragged` cuts a tensor mid-value."""
    ids = np.full(tokens, 3, dtype=np.int32)
    targets = np.full(tokens, 4, dtype=np.int64).tobytes()
    msg = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy")
    item = msg.data.add()
    item.model_input.add().encoded_text.tokens = ids.tobytes()
    item.loss_fn_inputs["target_tokens"].dense = targets[:-3] if ragged else targets
    item.loss_fn_inputs["target_tokens"].dtype = pb.DTYPE_INT64
    return msg.SerializeToString()


def retrieve(http: httpx.Client, request_id: str) -> dict:
    """The future's result: JSON as a dict, a protobuf ForwardBackwardOutput as its metrics."""
    for _ in range(8):  # each poll waits up to the server's 25 s
        answer = http.post("/retrieve_future", json={"request_id": request_id, "allow_metadata_only": False})
        if answer.status_code == 408:
            continue
        if answer.headers["content-type"] == "application/x-protobuf":
            out = pb.ForwardBackwardOutput()
            out.ParseFromString(answer.content)
            return {"metrics": dict(out.metrics)}
        return answer.json()
    pytest.fail(f"request {request_id} never finished: its seq_id is waiting for one that never came")


@pytest.mark.slow
def test_any_refused_training_body_still_uses_up_its_seq_id(tiny_model, tmp_path):
    """A body that fails to decode in any way (a tensor whose bytes are not whole values, a zstd
    body that expands past the cap, a body over the cap, proto or JSON) is answered 400/413 and
    its place in the model's order is taken by a failure, so the next request runs."""
    with server(tiny_model, tmp_path, max_body_mb=1) as url:
        service = tinker.ServiceClient(base_url=url, api_key="tml-test")
        model_id = service.create_lora_training_client(base_model=str(tiny_model), rank=2).result().model_id
        with httpx.Client(base_url=f"{url}/api/v1", headers={"X-API-Key": "tml-test"}, timeout=60) as http:
            proto = {"Content-Type": "application/x-protobuf"}
            ragged = http.post(
                "/forward_backward", content=raw_fwd_bwd(model_id, 1, ragged=True), headers=proto
            )
            assert ragged.status_code == 400 and "bad forward_backward body" in ragged.json()["error"]
            bomb = zstandard.ZstdCompressor().compress(raw_fwd_bwd(model_id, 2, tokens=2_000_000))
            assert len(bomb) < 2**20
            refused = http.post(
                "/forward_backward", content=bomb, headers=proto | {"Content-Encoding": "zstd"}
            )
            assert refused.status_code == 413
            good = http.post("/forward_backward", content=raw_fwd_bwd(model_id, 3), headers=proto)
            step = http.post("/optim_step", json={"model_id": model_id, "seq_id": 4, "adam_params": {}})
            assert good.status_code == step.status_code == 200
            assert retrieve(http, good.json()["request_id"])["metrics"]["loss:sum"] > 0
            assert retrieve(http, step.json()["request_id"])["metrics"]["grad_norm:mean"] > 0
            late = http.post("/optim_step", json={"model_id": model_id, "seq_id": 1, "adam_params": {}})
            # Bodies over the server's cap, refused before they are read in full.
            padded = {"model_id": model_id, "seq_id": 6, "adam_params": {}, "pad": "x" * 2**21}
            for path, body in (
                ("/forward_backward", raw_fwd_bwd(model_id, 5, tokens=300_000)),
                ("/optim_step", msgspec.json.encode(padded)),
            ):
                # On a connection of its own: refused with 413, or the server closes it while the
                # body is still being sent.
                with httpx.Client(base_url=f"{url}/api/v1", timeout=60) as once:
                    try:
                        assert once.post(path, content=body, headers=proto).status_code == 413
                    except (httpx.RemoteProtocolError, httpx.WriteError):
                        pass
            step = http.post("/optim_step", json={"model_id": model_id, "seq_id": 7, "adam_params": {}})
            assert retrieve(http, step.json()["request_id"])["metrics"]["learning_rate:mean"] > 0
            # A resent seq_id is a retry: it gets the first request's answer, not a second run.
            assert "bad forward_backward body" in retrieve(http, late.json()["request_id"])["error"]
        service.close("success").result()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_after_a_restart_the_client_is_told_to_resume_and_the_checkpoint_loads(tiny_model, tmp_path):
    port = free_port()
    with server(tiny_model, tmp_path, port=port) as url:
        service = tinker.ServiceClient(base_url=url, api_key="tml-test")
        client = service.create_lora_training_client(base_model=str(tiny_model), rank=2, seed=1).result()
        client.forward_backward([datum(TOKENS)], "cross_entropy").result()
        client.optim_step(LR).result()
        state = client.save_state("before-restart").result().path
        before = client.forward([datum(TOKENS)], "cross_entropy").result().metrics["loss:sum"]

    # A kill during a checkpoint write leaves its staging folder: the next server removes it.
    torn = tmp_path / client.model_id / "weights" / "torn.partial"
    torn.mkdir(parents=True)
    (torn / "adapter_model.safetensors").write_bytes(b"half")
    with server(tiny_model, tmp_path, port=port) as url2:
        assert url2 == url
        assert not torn.exists()
        with pytest.raises(tinker.BadRequestError) as refused:
            client.forward_backward([datum(TOKENS)], "cross_entropy").result(timeout=120)
        message = str(refused.value)
        assert "restarted" in message and "--resume" in message and state in message

        fresh = tinker.ServiceClient(base_url=url2, api_key="tml-test")
        rest = tinker.RestClient(base_url=url2, api_key="tml-test")
        assert client.model_id in {
            r.training_run_id for r in rest.list_training_runs().result().training_runs
        }
        resumed = fresh.create_training_client_from_state_with_optimizer(state).result()
        after = resumed.forward([datum(TOKENS)], "cross_entropy").result().metrics["loss:sum"]
        assert after == pytest.approx(before, rel=1e-6)
        fresh.close("success").result()
    service.holder.close()  # its session died with the first server: stop its heartbeat here


def test_a_model_never_saved_is_said_to_be_lost(base_url):
    with httpx.Client(base_url=f"{base_url}/api/v1", timeout=60) as http:
        step = http.post(
            "/optim_step", json={"model_id": "local-gone:train:0", "seq_id": 1, "adam_params": {}}
        )
        assert step.status_code == 400
        error = step.json()["error"]
    assert "Nothing of it was saved" in error and "--resume" in error
