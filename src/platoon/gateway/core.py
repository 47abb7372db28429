"""The model gateway: every model call of every agent goes through here.

It renders OpenAI-style messages into prompt tokens, samples the policy, parses the sampled
tokens back into an assistant message, and publishes `ModelCallFinished` with the exact
tokens and logprobs, so that what trains is exactly what was sampled.

Harnesses reach it two ways, which share `Gateway.complete`:

* in process, `ctx.chat(...)` publishes `ChatRequested` and awaits `ChatReplied`;
* over HTTP (`platoon.gateway.http`), with the agent's own key as the bearer token. The HTTP
  app imports this module, never the reverse: the package hands `Gateway` its `HttpFront`.

Token-exact history: when a request carries an assistant message that this agent was sampled
before, the prompt reuses the sampled tokens for that turn instead of re-rendering its text,
so each call of an agent extends the previous one token for token and prefix merging can fold
the whole agent into one datum.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import anyio
import anyio.abc
import structlog

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import (
    AgentOpened,
    AgentOpenRequested,
    CallKind,
    ChatReplied,
    ChatRequested,
    EpisodeFinished,
    ModelCallFinished,
    PolicyUpdated,
    derive_seed,
    new_id,
)
from platoon.gateway.renderers import ParsedMessage, Renderer, RendererError
from platoon.gateway.streaming import TextStream, find_stop, tokens_through
from platoon.policy.base import (
    SampledCompletion,
    SampleParams,
    Sampler,
    SamplerFactory,
    StopReason,
)

__all__ = ["AgentSession", "Completion", "Gateway", "GatewayError", "GatewayPolicy", "HttpFront"]

log = structlog.get_logger("platoon.gateway")

ErrorKind = Literal["budget", "context_length", "bad_request", "auth", "sampler", "overloaded", "not_found"]
TurnKey = tuple[str, tuple[tuple[str, str], ...]]  # an assistant turn's text and (name, arguments) calls


class GatewayError(Exception):
    """A call the gateway will not or cannot answer; `kind` picks the HTTP status and dialect."""

    def __init__(self, kind: ErrorKind, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.param = param


@dataclass
class Budget:
    """Model calls and completion tokens shared by the agents with one `budget_id`."""

    max_calls: int | None
    max_tokens: int | None
    calls: int = 0
    tokens: int = 0

    def check(self) -> None:
        if self.max_calls is not None and self.calls >= self.max_calls:
            raise GatewayError("budget", f"budget exhausted: all {self.max_calls} model calls are used")
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            raise GatewayError("budget", f"budget exhausted: all {self.max_tokens} tokens are used")

    def remaining(self) -> int | None:
        return None if self.max_calls is None else max(self.max_calls - self.calls, 0)


@dataclass
class GatewayPolicy:
    """One policy the gateway samples: its renderer (its tokenizer's chat format) and samplers.

    `frozen`: it never updates, so an agent's episode version does not apply to it."""

    renderer: Renderer
    factory: SamplerFactory
    frozen: bool = False
    model_name: str | None = None  # its model, a name agents may ask for (their key picks the policy)
    sampler: Sampler | None = None
    updated: anyio.Event | None = None  # set (and replaced) when the sampler changes
    stream_markers: tuple[list[str], bool] | None = None
    longest_token: int | None = None


@dataclass
class AgentSession:
    """One agent as the gateway knows it: its key, budget and the turns sampled for it."""

    episode_id: str
    agent_id: str
    key: str
    budget: Budget
    depth: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    min_version: int = 0
    sampled: dict[TurnKey, list[list[int]]] = field(default_factory=dict)
    calls: int = 0
    # Its calls' sampling seeds derive from `seed` and a count of its draws (None: unseeded);
    # its subagents' seeds from `seed` and a count of its children.
    seed: int | None = None
    draws: int = 0
    children: int = 0
    closed: bool = False
    in_flight: int = 0  # HTTP calls being answered
    policy: str = "default"  # the policy sampled for this agent
    # Responses kept for `previous_response_id` (Responses API, `store`): id -> (the
    # conversation without instructions, reply included; the response object). Bounded.
    responses: OrderedDict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = field(
        default_factory=OrderedDict
    )


@dataclass
class Completion:
    """One answered call: the assistant message and what was recorded."""

    message: dict[str, Any]
    call_id: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    parse_errors: list[str]
    budget_remaining: int | None
    tokens: list[int]
    logprobs: list[float]
    stop_sequence: str | None = None  # the client's stop sequence that ended the reply
    streamed: str = ""  # the content sent as deltas while sampling


@dataclass
class _Controls:
    """How one call's reply is steered and cut (see `Gateway.complete_stream`)."""

    stops: list[str]
    markers: list[str]
    plain: bool
    prefill: str = ""
    parse_tools: bool = True
    after_first_call: str | None = None


class HttpFront(Protocol):
    """Serves a gateway's HTTP app until cancelled and reports its `/v1` base URL through
    `task_status` (`platoon.gateway.http.serve_gateway`)."""

    async def __call__(
        self,
        gateway: Gateway,
        host: str,
        port: int,
        *,
        task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
    ) -> None: ...


class Gateway(ComponentBase):
    """The gateway component. See the module docstring.

    `context_window` (tokens) makes a longer prompt a context-length error and clamps
    `max_tokens` to the room left; `max_concurrent_samples` bounds calls in flight (HTTP
    callers get 429 past it, in-process callers wait), `max_calls_per_agent` those of one agent
    over HTTP, and `max_body` the size of an HTTP request.

    Several policies (RFC 0001): `renderer` and `sampler_factory` serve the policy named
    `policy`; `policies` adds others by name. Each agent is sampled from the policy its
    `AgentOpenRequested` names (a name the gateway does not serve is refused), each
    `PolicyUpdated` switches only its own policy's sampler, and every `ModelCallFinished` says
    which policy sampled it.
    """

    name = "gateway"
    subscribes = (AgentOpenRequested, ChatRequested, PolicyUpdated, EpisodeFinished)
    publishes = (AgentOpened, ChatReplied, ModelCallFinished)
    # What `serve_http` serves: set by `platoon.gateway` (the HTTP app imports this module).
    http_front: ClassVar[HttpFront | None] = None

    def __init__(
        self,
        *,
        renderer: Renderer,
        sampler_factory: SamplerFactory,
        defaults: SampleParams | None = None,
        context_window: int | None = None,
        max_concurrent_samples: int = 256,
        host: str = "127.0.0.1",
        port: int = 0,
        serve_http: bool = True,
        model_name: str = "platoon-policy",
        model_aliases: Sequence[str] = (),
        version_timeout: float = 600.0,
        max_calls_per_agent: int = 16,
        max_body: int = 64 * 2**20,
        policy: str = "default",
        policies: Mapping[str, GatewayPolicy] | None = None,
    ) -> None:
        self.renderer = renderer
        self.factory = sampler_factory
        self.default_policy = policy
        self.policies: dict[str, GatewayPolicy] = {policy: GatewayPolicy(renderer, sampler_factory)}
        self.policies.update(policies or {})
        self.defaults = defaults or SampleParams()
        self.context_window = context_window
        self.limiter = anyio.CapacityLimiter(max_concurrent_samples)
        self.host = host
        self.port = port
        self.serve_http = serve_http
        self.model_name = model_name
        # What agents may ask for: the policy's name, the generic one, and configured aliases.
        served = [p.model_name for p in (policies or {}).values() if p.model_name]
        self.model_names = frozenset({model_name, "platoon-policy", *model_aliases, *served})
        self.version_timeout = version_timeout
        self.max_calls_per_agent = max_calls_per_agent
        self.max_body = max_body
        self.base_url: str | None = None
        self.sampler: Sampler | None = None
        self.agents: dict[str, AgentSession] = {}  # by key
        self.by_agent: dict[str, AgentSession] = {}
        self.budgets: dict[str, Budget] = {}
        self._episodes: dict[str, list[AgentSession]] = {}
        self._bus: Bus | None = None
        self._ready = anyio.Event()
        self._chats: Stream[ChatRequested] | None = None

    # --- the component -----------------------------------------------------------------------

    def on_attach(self, bus: Bus) -> None:
        self._bus = bus
        self._chats = bus.stream(ChatRequested, name="gateway:chat").open()
        bus.subscribe(AgentOpenRequested, self._on_open, name="gateway:open")
        bus.subscribe(EpisodeFinished, self._on_episode_finished, name="gateway:close")
        bus.subscribe(PolicyUpdated, self._on_policy_updated, name="gateway:policy")

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._chats is not None
        for state in self.policies.values():
            state.sampler = await state.factory.initial()
        self.sampler = self.policies[self.default_policy].sampler
        async with anyio.create_task_group() as tg:
            if self.serve_http:
                front = type(self).http_front
                if front is None:
                    raise RuntimeError("the gateway has no HTTP front: import platoon.gateway")
                self.base_url = await tg.start(front, self, self.host, self.port)
            self._ready.set()
            with self._chats as chats:
                async for request in chats:
                    tg.start_soon(self._answer_chat, bus, request)

    async def _on_open(self, request: AgentOpenRequested) -> None:
        await self._ready.wait()
        assert self._bus is not None
        if request.policy not in self.policies:
            served = ", ".join(sorted(self.policies))
            await self._bus.publish(
                AgentOpened(
                    reply_to=request.request_id,
                    error=f"policy {request.policy!r} is not served here (policies: {served})",
                )
            )
            return
        session = self.open_agent(request)
        await self._bus.publish(
            AgentOpened(
                reply_to=request.request_id, key=session.key, base_url=self.base_url, policy=session.policy
            )
        )

    def _on_episode_finished(self, event: EpisodeFinished) -> None:
        self.close_episode(event.episode_id)

    async def _on_policy_updated(self, event: PolicyUpdated) -> None:
        state = self.policies.get(event.policy)
        if state is None:
            log.debug("update of a policy not served here ignored", policy=event.policy)
            return
        state.sampler = await state.factory.updated(event)
        if event.policy == self.default_policy:
            self.sampler = state.sampler
        updated, state.updated = state.updated, anyio.Event()
        if updated is not None:
            updated.set()
        log.debug("sampler updated", policy=event.policy, version=event.version, path=event.sampler_path)

    async def _sampler_for(self, session: AgentSession) -> Sampler:
        """The current sampler, once it is at least the version the agent's episode asked for.

        The scheduler requests a step's episodes as soon as the trainer published new weights,
        while the gateway may still be loading them: sampling the old policy then would make
        off-policy data out of an on-policy step. A frozen policy is always current.
        """
        state = self.policies[session.policy]
        if state.sampler is not None and (state.frozen or state.sampler.version >= session.min_version):
            return state.sampler  # the usual case, without a cancel scope per call
        with anyio.move_on_after(self.version_timeout):
            while state.sampler is None or state.sampler.version < session.min_version:
                if state.updated is None:
                    state.updated = anyio.Event()
                await state.updated.wait()
            return state.sampler
        raise GatewayError(
            "sampler",
            f"waited {self.version_timeout:g} s for policy version {session.min_version}; "
            f"the sampler is at {state.sampler.version if state.sampler else None}"
            + (f" (policy {session.policy!r})" if len(self.policies) > 1 else ""),
        )

    async def _answer_chat(self, bus: Bus, request: ChatRequested) -> None:
        session = self.by_agent.get(request.agent_id)
        try:
            if session is None or session.closed or session.episode_id != request.episode_id:
                raise GatewayError("auth", f"agent {request.agent_id} is not open at the gateway")
            done = await self.complete(session, request.messages, request.tools, request.params, request.kind)
        except GatewayError as exc:
            remaining = session.budget.remaining() if session else None
            await bus.publish(
                ChatReplied(
                    reply_to=request.request_id,
                    error=str(exc),
                    error_kind=_kind(exc),
                    budget_remaining=remaining,
                )
            )
            return
        await bus.publish(
            ChatReplied(
                reply_to=request.request_id,
                message=done.message,
                call_id=done.call_id,
                finish_reason=done.finish_reason,
                prompt_tokens=done.prompt_tokens,
                completion_tokens=done.completion_tokens,
                parse_errors=done.parse_errors,
                budget_remaining=done.budget_remaining,
            )
        )

    # --- agents ------------------------------------------------------------------------------

    def open_agent(self, request: AgentOpenRequested) -> AgentSession:
        budget_id = request.budget_id or request.episode_id
        budget = self.budgets.get(budget_id)
        if budget is None:
            budget = self.budgets[budget_id] = Budget(request.max_model_calls, request.max_tokens)
        seed = request.seed
        parent = self.by_agent.get(request.parent_id or "")
        if seed is None and parent is not None and parent.seed is not None:
            seed = derive_seed(parent.seed, "child", parent.children)
            parent.children += 1
        session = AgentSession(
            episode_id=request.episode_id,
            agent_id=request.agent_id,
            key="pt-" + secrets.token_urlsafe(32),
            budget=budget,
            depth=request.depth,
            params=dict(request.params),
            min_version=request.policy_version,
            policy=request.policy if request.policy in self.policies else self.default_policy,
            seed=seed,
        )
        self.agents[session.key] = session
        self.by_agent[session.agent_id] = session
        self._episodes.setdefault(request.episode_id, []).append(session)
        return session

    def close_episode(self, episode_id: str) -> None:
        """Revoke the keys of an episode's agents: a finished episode's key stops working."""
        for session in self._episodes.pop(episode_id, []):
            session.closed = True
            self.agents.pop(session.key, None)
            self.by_agent.pop(session.agent_id, None)
            self.budgets.pop(episode_id, None)
            for budget_id in [b for b in self.budgets if b.startswith(episode_id + ":")]:
                del self.budgets[budget_id]

    def authenticate(self, key: str | None) -> AgentSession:
        session = self.agents.get(key or "")
        if session is None or session.closed:
            raise GatewayError("auth", "invalid or expired API key")
        return session

    # --- one call ----------------------------------------------------------------------------

    async def complete(
        self,
        session: AgentSession,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        params: Mapping[str, Any],
        kind: CallKind = "policy",
        *,
        wait: bool = True,
    ) -> Completion:
        """Render, sample, parse and record one call of `session`'s agent."""
        replies = self.complete_stream(session, messages, tools, params, kind, wait=wait, stream=False)
        async with contextlib.aclosing(replies):  # type: ignore[type-var]
            async for item in replies:
                if isinstance(item, Completion):
                    return item
        raise AssertionError("complete_stream ended without a completion")

    async def complete_stream(
        self,
        session: AgentSession,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        params: Mapping[str, Any],
        kind: CallKind = "policy",
        *,
        wait: bool = True,
        stream: bool = True,
        record_messages: bool = False,
    ) -> AsyncIterator[str | Completion]:
        """`complete`, yielding the reply's content as it is sampled (str deltas, when the sampler
        streams and `stream` is set), then the `Completion`. Errors come before the first item.

        `params` may also hold `stop` (strings: the client's stop sequences, which end the reply
        where they appear), `tool_choice` ("auto", "none", "required" or {"name": ...}) and
        `parallel_tool_calls` (False: the reply ends after its first tool call).
        `record_messages` puts the messages in the call's `ModelCallFinished` (an HTTP call has
        no `ChatRequested` that holds them).
        """
        state = self.policies[session.policy]
        if state.sampler is None:
            raise GatewayError("sampler", "the gateway has no sampler yet")
        renderer = state.renderer
        if kind == "policy":
            session.budget.check()
        if not messages:
            raise GatewayError("bad_request", "messages must not be empty", param="messages")
        params = dict(params)
        controls = self._controls(params, tools, state)
        completions = self._sampled_turns(session, messages)
        chars = _text_size(messages) + _text_size(tools or ())
        self._check_size(chars, state)
        render = functools.partial(renderer.render, messages, tools or None, completions=completions)
        try:
            # A long prompt is tokenized on a worker thread so other agents' calls go on meanwhile.
            prompt = await anyio.to_thread.run_sync(render) if chars > _INLINE_CHARS else render()
        except RendererError as exc:
            raise GatewayError("bad_request", str(exc), param="messages") from None
        except UnicodeError:
            raise GatewayError("bad_request", "a string is not valid Unicode", param="messages") from None
        prefill: list[int] = []
        if controls.prefill:
            prefill = renderer.tokenizer.encode(controls.prefill, add_special_tokens=False)
            prompt += prefill
        sample_params = self._params(session, params, len(prompt))
        budget = session.budget
        if kind == "policy" and budget.max_tokens is not None:
            # A call may not sample past the episode's token budget.
            room = max(budget.max_tokens - budget.tokens, 1)
            if sample_params.max_tokens is None or sample_params.max_tokens > room:
                sample_params = SampleParams(**{**_asdict(sample_params), "max_tokens": room})
        sampler = await self._sampler_for(session)

        # The limiter is held on behalf of this call, not of a task: a stream is answered by
        # the task that started it and then by the one that sends the response.
        holder = object()
        if wait:
            await self.limiter.acquire_on_behalf_of(holder)
        else:
            try:
                self.limiter.acquire_on_behalf_of_nowait(holder)
            except anyio.WouldBlock:
                raise GatewayError("overloaded", "the sampler is saturated; retry later") from None
        started = time.time()
        clock = time.perf_counter()
        reserved = False
        text = TextStream(
            renderer.tokenizer,
            markers=controls.markers,
            stops=controls.stops,
            after_first_call=controls.after_first_call,
            stop_token_ids=renderer.stop_token_ids,
            plain=controls.plain,
        )
        try:
            if kind == "policy":
                # Checked again and reserved now: concurrent calls of one budget may have
                # waited for capacity since the first check.
                budget.check()
                budget.calls += 1
                reserved = True
            streams = _streams(sampler) and (stream or controls.stops)
            try:
                if streams:
                    tokens: list[int] = []
                    logprobs: list[float] = []
                    reason: StopReason = "stop"
                    chunks = sampler.sample_stream(prompt, sample_params, messages=list(messages))
                    try:
                        async for chunk in chunks:
                            tokens += chunk.tokens
                            logprobs += chunk.logprobs
                            reason = chunk.stop_reason or reason
                            delta = text.feed(chunk.tokens)
                            if delta and stream:
                                yield delta
                            if text.stop is not None:
                                break  # a stop sequence: no need to sample further
                    finally:
                        await chunks.aclose()  # type: ignore[attr-defined]
                    sampled = SampledCompletion(tokens=tokens, logprobs=logprobs, stop_reason=reason)
                else:
                    sampled = await sampler.sample(prompt, sample_params, messages=list(messages))
            except Exception as exc:
                log.warning("sampler failed", error=f"{type(exc).__name__}: {exc}")
                raise _sampler_error(exc) from exc
        except BaseException:
            if reserved:
                budget.calls -= 1
            raise
        finally:
            self.limiter.release_on_behalf_of(holder)
        duration = time.perf_counter() - clock

        sampled, parsed, stop_sequence = self._read(sampled, tools, controls, renderer)
        message = parsed.to_openai()
        call_id = new_id()
        key = _turn_key(message)
        if key is not None:
            session.sampled.setdefault(key, []).append(prefill + list(sampled.tokens))
        session.calls += 1
        if kind == "policy":
            session.budget.tokens += len(sampled.tokens)
        if self._bus is not None:
            await self._bus.publish(
                ModelCallFinished(
                    call_id=call_id,
                    episode_id=session.episode_id,
                    agent_id=session.agent_id,
                    prompt_tokens=list(prompt),
                    completion_tokens=list(sampled.tokens),
                    logprobs=list(sampled.logprobs),
                    stop_reason=sampled.stop_reason,
                    policy_version=sampler.version,
                    kind=kind,
                    completion_text=parsed.content,
                    started_at=started,
                    duration_s=duration,
                    messages=[dict(m) for m in messages] if record_messages else None,
                    policy=session.policy,
                )
            )
        # The rest of a streamed text goes before the end; a reply that streamed nothing goes whole.
        rest = text.rest(parsed.content or "") if stream and text.sent else ""
        if rest:
            yield rest
        yield Completion(
            message=message,
            call_id=call_id,
            finish_reason=parsed.finish_reason,
            prompt_tokens=len(prompt),
            completion_tokens=len(sampled.tokens),
            parse_errors=list(parsed.errors),
            budget_remaining=session.budget.remaining(),
            tokens=list(sampled.tokens),
            logprobs=list(sampled.logprobs),
            stop_sequence=stop_sequence,
            streamed=text.sent if stream else "",
        )

    def _controls(
        self, params: dict[str, Any], tools: Sequence[Mapping[str, Any]] | None, state: GatewayPolicy
    ) -> _Controls:
        """Take the reply controls (stop sequences, tool choice, parallel calls) out of `params`."""
        renderer = state.renderer
        stop = params.pop("stop", None)
        if isinstance(stop, str):
            stop = [stop]
        stops: list[str] = []
        if (
            isinstance(stop, list)
            and stop
            and all(isinstance(s, int) and not isinstance(s, bool) for s in stop)
        ):
            params["stop"] = stop  # token ids replace the renderer's stop tokens at the sampler
        elif stop is not None:
            if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
                raise GatewayError(
                    "bad_request", "stop must be a non-empty string or a list of them", param="stop"
                )
            stops = list(stop)
        choice = params.pop("tool_choice", None) or "auto"
        parallel = params.pop("parallel_tool_calls", None)
        if state.stream_markers is None:  # fixed for a renderer: read once
            state.stream_markers = renderer.stream_markers()
        markers, plain = state.stream_markers
        controls = _Controls(stops=stops, markers=markers, plain=plain)
        names = [_tool_name(t) for t in tools or ()]
        if choice == "none":
            controls.parse_tools = False
            controls.markers = [m for m in markers if m not in _tool_markers(renderer)]
        elif choice == "required" or isinstance(choice, Mapping):
            name = choice.get("name") if isinstance(choice, Mapping) else None
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
        elif choice != "auto":
            raise GatewayError(
                "bad_request",
                f"tool_choice {choice!r} is not auto, none, required or a tool",
                param="tool_choice",
            )
        if parallel is False and controls.parse_tools:
            controls.after_first_call = renderer.tool_call_end()
        return controls

    def _read(
        self,
        sampled: SampledCompletion,
        tools: Sequence[Mapping[str, Any]] | None,
        controls: _Controls,
        renderer: Renderer,
    ) -> tuple[SampledCompletion, ParsedMessage, str | None]:
        """Parse a completion, cut at the first stop (what is after it was never the reply)."""
        tokens = list(sampled.tokens)
        stop_ids = set(renderer.stop_token_ids)
        stop_at = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
        body = tokens if stop_at is None else tokens[:stop_at]
        tokenizer = renderer.tokenizer
        text = tokenizer.decode(body, skip_special_tokens=False)
        stop = (
            find_stop(text, controls.stops, controls.after_first_call)
            if controls.stops or controls.after_first_call
            else None
        )
        if stop is None:
            parsed = renderer.parse_text(
                controls.prefill + text,
                tools or None,
                stopped=stop_at is not None,
                tool_calls=controls.parse_tools,
            )
            if sampled.stop_reason == "length":
                parsed.finish_reason = "length"
            return sampled, parsed, None
        keep = tokens_through(tokenizer, body, stop.end)
        sampled = SampledCompletion(
            tokens=tokens[:keep], logprobs=list(sampled.logprobs[:keep]), stop_reason="stop"
        )
        parsed = renderer.parse_text(
            controls.prefill + text[: stop.kept], tools or None, stopped=True, tool_calls=controls.parse_tools
        )
        if stop.sequence is not None:
            parsed.finish_reason = "stop"
        return sampled, parsed, stop.sequence

    def _sampled_turns(
        self, session: AgentSession, messages: Sequence[Mapping[str, Any]]
    ) -> dict[int, list[int]]:
        """The tokens sampled for those assistant turns in `messages` that this agent was sampled.

        A text sampled twice (two identical tool calls, say) may have been sampled as different
        tokens, so the n-th occurrence of a turn gets the n-th sampling of it.
        """
        if not session.sampled:
            return {}
        completions: dict[int, list[int]] = {}
        seen: dict[TurnKey, int] = {}
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping) or message.get("role") != "assistant":
                continue
            key = _turn_key(message)
            samplings = session.sampled.get(key)
            if samplings:
                n = seen[key] = seen.get(key, -1) + 1
                completions[i] = samplings[min(n, len(samplings) - 1)]
        return completions

    def _check_size(self, chars: int, state: GatewayPolicy) -> None:
        """Refuse, before tokenizing, a prompt that cannot fit: no token spans more than
        `longest_token` characters, so `chars / longest_token` tokens at least."""
        if self.context_window is None:
            return
        if state.longest_token is None:
            state.longest_token = _longest_token(state.renderer.tokenizer)
        if chars > self.context_window * state.longest_token:
            raise GatewayError(
                "context_length",
                f"This model's maximum context length is {self.context_window} tokens; the prompt "
                f"has {chars} characters, more than that whatever the tokenization",
                param="messages",
            )

    def _params(self, session: AgentSession, request: Mapping[str, Any], prompt_len: int) -> SampleParams:
        """Request values first, then the agent's defaults, then the gateway's."""
        merged: dict[str, Any] = {}
        for source in (self.defaults_dict(), session.params, request):
            for key, value in source.items():
                if value is not None:
                    merged[_PARAM_ALIASES.get(key, key)] = value
        unknown = set(merged) - _PARAM_FIELDS
        for key in unknown:
            merged.pop(key)
        if "seed" not in merged and session.seed is not None:
            merged["seed"] = derive_seed(session.seed, session.draws)
            session.draws += 1
        params = _checked_params(merged)
        if self.context_window is not None:
            room = self.context_window - prompt_len
            if room <= 0:
                raise GatewayError(
                    "context_length",
                    f"This model's maximum context length is {self.context_window} tokens; the prompt "
                    f"has {prompt_len} tokens",
                    param="messages",
                )
            if params.max_tokens is None or params.max_tokens > room:
                params = SampleParams(**{**_asdict(params), "max_tokens": room})
        return params

    def defaults_dict(self) -> dict[str, Any]:
        return _asdict(self.defaults)


