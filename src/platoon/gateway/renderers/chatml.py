"""The ChatML family: every turn is `<|im_start|>ROLE\\nTEXT<|im_end|>\\n`, tools are listed in
Hermes form in the system turn and each tool call is a Hermes `<tool_call>` block.

`ChatMLRenderer` writes what the family shares; Qwen3 (with and without thinking) and SmolLM2
differ in where the tools go, how tool results are turned and what reasoning reads back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from platoon.gateway.memo import Texts
from platoon.gateway.renderers.base import (
    Renderer,
    RendererError,
    arguments_object,
    calls_of,
    check_messages,
    flat_text,
    function_at,
    message_text,
    reasoning_of,
    role_of,
    tojson,
)
from platoon.gateway.shapes import Message, Tool

__all__ = ["ChatMLRenderer", "Qwen3InstructRenderer", "Qwen3Renderer", "SmolLM2Renderer", "turn"]


def turn(role: str, text: str) -> str:
    """One whole ChatML turn."""
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


class ChatMLRenderer(Renderer):
    """What the ChatML formats share: their turns, stop tokens, Hermes tool list and tool calls.
    A subclass gives `_texts` (which turns a conversation makes)."""

    default_tool_call_parser = "hermes"
    stop_token_names = ("<|im_end|>", "<|endoftext|>")
    # A call's arguments given as text are checked to be JSON (a clear error, not a bad prompt);
    # a format that copies its template's `tool_call.arguments` as written does not.
    checks_arguments: ClassVar[bool] = True

    def _generation_text(self) -> str:
        return "<|im_start|>assistant\n"

    def _end_of_turn_text(self) -> str:
        return "<|im_end|>"

    def _after_turn_text(self) -> str:
        return "\n"

    @staticmethod
    def tools_text(tools: Sequence[Tool]) -> str:
        """The tool list as it is appended to the system message."""
        listed = "".join("\n" + tojson(tool) for tool in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
            f"{listed}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def _call_text(self, name: str, arguments: str) -> str:
        """One tool call (`arguments`: JSON text) as a Hermes block."""
        return '<tool_call>\n{"name": ' + tojson(name) + ', "arguments": ' + arguments + "}\n</tool_call>"

    def _calls_text(self, message: Message, i: int, content: str) -> str:
        """Assistant message `i`'s tool calls, each on a line of its own after `content`."""
        calls = calls_of(message)
        if not calls:
            return ""
        text = ""
        for n, call in enumerate(calls):
            name, arguments = function_at(call, i, n)
            rendered = arguments if isinstance(arguments, str) else tojson(arguments)
            if self.checks_arguments:
                arguments_object(rendered, f"messages.{i}.tool_calls.{n}")  # JSON, or a clear error
            if n > 0 or content:
                text += "\n"
            text += self._call_text(name, rendered)
        return text


