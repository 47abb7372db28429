"""The gateway component in process: what it records, budgets, call kinds, policy updates,
isolation between episodes, and token-exact history through `AgentContext.chat`.

The helpers at the top (`running_gateway`, `GUESS_TOOLS`, `extends`, ...) are shared with the
HTTP tests (`test_http*.py` import them from here).
"""

# ruff: noqa: F811
from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import structlog
import structlog.testing

from platoon.bus import Bus
from platoon.bus.events import (
    AgentOpened,
    AgentOpenRequested,
    ChatReplied,
    ChatRequested,
    EpisodeFinished,
    ModelCallFinished,
    PolicyUpdated,
    TaskRef,
    derive_seed,
)
from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
from platoon.gateway.renderers import get_renderer
from platoon.harness.context import AgentContext, Budget, BudgetExhausted, ChatError
from platoon.policy.base import SampledCompletion, SampleParams
from platoon.testing.policies import ScriptedSampler, ScriptedSamplerFactory
from tokenizer_fixtures import qwen3_tokenizer, toy_tokenizer  # noqa: F401

TASK = TaskRef(env="toy", split="train", task_id="0")
GUESS_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "guess",
            "description": "Guess the number.",
            "parameters": {
                "type": "object",
                "properties": {"number": {"type": "integer"}},
                "required": ["number"],
            },
        },
    }
]


def tool_call_text(number: int, *, compact: bool = False, preamble: str = "") -> str:
    """A Hermes tool call as a model writes it; `compact` JSON re-renders differently."""
    body = {"name": "guess", "arguments": {"number": number}}
    dumped = json.dumps(body, separators=(",", ":")) if compact else json.dumps(body)
    return f"{preamble}<tool_call>\n{dumped}\n</tool_call>"


def sampled_tokens(tokenizer: Any, text: str) -> list[int]:
    """What `ScriptedSampler` returns for `text`: its tokens and Qwen's `<|im_end|>`."""
    return [
        *tokenizer.encode(text, add_special_tokens=False),
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    ]


def extends(later: ModelCallFinished, earlier: ModelCallFinished) -> bool:
    """Whether `later`'s prompt starts with `earlier`'s prompt and completion, token for token."""
    head = list(earlier.prompt_tokens) + list(earlier.completion_tokens)
    return list(later.prompt_tokens[: len(head)]) == head


class TokenSampler:
    """Answers with given token lists, in order (for tokenizations a script cannot produce)."""

    def __init__(self, completions: Sequence[list[int]], version: int = 0) -> None:
        self.completions = list(completions)
        self.version = version
        self.prompts: list[list[int]] = []

    async def sample(self, prompt_tokens, params: SampleParams, *, messages=None) -> SampledCompletion:
        self.prompts.append(list(prompt_tokens))
        tokens = self.completions[len(self.prompts) - 1]
        return SampledCompletion(tokens=tokens, logprobs=[-1.0] * len(tokens), stop_reason="stop")


class BlockingSampler(ScriptedSampler):
    """A scripted sampler that holds every call until `release` is set, counting calls in flight."""

    def __init__(self, tokenizer: Any, script: Any) -> None:
        super().__init__(tokenizer, script)
        self.release = anyio.Event()
        self.entered = anyio.Event()
        self.in_flight = 0
        self.most_in_flight = 0

    async def sample(self, prompt_tokens, params, *, messages=None):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.entered.set()
        try:
            await self.release.wait()
            return await super().sample(prompt_tokens, params, messages=messages)
        finally:
            self.in_flight -= 1


class Factory:
    """A sampler factory over a given sampler, or one that makes a new sampler per version."""

    def __init__(self, sampler: Any = None, *, per_version: Callable[[int], Any] | None = None) -> None:
        self.sampler = sampler
        self.per_version = per_version

    async def initial(self) -> Any:
        return self.sampler if self.per_version is None else self.per_version(0)

    async def updated(self, event: PolicyUpdated) -> Any:
        return self.sampler if self.per_version is None else self.per_version(event.version)