_PARAM_ALIASES = {"max_completion_tokens": "max_tokens"}
_INLINE_CHARS = 32_768  # prompts longer than this are rendered on a worker thread
_MAX_TOKENS = 10_000_000  # no model samples more; a larger max_tokens is a mistake
# What each sampling parameter may be: (type, lowest, highest).
_PARAM_RANGES: dict[str, tuple[type, float, float]] = {
    "max_tokens": (int, 1, _MAX_TOKENS),
    "temperature": (float, 0.0, 100.0),
    "top_p": (float, 0.0, 1.0),
    "top_k": (int, -1, 2**31 - 1),
    "seed": (int, -(2**63), 2**63 - 1),
}


def _checked_params(values: dict[str, Any]) -> SampleParams:
    """SampleParams from request values, each a finite number in range, or a 400 naming it."""
    for name, (kind, low, high) in _PARAM_RANGES.items():
        value = values.get(name)
        if value is None:
            continue
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is int and ok_type and isinstance(value, float) and value.is_integer():
            value = values[name] = int(value)
        if (
            not ok_type
            or (kind is int and not isinstance(value, int))
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            raise GatewayError(
                "bad_request",
                f"{name} must be {'an integer' if kind is int else 'a number'} from {low} to {high}, "
                f"got {value!r}",
                param=name,
            )
    stop = values.get("stop")
    if isinstance(stop, str):
        values["stop"] = [stop]
    elif stop is not None and (
        not isinstance(stop, list)
        or not all(isinstance(s, (str, int)) and not isinstance(s, bool) for s in stop)
    ):
        raise GatewayError("bad_request", "stop must be a string or a list of strings", param="stop")
    return SampleParams(**values)


def _text_size(value: Any) -> int:
    """Characters of all the strings in a JSON-like value (a cheap bound on its tokens)."""
    total = 0
    pending = [value]
    while pending:  # a loop, not recursion: it runs on every call's whole history
        item = pending.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):  # JSON is dicts and lists; an ABC check costs 10x more
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, Mapping):
            pending.extend(item.values())
    return total


