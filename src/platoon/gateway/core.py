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
import itertools
import secrets
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

import anyio
import anyio.abc
import msgspec
import structlog

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.chat import ChatMessage, SampledMessage
from platoon.bus.events import (
    AgentOpened,
    AgentOpenRequested,
    CallKind,
    ChatReplied,
    ChatRequested,
    EpisodeFinished,
    ModelCallFailed,
    ModelCallFinished,
    PolicyUpdated,
    derive_seed,
    new_id,
)
from platoon.config.policies import DEFAULT_POLICY
from platoon.gateway.call import (
    PreparedCall,
    Reply,
    Slot,
    as_dicts,
    in_budget,
    refused,
    resampled,
    steered,
    streams,
)
from platoon.gateway.errors import GatewayError, sampler_error
from platoon.gateway.memo import encoded_each
from platoon.gateway.params import call_params, longest_token, size_bound, text_size
from platoon.gateway.renderers import Renderer, RendererError
from platoon.gateway.replies import read_reply, take_controls, unmet
from platoon.gateway.sessions import AgentSession, Budget, Completion, sampled_turns, turn_key
from platoon.gateway.settings import GatewaySettings
from platoon.gateway.shapes import Message, Messages, Params, Tool
from platoon.gateway.streaming import TextStream
from platoon.policy.base import (
    SampledCompletion,
    SampleParams,
    Sampler,
    SamplerFactory,
    StopReason,
    TopLogprobs,
)

__all__ = [
    "AgentSession",
    "Completion",
    "Gateway",
    "GatewayError",
    "GatewayPolicy",
    "GatewaySettings",
    "HttpFront",
]

