"""A distributed run's wiring, from the config's `nats:` section: the bridges of the trainer and
its workers, the lease, and the identity a worker must share with its trainer (see
`platoon.train.distributed` for the components and why they work as they do).
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

import msgspec
import structlog

from platoon import __version__
from platoon.bus.events import (
    EpisodeAbandoned,
    EpisodeRequested,
    Event,
    PolicyAnnounced,
    RunFinished,
    WorkerStatus,
    event_types,
)
from platoon.config import Config, redact, to_builtins
from platoon.config.schema import NatsConfig
from platoon.serving import is_loopback
from platoon.train.distributed import (
    FACTS,
    LEASE_GRACE,
    LEASE_WITHOUT_TIMEOUT,
    RESULT_TYPES,
    TRAINER_DURABLE,
    DistributedError,
)

if TYPE_CHECKING:
    from platoon.bus.nats import ConnectionSettings, Leases, NatsBridge, Routes

log = structlog.get_logger("platoon.assembly")


@dataclass(frozen=True)
class NatsSettings:
    """A distributed run's, resolved from the config's `nats:` (and `--nats URL`): the bridges'
    server and run, the trainer's lease and announcements, a worker's name and timeouts, and the
    identity a worker must share with its trainer."""

    nats: NatsConfig  # the config's `nats:`, its url the one the run connects to
    run: str  # the run's subject token (`run_name`)
    lease: float
    max_attempts: int
    announce_every: float
    identity: dict[str, str]
    extra: tuple[type[Event], ...] = ()  # `nats.subjects`: more event types the bridges mirror
    authenticated: bool = False  # steering events come from the trainer alone (`authenticated`)
    worker: str | None = None  # a worker's name (None: host:pid)
    drain_timeout: float | None = None  # a worker's, over `nats.drain_timeout`


def nats_settings(
    config: Config, url: str | None = None, *, worker: str | None = None, drain_timeout: float | None = None
) -> NatsSettings:
    """A distributed run's settings from `config` and the server `url` asked for (over
    `nats.url`). Raises where there is no server, or the section asks what is not supported."""
    nats = _nats(config, url)
    return NatsSettings(
        nats=msgspec.structs.replace(nats, url=url) if url else nats,
        run=run_name(config),
        lease=lease_timeout(config),
        max_attempts=nats.max_attempts,
        announce_every=nats.announce_every,
        identity=worker_identity(config),
        extra=tuple(_extra_types(nats)),
        authenticated=authenticated(config),
        worker=worker,
        drain_timeout=drain_timeout,
    )


def run_name(config: Config) -> str:
    """The run's NATS subject token: `nats.run`, else the experiment (and trial) name.

    A worker must compute the same name from the same config, so the trial's start time
    (the default trial name) never takes part."""
    if config.nats is not None and config.nats.run:
        return config.nats.run
    parts = [config.stats.experiment_name, config.stats.trial_name or ""]
    return re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(p for p in parts if p)).strip("-") or "platoon"


def lease_timeout(config: Config) -> float:
    """`nats.lease_timeout`, else the rollout timeout plus 30 s, else 10 minutes."""
    if config.nats is not None and config.nats.lease_timeout is not None:
        return config.nats.lease_timeout
    if config.train is not None:
        timeout = config.train.workflow_config.rollout_config.timeout
        if timeout is not None:
            return timeout + LEASE_GRACE
    return LEASE_WITHOUT_TIMEOUT


def _nats(config: Config, url: str | None) -> NatsConfig:
    if config.nats is None and url is None:
        raise DistributedError("no NATS server: add a nats: section to the config or pass --nats URL")

    nats = config.nats or NatsConfig()
    if nats.subject_prefix != "platoon":
        raise DistributedError(
            f"nats.subject_prefix: the bridge sends on platoon.<run>.<event>; {nats.subject_prefix!r} "
            "is not supported (use nats.run to keep runs apart)"
        )
    return nats


def _extra_types(nats: NatsConfig) -> list[type[Event]]:
    by_name = {}
    for event_type in event_types():
        by_name[event_type.__name__] = event_type
        info = msgspec.inspect.type_info(event_type)
        assert isinstance(info, msgspec.inspect.StructType)
        by_name[str(info.tag)] = event_type
    extra = []
    for i, name in enumerate(nats.subjects):
        if name not in by_name:
            raise DistributedError(f"nats.subjects.{i}: no event type {name!r} is registered")
        extra.append(by_name[name])
    return extra


def _tls(nats: NatsConfig) -> ssl.SSLContext | None:
    if nats.tls is None:
        return None
    try:
        context = ssl.create_default_context(cafile=nats.tls.ca_file)
        if nats.tls.cert_file:
            context.load_cert_chain(nats.tls.cert_file, nats.tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise DistributedError(f"nats.tls: {exc}") from None
    return context


def bridge(
    settings: NatsSettings,
    *,
    open_server: Literal["warn", "refuse"],
    routes: Routes,
    leases: Leases | None = None,
    issue_leases: bool = False,
) -> NatsBridge:
    """A bridge to the run's NATS server that carries `routes`. `open_server`: what it does on a
    server that lets anyone in, unless `nats.insecure` allows that (a worker refuses: it obeys
    what it hears)."""
    nats = settings.nats
    _check_authenticated(nats, nats.url)
    from platoon.bus.nats import Limits, NatsBridge  # the nats extra: imported only by a distributed run

    with bridge_refusals():
        return NatsBridge(
            nats.url,
            run=settings.run,
            routes=routes,
            connection=connection_settings(nats, open_server=open_server),
            limits=Limits(offer_timeout=nats.offer_timeout),
            leases=leases,
            issue_leases=issue_leases,
        )


@contextmanager
def bridge_refusals() -> Iterator[None]:
    """A bridge's refusal of its settings (`NatsBridgeError`: a bad run name, an event type that
    cannot travel) said as the run's: `DistributedError`."""
    from platoon.bus.nats import NatsBridgeError  # the nats extra: imported only by a distributed run

    try:
        yield
    except NatsBridgeError as exc:
        raise DistributedError(str(exc)) from None


