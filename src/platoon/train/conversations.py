"""Conversations recorded elsewhere, for `platoon sft --from FILE.jsonl`: OpenAI-format chats
(messages with tool calls, as agents and other frameworks export them) made into recorded
episodes by rendering them with the policy's own renderer.

Unlike a platoon run's episodes, these tokens are a rendering: the text of each assistant
message put through the policy's chat template, not the token ids a sampler produced. They are
what the policy would have had to sample to say that text, and the prompts are rendered as the
gateway renders them, so each assistant turn is spliced into the next prompt token for token
(`Renderer.render(..., completions=...)`) and a conversation merges into one datum as a run's
episode does.

One conversation a line: `{"messages": [...], "tools": [...], "reward": 1.0, "split": "train"}`
(`tools`, `reward`, `split`, `env` and `id` optional; a bare list of messages is a line too).
Every assistant message trains unless it says `"weight": 0` (OpenAI's fine-tuning format);
system, user and tool messages are prompt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from platoon.credit import Call
from platoon.gateway.renderers import Renderer, RendererError
from platoon.gateway.shapes import Message, Tool
from platoon.train.recorded import RecordedAgent, RecordedEpisode, RecordedError, RecordedRun

__all__ = ["is_conversations", "read_conversations", "rendered_calls"]


def is_conversations(source: str | Path) -> bool:
    """Whether `--from` names a conversations file rather than a run directory."""
    path = Path(source)
    return path.is_file() and path.suffix in (".jsonl", ".json")


def read_conversations(
    source: str | Path, renderer: Renderer, tokenizer: dict[str, str], *, policy: str = "default"
) -> RecordedRun:
    """The conversations of a JSONL file as recorded episodes of one agent (role "root"),
    rendered with `renderer`; `tokenizer` is its identity, the one the tokens are in."""
    path = Path(source)
    episodes = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordedError(f"{where}: not JSON ({exc.msg})") from None
        if isinstance(row, list):
            row = {"messages": row}
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise RecordedError(
                f'{where}: a line is {{"messages": [...]}} (OpenAI chat format) or a list of messages'
            )
        reward = row.get("reward")
        if reward is not None and not isinstance(reward, int | float):
            raise RecordedError(f"{where}: reward must be a number")
        try:
            calls = rendered_calls(row["messages"], row.get("tools"), renderer)
        except RendererError as exc:
            raise RecordedError(f"{where}: {exc}") from None
        episode_id = str(row.get("id", f"{path.name}:{number}"))
        episodes.append(
            RecordedEpisode(
                episode_id=episode_id,
                source=str(path),
                purpose="",
                env=str(row.get("env", "")),
                split=str(row.get("split", "")),
                task_id=episode_id,
                status="completed",
                reward=None if reward is None else float(reward),
                agents={"root": RecordedAgent("root", role="root", policy=policy, calls=calls)},
            )
        )
    return RecordedRun(str(path), [e for e in episodes if e.calls], {"": tokenizer, policy: tokenizer})


def rendered_calls(
    messages: Sequence[Message], tools: Sequence[Tool] | None, renderer: Renderer
) -> list[Call]:
    """One call per trained assistant message: the prompt before it as the gateway renders it
    (earlier assistant turns spliced in as their tokens), and its own tokens as a completion
    (the turn's tokens without the header that opens it and what follows its end)."""
    calls: list[Call] = []
    spliced: dict[int, list[int]] = {}
    opening = renderer.generation_prompt()
    stop = renderer.stop_token_ids[:1]
    after = renderer.completion_segment(stop)[len(opening) + 1 :] if stop else []  # between turns
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        segments = renderer.render_segments(messages[: index + 1], tools, add_generation_prompt=False)
        [turn] = [s.tokens for s in segments if s.message == index]
        if turn[: len(opening)] != opening or (after and turn[-len(after) :] != after):
            raise RendererError(
                f"messages.{index}: the {renderer.name} turn does not split into header and body"
            )
        completion = turn[len(opening) : len(turn) - len(after)]
        spliced[index] = completion
        if message.get("weight", 1) == 0:
            continue  # shown, never trained (OpenAI's per-message weight)
        prompt = renderer.render(
            messages[:index], tools, completions={i: t for i, t in spliced.items() if i < index}
        )
        calls.append(
            Call(prompt_tokens=prompt, completion_tokens=completion, logprobs=[0.0] * len(completion))
        )
    return calls
