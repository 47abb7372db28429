"""Context compaction: an agent's history summarized once its prompt grows past a threshold.

`CompactingContext(ctx, CompactionOptions(compact_at_tokens=...))` is an `AgentContext` whose
`chat` takes the whole history from the harness, as always. Once the last call's prompt had
more than `compact_at_tokens` tokens, the next `chat` first asks the model to summarize the
conversation (an `aux` call: it trains, and it does not count against the budget), then sends
the leading system messages, the instruction with the summary, and only the messages that come
after the compaction. That prompt no longer extends the previous one, so prefix merging starts
a new datum there, and the summary call is a datum of its own (its prompt begins with a
system message of its own).

Any harness that talks through `ctx.chat` can be given one (the `compacting` program does it
for every episode); a harness that reaches the gateway over HTTP keeps its own context.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from platoon.harness.context import AgentContext, ChatReply

__all__ = ["CompactingContext", "CompactionError", "CompactionOptions"]

SUMMARIZER_SYSTEM = "You summarize an agent's work so that it can continue from the summary alone."
SUMMARY_PROMPT = (
    "Summarize the conversation so far for yourself: what the task is, what you did, what you "
    "found out, what state things are in, and what is left to do. Keep every detail you will "
    "need (names, numbers, results); leave out what you will not."
)
SUMMARY_HEADER = "Summary of your work so far (the earlier conversation was compacted):"


class CompactionError(ValueError):
    """Compaction options that cannot work."""


class CompactionOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """When and how to compact. `summary_max_tokens` bounds the summary call's completion."""

    compact_at_tokens: int
    summary_prompt: str = SUMMARY_PROMPT
    summary_max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.compact_at_tokens < 1:
            raise CompactionError(f"compact_at_tokens must be at least 1, got {self.compact_at_tokens}")
        if self.summary_max_tokens is not None and self.summary_max_tokens < 1:
            raise CompactionError(f"summary_max_tokens must be at least 1, got {self.summary_max_tokens}")


class CompactingContext(AgentContext):
    """An agent's context whose `chat` compacts the history (see the module docstring).

    It shares the wrapped context's state (budget, tools, spawner) instead of copying it, so
    whoever holds the wrapped context (the runner, the agent tree) sees the calls made here.
    """

    def __init__(self, inner: AgentContext, options: CompactionOptions) -> None:
        self.__dict__.update(inner.__dict__)
        self.compaction = options
        self.compactions = 0
        self.summary: str | None = None
        self._cut = 0  # how many of the harness's messages the summary stands for
        self._last_prompt_tokens = 0

    async def next_step(self) -> str | None:
        """A new step is a new conversation: its history has nothing to summarize yet."""
        instruction = await super().next_step()
        self.summary, self._cut, self._last_prompt_tokens = None, 0, 0
        return instruction

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        kind: Literal["policy", "aux", "judge"] = "policy",
        **params: Any,
    ) -> ChatReply:
        if kind != "policy":
            return await super().chat(messages, tools, kind=kind, **params)
        if len(messages) < self._cut:  # the harness started its history anew
            self.summary, self._cut = None, 0
        if self._last_prompt_tokens > self.compaction.compact_at_tokens and len(messages) > self._cut:
            await self._compact(messages)
        reply = await super().chat(self.view(messages), tools, **params)
        self._last_prompt_tokens = reply.prompt_tokens
        return reply

    def view(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What the model sees of the harness's `messages`: all of them until the first
        compaction, then the head with the summary and the messages after the last one."""
        if self.summary is None:
            return list(messages)
        system, instruction = _head(messages, self.instruction)
        text = f"{instruction}\n\n{SUMMARY_HEADER}\n{self.summary}"
        return [*system, {"role": "user", "content": text}, *messages[self._cut :]]

    async def _compact(self, messages: list[dict[str, Any]]) -> None:
        seen = self.view(messages)
        history = [m for m in seen if m.get("role") != "system"]
        request = [
            {"role": "system", "content": SUMMARIZER_SYSTEM},
            *history,
            {"role": "user", "content": self.compaction.summary_prompt},
        ]
        limit = self.compaction.summary_max_tokens
        params = {} if limit is None else {"max_tokens": limit}
        reply = await super().chat(request, None, kind="aux", **params)
        self.summary = reply.text.strip() or "(the summary came back empty)"
        self._cut = len(messages)
        self._last_prompt_tokens = 0
        self.compactions += 1


def _head(messages: list[dict[str, Any]], fallback: str) -> tuple[list[dict[str, Any]], str]:
    """The leading system messages and the instruction (the first user message's text)."""
    system = []
    for message in messages:
        if message.get("role") != "system":
            break
        system.append(message)
    rest = messages[len(system) :]
    if rest and rest[0].get("role") == "user" and isinstance(rest[0].get("content"), str):
        return system, rest[0]["content"]
    return system, fallback