def connection_settings(nats: NatsConfig, *, open_server: Literal["warn", "refuse"]) -> ConnectionSettings:
    """How a bridge reaches the server of the config's `nats:`: its credentials, TLS and first
    connection's timeout, and whether it lets an open server be (`nats.insecure`)."""
    from platoon.bus.nats import ConnectionSettings  # the nats extra: imported only by a distributed run

    return ConnectionSettings(
        credentials=nats.credentials_file,
        tls=_tls(nats),
        connect_timeout=nats.connect_timeout,
        unauthenticated="allow" if nats.insecure else open_server,
    )


def _check_authenticated(nats: NatsConfig, url: str) -> None:
    """Beyond this machine, NATS without credentials lets anyone read the run and steer it."""

    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if nats.credentials_file or parts.password or nats.insecure or is_loopback(parts.hostname or ""):
        return
    raise DistributedError(
        f"nats.url {parts.hostname}:{parts.port or 4222} is beyond this machine and no credentials are "
        "given: anyone who reaches it could read every event and steer the run. Write a server config "
        "and per-role credentials with `platoon nats init`, then set nats.credentials_file (or, on a "
        "trusted isolated network only, nats.insecure: true)"
    )


def worker_identity(config: Config) -> dict[str, str]:
    """What must be the same on the trainer and its workers, for episodes to be the ones the
    trainer means: platoon's version, the environments (names, env versions, harnesses and their
    options, service options without secrets), the rollout settings, the model and renderer."""

    def digest(value: object) -> str:
        text = json.dumps(redact(value), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    train = config.train
    assert train is not None
    environments = []
    for entry in to_builtins(config)["environments"]:
        entry.pop("service", None)  # where the env server is may differ per machine
        entry.get("service_kwargs", {}).pop("secrets", None)
        environments.append(entry)
    identity = {
        "platoon": __version__,
        "environments": digest(environments),
        "rollout": digest(to_builtins(config)["train"]["workflow_config"]),
        "renderer": f"{train.renderer_name} ({train.tool_call_parser})",
        "lora_rank": str(train.lora_rank),
    }
    if config.policies:
        # How a worker turns each policy's calls into tokens. What it samples is announced, and
        # how a policy trains (its optimizer, load_path, kl) or where its service is are the
        # trainer's alone, so a worker's config need not repeat them.
        shaping = ("model_name", "tokenizer", "renderer_name", "tool_call_parser", "frozen")
        policies = {
            name: {k: v for k, v in policy.items() if k in shaping}
            for name, policy in to_builtins(config)["policies"].items()
        }
        identity["policies"] = digest(policies)
    return identity


def authenticated(config: Config) -> bool:
    """Whether the run's NATS connection is authenticated (steering events come from the trainer):
    credentials given, and no `nats.insecure` to let the worker on a server that asks for none."""
    return config.nats is not None and bool(config.nats.credentials_file) and not config.nats.insecure


def trainer_bridge(settings: NatsSettings) -> NatsBridge:
    """The trainer's bridge: work offered to the workers' queue group, their results taken
    durably (and counted only from the worker given the episode), the run's facts kept."""
    from platoon.bus.nats import Routes  # the nats extra: imported only by a distributed run

    with bridge_refusals():
        routes = Routes(
            mirror=[PolicyAnnounced, RunFinished, WorkerStatus, *settings.extra],
            work=[EpisodeRequested],
            durable=RESULT_TYPES,
            consume_durable=True,
            durable_name=TRAINER_DURABLE,
            state=FACTS,
            write_state=True,
            withdraw=[EpisodeAbandoned],  # a request the lease keeper gave up is offered no more
        )
    # results count only from the worker that was given the episode
    return bridge(settings, open_server="warn", routes=routes, issue_leases=True)
