"""The viewer's JSON API on a real run: what it answers equals what the event log holds."""

import json
import re
import shutil
from collections import defaultdict
from statistics import mean

import pytest
from starlette.testclient import TestClient

from platoon.bus import read_events
from platoon.bus.events import BatchReady, EpisodeGraded, ModelCallFinished, ToolReturned, step_number
from platoon.visualization import RunSet
from platoon.visualization.app import make_app

pytestmark = pytest.mark.torch

RUN = "quickstart/guess"  # a run named on the command line: its experiment/trial


@pytest.fixture
def client(quickstart_run):
    return TestClient(make_app(RunSet([quickstart_run])), base_url="http://127.0.0.1")


def _get(client, name, **params):
    response = client.get(f"/api/{name}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _log(run_dir):
    events = list(read_events(run_dir))
    graded = {e.episode_id: e for e in events if isinstance(e, EpisodeGraded)}
    calls = defaultdict(list)
    for e in events:
        if isinstance(e, ModelCallFinished):
            calls[e.episode_id].append(e)
    tools = defaultdict(list)
    for e in events:
        if isinstance(e, ToolReturned):
            tools[e.episode_id].append(e.output)
    datums = [d for e in events if isinstance(e, BatchReady) for d in e.datums]
    return graded, calls, tools, datums


@pytest.mark.slow
def test_the_runs_table_and_the_steps_match_the_log(client, quickstart_run):
    runs = _get(client, "runs")["runs"]
    assert len(runs) == 1
    run = runs[0]
    assert (run["experiment"], run["trial"], run["status"], run["steps"]) == (
        "quickstart",
        "guess",
        "completed",
        3,
    )
    assert run["problems"] == []
    graded, *_ = _log(quickstart_run)
    assert run["episodes"] == len(graded) == 48
    assert run["id"] == RUN
    by_step = defaultdict(list)
    for e in graded.values():
        by_step[step_number(e.step)].append(e.reward)  # train steps from 1, as the terminal says
    steps = _get(client, "steps", run=run["id"])["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert [(s["step"], s["episodes"]) for s in steps] == [(k, len(v)) for k, v in sorted(by_step.items())]
    for s in steps:
        assert s["reward_mean"] == pytest.approx(mean(by_step[s["step"]]))
    metrics = _get(client, "metrics", run=run["id"])["rows"]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert metrics[-1]["reward/mean"] == run["last_reward"]
    detail = _get(client, "run", run=run["id"])
    assert detail["lock"]["config"]["train"]["max_training_steps"] == 3
    assert "experiment_name: quickstart" in detail["config"]


def test_episodes_filter_and_sort(client, quickstart_run):
    graded, *_ = _log(quickstart_run)
    rows = _get(client, "episodes", run=RUN, purpose="train", step=2, sort="reward", order="asc")["episodes"]
    expected = sorted(e.reward for e in graded.values() if step_number(e.step) == 2)
    assert [r["reward"] for r in rows] == expected
    rewarded = _get(client, "episodes", run=RUN, min_reward=1)
    assert rewarded["total"] == sum(e.reward == 1 for e in graded.values()) > 0
    assert all(r["reward"] == 1 for r in rewarded["episodes"])
    limited = _get(client, "episodes", run=RUN, status="limit", sort="completion_tokens")
    assert limited["total"] and all(r["status"] == "limit" for r in limited["episodes"])
    tokens = [r["completion_tokens"] for r in limited["episodes"]]
    assert tokens == sorted(tokens, reverse=True)
    group = rows[0]["group_id"]
    assert {r["group_id"] for r in _get(client, "episodes", run=RUN, group_id=group)["episodes"]} == {group}
    assert client.get("/api/episodes", params={"run": RUN, "sort": "x; DROP TABLE"}).status_code == 400
    assert client.get("/api/episodes", params={"run": RUN, "nope": "1"}).status_code == 400


def test_an_episode_shows_its_calls_tool_results_and_grade(client, quickstart_run):
    graded, calls, tools, _ = _log(quickstart_run)
    for episode_id in list(graded)[:6]:
        view = _get(client, "episode", run=RUN, id=episode_id)
        assert view["episode"]["reward"] == graded[episode_id].reward
        (root,) = view["agents"]
        model_calls = [i for i in root["items"] if i["kind"] == "model_call"]
        assert [c["call_id"] for c in model_calls] == [c.call_id for c in calls[episode_id]]
        assert [c["completion_tokens"] for c in model_calls] == [
            len(c.completion_tokens) for c in calls[episode_id]
        ]
        assert all(c["messages"] and c["messages"][0]["role"] == "user" for c in model_calls)
        assert [i["output"] for i in root["items"] if i["kind"] == "tool"] == tools[episode_id]
        assert [i["reward"] for i in root["items"] if i["kind"] == "grade"] == [graded[episode_id].reward]
        assert len(view["group"]) == 4


@pytest.mark.slow
def test_a_call_shows_every_sampled_token_with_the_datum_values_it_trained_on(client, quickstart_run):
    _, calls, _, datums = _log(quickstart_run)
    checked = nonzero = 0
    for episode_id, episode_calls in calls.items():
        for call in episode_calls:
            tokens = _get(client, "call", run=RUN, episode=episode_id, call=call.call_id)
            assert [t["id"] for t in tokens["tokens"]] == call.completion_tokens
            assert [t["logprob"] for t in tokens["tokens"]] == call.logprobs
            assert tokens["prompt_ids"] == call.prompt_tokens
            assert "".join(t["text"] for t in tokens["tokens"]).startswith("<tool_call>")
            # The datum of this agent holding the call, found here independently of the viewer.
            (datum,) = [
                d
                for d in datums
                if d.agent_id == call.agent_id
                and d.model_input[: len(call.prompt_tokens)] == call.prompt_tokens
                and d.target_tokens[len(call.prompt_tokens) - 1 :][: len(call.completion_tokens)]
                == call.completion_tokens
            ]
            start = len(call.prompt_tokens) - 1
            span = slice(start, start + len(call.completion_tokens))
            assert [t["trained_advantage"] for t in tokens["tokens"]] == datum.advantages[span]
            assert [t["weight"] for t in tokens["tokens"]] == datum.weights[span]
            assert [t["datum_logprob"] for t in tokens["tokens"]] == datum.logprobs[span]
            assert tokens["trained_tokens"] == sum(datum.weights[span])
            checked += 1
            nonzero += any(datum.advantages[span])
    assert checked == sum(map(len, calls.values())) and nonzero


@pytest.mark.slow
def test_a_token_shows_its_rollouts_advantage_and_the_normalisation_apart(client, quickstart_run):
    """The quickstart trains with the mean baseline and `loss_normalization: token_mean`: a
    datum holds (reward - the group's mean reward) / the trained tokens of the step's batch."""
    graded, calls, _, _ = _log(quickstart_run)
    batches = [e for e in read_events(quickstart_run) if isinstance(e, BatchReady)]
    tokens_of_step = {step_number(b.step): sum(d.num_trained_tokens for d in b.datums) for b in batches}
    groups = defaultdict(list)
    for e in graded.values():
        groups[e.group_id].append(e.reward)
    checked = 0
    for episode_id, episode_calls in calls.items():
        episode = graded[episode_id]
        advantage = episode.reward - mean(groups[episode.group_id])
        for call in episode_calls:
            answer = _get(client, "call", run=RUN, episode=episode_id, call=call.call_id)
            datum = answer["datum"]
            step = step_number(episode.step)
            assert (datum["step"], datum["normalization"]) == (step, "token_mean")
            assert (datum["batch_tokens"], datum["depth_weight"]) == (tokens_of_step[step], 1.0)
            trained = [t for t in answer["tokens"] if t["weight"]]
            assert trained and all(t["advantage"] == pytest.approx(advantage, abs=1e-9) for t in trained)
            assert all(
                t["trained_advantage"] == pytest.approx(advantage / tokens_of_step[step], abs=1e-12)
                for t in trained
            )
            assert datum["advantages"] == pytest.approx([advantage], abs=1e-9)
            checked += advantage != 0
    assert checked


def test_runs_of_one_trial_name_in_two_experiments_are_told_apart(tmp_path):
    """`platoon view runs/duel/cpu runs/planner-executor/cpu`: each is its experiment/trial."""
    for experiment in ("duel", "planner-executor"):
        (tmp_path / experiment / "cpu").mkdir(parents=True)
        (tmp_path / experiment / "cpu" / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    client = TestClient(
        make_app(RunSet([tmp_path / "duel" / "cpu", tmp_path / "planner-executor" / "cpu"])),
        base_url="http://127.0.0.1",
    )
    runs = _get(client, "runs")["runs"]
    assert [r["id"] for r in runs] == ["duel/cpu", "planner-executor/cpu"]
    assert [(r["experiment"], r["trial"]) for r in runs] == [("duel", "cpu"), ("planner-executor", "cpu")]
    assert _get(client, "metrics", run="planner-executor/cpu")["rows"][0]["reward/mean"] == 0.5


def test_run_ids_are_looked_up_never_joined_onto_paths(client):
    for run_id in ("../../etc", "/etc", "guess/../../..", "..%2f..%2fetc"):
        response = client.get("/api/run", params={"run": run_id})
        assert response.status_code == 404 and "no run" in response.json()["error"]
    assert client.get("/static/../../pyproject.toml").status_code == 404
    assert client.get("/static/%2e%2e/%2e%2e/pyproject.toml").status_code == 404
    assert client.get("/api/episode", params={"run": RUN, "id": "nope"}).status_code == 404
    assert client.get("/api/nope").json() == {"error": "no API endpoint 'nope'"}
    # Another site's page in the browser cannot read runs by naming this server (DNS rebinding).
    assert client.get("/api/runs", headers={"Host": "evil.example"}).status_code == 400


def test_odd_directories_say_what_is_wrong(tmp_path, quickstart_run):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "events.msgpack").write_bytes(b"")
    (tmp_path / "fresh" / "config.yaml").write_text("train: {}\n")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "events.msgpack").write_bytes(b"PLTNEV03" + b"\x00garbage" * 40)
    (junk / "metrics.jsonl").write_text('{"step": 0, "reward/mean": 0.5}\n{"step": 1, "rew')
    (junk / "lock.json").write_text("{not json")
    client = TestClient(
        make_app(RunSet([empty, tmp_path / "fresh", junk, tmp_path / "missing"])), base_url="http://127.0.0.1"
    )
    runs = {r["trial"]: r for r in _get(client, "runs")["runs"]}
    assert runs["junk"]["id"] == f"{tmp_path.name}/junk"  # experiment/trial, as runs are laid out
    assert "not a run directory" in runs["empty"]["problems"][0]
    assert any("empty" in p for p in runs["fresh"]["problems"])
    junk_problems = " ".join(runs["junk"]["problems"])
    assert "damaged" in junk_problems and "metrics.jsonl: 1 lines" in junk_problems
    assert "lock.json does not read" in junk_problems
    assert "not a directory" in runs["missing"]["problems"][0]
    # A line of platoon 0.2 (its steps counted from 0) is shown as users count steps now.
    assert _get(client, "metrics", run=runs["junk"]["id"])["rows"] == [{"step": 1, "reward/mean": 0.5}]
    for run_id in (r["id"] for r in runs.values()):
        for name in ("run", "metrics", "steps", "episodes", "poll"):
            response = client.get(f"/api/{name}", params={"run": run_id})
            assert response.status_code == 200, (run_id, name, response.text)
        assert client.get("/api/episode", params={"run": run_id, "id": "x"}).json()["error"]


def test_a_half_written_log_shows_what_is_whole_and_catches_up_as_it_grows(tmp_path, quickstart_run):
    data = (quickstart_run / "events.msgpack").read_bytes()
    live = tmp_path / "live"
    live.mkdir()
    for name in ("lock.json", "config.yaml"):
        shutil.copy(quickstart_run / name, live / name)
    log = live / "events.msgpack"
    cut = len(data) // 2
    log.write_bytes(data[:cut])
    client = TestClient(make_app(RunSet([live])), base_url="http://127.0.0.1")
    first = _get(client, "runs")["runs"][0]
    assert first["status"] == "running" and 0 < first["episodes"] < 48
    assert any("cut short" in p for p in first["problems"])
    before = _get(client, "poll", run=first["id"])
    with log.open("ab") as file:
        file.write(data[cut:])
    after = _get(client, "poll", run=first["id"])
    assert after["episodes"] == 48 and after["log_bytes"] == len(data) and after != before
    run = _get(client, "runs")["runs"][0]
    assert run["status"] == "completed" and run["problems"] == []
    # The index is kept beside the log and reused: a new server reads it without scanning again.
    assert (live / "events.index.sqlite").exists()
    again = RunSet([live]).get(first["id"])
    assert again.index.refresh() is False and again.index.summary()["episodes"] == 48


def test_the_site_runs_folder_is_listed_and_new_runs_appear(tmp_path, quickstart_run):
    root = tmp_path / "runs"
    shutil.copytree(quickstart_run, root / "quickstart" / "a")
    client = TestClient(make_app(RunSet(root=root)), base_url="http://127.0.0.1")
    assert [r["id"] for r in _get(client, "runs")["runs"]] == ["quickstart/a"]
    shutil.copytree(quickstart_run, root / "quickstart" / "b")
    assert [r["id"] for r in _get(client, "runs")["runs"]] == ["quickstart/a", "quickstart/b"]
    assert _get(client, "steps", run="quickstart/b")["steps"]


def test_export_writes_what_the_api_answers(tmp_path, quickstart_run):
    from platoon.cli import main
    from platoon.visualization.export import data_key

    out = tmp_path / "export"
    assert main(["view", str(quickstart_run), "--export", str(out)]) == 0
    assert "window.PLATOON_STATIC = true" in (out / "index.html").read_text()
    assert (out / "static" / "app.js").exists()
    graded, calls, *_ = _log(quickstart_run)
    episode_id = next(iter(graded))
    key = data_key("episode", {"run": RUN, "id": episode_id})
    text = (out / "data" / f"{key}.js").read_text()
    prefix = f"window.__platoonData[{json.dumps(key)}] = "
    assert text.startswith(prefix)
    exported = json.loads(text[len(prefix) :].rstrip().rstrip(";"))
    client = TestClient(make_app(RunSet([quickstart_run])), base_url="http://127.0.0.1")
    assert exported == _get(client, "episode", run=RUN, id=episode_id)
    files = {p.name for p in (out / "data").iterdir()}
    assert len([f for f in files if f.startswith("call_")]) == sum(map(len, calls.values()))


def test_two_viewers_index_the_same_run_at_once_and_each_record_once(tmp_path, quickstart_run):
    import threading

    from platoon.visualization.index import RunIndex

    run = tmp_path / "run"
    shutil.copytree(quickstart_run, run, ignore=shutil.ignore_patterns("events.index.sqlite*"))
    indexes = [RunIndex(run), RunIndex(run)]
    threads = [threading.Thread(target=index.refresh) for index in indexes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    alone = RunIndex(run, index_path=tmp_path / "alone.sqlite")
    alone.refresh()
    for index in indexes:
        assert index.summary()["episodes"] == 48
        assert index.steps() == alone.steps()
        assert index._query("SELECT COUNT(*) FROM records") == alone._query("SELECT COUNT(*) FROM records")
        assert index._query("SELECT COUNT(*) FROM datums") == alone._query("SELECT COUNT(*) FROM datums")


def test_a_run_of_an_older_platoon_shows_its_episodes(tmp_path, quickstart_run):
    """A log from before the framing (bare lengths, no times) is indexed and read by offset."""
    import struct

    from platoon.bus import encode

    old = tmp_path / "old"
    old.mkdir()
    events = list(read_events(quickstart_run))
    (old / "events.msgpack").write_bytes(
        b"".join(struct.pack(">I", len(encode(e))) + encode(e) for e in events)
    )
    client = TestClient(make_app(RunSet([old])), base_url="http://127.0.0.1")
    run = _get(client, "runs")["runs"][0]
    assert run["episodes"] == 48 and run["status"] == "completed"
    graded, calls, tools, _ = _log(quickstart_run)
    episode_id = next(iter(graded))
    view = _get(client, "episode", run=run["id"], id=episode_id)
    (root,) = view["agents"]
    assert [i["output"] for i in root["items"] if i["kind"] == "tool"] == tools[episode_id]
    call = calls[episode_id][0]
    tokens = _get(client, "call", run=run["id"], episode=episode_id, call=call.call_id)
    assert [t["id"] for t in tokens["tokens"]] == call.completion_tokens and tokens["datum"]


def test_a_viewer_shared_beyond_loopback_asks_for_its_key(quickstart_run):
    app = make_app(RunSet([quickstart_run]), allowed_hosts=["*"], key="s3cret-key")
    stranger = TestClient(app, base_url="http://10.1.2.3:8000")
    for path in ("/", "/api/runs", "/static/app.js", "/?key=wrong"):
        answer = stranger.get(path)
        assert answer.status_code == 401, path
        assert "guess" not in answer.text and "?key=" in answer.text  # no run, and what to do
    reader = TestClient(app, base_url="http://10.1.2.3:8000")
    opened = reader.get("/?key=s3cret-key&x=1", follow_redirects=False)
    assert opened.status_code == 303 and opened.headers["location"] == "/?x=1"  # the key leaves the address
    cookie = opened.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert reader.get("/api/runs").json()["runs"][0]["id"] == RUN  # the cookie is the key now


def test_platoon_view_beyond_loopback_prints_an_address_with_a_key(quickstart_run):
    import subprocess
    import sys

    import httpx

    process = subprocess.Popen(
        [sys.executable, "-m", "platoon", "view", str(quickstart_run), "--host", "0.0.0.0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.search(r"at http://[^:]+:(\d+)/\?key=(\S+)", line)
        assert found, line
        port, key = found.groups()
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/api/runs").status_code == 401
        with httpx.Client(base_url=base, follow_redirects=True) as client:
            assert client.get(f"/?key={key}").status_code == 200
            assert client.get("/api/runs").status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=30)
        process.stdout.close()


def test_an_unknown_run_id_is_answered_without_walking_the_runs_folder(tmp_path, monkeypatch):
    """300 unknown ids once took 15 s, each rescanning the site's runs folder."""
    from platoon.visualization import runs as runs_module

    root = tmp_path / "runs"
    (root / "exp" / "old").mkdir(parents=True)
    (root / "exp" / "old" / "metrics.jsonl").write_text('{"step": 1}\n')
    walks = []
    walk = runs_module._find_runs
    monkeypatch.setattr(runs_module, "_find_runs", lambda folder: walks.append(folder) or walk(folder))
    client = TestClient(make_app(RunSet(root=root)), base_url="http://127.0.0.1")
    walks.clear()
    for i in range(20):
        for run_id in (f"nope-{i}", f"exp/{i}", "../runs/exp/old", "exp/../exp/old", "/etc"):
            assert client.get("/api/run", params={"run": run_id}).status_code == 404
    assert walks == []
    # A run that appeared since the start is still found by its id, and only it is looked at.
    (root / "exp" / "new").mkdir()
    (root / "exp" / "new" / "metrics.jsonl").write_text('{"step": 1}\n')
    assert client.get("/api/run", params={"run": "exp/new"}).status_code == 200
    assert walks == []


def test_a_shared_viewer_answers_only_the_names_it_is_reached_by(quickstart_run):
    """Shared with --host, the viewer still refuses a Host it does not have (DNS rebinding): its
    host, this machine's names, and what --allow-host adds."""
    import subprocess
    import sys

    import httpx

    argv = [sys.executable, "-m", "platoon", "view", str(quickstart_run), "--host", "127.0.0.2"]
    process = subprocess.Popen(
        [*argv, "--allow-host", "viewer.example"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        found = re.search(r"at (http://127\.0\.0\.2:\d+)/\?key=(\S+)", process.stdout.readline())
        assert found
        base, key = found.groups()
        with httpx.Client(base_url=base) as http:
            for host, status in (("evil.example", 400), ("127.0.0.2", 401), ("viewer.example", 401)):
                assert http.get("/api/runs", headers={"host": host}).status_code == status, host
            http.cookies.set("platoon-view-key", key)
            assert http.get("/api/runs", headers={"host": "viewer.example"}).status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=30)
        process.stdout.close()
