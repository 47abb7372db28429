"""Every server platoon starts has a key, on loopback too, and only its own clients hold it.

The attacker is another process of the machine (another user, or task code on the host's
network): it holds no key, so every route answers it 401, checkpoint listing and deletion
included, while the server's own clients (the real tinker SDK, a run's samplers, a rollout) find
the key without being told. Where a person starts the server, it prints the key (the viewer: in
the address to open, as Jupyter does); a run's own server prints it nowhere.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

# What a process without the key tries: every route of the embedded Tinker server.
TINKER_ROUTES = [
    *(
        ("POST", f"/api/v1/{name}")
        for name in (
            "client/config client/dynamic_config create_session session_heartbeat telemetry create_model "
            "get_info forward_backward optim_step save_weights save_weights_for_sampler load_weights "
            "save_weights_external copy_weights unload_model create_sampling_session asample "
            "retrieve_future retrieve_futures cancel_future join_sampling_session sessions/search "
            "weights_info sessions/s/finish"
        ).split()
    ),
    ("GET", "/api/v1/healthz"),
    ("GET", "/api/v1/get_server_capabilities"),
    ("GET", "/api/v1/samplers/s"),
    ("GET", "/api/v1/training_runs"),
    ("GET", "/api/v1/checkpoints"),
    ("GET", "/api/v1/sessions"),
    ("GET", "/api/v1/sessions/s"),
    ("POST", "/platoon/v1/sample_stream"),
]

_KEYLESS = """
import json, sys, httpx
base, routes = sys.argv[1], json.loads(sys.argv[2])
with httpx.Client(base_url=base, timeout=30) as http:
    print(json.dumps([http.request(method, path, json={}).status_code for method, path in routes]))
"""


def keyless(base: str, routes: list[tuple[str, str]]) -> list[int]:
    """The statuses another process, holding no key, gets on `routes`."""
    done = subprocess.run(
        [sys.executable, "-c", _KEYLESS, base, json.dumps(routes)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """Where this test's servers publish their keys (this user's runtime folder, here a private one)."""
    folder = tmp_path / "runtime"
    monkeypatch.setenv("PLATOON_RUNTIME_DIR", str(folder))
    return folder


def test_serve_tinker_by_hand_makes_a_key_that_only_its_users_clients_find(serve, tiny_model, runtime):
    import tinker

    server = serve(
        ["serve", "tinker", "--model", str(tiny_model), "--port", "0", "--device", "cpu"],
        ready=r"Tinker API for .* at http",
    )
    key = next(line.split()[1] for line in server.lines if line.startswith("key "))
    url = server.output.split(" at ", 1)[1].split()[0]
    assert key.startswith("tml-") and f"TINKER_API_KEY={key}" in server.output

    # The real SDK with the printed key trains and saves a checkpoint.
    service = tinker.ServiceClient(base_url=url, api_key=key)
    training = service.create_lora_training_client(base_model=str(tiny_model), rank=2).result()
    saved = training.save_state("kept").result().path
    run = training.model_id
    listing = [("GET", f"/api/v1/training_runs/{run}/checkpoints"), ("GET", f"/api/v1/training_runs/{run}")]
    delete = [("DELETE", f"/api/v1/training_runs/{run}/checkpoints/weights/kept")]
    assert set(keyless(url, TINKER_ROUTES + listing + delete)) == {401}
    with pytest.raises(tinker.AuthenticationError):
        tinker.RestClient(base_url=url, api_key="tml-local").list_checkpoints(run).result()
    rest = tinker.RestClient(base_url=url, api_key=key)
    assert [c.tinker_path for c in rest.list_checkpoints(run).result().checkpoints] == [saved]  # not deleted
    service.close("success").result()

    # This user's clients find it (a `platoon train tinker_base_url=...`); the file is theirs alone.
    from platoon.policy.tinker import tinker_endpoint

    assert tinker_endpoint(url) == (url, key)
    published = next(runtime.glob("server-*.json"))
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700 and stat.S_IMODE(published.stat().st_mode) == 0o600
    assert server.close() == 0
    assert not published.exists()  # gone with its server


def test_a_runs_own_tinker_server_has_a_key_given_to_its_clients_only(serve, tiny_model, runtime, tmp_path):
    """`gateway serve` on `train.backend: local` opens the run's embedded server, as `train` does."""
    import openai

    config = Path(__file__).resolve().parents[2] / "examples" / "number-search" / "train-local.yaml"
    events = tmp_path / "events"
    argv = ["gateway", "serve", str(config), f"train.model_name={tiny_model}", "train.lora_rank=2"]
    gateway = serve([*argv, "--events-dir", str(events)], ready=r"^Ctrl-C")
    printed = dict(line.strip().partition(" ")[::2] for line in gateway.lines)
    record = json.loads(next(runtime.glob("server-*.json")).read_text())
    url, key = record["url"], record["key"]

    assert set(keyless(url, TINKER_ROUTES)) == {401}
    # Its own clients got the key: the gateway samples the policy through it.
    client = openai.OpenAI(base_url=printed["gateway"].split()[0], api_key=printed["key"].strip())
    reply = client.chat.completions.create(
        model="platoon-policy", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert reply.choices[0].message.content is not None
    assert gateway.close() == 0
    # Printed nowhere, written to no run file: only the private runtime file held it.
    assert key not in gateway.output
    assert not any(key.encode() in path.read_bytes() for path in events.rglob("*") if path.is_file())


def test_env_serve_makes_a_key_that_a_rollout_on_this_machine_finds(serve, runtime):
    here = Path(__file__).resolve().parents[1] / "envs"
    server = serve(
        ["env", "serve", "ors_sample_envs:GuessTheNumber", "--port", "0"],
        ready=r"^serving ",
        env={"PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    key = next(line.split()[1] for line in server.lines if line.startswith("key "))
    url = server.lines[-1].split(" on ")[1].strip()
    routes = [("GET", "/"), ("GET", "/list_environments"), ("POST", "/create_session"), ("GET", "/x/tasks")]
    assert set(keyless(url, routes)) == {401}
    assert httpx.get(f"{url}/list_environments", headers={"x-api-key": key}).status_code == 200

    from platoon.envs.remote import RemoteBackend

    assert RemoteBackend(url).api_key == key  # what `service: http://...` sends, untold


def test_the_viewer_on_loopback_asks_for_the_key_its_address_carries(serve, tmp_path):
    run = tmp_path / "runs" / "exp" / "trial"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    viewer = serve(["view", str(run)], ready=r"\?key=")
    address = next(line for line in viewer.lines if "?key=" in line).split(" at ")[1].split()[0]
    base, key = address.split("/?key=")
    assert set(keyless(base, [("GET", "/"), ("GET", "/api/runs"), ("GET", "/static/app.js")])) == {401}
    with httpx.Client(base_url=base, follow_redirects=True) as browser:
        assert browser.get(f"/?key={key}").status_code == 200  # the printed address opens it
        assert browser.get("/api/runs").json()["runs"]


def test_a_key_left_by_a_server_that_died_is_not_used(runtime):
    from platoon.serving import published_key, published_key_for

    with published_key("http://127.0.0.1:1234", "tml-alive"):
        assert published_key_for("http://localhost:1234") == "tml-alive"
        assert published_key_for("http://10.0.0.1:1234") is None  # only loopback servers
    assert published_key_for("http://127.0.0.1:1234") is None
    (runtime / "server-1235.json").write_text(json.dumps({"key": "tml-stale", "pid": 2**22 + 7}))
    assert published_key_for("http://127.0.0.1:1235") is None
