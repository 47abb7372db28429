"""The episode runner: turns each `EpisodeRequested` into one played episode.

For every request whose environment it serves, the runner opens the root agent's env
session and its gateway key, runs the entry's episode program (by default the single-agent
program: the harness plays the task) within the budget and the wall-clock timeout, and
publishes `EpisodeFinished` with a status that says how it ended:

* `completed`: the harness returned;
* `limit`: the budget of model calls or tokens (or the context window) ran out;
* `timeout`: the episode's wall-clock limit passed;
* `error`: the harness raised, or the env session could not be opened (`reason` says why);
* `cancelled`: the run was shut down mid-episode.

A failing episode never takes the runner down, and its env sessions are closed by the env
service once the episode is graded.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import (
    AgentFinished,
    AgentOpened,
    AgentOpenRequested,
    AgentProcessExited,
    AgentProcessRequested,
    AgentSpawned,
    ChatReplied,
    ChatRequested,
    EpisodeFinished,
    EpisodeRequested,
    EpisodeStarted,
    Graded,
    GradeRequested,
    ModelCallFailed,
    ModelCallFinished,
    SessionOpened,
    SessionOpenRequested,
    StepRequested,
    StepStarted,
    ToolCalled,
    ToolReturned,
    new_id,
)
from platoon.config.policies import DEFAULT_POLICY, ROOT_ROLE
from platoon.harness import AgentContext, AgentResult, Budget, BudgetExhausted, choose_harness, get_harness
from platoon.harness.registry import validate_options
from platoon.programs.agents import AgentOpenError, chosen_policy, open_agent, spawned
from platoon.programs.registry import Episode, get_program, validate_program_options

__all__ = ["EntrySettings", "EpisodeRunner"]

log = structlog.get_logger("platoon.runner")


@dataclass
class EntrySettings:
    """What the runner needs to know about one environment entry of the config."""

    name: str
    harness: str | Mapping[str, float]
    harness_options: dict[str, Any] = field(default_factory=dict)
    program: str = "single"
    program_options: dict[str, Any] = field(default_factory=dict)
    max_steps: int | None = 20
    max_tokens: int | None = None
    timeout: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    agents: Any = None
    path: str = "environments"
    default_policy: str = DEFAULT_POLICY  # the policy of agents that `agents.policy` does not choose


def checked_entry(entry: EntrySettings) -> tuple[dict[str, object], object]:
    """Resolve every harness an entry may pick and validate its options and its program's:
    (each harness's options by name, the program's options). Raises on a name or an option
    that is wrong, so a run can say so before it opens anything."""
    names = [entry.harness] if isinstance(entry.harness, str) else list(entry.harness)
    # A mixture may give each harness its own options: `harness_options: {name: {...}}`.
    per_harness = len(names) > 1 and bool(entry.harness_options) and set(entry.harness_options) <= set(names)
    options: dict[str, object] = {}
    for name in names:
        harness = get_harness(name)
        given = entry.harness_options.get(name, {}) if per_harness else entry.harness_options
        path = f"{entry.path}.harness_options" + (f".{name}" if per_harness else "")
        options[name] = validate_options(harness, given, path)
    program = validate_program_options(entry.program, entry.program_options, f"{entry.path}.program_options")
    return options, program


class EpisodeRunner(ComponentBase):
    """The runner component. `entries` are the environment entries it plays."""

    name = "episode-runner"
    # With what its programs and harnesses send while they play: chats, tool calls (and the
    # recursive program's own spawn tool), command-line agents' processes, subagents' grades;
    # a command-line harness counts its agent's model calls.
    subscribes = (
        EpisodeRequested,
        SessionOpened,
        AgentOpened,
        ChatReplied,
        ToolReturned,
        AgentProcessExited,
        Graded,
        ModelCallFinished,
        StepStarted,
        ModelCallFailed,
    )
    publishes = (
        SessionOpenRequested,
        AgentOpenRequested,
        EpisodeStarted,
        AgentSpawned,
        ChatRequested,
        ToolCalled,
        ToolReturned,
        AgentProcessRequested,
        GradeRequested,
        StepRequested,
        AgentFinished,
        EpisodeFinished,
    )

    def __init__(
        self,
        entries: list[EntrySettings],
        *,
        max_concurrent: int = 256,
        seed: int = 0,
        request_timeout: float | None = 600.0,
        worker: str = "",
    ) -> None:
        self.entries = {e.name: e for e in entries}
        self.limiter = anyio.CapacityLimiter(max_concurrent)
        self.seed = seed
        self.request_timeout = request_timeout
        self.worker = worker
        self.options: dict[tuple[str, str], Any] = {}
        self.program_options: dict[str, Any] = {}
        self._requests: Stream[EpisodeRequested] | None = None
        self._env_faults: dict[str, list[str]] = {}  # episodes being played -> the env's failures
        self._sampler_faults: dict[str, str] = {}  # episodes whose sampler failed -> the first failure
        self._stops: dict[str, anyio.CancelScope] = {}  # episodes being played -> what ends one early
        for entry in entries:
            options, self.program_options[entry.name] = checked_entry(entry)
            self.options.update({(entry.name, name): o for name, o in options.items()})

    def on_attach(self, bus: Bus) -> None:
        self._requests = bus.stream(EpisodeRequested, name="runner").open()
        bus.subscribe(ModelCallFailed, self._sampler_failed, name="runner:sampler-failures")

    def _sampler_failed(self, event: ModelCallFailed) -> None:
        """The policy's sampler failed one of an episode's calls: the episode is the system's
        failure, so it ends now and is never graded (`_finish`), whatever its harness does next."""
        stop = self._stops.get(event.episode_id)
        if stop is None:
            return  # not an episode this runner plays
        self._sampler_faults.setdefault(event.episode_id, event.error)
        stop.cancel()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._requests is not None
        async with anyio.create_task_group() as tg:
            with self._requests as requests:
                async for request in requests:
                    if request.task.env in self.entries:
                        await self.limiter.acquire_on_behalf_of(request.episode_id)
                        tg.start_soon(self._play, bus, request)

    async def _play(self, bus: Bus, request: EpisodeRequested) -> None:
        try:
            await self.play(bus, request)
        finally:
            self.limiter.release_on_behalf_of(request.episode_id)

    async def play(self, bus: Bus, request: EpisodeRequested) -> EpisodeFinished:
        """Play one episode and publish (and return) its `EpisodeFinished`.

        An episode in which the environment failed (a tool raised, timed out or answered
        garbage: `ToolReturned.env_fault`) ends as an error with that reason, whatever the
        agent did after: its grade would measure the environment, not the policy."""
        self._env_faults[request.episode_id] = []
        entry = self.entries[request.task.env]
        # A seeded episode draws its harness from its seed, so a rerun of the run plays the same ones.
        key = request.episode_id if request.seed is None else f"seed:{request.seed}"
        harness_name = request.harness or choose_harness(entry.harness, key, self.seed)
        agent_id = new_id()
        started = time.monotonic()
        deadline = started + entry.timeout if entry.timeout else None
        result = AgentResult("error", reason="the episode did not start")
        calls = 0
        # The environment failing under the agent ends the episode here, at once (`_finish` says why).
        ended_by_env = self._stops[request.episode_id] = anyio.CancelScope()
        try:
            with (
                anyio.fail_after(entry.timeout) if entry.timeout else contextlib.nullcontext(),
                ended_by_env,
            ):
                ctx = await self._open_root(bus, request, entry, harness_name, agent_id, deadline)
                ctx.on_env_fault = ended_by_env.cancel
                episode = Episode(
                    bus=bus,
                    request=request,
                    entry=entry,
                    harness=get_harness(harness_name),
                    root=ctx,
                    options=self.program_options[entry.name],
                )
                try:
                    result = await get_program(entry.program)(episode)
                finally:
                    calls = ctx.budget.used
            if ended_by_env.cancelled_caught and request.episode_id not in self._sampler_faults:
                faults = self._env_faults.get(request.episode_id) or ["a tool failed"]
                result = AgentResult("error", reason=f"the environment failed: {faults[0]}")
        except TimeoutError:
            result = AgentResult("timeout", reason=f"the episode passed its {entry.timeout} s timeout")
        except BudgetExhausted as exc:
            result = AgentResult("limit", reason=str(exc))
        except anyio.get_cancelled_exc_class():
            result = AgentResult("error", reason="cancelled")
            with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                await self._finish(bus, request, agent_id, result, calls, started, cancelled=True)
            raise
        except AgentOpenError as exc:
            result = AgentResult("error", reason=str(exc))
        except Exception as exc:
            log.info("harness raised", episode=request.episode_id, error=f"{type(exc).__name__}: {exc}")
            result = AgentResult("error", reason=f"the harness raised {type(exc).__name__}: {exc}")
        return await self._finish(bus, request, agent_id, result, calls, started)

    async def _open_root(
        self,
        bus: Bus,
        request: EpisodeRequested,
        entry: EntrySettings,
        harness_name: str,
        agent_id: str,
        deadline: float | None,
    ) -> AgentContext:
        policy = chosen_policy(
            getattr(entry.agents, "policy", None),
            depth=0,
            harness=harness_name,
            role=ROOT_ROLE,
            default=entry.default_policy,
        )
        agent = AgentOpenRequested(
            episode_id=request.episode_id,
            agent_id=agent_id,
            depth=0,
            budget_id=request.episode_id,
            max_model_calls=entry.max_steps,
            max_tokens=entry.max_tokens,
            params=entry.params,
            policy_version=request.policy_versions.get(policy, request.policy_version),
            policy=policy,
            role=ROOT_ROLE,
            seed=request.seed,
            checks_tool_calls=getattr(get_harness(harness_name), "checks_tool_calls", False),
        )
        session = SessionOpenRequested(episode_id=request.episode_id, agent_id=agent_id, task=request.task)
        opened, key = await open_agent(bus, session, agent, timeout=self.request_timeout)
        await bus.publish(
            EpisodeStarted(
                episode_id=request.episode_id,
                group_id=request.group_id,
                task=request.task,
                root_agent_id=agent_id,
                instruction=opened.instruction,
                worker=self.worker,
            )
        )
        await bus.publish(spawned(agent, harness=harness_name, instruction=opened.instruction))
        return AgentContext(
            bus=bus,
            task=request.task,
            episode_id=request.episode_id,
            agent_id=agent_id,
            instruction=opened.instruction,
            tools=list(opened.tools),
            budget=Budget(entry.max_steps, deadline=deadline),
            options=self.options[entry.name, harness_name],
            gateway_url=key.base_url,
            api_key=key.key,
            request_timeout=self.request_timeout,
            env_faults=self._env_faults.setdefault(request.episode_id, []),
            steps=opened.steps,
        )

    async def _finish(
        self,
        bus: Bus,
        request: EpisodeRequested,
        agent_id: str,
        result: AgentResult,
        calls: int,
        started: float,
        *,
        cancelled: bool = False,
    ) -> EpisodeFinished:
        faults = self._env_faults.pop(request.episode_id, [])
        sampler = self._sampler_faults.pop(request.episode_id, None)
        self._stops.pop(request.episode_id, None)
        if sampler is not None and not cancelled:
            result = AgentResult("error", result.final_message, f"the policy's sampler failed: {sampler}")
        elif faults and result.status != "error" and not cancelled:
            result = AgentResult("error", result.final_message, f"the environment failed: {faults[0]}")
        status = "cancelled" if cancelled else result.status
        await bus.publish(
            AgentFinished(
                episode_id=request.episode_id,
                agent_id=agent_id,
                status=status,
                final_message=result.final_message,
                reason=result.reason,
            )
        )
        finished = EpisodeFinished(
            episode_id=request.episode_id,
            group_id=request.group_id,
            task=request.task,
            status=status,
            reason=result.reason,
            final_message=result.final_message,
            root_agent_id=agent_id,
            num_model_calls=calls,
            duration_s=time.monotonic() - started,
            purpose=request.purpose,
            step=request.step,
            policy_version=request.policy_version,
        )
        await bus.publish(finished)
        return finished
