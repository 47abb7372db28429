"""Secrets written inline in a config never reach the run directory, a log line or the event log."""

from __future__ import annotations

import json
import stat

import msgspec
import pytest
import structlog

from platoon.bus.events import AgentOpened
from platoon.config import Config, load_config, write_run_files
from platoon.config.redact import REDACTED, is_secret_key, redact, redact_text

SECRET = "sk-live-0123456789"


def test_secret_keys_and_url_passwords_are_replaced():
    assert is_secret_key("api_key") and is_secret_key("X-API-Key") and is_secret_key("nats.token")
    assert not is_secret_key("max_tokens") and not is_secret_key("seed") and not is_secret_key("tokenizer")
    data = {
        "service_kwargs": {"api_key": SECRET, "secrets": {"HF_TOKEN": SECRET}, "split": "train"},
        "url": f"nats://trainer:{SECRET}@10.0.0.1:4222",
        "argv": ["platoon", "train", f"environments.0.service_kwargs.api_key={SECRET}", "train.seed=3"],
        "empty_token": "",
    }
    cleaned = redact(data)
    assert SECRET not in json.dumps(cleaned)
    assert cleaned["service_kwargs"]["split"] == "train"
    assert cleaned["url"] == f"nats://trainer:{REDACTED}@10.0.0.1:4222"
    assert cleaned["argv"][-1] == "train.seed=3"
    assert cleaned["empty_token"] == ""  # nothing there is not hidden as if it were
    assert redact_text("https://example.org/path?x=1") == "https://example.org/path?x=1"


def test_run_files_hold_no_secret_and_are_private(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "environments:\n"
        "  - service: http://127.0.0.1:9/\n"
        f"    service_kwargs: {{api_key: {SECRET}}}\n"
        f"nats: {{url: 'nats://u:{SECRET}@127.0.0.1:4222'}}\n"
        f"tinker_base_url: 'https://me:{SECRET}@tinker.example'\n"
    )
    config = load_config(tmp_path / "c.yaml")
    run = tmp_path / "runs" / "r"
    write_run_files(run, config, {"argv": ["platoon", "train", f"nats.url=nats://u:{SECRET}@h:4222"]})
    for name in ("config.yaml", "lock.json"):
        text = (run / name).read_text()
        assert SECRET not in text, name
        assert REDACTED in text
        assert stat.S_IMODE((run / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    reloaded = load_config(run / "config.yaml")  # still a valid config, secrets to be given again
    assert isinstance(reloaded, Config)


@pytest.mark.anyio
async def test_the_event_log_keeps_no_agent_key(tmp_path):
    from platoon.bus import Bus, EventLog, read_events

    log = EventLog(tmp_path)
    async with Bus() as bus:
        log.attach(bus)
        bus.start_soon(log.run, bus)
        await bus.publish(AgentOpened(reply_to="r", key=SECRET, base_url="http://127.0.0.1:1/v1"))
    raw = (tmp_path / "events.msgpack").read_bytes()
    assert SECRET.encode() not in raw
    assert [e.key for e in read_events(tmp_path) if isinstance(e, AgentOpened)] == [REDACTED]
    assert stat.S_IMODE((tmp_path / "events.msgpack").stat().st_mode) == 0o600


def test_log_lines_hold_no_secret(capsys):
    from platoon.stats.logging import configure_logging

    configure_logging("json")
    structlog.get_logger("platoon.test").info(
        "connecting", url=f"https://u:{SECRET}@h/", api_key=SECRET, note=f"token={SECRET}"
    )
    line = capsys.readouterr().err
    assert SECRET not in line and "connecting" in line
    assert msgspec.json.decode(line.splitlines()[-1])["api_key"] == REDACTED
