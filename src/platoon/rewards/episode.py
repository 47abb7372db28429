"""What reward rules and judges read: one finished episode, as the bus saw it.

`EpisodeRecorder` folds the events of episodes in flight (their model calls, tool calls and
tool results) into `Episode`s; the grader hands one to the rules when the episode finishes.
The per-turn rewards credit assignment uses come from the same record: each reward a tool
result carries is added to the model call of the same agent that came before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from platoon.bus.events import (
    EpisodeAbandoned,
    EpisodeFinished,
    EpisodeStarted,
    Event,
    ModelCallFinished,
    TaskRef,
    ToolCalled,
    ToolReturned,
)

__all__ = ["Episode", "EpisodeRecorder", "Reply", "ToolUse"]


@dataclass
class Reply:
    """One model call of an agent: its decoded text and how many tokens it sampled."""

    agent_id: str
    text: str
    tokens: int


@dataclass
class ToolUse:
    """One tool call of an agent and its result."""

    agent_id: str
    name: str
    arguments: dict[str, Any]
    output: str = ""
    reward: float | None = None
    after: int = 0  # how many replies of the episode came before it


@dataclass
class Episode:
    """A finished episode: the task, the root agent's final answer, every reply and tool use.

    `env_reward` is the environment's grade (after the entry's reward processor), None where
    the environment gave none; `task_spec` is the task's spec when a rule asked for it.
    """

    episode_id: str
    group_id: str
    task: TaskRef
    instruction: str = ""
    root_agent_id: str = ""
    final_answer: str | None = None
    status: str = "completed"
    replies: list[Reply] = field(default_factory=list)
    tools: list[ToolUse] = field(default_factory=list)
    turn_rewards: dict[str, list[float]] = field(default_factory=dict)
    env_reward: float | None = None
    env_rewards: dict[str, float] = field(default_factory=dict)
    task_spec: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # sandbox files a judge asked for

    @property
    def sampled_tokens(self) -> int:
        return sum(reply.tokens for reply in self.replies)

    def root_replies(self) -> list[str]:
        return [r.text for r in self.replies if r.agent_id == self.root_agent_id]

    def root_turns(self) -> int:
        return sum(1 for r in self.replies if r.agent_id == self.root_agent_id)

    def until_turn(self, turn: int) -> Episode:
        """The episode as it stood at the root agent's reply `turn` (0-based): the replies and
        tool uses up to it, that reply as the final answer."""
        seen, end = -1, len(self.replies)
        for i, reply in enumerate(self.replies):
            if reply.agent_id == self.root_agent_id:
                seen += 1
                if seen == turn:
                    end = i + 1
                    break
        replies = self.replies[:end]
        return Episode(
            episode_id=self.episode_id,
            group_id=self.group_id,
            task=self.task,
            instruction=self.instruction,
            root_agent_id=self.root_agent_id,
            final_answer=replies[-1].text if replies else None,
            status=self.status,
            replies=replies,
            tools=[t for t in self.tools if t.after <= end - 1],
            env_reward=self.env_reward,
            env_rewards=dict(self.env_rewards),
            task_spec=dict(self.task_spec),
            files=dict(self.files),
        )

    def transcript(self, limit: int = 20_000) -> str:
        """The episode as text, in order: the task, each reply, each tool call and its result."""
        lines = [f"TASK: {self.instruction}"]
        events: list[tuple[float, str]] = []
        for i, reply in enumerate(self.replies):
            events.append((i, f"ASSISTANT ({_short(reply.agent_id)}): {reply.text}"))
        for tool in self.tools:
            result = f" -> {tool.output}" if tool.output else ""
            events.append((tool.after - 0.5, f"TOOL {tool.name}({_args(tool.arguments)}){result}"))
        lines += [text for _, text in sorted(events, key=lambda item: item[0])]
        if self.final_answer is not None:
            lines.append(f"FINAL ANSWER: {self.final_answer}")
        text = "\n".join(lines)
        return text if len(text) <= limit else text[: limit // 2] + "\n[...]\n" + text[-limit // 2 :]


def _short(agent_id: str) -> str:
    return agent_id[:8]


def _args(arguments: dict[str, Any]) -> str:
    import json

    try:
        return json.dumps(arguments, ensure_ascii=False)[:2000]
    except (TypeError, ValueError):
        return repr(arguments)[:2000]


class EpisodeRecorder:
    """Folds the events of episodes in flight into `Episode`s (fed every event, in order)."""

    def __init__(self) -> None:
        self.episodes: dict[str, Episode] = {}
        self._calls: dict[str, tuple[str, ToolUse]] = {}  # request id -> (episode id, its tool use)

    def see(self, event: Event) -> None:
        match event:
            case EpisodeStarted():
                self.episodes[event.episode_id] = Episode(
                    episode_id=event.episode_id,
                    group_id=event.group_id,
                    task=event.task,
                    instruction=event.instruction,
                    root_agent_id=event.root_agent_id,
                )
            case ModelCallFinished() if event.kind != "judge" and event.episode_id in self.episodes:
                episode = self.episodes[event.episode_id]
                episode.replies.append(
                    Reply(event.agent_id, event.completion_text, len(event.completion_tokens))
                )
                episode.turn_rewards.setdefault(event.agent_id, []).append(0.0)
            case ToolCalled() if event.episode_id in self.episodes:
                episode = self.episodes[event.episode_id]
                use = ToolUse(event.agent_id, event.name, dict(event.arguments), after=len(episode.replies))
                episode.tools.append(use)
                self._calls[event.request_id] = (event.episode_id, use)
            case ToolReturned() if event.episode_id in self.episodes:
                opened = self._calls.pop(event.reply_to, None)
                if opened is not None:
                    opened[1].output, opened[1].reward = event.output, event.reward
                turns = self.episodes[event.episode_id].turn_rewards.get(event.agent_id)
                if event.reward is not None and turns:
                    turns[-1] += float(event.reward)
            case EpisodeAbandoned():  # re-requested elsewhere: its finish will not come here
                self.episodes.pop(event.episode_id, None)
            case _:
                pass

    def pop(self, finished: EpisodeFinished) -> Episode:
        """The episode's record, completed with how it finished; forgotten here."""
        episode = self.episodes.pop(finished.episode_id, None) or Episode(
            episode_id=finished.episode_id, group_id=finished.group_id, task=finished.task
        )
        for request_id in [r for r, (e, _) in self._calls.items() if e == finished.episode_id]:
            del self._calls[request_id]
        episode.final_answer = finished.final_message
        episode.status = finished.status
        episode.root_agent_id = episode.root_agent_id or finished.root_agent_id
        return episode