class Running:
    """A gateway running on a bus, with every `ModelCallFinished` it published."""

    def __init__(self, bus: Bus, gateway: Gateway) -> None:
        self.bus = bus
        self.gateway = gateway
        self.records: list[ModelCallFinished] = []

    @property
    def renderer(self) -> Any:
        """The renderer of the gateway's default policy."""
        return self.gateway.policies[self.gateway.default_policy].renderer

    async def open(self, episode_id: str, agent_id: str | None = None, **options: Any) -> AgentOpened:
        reply = await self.bus.request(
            AgentOpenRequested(episode_id=episode_id, agent_id=agent_id or f"{episode_id}/root", **options)
        )
        assert isinstance(reply, AgentOpened) and reply.error is None
        return reply

    async def context(self, episode_id: str, agent_id: str | None = None, **options: Any) -> AgentContext:
        """Open an agent and give the context a function harness would get."""
        agent_id = agent_id or f"{episode_id}/root"
        opened = await self.open(episode_id, agent_id, **options)
        return AgentContext(
            bus=self.bus,
            task=TASK,
            episode_id=episode_id,
            agent_id=agent_id,
            instruction="Guess the number.",
            tools=[],
            budget=Budget(options.get("max_model_calls")),
            gateway_url=opened.base_url,
            api_key=opened.key,
            request_timeout=10,
        )

    async def finish(self, episode_id: str, status: str = "completed") -> None:
        await self.bus.publish(EpisodeFinished(episode_id=episode_id, group_id="g", task=TASK, status=status))
        await self.bus.drained()

    async def settled(self) -> list[ModelCallFinished]:
        """The records, once every published event has been handled."""
        await self.bus.drained()
        return self.records

    def of(self, episode_id: str) -> list[ModelCallFinished]:
        return [r for r in self.records if r.episode_id == episode_id]


@asynccontextmanager
async def running_gateway(
    tokenizer: Any,
    script: Any = None,
    *,
    factory: Any = None,
    renderer: str = "qwen3_instruct",
    policy: str = "default",
    policies: dict[str, GatewayPolicy] | None = None,
    **options: Any,
) -> AsyncIterator[Running]:
    """A bus with a gateway on it answering from `script` (or `factory`); HTTP off unless asked."""
    options.setdefault("serve_http", False)
    if "model_aliases" in options:
        options["model_aliases"] = tuple(options["model_aliases"])
    first = GatewayPolicy(
        get_renderer(renderer, tokenizer), factory or ScriptedSamplerFactory(tokenizer, script)
    )
    gateway = Gateway({policy: first, **(policies or {})}, GatewaySettings(**options))
    async with Bus() as bus:
        running = Running(bus, gateway)
        bus.subscribe(ModelCallFinished, running.records.append)
        gateway.attach(bus)
        bus.start_soon(gateway.run, bus)
        yield running


async def guessing_agent(
    ctx: AgentContext,
    calls: int,
    echo: Callable[[dict[str, Any]], dict[str, Any]] = dict,
) -> list[dict[str, Any]]:
    """A tool-calling harness: asks, echoes each reply back (through `echo`), adds the result."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You play a guessing game."},
        {"role": "user", "content": "Guess a number from 1 to 100."},
    ]
    for n in range(calls):
        reply = await ctx.chat(messages, GUESS_TOOLS)
        messages.append(echo(reply.message))
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"wrong ({n})"})
    return messages


# --- echo shapes: how harnesses send an assistant reply back ---------------------------------


def _empty_content(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "content": message.get("content") or ""}


def _arguments_as_objects(message: dict[str, Any]) -> dict[str, Any]:
    calls = [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in message.get("tool_calls") or []
    ]
    return {**message, "tool_calls": calls} if calls else message


def _rebuilt(message: dict[str, Any]) -> dict[str, Any]:
    """Only role, text and calls, with the harness's own call ids and no `type` fields."""
    out: dict[str, Any] = {"role": "assistant"}
    if message.get("content"):
        out["content"] = message["content"]
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": f"mine-{n}", "function": dict(c["function"])} for n, c in enumerate(message["tool_calls"])
        ]
    return out


ECHOES = {
    "as_returned": dict,
    "content_empty_string": _empty_content,
    "arguments_as_dict": _arguments_as_objects,
    "rebuilt_by_harness": _rebuilt,
}


