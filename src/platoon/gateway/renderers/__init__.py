"""Renderers: OpenAI-style messages and tool schemas to prompt tokens, and sampled tokens back
to an assistant message.

A renderer reproduces a model's chat template in Python, so a prompt is built from token
chunks the gateway can reason about: `render_segments` gives one chunk per message (plus the
tools preamble and the generation prompt), each tokenized on its own. Chunks start and end at
special tokens, so their concatenation equals `tokenizer.apply_chat_template(...)` for the
chat formats here (`role_colon` has no template: it is defined by its chunks).

Token-exact history: `render(..., completions={i: tokens})` puts the tokens that were sampled
for assistant message `i` in place of its re-rendered text, so a conversation that grows
turn by turn gives prompts that extend each other token for token, even where re-tokenizing the
text would differ, or where the template rewrites old turns (Qwen3 drops the reasoning of
assistant turns before the latest user message; a spliced turn keeps exactly what was sampled).

Conventions (the same for every renderer):
- `content` may be a string, None, or a list of parts; text parts are joined with "\\n"
  (as vLLM and SGLang do), other part types raise `RendererError`.
- Reasoning is read from `reasoning_content`, `thinking` or `reasoning` (first not None), as
  transformers does.
- Tool call arguments may be JSON strings (OpenAI) or objects.
- `tools=[]` means no tools.

The package: `base` (the `Renderer` every format subclasses, and the registry), `chatml` (the
ChatML family: Qwen3, Qwen3 Instruct, SmolLM2), `llama3` and `role_colon`; each built-in format is
registered here under its name.
"""

# `_RENDERERS`, the registry, is here too: tests tell the built-in formats (this package's) from their own.
from platoon.gateway.renderers.base import _RENDERERS as _RENDERERS
from platoon.gateway.renderers.base import (
    ParsedMessage,
    Renderer,
    RendererError,
    Segment,
    UnknownRendererError,
    get_renderer,
    register_renderer,
    renderer_names,
)
from platoon.gateway.renderers.chatml import (
    ChatMLRenderer,
    Qwen3InstructRenderer,
    Qwen3Renderer,
    SmolLM2Renderer,
)
from platoon.gateway.renderers.llama3 import Llama3Renderer
from platoon.gateway.renderers.role_colon import RoleColonRenderer

__all__ = [
    "ChatMLRenderer",
    "Llama3Renderer",
    "ParsedMessage",
    "Qwen3InstructRenderer",
    "Qwen3Renderer",
    "Renderer",
    "RendererError",
    "RoleColonRenderer",
    "Segment",
    "SmolLM2Renderer",
    "UnknownRendererError",
    "get_renderer",
    "register_renderer",
    "renderer_names",
]

register_renderer("qwen3", Qwen3Renderer)
register_renderer("qwen3_instruct", Qwen3InstructRenderer)
register_renderer("llama3", Llama3Renderer)
register_renderer("role_colon", RoleColonRenderer)
register_renderer("smollm2", SmolLM2Renderer)
