"""How one call's reply is steered and read back: the client's stop sequences, tool choice,
parallel calls and output format taken out of its parameters (`take_controls`), the sampled tokens
parsed into an assistant message, cut at the first stop (`read_reply`), and what a reply that had
to be a tool call or JSON lacks (`unmet`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from platoon.gateway.errors import GatewayError
from platoon.gateway.renderers import ParsedMessage, Renderer
from platoon.gateway.shapes import Tool
from platoon.gateway.streaming import find_stop, tokens_through
from platoon.policy.base import SampledCompletion
from platoon.policy.constraints import DecodingConstraint, ToolSpec, json_reply_error

__all__ = ["Controls", "read_reply", "take_controls", "unmet"]


@dataclass
class Controls:
    """How one call's reply is steered and cut (see `Gateway.complete_stream`)."""

    stops: list[str]
    markers: list[str]
    plain: bool
    prefill: str = ""
    parse_tools: bool = True
    after_first_call: str | None = None
    # What the reply must be, for a sampler that constrains its decoding: the forced tool call
    # (with `prefill`), or the JSON of `json_format` ({"schema": SCHEMA or None}).
    constraint: DecodingConstraint | None = None
    json_format: Mapping[str, object] | None = None


def take_controls(
    params: dict[str, object],
    tools: Sequence[Tool] | None,
    renderer: Renderer,
    stream_markers: tuple[list[str], bool],
) -> Controls:
    """Take the reply controls (stop sequences, tool choice, parallel calls, output format) out
    of `params`."""
    stop = params.pop("stop", None)
    if isinstance(stop, str):
        stop = [stop]
    stops: list[str] = []
    if isinstance(stop, list) and stop and all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        params["stop"] = stop  # token ids replace the renderer's stop tokens at the sampler
    elif stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise GatewayError(
                "bad_request", "stop must be a non-empty string or a list of them", param="stop"
            )
        stops = list(stop)
    choice = params.pop("tool_choice", None) or "auto"
    parallel = params.pop("parallel_tool_calls", None)
    json_format = params.pop("response_format", None)
    markers, plain = stream_markers
    controls = Controls(stops=stops, markers=markers, plain=plain)
    if choice == "none" or (choice == "auto" and not tools):
        # No tools to call: tool-call markup is text, as a model without tools writes it.
        controls.parse_tools = False
        controls.markers = [m for m in markers if m not in _tool_markers(renderer)]
    elif choice == "required" or isinstance(choice, Mapping):
        name = choice.get("name") if isinstance(choice, Mapping) else None
        names = [_tool_name(t) for t in tools or ()]
        if not names:
            raise GatewayError(
                "bad_request",
                "tool_choice asks for a tool call but no tools are given",
                param="tool_choice",
            )
        if name is not None and name not in names:
            raise GatewayError(
                "bad_request",
                f"tool_choice names {name!r}, which is not among the tools",
                param="tool_choice",
            )
        prefill = renderer.tool_call_prefill(name)
        if prefill is None:
            raise GatewayError(
                "bad_request",
                f"tool_choice {choice!r} cannot be enforced with this renderer's tool call format",
                param="tool_choice",
            )
        controls.prefill = prefill
        controls.plain = False  # the reply is a tool call from its first token
        controls.constraint = _call_constraint(renderer, prefill, tools or (), name)
    elif choice != "auto":
        raise GatewayError(
            "bad_request",
            f"tool_choice {choice!r} is not auto, none, required or a tool",
            param="tool_choice",
        )
    if isinstance(json_format, Mapping) and not controls.prefill:
        # The reply is the JSON itself: tool-call markup in it is text, as with tool_choice none.
        controls.json_format = json_format
        schema = json_format.get("schema")
        controls.constraint = DecodingConstraint(schema=dict(schema) if isinstance(schema, Mapping) else None)
        controls.parse_tools = False
        controls.markers = [m for m in controls.markers if m not in _tool_markers(renderer)]
    if parallel is False and controls.parse_tools:
        controls.after_first_call = renderer.tool_call_end()
    return controls


def _call_constraint(
    renderer: Renderer, prefill: str, tools: Sequence[Tool], name: str | None
) -> DecodingConstraint | None:
    """The forced call as a decoding constraint: the call object after the markup's opening
    (part of it written by `prefill`), then its closing markup."""
    opening, end = renderer.tool_call_prefill(None), renderer.tool_call_end()
    if opening is None or end is None or not prefill.startswith(opening):
        return None
    specs = []
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        if name is None or function["name"] == name:
            parameters = function.get("parameters")
            specs.append(
                ToolSpec(function["name"], dict(parameters) if isinstance(parameters, Mapping) else None)
            )
    return DecodingConstraint(tools=specs, written=prefill[len(opening) :], after="\n" + end)


def unmet(controls: Controls, parsed: ParsedMessage, sampled: SampledCompletion) -> str | None:
    """Why a reply is not what it had to be (a tool call, JSON of a schema); None when it is, or
    when nothing was asked of it."""
    if controls.prefill and not parsed.tool_calls:
        if parsed.errors:
            return parsed.errors[-1]
        return "it ran out of max_tokens" if sampled.stop_reason == "length" else "it wrote no call"
    if controls.json_format is not None:
        schema = controls.json_format.get("schema")
        problem = json_reply_error(
            parsed.content or "", dict(schema) if isinstance(schema, Mapping) else None
        )
        if problem is not None and sampled.stop_reason == "length":
            return f"it ran out of max_tokens: {problem}"
        return problem
    return None


def read_reply(
    sampled: SampledCompletion,
    tools: Sequence[Tool] | None,
    controls: Controls,
    renderer: Renderer,
    *,
    check_arguments: bool = True,
) -> tuple[SampledCompletion, ParsedMessage, str | None]:
    """Parse a completion, cut at the first stop (what is after it was never the reply).
    Without `check_arguments` a call is taken whatever its name and arguments (its client checks)."""
    checked = (tools or None) if check_arguments else None
    tokens = list(sampled.tokens)
    stop_ids = set(renderer.stop_token_ids)
    stop_at = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
    body = tokens if stop_at is None else tokens[:stop_at]
    text = renderer.decode(body)
    stop = (
        find_stop(text, controls.stops, controls.after_first_call)
        if controls.stops or controls.after_first_call
        else None
    )
    if stop is None:
        parsed = renderer.parse_text(
            controls.prefill + text,
            checked,
            stopped=stop_at is not None,
            tool_calls=controls.parse_tools,
        )
        if sampled.stop_reason == "length":
            parsed.finish_reason = "length"
        return sampled, parsed, None
    keep = tokens_through(renderer.decode, body, stop.end)
    top = sampled.top_logprobs
    sampled = SampledCompletion(
        tokens=tokens[:keep],
        logprobs=list(sampled.logprobs[:keep]),
        stop_reason="stop",
        top_logprobs=None if top is None else top[:keep],
    )
    parsed = renderer.parse_text(
        controls.prefill + text[: stop.kept], checked, stopped=True, tool_calls=controls.parse_tools
    )
    if stop.sequence is not None:
        parsed.finish_reason = "stop"
    return sampled, parsed, stop.sequence


def _tool_name(tool: Tool) -> object:
    function = tool.get("function", tool) if isinstance(tool, Mapping) else None
    return function.get("name") if isinstance(function, Mapping) else None


def _tool_markers(renderer: Renderer) -> set[str]:
    parser = renderer.tool_call_parser
    return {getattr(parser, "start", None) or ""} if parser is not None else set()
