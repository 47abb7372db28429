"""`role_colon`: a chat format for base models, defined by its chunks (there is no template)."""

from __future__ import annotations

from collections.abc import Sequence

from platoon.gateway.renderers.base import Renderer, RendererError, flat_text, role_of
from platoon.gateway.shapes import Message, Tokenizer, Tool

__all__ = ["RoleColonRenderer"]


class RoleColonRenderer(Renderer):
    """`User: ...\\n\\nAssistant: ...\\n\\n` for base models (tinker-cookbook's role_colon).

    There is no template to match: a prompt is the concatenation of its chunks, after the BOS
    token if the tokenizer has one. Sampling stops at the string "\\n\\nUser:". No tools.
    """

    name = "role_colon"

    def __init__(self, tokenizer: Tokenizer, *, tool_call_parser: str | None = None) -> None:
        super().__init__(tokenizer, tool_call_parser=tool_call_parser)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_token_ids = [eos] if isinstance(eos, int) else []
        self.stop_strings = ["\n\nUser:"]

    def _generation_text(self) -> str:
        return "Assistant:"

    def _end_of_turn_text(self) -> str:
        return "\n\n"

    def completion_segment(self, completion: Sequence[int]) -> list[int]:
        """The sampled tokens (without a final EOS) closed by "\n\n" unless they end with it.

        Chunks here do not end at special tokens, so the caller should pass a completion cut
        before the stop string.
        """
        body = list(completion)
        if body and body[-1] in self.stop_token_ids:
            body = body[:-1]
        if not self.decode(body).endswith("\n\n"):
            body += self._encode("\n\n")
        return self.generation_prompt() + body

    def _texts(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool
    ) -> list[tuple[int | None, str, str]]:
        if tools:
            raise RendererError("role_colon cannot render tools")
        out: list[tuple[int | None, str, str]] = []
        bos = getattr(self.tokenizer, "bos_token", None)
        if bos:
            out.append((None, "bos", bos))
        for i, message in enumerate(messages):
            role = role_of(message)
            if role == "tool" or message.get("tool_calls"):
                raise RendererError(f"messages.{i}: role_colon cannot render tool calls or tool results")
            content = flat_text(message.get("content"), f"messages.{i}.content")
            out.append((i, role, f"{role.capitalize()}: {content}\n\n"))
        if add_generation_prompt:
            out.append((None, "assistant", self._generation_text()))
        return out