# --- records -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_call_records_the_exact_sampled_tokens(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["Fifty."]) as gw:
        ctx = await gw.context("ep1")
        messages = [{"role": "user", "content": "Guess."}]
        reply = await ctx.chat(messages)
        [record] = await gw.settled()

    expected = sampled_tokens(toy_tokenizer, "Fifty.")
    assert reply.text == "Fifty."
    assert reply.finish_reason == "stop"
    assert (reply.prompt_tokens, reply.completion_tokens) == (len(record.prompt_tokens), len(expected))
    assert record.call_id == reply.call_id
    assert (record.episode_id, record.agent_id, record.kind) == ("ep1", "ep1/root", "policy")
    assert record.prompt_tokens == gw.renderer.render(messages)
    assert record.completion_tokens == expected
    assert record.logprobs == [-0.25] * len(expected)
    assert record.stop_reason == "stop"
    assert record.policy_version == 0
    assert record.completion_text == "Fifty."
    assert record.duration_s >= 0 and record.started_at > 0


@pytest.mark.anyio
async def test_tool_calls_come_back_parsed(toy_tokenizer):
    async with running_gateway(toy_tokenizer, [tool_call_text(7, preamble="Trying seven.\n")]) as gw:
        ctx = await gw.context("ep1")
        reply = await ctx.chat([{"role": "user", "content": "Guess."}], GUESS_TOOLS)

    assert reply.finish_reason == "tool_calls"
    assert reply.text == "Trying seven."
    [call] = reply.tool_calls
    assert call["function"]["name"] == "guess"
    assert json.loads(call["function"]["arguments"]) == {"number": 7}
    assert reply.parse_errors == []


@pytest.mark.anyio
async def test_a_malformed_tool_call_comes_back_as_text_with_an_error(toy_tokenizer):
    bad = '<tool_call>\n{"name": "guess", "arguments": {"number": seven}}\n</tool_call>'
    async with running_gateway(toy_tokenizer, [bad]) as gw:
        ctx = await gw.context("ep1")
        reply = await ctx.chat([{"role": "user", "content": "Guess."}], GUESS_TOOLS)
        [record] = await gw.settled()

    assert reply.tool_calls == [] and reply.finish_reason == "stop"
    assert "seven" in reply.text
    assert "invalid JSON in tool call" in reply.parse_errors[0]
    assert record.completion_tokens == sampled_tokens(toy_tokenizer, bad)


@pytest.mark.anyio
async def test_an_agent_that_checks_its_own_calls_gets_the_calls_its_schemas_do_not_fit(toy_tokenizer):
    """OpenHands answers a bad call with its own error: the gateway hands such calls back as calls
    (bad JSON is still text: it is no call at all)."""
    unfit = '<tool_call>\n{"name": "guess", "arguments": {"number": "seven"}}\n</tool_call>'
    unknown = '<tool_call>\n{"name": "peek", "arguments": {}}\n</tool_call>'
    broken = "<tool_call>\n{not json}\n</tool_call>"
    async with running_gateway(toy_tokenizer, [unfit, unknown, broken]) as gw:
        ctx = await gw.context("ep1", checks_tool_calls=True)
        replies = [await ctx.chat([{"role": "user", "content": "Guess."}], GUESS_TOOLS) for _ in range(3)]

    calls = [
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in r.tool_calls]
        for r in replies
    ]
    assert calls == [[("guess", {"number": "seven"})], [("peek", {})], []]
    assert [r.finish_reason for r in replies] == ["tool_calls", "tool_calls", "stop"]
    assert "invalid JSON" in replies[2].parse_errors[0]


@pytest.mark.anyio
async def test_a_call_whose_arguments_do_not_fit_comes_back_as_a_call_with_the_error(toy_tokenizer):
    bad = '<tool_call>\n{"name": "guess", "arguments": {"number": "seven"}}\n</tool_call>'
    async with running_gateway(toy_tokenizer, [bad]) as gw:
        ctx = await gw.context("ep1")
        reply = await ctx.chat([{"role": "user", "content": "Guess."}], GUESS_TOOLS)

    [call] = reply.tool_calls
    assert json.loads(call["function"]["arguments"]) == {"number": "seven"}
    assert reply.finish_reason == "tool_calls" and reply.text == ""
    assert reply.parse_errors == ["tool call 1: argument 'number' of 'guess' must be integer, got string"]


