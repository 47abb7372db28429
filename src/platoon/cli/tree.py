"""An episode's events printed as its agent tree (`platoon rollout`)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from platoon.bus.events import (
    AgentFinished,
    AgentSpawned,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeStarted,
    Event,
    ModelCallFinished,
    ToolCalled,
    ToolReturned,
)

__all__ = ["render_tree"]


def _clip(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_tree(events: Sequence[Event]) -> str:
    """Each agent with its model calls, tool calls and results, and its children where they
    were spawned (after the `spawn_subagent` call that made them), then the grade."""
    agents: dict[str, AgentSpawned] = {}
    items: defaultdict[str, list[str | _Child]] = defaultdict(list)
    calls: Counter[str] = Counter()
    ends: dict[str, AgentFinished] = {}
    header: list[str] = []
    footer: list[str] = []
    for event in events:
        match event:
            case EpisodeStarted():
                t = event.task
                header.append(f"episode {event.episode_id[:8]}  task {t.env} {t.split}:{t.task_id}")
            case AgentSpawned():
                agents[event.agent_id] = event
                items[event.parent_id or ""].append(_Child(event.agent_id))
            case ModelCallFinished():
                calls[event.agent_id] += 1
                text = f"  {_clip(event.completion_text)!r}" if event.completion_text else ""
                items[event.agent_id].append(
                    f"model call {calls[event.agent_id]}: {len(event.prompt_tokens)} prompt + "
                    f"{len(event.completion_tokens)} completion tokens ({event.kind}, {event.stop_reason}, "
                    f"policy v{event.policy_version}){text}"
                )
            case ToolCalled():
                args = _clip(json.dumps(event.arguments, ensure_ascii=False), 80)
                items[event.agent_id].append(f"tool {event.name}({args})")
            case ToolReturned():
                result = f"error: {event.error}" if event.error else _clip(event.output)
                extra = "".join(
                    [
                        f" reward={event.reward:g}" if event.reward is not None else "",
                        " finished" if event.finished else "",
                    ]
                )
                items[event.agent_id].append(f"  -> {result}{extra}")
            case AgentFinished():
                ends[event.agent_id] = event
            case EpisodeFinished():
                why = f" ({event.reason})" if event.reason else ""
                total = sum(calls.values())
                by = (
                    f" ({len(calls)} agents; the root made {calls[event.root_agent_id]})"
                    if len(calls) > 1
                    else ""
                )
                footer.append(
                    f"finished: {event.status}{why} after {total} model calls{by}, {event.duration_s:.2f} s"
                )
            case EpisodeGraded():
                if event.reward is None:
                    footer.append(f"not graded: {event.reason}")
                else:
                    parts = {k: v for k, v in event.rewards.items() if k != "reward"}
                    footer.append(f"reward: {event.reward:g}" + (f"  {parts}" if parts else ""))

    out = list(header)

    def walk(agent_id: str, prefix: str, last: bool) -> None:
        spawned = agents[agent_id]
        branch = "└─ " if last else "├─ "
        played = f" policy {spawned.policy}" if spawned.policy != "default" else ""
        out.append(
            f"{prefix}{branch}agent {agent_id[:8]} depth {spawned.depth} harness {spawned.harness}{played}"
        )
        inner = prefix + ("   " if last else "│  ")
        if spawned.depth > 0:
            out.append(f"{inner}instruction: {_clip(spawned.instruction)}")
        block: list[str | _Child] = list(items[agent_id])
        end = ends.get(agent_id)
        if end is not None:
            why = f" ({end.reason})" if end.reason else ""
            final = f": {_clip(end.final_message)}" if end.final_message else ""
            own = f"  [own reward {end.reward:g}]" if end.reward is not None else ""
            block.append(f"{end.status}{why}{final}{own}")
        for i, item in enumerate(block):
            if isinstance(item, _Child):
                walk(item.agent_id, inner, i == len(block) - 1)
            else:
                out.append(f"{inner}{item}")

    roots = [item for item in items[""] if isinstance(item, _Child)]
    for i, root in enumerate(roots):
        walk(root.agent_id, "", i == len(roots) - 1)
    out += footer
    return "\n".join(out) + "\n"


class _Child(NamedTuple):
    """Where a subagent was spawned among its parent's lines."""

    agent_id: str