class Qwen3Renderer(ChatMLRenderer):
    """Qwen3 (hybrid thinking) ChatML, as Qwen3's own chat template renders it.

    Assistant turns after the latest user query keep their reasoning in `<think>` blocks (and
    the final assistant turn always gets one); earlier turns lose it, as in the template. Tool
    results become `<tool_response>` blocks in a user turn; consecutive results share one turn.
    """

    name = "qwen3"
    checks_arguments = False
    thinking: ClassVar[bool] = True
    reasoning_markers = ("<think>", "</think>")

    def _call_text(self, name: str, arguments: str) -> str:
        # The template writes the name between quotes as it is, not as JSON.
        return '<tool_call>\n{"name": "' + name + '", "arguments": ' + arguments + "}\n</tool_call>"

    def _last_query(self, messages: list[Message]) -> int:
        """The latest user message that is not tool results (the last message if there is none)."""
        for i in range(len(messages) - 1, -1, -1):
            if messages[i]["role"] == "user":
                content = message_text(messages[i], i)
                if not (content.startswith("<tool_response>") and content.endswith("</tool_response>")):
                    return i
        return len(messages) - 1

    def _assistant_body(
        self, i: int, message: Message, content: str, last_query: int, last: bool
    ) -> tuple[str, str]:
        """(text after the turn header, content without reasoning) of an assistant message."""
        if not self.thinking:
            return content, content
        given = reasoning_of(message)
        if isinstance(given, str):
            reasoning = given
        elif "</think>" in content:
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
        else:
            reasoning = ""
        if i > last_query and (last or reasoning):
            return "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n"), content
        return content, content

    def _context(self, messages: list[Message]) -> object:
        if not self.thinking:
            return None
        try:
            return self._last_query(messages)
        except RendererError:  # the full render names the message
            return None

    def _unchanged(self, before: object, after: object, same: int) -> int:
        # A tool result's chunk depends on whether the next message is one too (they share a
        # turn); with thinking, an assistant turn's on where the latest user query is.
        if before == after:
            return same - 1
        if not (isinstance(before, int) and isinstance(after, int)):
            return 0
        return min(same - 1, min(before, after) + 1)

    def _texts(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool
    ) -> list[tuple[int | None, str, str]]:
        return self._texts_from(messages, tools, add_generation_prompt, 0)

    def _texts_from(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool, start: int
    ) -> Texts:
        contents = [""] * start + [message_text(messages[i], i) for i in range(start, len(messages))]
        out: Texts = []
        first_is_system = bool(messages) and messages[0]["role"] == "system"
        if start == 0 and tools:
            system = contents[0] + "\n\n" if first_is_system else ""
            out.append(
                (
                    0 if first_is_system else None,
                    "system",
                    turn("system", system + self.tools_text(tools)),
                )
            )
        elif start == 0 and first_is_system:
            out.append((0, "system", turn("system", contents[0])))
        last_query = self._last_query(messages) if self.thinking else 0
        for i in range(start, len(messages)):
            message = messages[i]
            role, content = message["role"], contents[i]
            if role == "user" or (role == "system" and i > 0):
                out.append((i, role, turn(role, content)))
            elif role == "assistant":
                body, content = self._assistant_body(i, message, content, last_query, i == len(messages) - 1)
                out.append((i, role, turn(role, body + self._calls_text(message, i, content))))
            elif role == "tool":  # consecutive results share one user turn
                opens = i == 0 or messages[i - 1]["role"] != "tool"
                closes = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
                text = (
                    ("<|im_start|>user" if opens else "")
                    + "\n<tool_response>\n"
                    + content
                    + "\n</tool_response>"
                )
                out.append((i, role, text + ("<|im_end|>\n" if closes else "")))
        if add_generation_prompt:
            out.append((None, "assistant", self._generation_text()))
        return out

    def _split(self, text: str) -> tuple[str | None, str]:
        if "</think>" in text:
            reasoning = text.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            return reasoning, text.split("</think>")[-1].strip()
        if "<think>" in text:
            before, after = text.split("<think>", 1)
            return after.strip("\n"), before.strip()
        return None, text.strip()


class Qwen3InstructRenderer(Qwen3Renderer):
    """Qwen3 ChatML without thinking (Qwen3 Instruct-2507 style): no `<think>` blocks are written
    or read; reasoning fields on messages are ignored."""

    name = "qwen3_instruct"
    thinking = False
    _unchanged = Qwen3Renderer._unchanged  # its own: a subclass says itself that it may reuse chunks

    def _split(self, text: str) -> tuple[str | None, str]:
        return None, text.strip()


class SmolLM2Renderer(ChatMLRenderer):
    """SmolLM2 Instruct's ChatML, as its chat template renders it: every message is
    `<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`, and a conversation that does not open with a
    system message gets the template's default one.

    The template knows nothing of tools, so platoon writes them as plain text that the template
    then renders unchanged: the tool list goes at the end of the system message (the default one
    when there is none) in Hermes form, each tool call is appended to its assistant message's
    content as a `<tool_call>` block, and a tool result is a `tool` turn, as the template writes
    any role. `lowered_messages` gives those messages, so `apply_chat_template` on them is the
    reference these prompts match token for token.
    """

    name = "smollm2"
    default_system: ClassVar[str] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

    def lowered_messages(
        self, messages: Sequence[Message], tools: Sequence[Tool] | None = None
    ) -> list[dict[str, str]]:
        """The conversation as plain `{role, content}` messages, tools and tool calls written
        into the text as this renderer writes them (the default system message made explicit)."""
        check_messages(messages)
        out: list[dict[str, str]] = []
        for i, message in enumerate(messages):
            content = flat_text(message.get("content"), f"messages.{i}.content")
            out.append({"role": role_of(message), "content": content + self._calls_text(message, i, content)})
        if messages and messages[0]["role"] != "system":
            out.insert(0, {"role": "system", "content": self.default_system})
        if tools:
            if not out:
                raise RendererError("smollm2 writes tools into the system message, and there is no message")
            out[0]["content"] += "\n\n" + self.tools_text(tools)
        return out

    def _texts(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool
    ) -> list[tuple[int | None, str, str]]:
        lowered = self.lowered_messages(messages, tools)
        owners: list[int | None] = list(range(len(messages)))
        if messages and messages[0]["role"] != "system":
            owners.insert(0, None)  # the default system message belongs to no message
        out: list[tuple[int | None, str, str]] = [
            (owner, m["role"], turn(m["role"], m["content"]))
            for owner, m in zip(owners, lowered, strict=True)
        ]
        if add_generation_prompt:
            out.append((None, "assistant", self._generation_text()))
        return out