# --- token-exact history ----------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("echo", list(ECHOES))
async def test_a_tool_calling_agent_forms_one_token_sequence(toy_tokenizer, echo):
    # Compact JSON and a text preamble: re-rendering these turns would give other tokens.
    script = [tool_call_text(n, compact=True, preamble=f"Try {n}. ") for n in (10, 20, 30)] + ["Done."]
    async with running_gateway(toy_tokenizer, script) as gw:
        ctx = await gw.context("ep1")
        messages = await guessing_agent(ctx, 4, ECHOES[echo])
        records = await gw.settled()

    assert len(records) == 4
    for earlier, later in itertools.pairwise(records):
        assert extends(later, earlier)
    # The splice is what makes it hold: the re-rendered history differs from what was sampled.
    rerendered = gw.renderer.render(messages[:-2], GUESS_TOOLS)
    assert rerendered[: len(records[3].prompt_tokens)] != records[3].prompt_tokens


@pytest.mark.anyio
async def test_rewritten_history_is_rendered_as_written(toy_tokenizer):
    async with running_gateway(toy_tokenizer, [tool_call_text(10), "Done."]) as gw:
        ctx = await gw.context("ep1")
        messages = [{"role": "user", "content": "Guess."}]
        reply = await ctx.chat(messages, GUESS_TOOLS)
        call = reply.tool_calls[0]
        rewritten = {**reply.message, "content": "I changed my mind, but try this."}
        messages += [rewritten, {"role": "tool", "tool_call_id": call["id"], "content": "no"}]
        await ctx.chat(messages, GUESS_TOOLS)
        first, second = await gw.settled()

    assert not extends(second, first)
    assert second.prompt_tokens == gw.renderer.render(messages, GUESS_TOOLS)


@pytest.mark.anyio
async def test_a_text_sampled_twice_as_different_tokens_keeps_each_tokenization(toy_tokenizer):
    renderer = get_renderer("qwen3_instruct", toy_tokenizer)
    end = renderer.stop_token_ids[0]
    whole = [*toy_tokenizer.encode("Hmm, let me think.", add_special_tokens=False), end]
    by_char = [t for c in "Hmm, let me think." for t in toy_tokenizer.encode(c, add_special_tokens=False)]
    assert whole != [*by_char, end]  # the same text, two tokenizations
    sampler = TokenSampler([whole, [*by_char, end], whole])
    async with running_gateway(toy_tokenizer, factory=Factory(sampler)) as gw:
        ctx = await gw.context("ep1")
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Go on."}]
        for _ in range(3):
            reply = await ctx.chat(messages)
            messages += [reply.message, {"role": "user", "content": "Go on."}]
        first, second, third = await gw.settled()

    assert extends(second, first) and extends(third, second)


@pytest.mark.slow
@pytest.mark.anyio
async def test_real_qwen3_thinking_agent_forms_one_token_sequence(qwen3_tokenizer):
    # Qwen3's template drops the reasoning of turns before the last user message and writes
    # `<think>` blocks its own way; the spliced turns keep exactly what was sampled.
    script = [
        "<think>\nStart in the middle.\n</think>\n\n" + tool_call_text(50),
        "<think>\nToo high, so lower.\n</think>\n\n" + tool_call_text(25, compact=True),
        "<think>\nGot it.\n</think>\n\nIt is 25.",
    ]
    async with running_gateway(qwen3_tokenizer, script, renderer="qwen3") as gw:
        ctx = await gw.context("ep1")
        messages = await guessing_agent(ctx, 3)
        records = await gw.settled()

    assert [r.completion_tokens for r in records] == [sampled_tokens(qwen3_tokenizer, s) for s in script]
    assert extends(records[1], records[0]) and extends(records[2], records[1])
    assert messages[-1]["content"] == "It is 25." and messages[-1]["reasoning_content"] == "Got it."


# --- budgets and call kinds -------------------------------------------------------------------