log = structlog.get_logger("platoon.gateway")


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

    It serves one policy or several (RFC 0001), by name, the first as the one agents get when
    they name none; a bare `GatewayPolicy` is the one policy "default". Each agent is sampled
    from the policy its `AgentOpenRequested` names (a name the gateway does not serve is
    refused), and every per-policy fact of its calls (renderer, tokenizer, sampler) is that
    policy's; each `PolicyUpdated` switches only its own policy's sampler, and every
    `ModelCallFinished` says which policy sampled it. `settings`: see `GatewaySettings`.
    """

    name = "gateway"
    subscribes = (AgentOpenRequested, ChatRequested, PolicyUpdated, EpisodeFinished)
    publishes = (AgentOpened, ChatReplied, ModelCallFinished, ModelCallFailed)
    # What `serve_http` serves: set by `platoon.gateway` (the HTTP app imports this module).
    http_front: ClassVar[HttpFront | None] = None

    def __init__(
        self,
        policies: Mapping[str, GatewayPolicy] | GatewayPolicy,
        settings: GatewaySettings | None = None,
        *,
        defaults: SampleParams | None = None,
    ) -> None:
        self.policies: dict[str, GatewayPolicy] = (
            {DEFAULT_POLICY: policies} if isinstance(policies, GatewayPolicy) else dict(policies)
        )
        if not self.policies:
            raise ValueError("a gateway serves at least one policy")
        self.default_policy = next(iter(self.policies))
        self.settings = s = settings or GatewaySettings()
        self.defaults = defaults or SampleParams()
        self.context_window = s.context_window
        self.limiter = anyio.CapacityLimiter(s.max_concurrent_samples)
        self.serve_http = s.serve_http
        # What agents may ask for: the gateway's name, the generic one, aliases and each policy's model.
        served = [p.model_name for p in self.policies.values() if p.model_name]
        self.model_names = frozenset({s.model_name, "platoon-policy", *s.model_aliases, *served})
        self.base_url: str | None = None
        self.agents: dict[str, AgentSession] = {}  # by key
        self.by_agent: dict[str, AgentSession] = {}
        self.budgets: dict[str, Budget] = {}
        self._episodes: dict[str, list[AgentSession]] = {}
        self._bus: Bus | None = None
        self._ready = anyio.Event()
        self._chats: Stream[ChatRequested] | None = None
        self._said_too_long = False  # the run is told once that agents' first prompts do not fit

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
        async with anyio.create_task_group() as tg:
            if self.serve_http:
                front = type(self).http_front
                if front is None:
                    raise RuntimeError("the gateway has no HTTP front: import platoon.gateway")
                self.base_url = await tg.start(front, self, self.settings.host, self.settings.port)
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
        with anyio.move_on_after(self.settings.version_timeout):
            while state.sampler is None or state.sampler.version < session.min_version:
                if state.updated is None:
                    state.updated = anyio.Event()
                await state.updated.wait()
            return state.sampler
        raise await self._failed(
            session,
            GatewayError(
                "sampler",
                f"waited {self.settings.version_timeout:g} s for policy version {session.min_version}; "
                f"the sampler is at {state.sampler.version if state.sampler else None}"
                + (f" (policy {session.policy!r})" if len(self.policies) > 1 else ""),
            ),
        )

    async def _failed(self, session: AgentSession, error: GatewayError) -> GatewayError:
        """`error`, once said on the bus where the sampler failed (`ModelCallFailed`): the
        episode is the system's failure, not the policy's, however its harness goes on."""
        if error.kind == "sampler" and self._bus is not None:
            await self._bus.publish(
                ModelCallFailed(
                    episode_id=session.episode_id,
                    agent_id=session.agent_id,
                    error=str(error),
                    policy=session.policy,
                )
            )
        return error

    async def _answer_chat(self, bus: Bus, request: ChatRequested) -> None:
        session = self.by_agent.get(request.agent_id)
        try:
            if session is None or session.closed or session.episode_id != request.episode_id:
                raise GatewayError("auth", f"agent {request.agent_id} is not open at the gateway")
            try:
                messages = session.sent.read(request.messages)
            except ValueError as exc:
                raise GatewayError("bad_request", str(exc)) from None
            done = await self.complete(session, messages, request.tools, request.params, request.kind)
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
                message=msgspec.convert(done.message, SampledMessage),
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
            checks_tool_calls=request.checks_tool_calls,
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
        messages: Sequence[Message] | Messages,
        tools: Sequence[Tool] | None,
        params: Params,
        kind: CallKind = "policy",
        *,
        wait: bool = True,
        record_messages: bool = False,
    ) -> Completion:
        """Render, sample, parse and record one call of `session`'s agent (`complete_stream`,
        the reply whole)."""
        call = await self._prepare(session, messages, tools, params, kind)
        if _reads_stream(call, stream=False):
            return await last_of(self._replies(session, call, kind, wait, False, record_messages))
        async with Slot(self.limiter, session.budget if kind == "policy" else None, wait) as slot:
            reply = await self._sampled_whole(session, call)
        return await self._record(session, call, reply, slot, kind, None, record_messages)

    async def complete_stream(
        self,
        session: AgentSession,
        messages: Sequence[Message] | Messages,
        tools: Sequence[Tool] | None,
        params: Params,
        kind: CallKind = "policy",
        *,
        wait: bool = True,
        stream: bool = True,
        record_messages: bool = False,
    ) -> AsyncGenerator[str | Completion, None]:
        """`complete`, yielding the reply's content as it is sampled (str deltas, when the sampler
        streams and `stream` is set), then the `Completion`. Errors come before the first item.

        `params` may also hold `stop` (strings: the client's stop sequences, which end the reply
        where they appear), `tool_choice` ("auto", "none", "required" or {"name": ...}) and
        `parallel_tool_calls` (False: the reply ends after its first tool call).
        `messages` are the client's dicts, or `Messages` where the caller has them in more forms.
        `record_messages` puts the messages in the call's `ModelCallFinished` (an HTTP call has
        no `ChatRequested` that holds them). `response_format` ({"schema": SCHEMA or None}) asks
        for a reply that is JSON (of the schema).

        A call is three phases: prepare (`_prepare`: checked, rendered, its parameters fixed),
        sample (in a `Slot` of the limiter and the agent's budget, sampled again while the reply
        is not what it must be) and record (`_record`: `ModelCallFinished`, the turn kept).
        """
        call = await self._prepare(session, messages, tools, params, kind)
        async with contextlib.aclosing(
            self._replies(session, call, kind, wait, stream, record_messages)
        ) as replies:
            async for item in replies:
                yield item

    async def _replies(
        self,
        session: AgentSession,
        call: PreparedCall,
        kind: CallKind,
        wait: bool,
        stream: bool,
        record_messages: bool,
    ) -> AsyncGenerator[str | Completion, None]:
        """The sample and record phases of a prepared call, as `complete_stream` yields them."""
        reply: Reply | None = None
        text: TextStream | None = None
        async with Slot(self.limiter, session.budget if kind == "policy" else None, wait) as slot:
            if not _reads_stream(call, stream):
                reply = await self._sampled_whole(session, call)
            else:
                for attempt in itertools.count():
                    text = _text_stream(call)
                    sampled: SampledCompletion | None = None
                    streamed = self._sample_streamed(session, call, attempt, text, stream)
                    async with contextlib.aclosing(streamed):
                        async for item in streamed:
                            if isinstance(item, str):
                                yield item
                            else:
                                sampled = item
                    assert sampled is not None
                    reply = self._read(session, call, sampled, attempt + 1, text if stream else None)
                    if reply is not None:
                        break
        assert reply is not None
        text = text if stream else None
        done = await self._record(session, call, reply, slot, kind, text, record_messages)
        # The rest of a streamed text goes before the end; a reply that streamed nothing goes whole.
        if text is not None and text.sent:
            rest = text.rest(reply[1].content or "")
            if rest:
                yield rest
        yield done

    # --- a call's phases -----------------------------------------------------------------------

    async def _prepare(
        self,
        session: AgentSession,
        messages: Sequence[Message] | Messages,
        tools: Sequence[Tool] | None,
        params: Params,
        kind: CallKind,
    ) -> PreparedCall:
        """A call checked and rendered, with the parameters and the sampler it is sampled with;
        nothing is reserved or sampled yet."""
        if not isinstance(messages, Messages):
            messages = Messages(messages, encoded_each(messages))
        elif messages.written is None:  # each message as msgpack, once: see `_render`
            messages = Messages(messages.dicts, encoded_each(messages.dicts), messages.typed)
        state = self.policies[session.policy]
        if state.sampler is None:
            raise await self._failed(session, GatewayError("sampler", "the gateway has no sampler yet"))
        renderer = state.renderer
        if kind == "policy":
            session.budget.check()
        if not messages.dicts:
            raise GatewayError("bad_request", "messages must not be empty", param="messages")
        params = dict(params)
        if state.stream_markers is None:  # fixed for a renderer: read once
            state.stream_markers = renderer.stream_markers()
        controls = take_controls(params, tools, renderer, state.stream_markers)
        prompt = await self._render(session, state, messages, tools)
        prefill: list[int] = []
        if controls.prefill:
            prefill = renderer.tokenizer.encode(controls.prefill, add_special_tokens=False)
            prompt += prefill
        try:
            sample_params = call_params(self.defaults, session, params, len(prompt), self.context_window)
        except GatewayError as exc:
            raise self._first_too_long(session, exc, f"{len(prompt):,}") from None
        sampler = await self._sampler_for(session)
        sample_params, constrained = steered(in_budget(sample_params, session, kind), sampler, controls)
        dicts = as_dicts(messages.dicts)
        # The forced opening, for scripted policies (real ones see its tokens).
        conversation = (
            [*dicts, {"role": "assistant", "content": controls.prefill, "prefix": True}]
            if controls.prefill
            else dicts
        )
        return PreparedCall(
            renderer,
            tools,
            controls,
            prompt,
            prefill,
            sample_params,
            sampler,
            constrained,
            messages,
            conversation,
        )

    async def _render(
        self,
        session: AgentSession,
        state: GatewayPolicy,
        messages: Messages,
        tools: Sequence[Tool] | None,
    ) -> list[int]:
        """The prompt's tokens, reusing the agent's sampled turns; a prompt that cannot fit the
        context window is refused before it is tokenized."""
        # Each message as msgpack: for turns sampled before, the size bound, and the memos.
        dicts, written = messages.dicts, messages.written
        assert written is not None  # `_prepare` wrote them
        session.prompt.repeated(state.renderer, written)  # compared once, for the call's readers
        completions = sampled_turns(session, dicts, written, session.prompt.compared)
        # Their text, bounded from above (msgpack holds each string's UTF-8, and more).
        sizes = [len(w) for w in written if w is not None]
        bound = sum(sizes) if len(sizes) == len(written) else size_bound(dicts)
        chars = bound + size_bound(tools or ())
        try:
            self._check_size(chars, dicts, tools, state)
        except GatewayError as exc:
            raise self._first_too_long(
                session, exc, f"more than {chars // (state.longest_token or 1):,}"
            ) from None
        render = functools.partial(
            state.renderer.render, dicts, tools or None, completions=completions, memo=session.prompt
        )
        try:
            # A long prompt is tokenized on a worker thread so other agents' calls go on meanwhile
            # (the messages then encoded again there, as they are then).
            if chars > _INLINE_CHARS:
                return await anyio.to_thread.run_sync(render)
            return render(encoded=written)
        except RendererError as exc:
            raise GatewayError("bad_request", str(exc), param="messages") from None
        except UnicodeError:
            raise GatewayError("bad_request", "a string is not valid Unicode", param="messages") from None

    async def _sampled_whole(self, session: AgentSession, call: PreparedCall) -> Reply:
        """The reply of a call sampled whole, sampled again while it is not what it must be."""
        for attempt in itertools.count():
            sampled = await self._sample_whole(session, call, attempt)
            reply = self._read(session, call, sampled, attempt + 1, None)
            if reply is not None:
                return reply
        raise AssertionError("unreachable: `_read` refuses the last try")

    async def _sample_whole(
        self, session: AgentSession, call: PreparedCall, attempt: int
    ) -> SampledCompletion:
        """Sample `attempt` of `call` whole. A sampler's failure is the system's (`_failed`)."""
        try:
            return await call.sampler.sample(
                call.prompt, resampled(call.params, attempt), messages=call.conversation
            )
        except Exception as exc:
            raise await self._sampler_failed(session, exc) from exc

    async def _sample_streamed(
        self, session: AgentSession, call: PreparedCall, attempt: int, text: TextStream, stream: bool
    ) -> AsyncGenerator[str | SampledCompletion, None]:
        """Sample `attempt` of `call` through the sampler's stream, which `text` reads: its
        content deltas (when `stream`), then the completion. Sampling ends at a stop sequence."""
        assert streams(call.sampler)
        tokens: list[int] = []
        logprobs: list[float] = []
        top: TopLogprobs = []
        reason: StopReason = "stop"
        try:
            chunks = call.sampler.sample_stream(
                call.prompt, resampled(call.params, attempt), messages=call.conversation
            )
            try:
                async for chunk in chunks:
                    tokens += chunk.tokens
                    logprobs += chunk.logprobs
                    top += chunk.top_logprobs or []
                    reason = chunk.stop_reason or reason
                    delta = text.feed(chunk.tokens)
                    if delta and stream:
                        yield delta
                    if text.stop is not None:
                        break  # a stop sequence: no need to sample further
            finally:
                if isinstance(chunks, AsyncGenerator):  # a streaming sampler's always is
                    await chunks.aclose()
        except Exception as exc:
            raise await self._sampler_failed(session, exc) from exc
        yield SampledCompletion(
            tokens=tokens, logprobs=logprobs, stop_reason=reason, top_logprobs=top or None
        )

    async def _sampler_failed(self, session: AgentSession, exc: Exception) -> GatewayError:
        log.warning("sampler failed", error=f"{type(exc).__name__}: {exc}")
        return await self._failed(session, sampler_error(exc))

    def _read(
        self,
        session: AgentSession,
        call: PreparedCall,
        sampled: SampledCompletion,
        tries: int,
        text: TextStream | None,
    ) -> Reply | None:
        """The reply, parsed and cut at its first stop; None where it must be sampled again.

        A reply forced to call a tool (tool_choice) or to be JSON (response_format) that is not is
        sampled again, a bounded number of times, then refused: never markup as text. Nothing of
        such a reply streams before it is checked (unless the sampler decoded it to its
        constraint: then it is refused as it is; `text`, where it streamed), so a retry sends
        nothing twice.
        """
        # An agent that checks its own calls gets every well-formed call as it came.
        reply = read_reply(
            sampled,
            call.tools,
            call.controls,
            call.renderer,
            check_arguments=not session.checks_tool_calls,
        )
        problem = unmet(call.controls, reply[1], reply[0])
        if problem is None:
            return reply
        if tries >= self.settings.constraint_tries or (text is not None and text.sent):
            raise refused(call.controls, tries, problem)
        log.debug("a constrained reply is not what it must be; sampling again", attempt=tries)
        return None

    async def _record(
        self,
        session: AgentSession,
        call: PreparedCall,
        reply: Reply,
        slot: Slot,
        kind: CallKind,
        text: TextStream | None,
        record_messages: bool,
    ) -> Completion:
        """The answered call: its turn kept for the agent's next prompt, its tokens counted in
        the budget, `ModelCallFinished` published; `text`, the stream its content went out by."""
        sampled, parsed, stop_sequence = reply
        message = parsed.to_openai()
        call_id = new_id()
        key = turn_key(message)
        if key is not None:
            session.remember(key, call.prefill + list(sampled.tokens))
        session.calls += 1
        if kind == "policy":
            session.budget.tokens += len(sampled.tokens)
        if self._bus is not None:
            await self._bus.publish(
                ModelCallFinished(
                    call_id=call_id,
                    episode_id=session.episode_id,
                    agent_id=session.agent_id,
                    prompt_tokens=call.prompt,  # a list of this call's own
                    completion_tokens=list(sampled.tokens),
                    logprobs=list(sampled.logprobs),
                    stop_reason=sampled.stop_reason,
                    policy_version=call.sampler.version,
                    kind=kind,
                    completion_text=parsed.content,
                    started_at=slot.started,
                    duration_s=slot.duration,
                    messages=_logged(call.messages, session) if record_messages else None,
                    policy=session.policy,
                    parse_errors=list(parsed.errors),
                )
            )
        return Completion(
            message=message,
            call_id=call_id,
            finish_reason=parsed.finish_reason,
            prompt_tokens=len(call.prompt),
            completion_tokens=len(sampled.tokens),
            parse_errors=list(parsed.errors),
            budget_remaining=session.budget.remaining(),
            tokens=list(sampled.tokens),
            logprobs=list(sampled.logprobs),
            stop_sequence=stop_sequence,
            streamed=text.sent if text is not None else "",
            top_logprobs=sampled.top_logprobs,
        )

    def _first_too_long(self, session: AgentSession, error: GatewayError, tokens: str) -> GatewayError:
        """`error`; where it refuses an agent's first prompt as longer than the model's window,
        the run is told so once, in one line, before anything is sampled: an agent whose own
        system prompt and tools do not fit can make no call at all, and each of its episodes
        would end in the same refusal."""
        if error.kind == "context_length" and session.calls == 0 and not self._said_too_long:
            self._said_too_long = True
            log.warning(
                f"an agent's first prompt is {tokens} tokens and the model's context window is "
                f"{self.context_window:,}: no call of such an agent can be sampled. Use a model with "
                "a longer window, or an agent with a shorter prompt (its harness options, or another "
                "agent)",
                episode=session.episode_id,
            )
        return error

    def _check_size(
        self, bound: int, messages: Sequence[Message], tools: Sequence[Tool] | None, state: GatewayPolicy
    ) -> None:
        """Refuse, before tokenizing, a prompt that cannot fit: no token spans more than
        `longest_token` characters, so `chars / longest_token` tokens at least. The characters
        are counted only when their bound (`bound`) says the prompt may not fit."""
        if self.context_window is None:
            return
        if state.longest_token is None:
            state.longest_token = longest_token(state.renderer.tokenizer)
        if bound <= self.context_window * state.longest_token:
            return
        chars = text_size(messages) + text_size(tools or ())
        if chars > self.context_window * state.longest_token:
            raise GatewayError(
                "context_length",
                f"This model's maximum context length is {self.context_window} tokens; the prompt "
                f"has {chars} characters, more than that whatever the tokenization",
                param="messages",
            )


def _reads_stream(call: PreparedCall, stream: bool) -> bool:
    """Whether a call's reply is read through its sampler's stream as it comes: a streaming
    sampler's, where the call streams its text, is cut at a client's stop sequence or is decoded
    to its constraint. Any other reply is sampled whole."""
    return streams(call.sampler) and bool(stream or call.controls.stops or call.constrained)


def _text_stream(call: PreparedCall) -> TextStream:
    """What a streaming sampler's tokens for `call` read as, so far."""
    controls, renderer = call.controls, call.renderer
    return TextStream(
        renderer.decode,
        markers=controls.markers,
        stops=controls.stops,
        after_first_call=controls.after_first_call,
        stop_token_ids=renderer.stop_token_ids,
        plain=controls.plain,
    )


