"""A worker's Tinker key goes only where the worker itself trusts (issue: key exfiltration by a
forged policy announcement)."""

from __future__ import annotations

import http.server
import threading

import pytest

pytest.importorskip("tinker")

from platoon.assembly.nats import bridge, nats_settings
from platoon.config import validate_config
from platoon.train.distributed import DistributedError
from platoon.train.worker import TinkerPolicies

SECRET = "tml-worker-secret-key"
CONFIG = {
    "environments": [{"env": "platoon-number-search@1", "harness": "platoon-react"}],
    "train": {"backend": "tinker", "model_name": "m", "renderer_name": "qwen3_instruct"},
}


class Recorder:
    """An HTTP server on loopback that records the keys it is sent and answers nothing useful."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _record(self) -> None:
                recorder.keys.append(self.headers.get("x-api-key") or self.headers.get("authorization") or "")
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            do_GET = do_POST = _record

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder():
    made = Recorder()
    yield made
    made.close()


def _connect(policies: TinkerPolicies, url: str) -> None:
    import warnings

    try:
        client = policies._client(url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            client.get_server_capabilities()
    except Exception:
        pass  # the recorder is no Tinker server; what matters is what it was sent


def test_an_unauthenticated_announcement_never_gets_the_key(recorder, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    _connect(TinkerPolicies(base_url=None, model_name="m"), recorder.url)
    assert recorder.keys, "the worker did not try the announced URL at all"
    assert not any(SECRET in key for key in recorder.keys)


def test_the_key_goes_to_the_workers_own_url_or_an_authenticated_announcement(recorder, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    _connect(TinkerPolicies(base_url=recorder.url, model_name="m"), "http://evil.invalid")
    _connect(TinkerPolicies(base_url=None, model_name="m", trust_announced=True), recorder.url)
    assert recorder.keys and all(SECRET in key for key in recorder.keys)


def test_nats_beyond_loopback_needs_credentials():
    from platoon.bus.nats import Routes

    config = validate_config({**CONFIG, "nats": {"url": "nats://10.20.30.40:4222"}})
    with pytest.raises(DistributedError, match="platoon nats init"):
        bridge(nats_settings(config), open_server="refuse", routes=Routes())
    insecure = validate_config({**CONFIG, "nats": {"url": "nats://10.20.30.40:4222", "insecure": True}})
    assert (
        bridge(nats_settings(insecure), open_server="refuse", routes=Routes()) is not None
    )  # made, not connected


def test_announcements_count_as_authenticated_only_where_the_server_was_checked(tmp_path):
    """With `nats.insecure` the worker may be on a server that lets anyone in, credentials or not:
    an announced URL then gets no key."""
    from platoon.assembly.nats import authenticated

    credentials = tmp_path / "worker.json"
    credentials.write_text('{"user": "worker", "password": "p"}')
    nats = {"url": "nats://127.0.0.1:4222", "credentials_file": str(credentials)}
    assert authenticated(validate_config({**CONFIG, "nats": nats}))
    assert not authenticated(validate_config({**CONFIG, "nats": {**nats, "insecure": True}}))
    assert not authenticated(validate_config({**CONFIG, "nats": {"url": nats["url"]}}))