@pytest.mark.anyio
async def test_policy_calls_stop_at_the_call_budget(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["one", "two", "three"]) as gw:
        ctx = await gw.context("ep1", max_model_calls=2)
        messages = [{"role": "user", "content": "Count."}]
        await ctx.chat(messages)
        assert ctx.budget.remaining() == 1
        await ctx.chat(messages)
        with pytest.raises(BudgetExhausted, match="all 2 model calls are used"):
            await ctx.chat(messages)
        assert ctx.budget.remaining() == 0
        assert len(await gw.settled()) == 2


@pytest.mark.anyio
async def test_aux_calls_are_free_and_judge_calls_are_recorded_as_judge(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["a", "b", "c", "d", "e"]) as gw:
        ctx = await gw.context("ep1", max_model_calls=1)
        messages = [{"role": "user", "content": "Hi."}]
        await ctx.chat(messages)
        await ctx.chat(messages, kind="aux")
        await ctx.chat(messages, kind="judge")
        await ctx.chat(messages, kind="aux")
        with pytest.raises(BudgetExhausted):
            await ctx.chat(messages)
        records = await gw.settled()

    assert [r.kind for r in records] == ["policy", "aux", "judge", "aux"]
    assert [r.completion_text for r in records] == ["a", "b", "c", "d"]


@pytest.mark.anyio
async def test_the_token_budget_counts_completion_tokens(toy_tokenizer):
    long = "a rather long answer with many tokens in it"
    async with running_gateway(toy_tokenizer, [long, long]) as gw:
        ctx = await gw.context("ep1", max_tokens=5)
        await ctx.chat([{"role": "user", "content": "Talk."}])
        with pytest.raises(BudgetExhausted, match="all 5 tokens are used"):
            await ctx.chat([{"role": "user", "content": "Talk."}])


