"""The parts of a run that exist once per policy (RFC 0001): training services, checkpoint
stores, resume points, and the step that ends when every trained policy has stepped.

A run without `policies:` has one policy, "default", built by these same functions, so the
one-policy run is the several-policy run with one entry: its files stay where they always were
(`checkpoints.jsonl` in the run directory), its metrics keep their names.

Policies that share a training service share one client: two policies on the same base model
of the embedded backend are two LoRA adapters on one server (one copy of the base weights);
each policy of hosted Tinker or a self-hosted server talks to its own `tinker_base_url`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import PolicyStepFinished, TrainStepFinished
from platoon.config.policies import PolicySpec
from platoon.train.checkpoints import Checkpoint, CheckpointStore, ResumeError

__all__ = [
    "Service",
    "StepJoin",
    "policy_services",
    "policy_stores",
    "resolved_specs",
    "resume_points",
    "serving_policies",
]

log = structlog.get_logger("platoon.train")


@dataclass
class Service:
    """A Tinker service client and how the gateway reaches the same service."""

    client: Any
    base_url: str | None


def _service_key(spec: PolicySpec) -> tuple[str, str]:
    if spec.train.backend == "local":
        return ("local", spec.train.model_name)
    return ("tinker", spec.tinker_base_url or os.environ.get("TINKER_BASE_URL") or "")


@contextlib.asynccontextmanager
async def policy_services(
    specs: dict[str, PolicySpec], run_dir: Path | None
) -> AsyncIterator[dict[str, Service]]:
    """Each policy's training service, opened once per distinct service: the embedded one
    (`backend: local`, one server per base model, its checkpoints under `run_dir/tinker`, a
    second model's under `run_dir/tinker-<policy>`; without `run_dir`, in a temporary folder),
    a self-hosted server, or hosted Tinker."""
    import tinker

    from platoon.policy.tinker import closing

    async with contextlib.AsyncExitStack() as stack:
        opened: dict[tuple[str, str], Service] = {}
        out: dict[str, Service] = {}
        for name, spec in specs.items():
            key = _service_key(spec)
            if key not in opened:
                if key[0] == "local":
                    from platoon.backends.local import running_server_in_thread

                    where = (
                        None if run_dir is None else run_dir / ("tinker" if not opened else f"tinker-{name}")
                    )
                    base_url = await stack.enter_async_context(
                        running_server_in_thread(spec.train.model_name, checkpoint_dir=where)
                    )
                    client = tinker.ServiceClient(base_url=base_url, api_key="tml-local")
                else:
                    base_url = spec.tinker_base_url
                    client = _tinker_client(spec.tinker_base_url)
                await stack.enter_async_context(closing(client))
                opened[key] = Service(client, base_url)
            out[name] = opened[key]
        yield out


def resolved_specs(config: Any) -> dict[str, PolicySpec]:
    """The run's policies, each built-in model (the tiny one) resolved to its directory."""
    import msgspec

    from platoon import system
    from platoon.config.policies import resolve_policies

    specs = resolve_policies(config)
    for name, spec in specs.items():
        if spec.train.model_name == system.TINY_MODEL:
            model = system.resolve_model(system.TINY_MODEL, seed=spec.train.seed)
            specs[name] = msgspec.structs.replace(
                spec, train=msgspec.structs.replace(spec.train, model_name=model)
            )
    return specs


@contextlib.asynccontextmanager
async def serving_policies(config: Any, *, scripted: str | None = None) -> AsyncIterator[dict[str, Any]]:
    """What a gateway that plays (not trains) every policy of `config` serves, by name: each
    policy's renderer and its sampler (its base model, or a frozen policy's `model_path`), or
    the scripted policy `scripted` (`scripted:MODULE:ATTR`) for all of them."""
    from platoon import system
    from platoon.gateway import GatewayPolicy
    from platoon.policy.tinker import TinkerSamplerFactory

    specs = resolved_specs(config)
    tokenizers, renderers = {}, {}
    for name, spec in specs.items():
        try:
            tokenizers[name] = system.load_tokenizer(spec.train.tokenizer or spec.train.model_name)
        except system.SystemError:
            if scripted is None:
                raise
            tokenizers[name] = system.load_tokenizer(system.TOY_TOKENIZER)
        renderers[name], _ = system.make_renderer(
            spec.train.renderer_name, tokenizers[name], spec.train.tool_call_parser
        )
    if scripted is not None:
        yield {
            name: GatewayPolicy(
                renderers[name], system.policy_from_ref(scripted, tokenizers[name]), spec.frozen
            )
            for name, spec in specs.items()
        }
        return
    async with policy_services(specs, None) as services:
        yield {
            name: GatewayPolicy(
                renderers[name],
                TinkerSamplerFactory(
                    services[name].client, spec.train.model_name, model_path=spec.model_path
                ),
                frozen=spec.frozen,
                model_name=spec.train.model_name,
            )
            for name, spec in specs.items()
        }


def _tinker_client(base_url: str | None) -> Any:
    """A `tinker.ServiceClient` for `base_url`, else `$TINKER_BASE_URL`, else hosted Tinker."""
    import tinker

    from platoon.system import SystemError as AssemblyError

    base_url = base_url or os.environ.get("TINKER_BASE_URL")
    api_key = os.environ.get("TINKER_API_KEY")
    if base_url is None and not api_key:
        raise AssemblyError(
            "no training service: set TINKER_API_KEY for hosted Tinker, TINKER_BASE_URL or "
            "tinker_base_url for a self-hosted one, or backend=local for the embedded one"
        )
    return tinker.ServiceClient(base_url=base_url, api_key=api_key or "tml-local")


def policy_stores(run_dir: Path, trained: Sequence[str], *, several: bool) -> dict[str, CheckpointStore]:
    """Where each trained policy records its checkpoints: the run directory for the one policy,
    `checkpoints/<policy>/` for each of several."""
    if not several:
        return {name: CheckpointStore(run_dir) for name in trained}
    return {name: CheckpointStore(run_dir / "checkpoints" / name) for name in trained}


def resume_points(stores: dict[str, CheckpointStore]) -> dict[str, list[Checkpoint]]:
    """Each policy's checkpoints a resume may start from, newest first, all at or before the
    newest step every policy saved (a run stopped between two policies' saves resumes from the
    step they all have). No policy starts from a checkpoint while another starts afresh."""
    found = {name: store.candidates() for name, store in stores.items()}
    if not all(found.values()):
        if any(found.values()):
            missing = sorted(name for name, candidates in found.items() if not candidates)
            raise ResumeError(
                f"policies {', '.join(missing)} have no checkpoint while others do; the run cannot "
                "resume all of them from one step"
            )
        return {name: [] for name in stores}
    common = min(candidates[0].step for candidates in found.values())
    return {name: [c for c in candidates if c.step <= common] for name, candidates in found.items()}


class StepJoin(ComponentBase):
    """Gathers each trained policy's `PolicyStepFinished` of a step into the step's one
    `TrainStepFinished`, so that the scheduler, metrics and progress see one step as ever."""

    name = "step-join"
    subscribes = (PolicyStepFinished,)
    publishes = (TrainStepFinished,)

    def __init__(self, policies: Sequence[str]) -> None:
        self.policies = tuple(policies)
        self.pending: dict[int, dict[str, dict[str, float]]] = {}
        self._events: Stream[PolicyStepFinished] | None = None

    def on_attach(self, bus: Bus) -> None:
        self._events = bus.stream(PolicyStepFinished, name=self.name).open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._events is not None
        with self._events as events:
            async for event in events:
                joined = self.add(event)
                if joined is not None:
                    await bus.publish(joined)

    def add(self, event: PolicyStepFinished) -> TrainStepFinished | None:
        """The step's `TrainStepFinished` once this was its last policy to finish, else None."""
        if event.policy not in self.policies:
            return None
        parts = self.pending.setdefault(event.step, {})
        parts[event.policy] = event.metrics
        if len(parts) < len(self.policies):
            return None
        del self.pending[event.step]
        metrics: dict[str, float] = {}
        for name in self.policies:
            metrics |= parts[name]
        return TrainStepFinished(step=event.step, metrics=metrics)
