"""Attack platoon's servers as another local user would, through the real command line.

    python tests/security/attack.py [--model DIR]

Starts `platoon serve tinker` (with a checkpoint folder, under umask 000), `platoon env serve`,
`platoon view` and `platoon gateway serve` as their user would, then, from a process that holds no
key, tries every route; and, holding the Tinker key, sends the one small request that once froze
the training service. Prints one line per attack and what it measured; exits 1 if any held not.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from served import Served  # noqa: E402

KEYLESS = """
import json, sys, httpx
base, routes = sys.argv[1], json.loads(sys.argv[2])
with httpx.Client(base_url=base, timeout=30) as http:
    print(json.dumps([http.request(m, p, json={}).status_code for m, p in routes]))
"""


class Report:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def check(self, name: str, held: bool, measured: str = "") -> None:
        print(f"{'held' if held else 'FAILED'}  {name}{f'  ({measured})' if measured else ''}", flush=True)
        if not held:
            self.failed.append(name)


def keyless(base: str, routes: list[tuple[str, str]]) -> list[int]:
    """What another process, without the key, is answered on `routes`."""
    done = subprocess.run(
        [sys.executable, "-c", KEYLESS, base, json.dumps(routes)], capture_output=True, text=True
    )
    return json.loads(done.stdout) if done.returncode == 0 else [-1]


def attack_tinker(report: Report, model: str, work: Path) -> None:
    checkpoints = work / "checkpoints"
    server = Served(
        [
            "serve",
            "tinker",
            "--model",
            model,
            "--port",
            "0",
            "--device",
            "cpu",
            "--checkpoint-dir",
            str(checkpoints),
        ],
        ready=r"Tinker API for .* at http",
        umask=0,
    )
    try:
        url = server.output.split(" at ", 1)[1].split()[0]
        key = next((line.split()[1] for line in server.lines if line.startswith("key ")), "")
        report.check("serve tinker on loopback makes a key", key.startswith("tml-"))
        http = httpx.Client(base_url=url, headers={"x-api-key": key}, timeout=60)
        session = http.post("/api/v1/create_session", json={}).json()["session_id"]
        created = http.post(
            "/api/v1/create_model",
            json={"session_id": session, "model_seq_id": 0, "base_model": model, "lora_config": {"rank": 2}},
        ).json()["request_id"]
        run = _result(http, created)["model_id"]
        saved = http.post("/api/v1/save_weights", json={"model_id": run, "seq_id": 1, "path": "kept"})
        _result(http, saved.json()["request_id"])
        routes = [
            ("GET", "/api/v1/healthz"),
            ("GET", "/api/v1/training_runs"),
            ("GET", f"/api/v1/training_runs/{run}/checkpoints"),
            ("DELETE", f"/api/v1/training_runs/{run}/checkpoints/weights/kept"),
            ("POST", "/api/v1/asample"),
            ("POST", "/api/v1/create_model"),
            ("POST", "/platoon/v1/sample_stream"),
        ]
        answers = keyless(url, routes)
        report.check(
            "no key: every Tinker route, checkpoint listing and deletion, is 401",
            set(answers) == {401},
            str(answers),
        )
        listed = http.get(f"/api/v1/training_runs/{run}/checkpoints").json()["checkpoints"]
        report.check(
            "the checkpoint is still there", [c["checkpoint_id"] for c in listed] == ["weights/kept"]
        )

        loose = [
            f"{oct(stat.S_IMODE(p.stat().st_mode))} {p.relative_to(checkpoints)}"
            for p in checkpoints.rglob("*")
            if stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)
        ]
        report.check("checkpoint files 0600 in 0700 folders under umask 000", not loose, "; ".join(loose[:3]))

        before = server.memory_mib("VmRSS")
        body = {
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
            "sampling_params": {"max_tokens": 2},
            "num_samples": 20_000_000,
            "base_model": model,
        }
        started = time.monotonic()
        answer = http.post("/api/v1/asample", json=body, timeout=120)
        took = time.monotonic() - started
        try:
            healthy = (
                httpx.get(f"{url}/api/v1/healthz", headers={"x-api-key": key}, timeout=1.0).status_code == 200
            )
        except httpx.TimeoutException:
            healthy = False
        grown = server.memory_mib("VmHWM") - before
        report.check(
            "asample num_samples=2e7 is a 400 naming the field, the server answering",
            answer.status_code == 400 and "num_samples" in answer.text and healthy and grown < 64,
            f"{answer.status_code} in {took:.2f} s, {len(answer.content)} bytes, peak memory +{grown:.0f} MiB",
        )
    finally:
        server.close()


def _result(http: httpx.Client, request_id: str) -> dict:
    while True:
        answer = http.post("/api/v1/retrieve_future", json={"request_id": request_id})
        if answer.status_code != 408:
            return answer.json()


def attack_env_server(report: Report) -> None:
    envs = HERE.parent / "envs"
    server = Served(
        ["env", "serve", "ors_sample_envs:GuessTheNumber", "--port", "0"],
        ready=r"^serving ",
        env={"PYTHONPATH": f"{envs}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    try:
        url = server.lines[-1].split(" on ")[1].strip()
        answers = keyless(url, [("GET", "/list_environments"), ("POST", "/create_session")])
        report.check("no key: the env server is 401", set(answers) == {401}, str(answers))
    finally:
        server.close()


def attack_viewer(report: Report, work: Path) -> None:
    runs = work / "runs"
    for i in range(20):
        (runs / "exp" / f"t{i}").mkdir(parents=True)
        (runs / "exp" / f"t{i}" / "metrics.jsonl").write_text('{"step": 1}\n')
    site = work / "site.yaml"
    site.write_text(f"runs: {runs}\ncache: {work / 'cache'}\n")
    viewer = Served(["view", "--host", "127.0.0.2"], ready=r"\?key=", env={"PLATOON_SITE": str(site)})
    try:
        address = next(line for line in viewer.lines if "?key=" in line).split(" at ")[1].split()[0]
        base, key = address.split("/?key=")
        report.check(
            "no key: the viewer is 401", set(keyless(base, [("GET", "/"), ("GET", "/api/runs")])) == {401}
        )
        http = httpx.Client(base_url=base, timeout=30)
        evil = http.get("/", headers={"host": "evil.example"}).status_code
        report.check("the viewer refuses a Host it is not reached by (DNS rebinding)", evil == 400, str(evil))
        http.cookies.set("platoon-view-key", key)
        started = time.monotonic()
        statuses = {http.get("/api/run", params={"run": f"nope-{i}"}).status_code for i in range(300)}
        took = time.monotonic() - started
        report.check(
            "300 unknown run ids are 404s, answered without a rescan", statuses == {404}, f"{took:.2f} s"
        )
    finally:
        viewer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a transformers model directory (default: a tiny random one)")
    args = parser.parse_args()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="platoon-attack-") as folder:
        work = Path(folder)
        os.environ["PLATOON_RUNTIME_DIR"] = str(work / "runtime")  # the servers' user: this script
        model = args.model
        if model is None:
            from platoon.testing.models import save_tiny_model

            model = str(save_tiny_model(work / "model", seed=0))
        for attack, attack_args in (
            (attack_tinker, (report, model, work)),
            (attack_env_server, (report,)),
            (attack_viewer, (report, work)),
        ):
            try:
                attack(*attack_args)  # type: ignore[operator]
            except (AssertionError, StopIteration, ValueError, IndexError) as exc:  # a server not as expected
                report.check(f"{attack.__name__}: ran to its end", False, str(exc)[-300:])
    print(f"{len(report.failed)} attack(s) got through" if report.failed else "every attack was refused")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
