"""An episode's events printed as its agent tree (`platoon rollout`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from platoon.bus.episodes import AgentLog, ChildTurn, EpisodeLog, ModelTurn, ToolTurn, fold_events
from platoon.bus.events import Event, ModelCallFinished, ToolCalled, ToolReturned

__all__ = ["render_tree"]


def _clip(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_tree(events: Sequence[Event]) -> str:
    """Each agent with its model calls, tool calls and results, and its children where they
    were spawned (after the `spawn_subagent` call that made them), then the grade."""
    out: list[str] = []
    for log in fold_events(events).values():
        if log.started is not None:
            t = log.started.event.task
            out.append(f"episode {log.episode_id[:8]}  task {t.env} {t.split}:{t.task_id}")
        roots = [a for a in log.agents.values() if a.spawned is not None and not a.parent_id]
        for i, root in enumerate(roots):
            _walk(log, root, "", i == len(roots) - 1, out)
        out += _footer(log)
    return "\n".join(out) + "\n"


def _walk(log: EpisodeLog, agent: AgentLog, prefix: str, last: bool, out: list[str]) -> None:
    """An agent's line, then its turns' lines in the order their events came, its children among
    them where they were spawned, and how it ended."""
    assert agent.spawned is not None  # only spawned agents are walked
    spawned = agent.spawned.event
    branch = "└─ " if last else "├─ "
    played = f" policy {spawned.policy}" if spawned.policy != "default" else ""
    out.append(
        f"{prefix}{branch}agent {agent.agent_id[:8]} depth {spawned.depth} harness {spawned.harness}{played}"
    )
    inner = prefix + ("   " if last else "│  ")
    if spawned.depth > 0:
        out.append(f"{inner}instruction: {_clip(spawned.instruction)}")
    block: list[str | AgentLog] = [line for _, line in sorted(_lines(log, agent), key=lambda at: at[0])]
    if agent.finished is not None:
        end = agent.finished.event
        why = f" ({end.reason})" if end.reason else ""
        final = f": {_clip(end.final_message)}" if end.final_message else ""
        own = f"  [own reward {end.reward:g}]" if end.reward is not None else ""
        block.append(f"{end.status}{why}{final}{own}")
    for i, item in enumerate(block):
        if isinstance(item, AgentLog):
            _walk(log, item, inner, i == len(block) - 1, out)
        else:
            out.append(f"{inner}{item}")


def _lines(log: EpisodeLog, agent: AgentLog) -> list[tuple[int, str | AgentLog]]:
    """Each line of the agent's turns at the place in the log of the event it shows."""
    lines: list[tuple[int, str | AgentLog]] = []
    numbers = {id(call): n for n, call in enumerate(agent.calls(), 1)}
    for turn in agent.turns:
        if isinstance(turn, ModelTurn) and turn.call is not None and turn.recorded_at is not None:
            lines.append((turn.recorded_at, _call_line(turn.call, numbers[id(turn.call)])))
        elif isinstance(turn, ToolTurn):
            if turn.request is not None:
                lines.append((turn.at, _tool_line(turn.request)))
            if turn.reply is not None and turn.replied_at is not None:
                lines.append((turn.replied_at, _result_line(turn.reply)))
        elif isinstance(turn, ChildTurn) and (child := log.agents[turn.agent_id]).spawned is not None:
            lines.append((turn.at, child))
    return lines


def _call_line(call: ModelCallFinished, number: int) -> str:
    text = f"  {_clip(call.completion_text)!r}" if call.completion_text else ""
    return (
        f"model call {number}: {len(call.prompt_tokens)} prompt + {len(call.completion_tokens)} completion "
        f"tokens ({call.kind}, {call.stop_reason}, policy v{call.policy_version}){text}"
    )


def _tool_line(called: ToolCalled) -> str:
    return f"tool {called.name}({_clip(json.dumps(called.arguments, ensure_ascii=False), 80)})"


def _result_line(returned: ToolReturned) -> str:
    result = f"error: {returned.error}" if returned.error else _clip(returned.output)
    reward = f" reward={returned.reward:g}" if returned.reward is not None else ""
    return f"  -> {result}{reward}{' finished' if returned.finished else ''}"


def _footer(log: EpisodeLog) -> list[str]:
    """How the episode finished, after how many model calls, and its grade."""
    footer = []
    if log.finished is not None:
        end = log.finished.event
        why = f" ({end.reason})" if end.reason else ""
        calls = {a.agent_id: len(a.calls()) for a in log.agents.values() if a.calls()}
        root = calls.get(end.root_agent_id, 0)
        by = f" ({len(calls)} agents; the root made {root})" if len(calls) > 1 else ""
        footer.append(
            f"finished: {end.status}{why} after {sum(calls.values())} model calls{by}, {end.duration_s:.2f} s"
        )
    for graded in log.grades:
        if graded.event.reward is None:
            footer.append(f"not graded: {graded.event.reason}")
        else:
            parts = {k: v for k, v in graded.event.rewards.items() if k != "reward"}
            footer.append(f"reward: {graded.event.reward:g}" + (f"  {parts}" if parts else ""))
    return footer