@pytest.mark.anyio
async def test_agents_with_one_budget_id_share_it(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"] * 4) as gw:
        root = await gw.context("ep1", "root", budget_id="ep1:tree", max_model_calls=3)
        child = await gw.context("ep1", "child", budget_id="ep1:tree", max_model_calls=3, depth=1)
        loner = await gw.context("ep1", "loner", budget_id="ep1:own", max_model_calls=1)
        messages = [{"role": "user", "content": "Go."}]
        await root.chat(messages)
        await child.chat(messages)
        await root.chat(messages)
        with pytest.raises(BudgetExhausted):
            await child.chat(messages)
        await loner.chat(messages)


@pytest.mark.anyio
async def test_concurrent_calls_cannot_overrun_the_budget(toy_tokenizer):
    sampler = BlockingSampler(toy_tokenizer, ["x"] * 8)
    async with running_gateway(toy_tokenizer, factory=Factory(sampler)) as gw:
        ctx = await gw.context("ep1", max_model_calls=3)
        outcomes: list[str] = []

        async def call() -> None:
            try:
                await ctx.chat([{"role": "user", "content": "Go."}])
                outcomes.append("ok")
            except BudgetExhausted:
                outcomes.append("exhausted")

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(call)
            await sampler.entered.wait()
            await anyio.sleep(0.05)
            sampler.release.set()

    assert sorted(outcomes) == ["exhausted"] * 3 + ["ok"] * 3


@pytest.mark.anyio
async def test_a_prompt_past_the_context_window_ends_the_agent(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["never"], context_window=20) as gw:
        ctx = await gw.context("ep1")
        with pytest.raises(BudgetExhausted, match="maximum context length is 20 tokens"):
            await ctx.chat([{"role": "user", "content": "word " * 50}])
        assert await gw.settled() == []


@pytest.mark.anyio
async def test_a_first_prompt_past_the_window_is_said_once_in_one_line_before_any_sample(toy_tokenizer):
    """An agent whose own prompt cannot fit (a CLI agent's system prompt on a small model) makes
    no call: the run says so once, naming both sizes and what to change, not once per episode."""
    long = [{"role": "user", "content": "word " * 50}]
    with structlog.testing.capture_logs() as logs:
        async with running_gateway(toy_tokenizer, ["never"], context_window=20) as gw:
            for episode in ("ep1", "ep2"):
                ctx = await gw.context(episode)
                with pytest.raises(BudgetExhausted):
                    await ctx.chat(long)
            assert await gw.settled() == []
    said = [entry["event"] for entry in logs if "first prompt" in entry["event"]]
    prompt = len(get_renderer("qwen3_instruct", toy_tokenizer).render(long))
    assert said == [
        f"an agent's first prompt is {prompt} tokens and the model's context window is 20: no call of "
        "such an agent can be sampled. Use a model with a longer window, or an agent with a shorter "
        "prompt (its harness options, or another agent)"
    ]


@pytest.mark.anyio
async def test_max_tokens_is_clamped_to_the_room_left(toy_tokenizer):
    messages = [{"role": "user", "content": "Say a lot."}]
    prompt = len(get_renderer("qwen3_instruct", toy_tokenizer).render(messages))
    text = "one two three four five six seven eight"
    async with running_gateway(toy_tokenizer, [text, text], context_window=prompt + 3) as gw:
        ctx = await gw.context("ep1")
        clamped = await ctx.chat(messages, max_tokens=100)
        asked = await ctx.chat(messages, max_tokens=2)
        first, second = await gw.settled()

    assert clamped.finish_reason == "length" and len(first.completion_tokens) == 3
    assert first.stop_reason == "length"
    assert asked.finish_reason == "length" and len(second.completion_tokens) == 2


# --- policy updates ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_policy_updated_switches_the_sampler(toy_tokenizer):
    def per_version(version: int) -> ScriptedSampler:
        return ScriptedSampler(toy_tokenizer, lambda _: f"from version {version}", version=version)

    async with running_gateway(toy_tokenizer, factory=Factory(per_version=per_version)) as gw:
        ctx = await gw.context("ep1")
        messages = [{"role": "user", "content": "Who are you?"}]
        before = await ctx.chat(messages)
        await gw.bus.publish(PolicyUpdated(version=3, sampler_path="tinker://run/sampler/3"))
        await gw.bus.drained()
        after = await ctx.chat(messages)
        records = await gw.settled()

    assert (before.text, after.text) == ("from version 0", "from version 3")
    assert [r.policy_version for r in records] == [0, 3]
    assert records[1].completion_tokens == sampled_tokens(toy_tokenizer, "from version 3")


# --- isolation --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_concurrent_episodes_keep_their_own_records(toy_tokenizer):
    def answer(messages: list[dict[str, Any]]) -> str:
        # The episode shows in the system prompt, so a mix-up would show in the answers.
        episode = messages[0]["content"].split()[-1]
        turns = sum(m["role"] == "assistant" for m in messages)
        return tool_call_text(turns, preamble=f"{episode} turn {turns}. ")

    async with running_gateway(toy_tokenizer, answer) as gw:

        async def episode(name: str) -> None:
            ctx = await gw.context(name)
            messages = [
                {"role": "system", "content": f"You are in episode {name}"},
                {"role": "user", "content": "Guess."},
            ]
            for _ in range(4):
                reply = await ctx.chat(messages, GUESS_TOOLS)
                assert reply.text.startswith(name)
                messages.append(reply.message)
                messages.append({"role": "tool", "tool_call_id": reply.tool_calls[0]["id"], "content": "no"})
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            for name in ("A", "B", "C"):
                tg.start_soon(episode, name)
        await gw.settled()

        for name in ("A", "B", "C"):
            records = gw.of(name)
            assert len(records) == 4
            assert {r.agent_id for r in records} == {f"{name}/root"}
            assert all(r.completion_text.startswith(name) for r in records)
            assert all(extends(b, a) for a, b in itertools.pairwise(records))


@pytest.mark.anyio
async def test_a_chat_published_in_process_is_read_as_ctx_chat_reads_it(toy_tokenizer):
    """A `ChatRequested` made in process with dicts (a struct checks its fields only when
    decoded) is sampled if its messages fit, and refused naming the field if not."""
    async with running_gateway(toy_tokenizer, ["fine"]) as gw:
        await gw.open("A")
        asked = [{"role": "user", "content": "hi"}], [{"role": "user", "content": 5}]
        ok, bad = [
            await gw.bus.request(ChatRequested(episode_id="A", agent_id="A/root", messages=m))  # type: ignore[arg-type]
            for m in asked
        ]
    assert isinstance(ok, ChatReplied) and ok.error is None and ok.message.content == "fine"
    assert isinstance(bad, ChatReplied) and bad.error_kind == "bad_request"
    assert bad.error is not None and bad.error.startswith("messages.0.content: Expected `str | array | null`")


@pytest.mark.anyio
async def test_an_agent_cannot_call_into_another_episode(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"] * 3) as gw:
        await gw.open("A")
        await gw.open("B")
        reply = await gw.bus.request(
            ChatRequested(episode_id="A", agent_id="B/root", messages=[{"role": "user", "content": "hi"}])
        )
        assert isinstance(reply, ChatReplied)
        assert reply.error_kind == "auth" and "not open" in reply.error
        assert await gw.settled() == []


@pytest.mark.anyio
async def test_a_finished_episode_can_no_longer_call(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"] * 3) as gw:
        a = await gw.context("A")
        b = await gw.context("B")
        messages = [{"role": "user", "content": "hi"}]
        await a.chat(messages)
        await gw.finish("A")
        with pytest.raises(ChatError, match="not open"):
            await a.chat(messages)
        await b.chat(messages)
        assert [r.episode_id for r in await gw.settled()] == ["A", "B"]
        with pytest.raises(Exception, match="invalid or expired"):
            gw.gateway.authenticate(a.api_key)


# --- failures and capacity --------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_sampler_failure_is_a_chat_error_and_costs_nothing(toy_tokenizer):
    def answer(messages: list[dict[str, Any]]) -> str:
        if messages[-1]["content"] == "crash":
            raise RuntimeError("the policy server is down")
        return "fine"

    async with running_gateway(toy_tokenizer, answer) as gw:
        ctx = await gw.context("ep1", max_model_calls=1)
        with pytest.raises(ChatError, match="sampling failed: RuntimeError: the policy server is down"):
            await ctx.chat([{"role": "user", "content": "crash"}])
        reply = await ctx.chat([{"role": "user", "content": "hello"}])
        assert reply.text == "fine"
        assert len(await gw.settled()) == 1


@pytest.mark.anyio
async def test_a_bad_conversation_is_a_chat_error(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"]) as gw:
        ctx = await gw.context("ep1")
        with pytest.raises(ChatError, match=r"messages\.0\.role"):
            await ctx.chat([{"role": "wizard", "content": "hi"}])
        with pytest.raises(ChatError, match="must not be empty"):
            await ctx.chat([])


@pytest.mark.anyio
async def test_in_process_calls_wait_for_capacity(toy_tokenizer):
    sampler = BlockingSampler(toy_tokenizer, ["x"] * 3)
    async with running_gateway(toy_tokenizer, factory=Factory(sampler), max_concurrent_samples=1) as gw:
        contexts = [await gw.context(f"ep{n}") for n in range(3)]
        async with anyio.create_task_group() as tg:
            for ctx in contexts:
                tg.start_soon(ctx.chat, [{"role": "user", "content": "hi"}])
            await sampler.entered.wait()
            await anyio.sleep(0.05)
            sampler.release.set()
        assert len(await gw.settled()) == 3
    assert sampler.most_in_flight == 1


@pytest.mark.anyio
async def test_an_agent_waits_for_the_policy_its_episode_asked_for(toy_tokenizer):
    """A step's episodes start as soon as the trainer publishes new weights; their calls must
    sample those weights, not the ones the gateway still had loaded."""

    def per_version(version: int) -> ScriptedSampler:
        return ScriptedSampler(toy_tokenizer, lambda _: f"from version {version}", version=version)

    async with running_gateway(toy_tokenizer, factory=Factory(per_version=per_version)) as gw:
        ctx = await gw.context("ep1", policy_version=2)
        replies = []

        async def chat() -> None:
            replies.append(await ctx.chat([{"role": "user", "content": "Who are you?"}]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(chat)
            await gw.bus.publish(PolicyUpdated(version=1, sampler_path="tinker://run/sampler/1"))
            await gw.bus.drained()
            assert replies == []  # version 1 is not yet the policy of this episode
            await gw.bus.publish(PolicyUpdated(version=2, sampler_path="tinker://run/sampler/2"))
        records = await gw.settled()

    assert replies[0].text == "from version 2"
    assert [r.policy_version for r in records] == [2]


@pytest.mark.anyio
async def test_waiting_for_a_policy_that_never_comes_is_a_clear_error(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["never sampled"], version_timeout=0.05) as gw:
        ctx = await gw.context("ep1", policy_version=5)
        with pytest.raises(ChatError, match=r"waited 0\.05 s for policy version 5; the sampler is at 0"):
            await ctx.chat([{"role": "user", "content": "hi"}])


@pytest.mark.anyio
async def test_a_call_never_samples_past_the_token_budget(toy_tokenizer):
    long_answer = "word " * 50
    async with running_gateway(toy_tokenizer, [long_answer, long_answer]) as gw:
        ctx = await gw.context("ep1", max_tokens=30)
        first = await ctx.chat([{"role": "user", "content": "talk"}])
        assert first.completion_tokens == 30 and first.finish_reason == "length"
        with pytest.raises(BudgetExhausted, match="all 30 tokens are used"):
            await ctx.chat([{"role": "user", "content": "talk"}])


# --- sampling seeds ----------------------------------------------------------------------------


class SeedSampler:
    """Answers "ok" to every call and keeps the seed each call sampled with."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokens = sampled_tokens(tokenizer, "ok")
        self.version = 0
        self.seeds: list[int | None] = []

    async def sample(self, prompt_tokens, params: SampleParams, *, messages=None) -> SampledCompletion:
        self.seeds.append(params.seed)
        return SampledCompletion(tokens=self.tokens, logprobs=[-1.0] * len(self.tokens), stop_reason="stop")


@pytest.mark.anyio
async def test_a_seeded_agent_samples_each_call_with_its_own_derived_seed(toy_tokenizer):
    """An episode's seed reaches the sampler as one seed per call, the same on every rerun; a
    subagent's derive from its parent's; a seed the call names itself wins."""
    sampler = SeedSampler(toy_tokenizer)
    messages = [{"role": "user", "content": "Say ok."}]
    async with running_gateway(toy_tokenizer, factory=Factory(sampler)) as gw:
        root = await gw.context("ep1", seed=7)
        await root.chat(messages)
        await root.chat(messages)
        for n in range(2):
            child = await gw.context("ep1", f"ep1/child{n}", parent_id="ep1/root")
            await child.chat(messages)
        session = gw.gateway.authenticate(root.api_key)
        await gw.gateway.complete(session, messages, None, {"seed": 5})
        unseeded = await gw.context("ep2")
        await unseeded.chat(messages)
    children = [derive_seed(7, "child", n) for n in range(2)]
    assert sampler.seeds == [
        derive_seed(7, 0),
        derive_seed(7, 1),
        derive_seed(children[0], 0),
        derive_seed(children[1], 0),
        5,
        None,
    ]
    assert len(set(sampler.seeds[:4])) == 4 and all(0 <= s < 2**63 for s in sampler.seeds[:4])


def test_a_call_whose_messages_do_not_fit_the_record_is_recorded_without_them():
    """What an HTTP agent sent is put in its call's record as typed messages; one that does not
    fit them (a dialect's oddity) costs the record its messages, said once, never the call."""
    from platoon.bus.chat import ChatMessage
    from platoon.gateway.core import _logged
    from platoon.gateway.sessions import AgentSession, Budget
    from platoon.gateway.shapes import Messages

    def _session() -> AgentSession:
        return AgentSession(episode_id="e", agent_id="a", key="k", budget=Budget(None, None))

    fits = [{"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}}]
    assert _logged(Messages(fits), _session()) == [ChatMessage(role="user", content="hi")]
    with structlog.testing.capture_logs() as logs:
        assert _logged(Messages([{"role": "user", "content": 5}]), _session()) is None
    [said] = [entry for entry in logs if entry["event"] == "a call's messages are not recorded"]
    assert said["error"].startswith("messages.0.content: ")