async def last_of(replies: AsyncGenerator[str | Completion, None]) -> Completion:
    """The `Completion` a call's replies end with. They are read to their end, not closed after
    it: a generator that has returned is finished with at no cost."""
    done: Completion | None = None
    async with contextlib.aclosing(replies):  # closed early only where reading them failed
        async for item in replies:
            if isinstance(item, Completion):
                done = item
    if done is None:
        raise AssertionError("complete_stream ended without a completion")
    return done


_INLINE_CHARS = 32_768  # prompts longer than this are rendered on a worker thread


def _kind(exc: GatewayError) -> Literal["budget", "context_length", "bad_request", "auth", "sampler"]:
    # "not_found" is the HTTP front's alone (a route, a stored response): never raised here.
    return "bad_request" if exc.kind == "overloaded" or exc.kind == "not_found" else exc.kind


def _logged(messages: Messages, session: AgentSession) -> list[ChatMessage] | None:
    """An HTTP call's messages as its record carries them (read where its agent's last call's
    were not the same); None, said once a call, where one does not fit the record's type: the
    call is recorded and trains all the same."""
    if messages.typed is not None:
        return messages.typed
    try:
        return session.recorded.read(messages, session.prompt.compared)
    except ValueError as exc:
        log.warning("a call's messages are not recorded", error=str(exc))
        return None
