"""Opening an agent, the one way a root agent (`EpisodeRunner`) and a subagent (`recursive`) are
opened: its policy chosen from the entry's `agents.policy`, its env session opened, then its key
at the gateway, each failure said in the words the episode records."""

from __future__ import annotations

from platoon.bus import Bus, NoResponder, RequestTimeout
from platoon.bus.events import (
    AgentOpened,
    AgentOpenRequested,
    AgentSpawned,
    SessionOpened,
    SessionOpenRequested,
)
from platoon.config.policies import PolicyChoiceError, choose_policy
from platoon.config.schema import PolicyChoice

__all__ = ["AgentOpenError", "chosen_policy", "open_agent", "spawned"]


class AgentOpenError(Exception):
    """An agent could not be opened; the message says why."""


def chosen_policy(
    choice: PolicyChoice | None, *, depth: int, harness: str, role: str | None, default: str
) -> str:
    """The policy that plays an agent, as the entry's `agents.policy` chooses it."""
    try:
        return choose_policy(choice, depth=depth, harness=harness, role=role, default=default)
    except PolicyChoiceError as exc:
        raise AgentOpenError(str(exc)) from None


async def open_agent(
    bus: Bus, session: SessionOpenRequested, agent: AgentOpenRequested, *, timeout: float | None
) -> tuple[SessionOpened, AgentOpened]:
    """Open the agent's env session, then its key at the gateway."""
    try:
        opened = await bus.request(session, timeout=timeout)
    except (NoResponder, RequestTimeout) as exc:
        raise AgentOpenError(f"no env session for {session.task.env!r}: {exc}") from None
    if opened.error is not None:
        raise AgentOpenError(f"the env session failed to open: {opened.error}")
    try:
        key = await bus.request(agent, timeout=timeout)
    except (NoResponder, RequestTimeout) as exc:
        raise AgentOpenError(f"the model gateway did not answer: {exc}") from None
    if key.error is not None:
        raise AgentOpenError(f"the model gateway refused the agent: {key.error}")
    return opened, key


def spawned(agent: AgentOpenRequested, *, harness: str, instruction: str) -> AgentSpawned:
    """The `AgentSpawned` of an agent opened as `agent` asked."""
    return AgentSpawned(
        episode_id=agent.episode_id,
        agent_id=agent.agent_id,
        parent_id=agent.parent_id,
        depth=agent.depth,
        harness=harness,
        instruction=instruction,
        policy=agent.policy,
    )
