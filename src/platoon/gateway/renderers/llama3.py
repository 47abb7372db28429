"""Llama 3.1 / 3.3 Instruct's chat format."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from platoon.gateway.renderers.base import (
    Renderer,
    RendererError,
    arguments_object,
    calls_of,
    flat_text,
    function_of,
    role_of,
    tojson,
)
from platoon.gateway.shapes import Message, Tool

__all__ = ["Llama3Renderer"]


class Llama3Renderer(Renderer):
    """Llama 3.1 / 3.3 Instruct, as their chat template renders it (tools in the first user turn,
    the template's fixed dates, tool results in `ipython` turns, one tool call per message;
    an assistant message with a tool call renders the call only, not its content)."""

    name = "llama3"
    default_tool_call_parser = "llama3"
    stop_token_names = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
    date_string: ClassVar[str] = "26 Jul 2024"

    def _generation_text(self) -> str:
        return "<|start_header_id|>assistant<|end_header_id|>\n\n"

    def _end_of_turn_text(self) -> str:
        return "<|eot_id|>"

    def _texts(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool
    ) -> list[tuple[int | None, str, str]]:
        out: list[tuple[int | None, str, str]] = []
        bos = self.tokenizer.bos_token or ""
        offset = 0
        system_message = ""
        if messages and messages[0]["role"] == "system":
            system_message = flat_text(messages[0].get("content"), "messages.0.content").strip()
            offset = 1
        system = "<|start_header_id|>system<|end_header_id|>\n\n"
        if tools:
            system += "Environment: ipython\n"
        system += f"Cutting Knowledge Date: December 2023\nToday Date: {self.date_string}\n\n"
        out.append((0 if offset else None, "system", bos + system + system_message + "<|eot_id|>"))
        if tools:
            if len(messages) == offset:
                raise RendererError("llama3 puts tools in the first user message, and there is none")
            first = flat_text(messages[offset].get("content"), f"messages.{offset}.content").strip()
            listed = "".join(tojson(tool, indent=4) + "\n\n" for tool in tools)
            out.append(
                (
                    offset,
                    "user",
                    "<|start_header_id|>user<|end_header_id|>\n\n"
                    "Given the following functions, please respond with a JSON for a function call "
                    "with its proper arguments that best answers the given prompt.\n\n"
                    'Respond in the format {"name": function name, "parameters": dictionary of argument '
                    "name and its value}.Do not use variables.\n\n" + listed + first + "<|eot_id|>",
                )
            )
            offset += 1
        for i in range(offset, len(messages)):
            message = messages[i]
            role = role_of(message)
            calls = calls_of(message)
            if role == "tool":
                content = message.get("content")
                # The template applies `tojson` to anything iterable, strings included.
                body = tojson(content) if isinstance(content, str | list | Mapping) else str(content)
                out.append((i, role, "<|start_header_id|>ipython<|end_header_id|>\n\n" + body + "<|eot_id|>"))
            elif calls:
                if len(calls) != 1:
                    raise RendererError(
                        f"messages.{i}.tool_calls: llama3 renders exactly one tool call per message"
                    )
                name, arguments = function_of(calls[0], f"messages.{i}.tool_calls.0")
                arguments = arguments_object(arguments, f"messages.{i}.tool_calls.0")
                call = '{"name": "' + name + '", "parameters": ' + tojson(arguments) + "}"
                out.append((i, role, self._generation_text() + call + "<|eot_id|>"))
            else:
                content = flat_text(message.get("content"), f"messages.{i}.content").strip()
                out.append((i, role, f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"))
        if add_generation_prompt:
            out.append((None, "assistant", self._generation_text()))
        return out
