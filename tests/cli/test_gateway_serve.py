"""`platoon gateway serve`: a real `platoon` process serves a scripted policy; the real openai
and anthropic clients reach it with the key it prints, and its event log holds the calls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anthropic
import openai
import pytest

from platoon.bus.eventlog import read_events
from platoon.bus.events import ModelCallFinished

POLICY = 'def echo(messages):\n    return "you said: " + str(messages[-1]["content"])\n'


@pytest.fixture
def served(tmp_path: Path):
    (tmp_path / "echo_policy.py").write_text(POLICY)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    argv = [sys.executable, "-m", "platoon", "gateway", "serve", "--policy", "scripted:echo_policy:echo"]
    argv += ["--events-dir", str(tmp_path / "events")]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: dict[str, str] = {}
    assert process.stdout is not None
    for line in process.stdout:  # the command prints its URL and key, then this line
        key, _, value = line.strip().partition(" ")
        lines[key] = value.strip()
        if line.startswith("Ctrl-C"):
            break
    else:
        pytest.fail(f"gateway serve ended: {process.stderr.read() if process.stderr else ''}")
    try:
        yield lines["gateway"].split()[0], lines["key"], tmp_path / "events", process
    finally:
        process.terminate()
        process.communicate(timeout=30)  # waits, and closes its pipes


@pytest.mark.slow
def test_the_printed_key_opens_the_gateway_to_real_clients(served):
    base_url, key, events_dir, process = served
    chat = openai.OpenAI(base_url=base_url, api_key=key).chat.completions.create(
        model="platoon-policy", messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.choices[0].message.content == "you said: hi"
    message = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key=key).messages.create(
        model="platoon-policy", max_tokens=50, messages=[{"role": "user", "content": "hello"}]
    )
    assert message.content[0].text == "you said: hello"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base_url, api_key="pt-wrong").models.list()

    process.terminate()  # SIGTERM stops it like Ctrl-C: the event log is closed, not cut
    assert process.wait(timeout=30) == 0
    calls = [e for e in read_events(events_dir) if isinstance(e, ModelCallFinished)]
    assert [c.completion_text for c in calls] == ["you said: hi", "you said: hello"]


def test_it_needs_a_policy():
    done = subprocess.run(
        [sys.executable, "-m", "platoon", "gateway", "serve"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "give a CONFIG (its policy) or --policy scripted:MODULE:ATTR" in done.stderr
