"""`platoon nats init`: a NATS server config and per-role credentials for a distributed run.

Two roles, each a NATS user with its own random password:

* **trainer**: everything on the run's subjects and the JetStream API.
* **worker**: takes work only as a member of the queue group (so each episode, and the lease
  token that comes with it, reaches one worker), hears the trainer's announcements and the run's
  end, and publishes only results, its own status and answers to what it was sent (its claim
  of an offered episode, `allow_responses`). It cannot announce a policy, end the run, request
  episodes, or read the results stream.

The server enforces this, so what steers a run (policy announcements, the run's end, requests)
comes from the trainer, and results count only from the worker that holds the episode's lease
(see `platoon.bus.nats`). TLS is on when a certificate and key are given; the clients then use
`nats.tls` (and `tls://` URLs).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from platoon.bus.events import EpisodeRequested, PolicyAnnounced, RunFinished, WorkerStatus
from platoon.bus.nats import WORK_QUEUE, subject_for
from platoon.config.rundir import write_private
from platoon.train.distributed import RESULT_TYPES

__all__ = ["WORK_QUEUE", "NatsSetup", "write_nats_setup"]


@dataclass
class NatsSetup:
    """What `write_nats_setup` wrote."""

    server_config: Path
    trainer_credentials: Path
    worker_credentials: Path
    url: str


def _subjects(run: str) -> dict[str, list[str]]:

    def subject(event_type: type) -> str:
        return subject_for(run, event_type)

    stream = f"platoon-{run}"
    return {
        "worker_publish": [
            *(subject(t) for t in RESULT_TYPES),
            subject(WorkerStatus),
            f"$JS.API.STREAM.INFO.{stream}",
            f"$JS.API.STREAM.CREATE.{stream}",
            f"$JS.API.STREAM.MSG.GET.{stream}-state",  # the facts: policy and run end, nothing else
        ],
        "worker_subscribe": [
            subject(PolicyAnnounced),
            subject(RunFinished),
            subject(WorkerStatus),
            f"{subject(EpisodeRequested)} {WORK_QUEUE}",
            "_INBOX.>",
        ],
        "trainer": [f"platoon.{run}.>", "$JS.API.>", "$JS.ACK.>", "_INBOX.>"],
    }


def _quoted(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def write_nats_setup(
    directory: str | os.PathLike[str],
    *,
    run: str,
    host: str = "127.0.0.1",
    port: int = 4222,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> NatsSetup:
    """Write `nats-server.conf`, `trainer.json` and `worker.json` (all 0600) into `directory`.

    `run` scopes the permissions to one run's subjects and streams (the config's `nats.run`).
    """
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("TLS needs both a certificate and its key")
    if not run.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"run name {run!r} must be letters, digits, '-' or '_'")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    passwords = {role: secrets.token_urlsafe(24) for role in ("trainer", "worker")}
    subjects = _subjects(run)
    lines = [
        "# Written by `platoon nats init`: run it with  nats-server -c " + str(out / "nats-server.conf"),
        f"listen: {json.dumps(f'{host}:{port}')}",
        "max_payload: 8MB",
        "jetstream {",
        f"  store_dir: {json.dumps(str(out / 'jetstream'))}",
        "}",
    ]
    if tls_cert is not None:
        lines += [
            "tls {",
            f"  cert_file: {json.dumps(str(Path(tls_cert).resolve()))}",
            f"  key_file: {json.dumps(str(Path(tls_key).resolve()))}",  # type: ignore[arg-type]
            "}",
        ]
    lines += [
        "authorization {",
        "  users = [",
        f"    {{user: trainer, password: {json.dumps(passwords['trainer'])},",
        f"     permissions: {{publish: {_quoted(subjects['trainer'])}, "
        f"subscribe: {_quoted(subjects['trainer'])}}}}},",
        f"    {{user: worker, password: {json.dumps(passwords['worker'])},",
        f"     permissions: {{publish: {_quoted(subjects['worker_publish'])},",
        f"                   subscribe: {_quoted(subjects['worker_subscribe'])},",
        "                   allow_responses: true}}",
        "  ]",
        "}",
    ]
    config = out / "nats-server.conf"
    write_private(config, ("\n".join(lines) + "\n").encode())
    written = {}
    for role, password in passwords.items():
        path = out / f"{role}.json"
        write_private(path, (json.dumps({"user": role, "password": password}, indent=2) + "\n").encode())
        written[role] = path
    scheme = "tls" if tls_cert else "nats"
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # nosec B104 # names the address to show for a wildcard bind, binds nothing
    return NatsSetup(config, written["trainer"], written["worker"], f"{scheme}://{shown}:{port}")