def _longest_token(tokenizer: Any) -> int:
    """The most characters one token can stand for (vocabulary strings are at least as long)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary table: no bound known
        return 1 << 30
    return max((len(token) for token in vocab), default=1 << 30) or 1


_PARAM_FIELDS = set(SampleParams.__struct_fields__)


def _asdict(params: SampleParams) -> dict[str, Any]:
    return {f: getattr(params, f) for f in SampleParams.__struct_fields__}


def _streams(sampler: Sampler) -> bool:
    """Whether a sampler streams (`StreamingSampler`; an isinstance check of a protocol costs
    more than the rest of a call's bookkeeping)."""
    return callable(getattr(sampler, "sample_stream", None))


def _tool_name(tool: Mapping[str, Any]) -> Any:
    function = tool.get("function", tool) if isinstance(tool, Mapping) else None
    return function.get("name") if isinstance(function, Mapping) else None


def _tool_markers(renderer: Renderer) -> set[str]:
    parser = renderer.tool_call_parser
    return {getattr(parser, "start", None) or ""} if parser is not None else set()


_CONTEXT_WORDS = ("context length", "context window", "too long", "maximum context", "exceeds the context")


def _sampler_error(exc: Exception) -> GatewayError:
    """A sampler's failure as the gateway answers it: a prompt the model cannot take is the
    client's error (400 context_length_exceeded, at once), anything else a 502."""
    message = f"{type(exc).__name__}: {exc}"
    if any(word in str(exc).lower() for word in _CONTEXT_WORDS):
        return GatewayError(
            "context_length",
            f"This model's maximum context length is exceeded: the model refused the prompt ({message})",
            param="messages",
        )
    return GatewayError("sampler", f"sampling failed: {message}")


def _kind(exc: GatewayError) -> Any:
    return "bad_request" if exc.kind == "overloaded" else exc.kind


def _turn_key(message: Mapping[str, Any]) -> TurnKey | None:
    """What identifies an assistant turn across requests: its text and its calls.

    Harnesses echo replies back in different shapes (None or "" content, arguments as a JSON
    string or an object, their own call ids), so the key ignores those differences. A
    malformed turn has no key (the renderer then says what is wrong with it).
    """
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text", "") if isinstance(p, Mapping) else p for p in content]
        content = "\n".join(texts) if all(isinstance(t, str) for t in texts) else None
    elif content is not None and not isinstance(content, str):
        return None
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        return None
    calls = []
    for call in raw_calls:
        function = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            return None
        calls.append((function["name"], _arguments_key(function.get("arguments"))))
    return (content or "").strip(), tuple(calls)


def _arguments_key(arguments: Any) -> str:
    """Tool call arguments as canonical JSON, whether sent as a JSON string or an object."""
    if not isinstance(arguments, str):
        try:
            return json.dumps(arguments, sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError):
            return repr(arguments)
    # An agent's history repeats its calls on every request, so short ones are memoized.
    return _canonical_json(arguments) if len(arguments) <= 4096 else _canonical_json.__wrapped__(arguments)


@functools.lru_cache(maxsize=4096)
def _canonical_json(text: str) -> str:
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        value = text
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
