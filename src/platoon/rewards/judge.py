"""Judges: a model scores an episode from a rubric.

A `Judge` fills its rubric with the episode (the task, the transcript, the final answer, the
environment's reward), asks its model for `samples` replies, reads a score from each (a number,
a label, or a field of a JSON object), and aggregates them. A reply without a readable score is
retried, then the judge fails and the episode is not graded: a judge that cannot answer is never
a score of 0. Replies are cached by content for the run, calls run under a concurrency limit, and
each one is published as a `ModelCallFinished` of kind `judge` (agent `judge`), which credit
assignment never trains on.

The transcript is the agent's text and so untrusted: it goes into the rubric inside a fenced
block whose closing tag it cannot forge, and the judge's reply is parsed, never run.

Models: `OpenAIJudgeModel` (any OpenAI-compatible endpoint, through the `openai` client) and
`SamplerJudgeModel` (a platoon sampler and a renderer: a Tinker sampling client, a frozen
platoon policy, or a scripted policy in tests).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import anyio
import structlog

from platoon.bus import Bus
from platoon.bus.events import ModelCallFinished, new_id
from platoon.config.schema import JudgeConfig, JudgeScore
from platoon.policy.base import SampleParams, Sampler
from platoon.rewards.episode import Episode

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

    from platoon.gateway.renderers import Renderer

__all__ = [
    "Judge",
    "JudgeError",
    "JudgeModel",
    "JudgeReply",
    "JudgeResult",
    "OpenAIJudgeModel",
    "SamplerJudgeModel",
    "parse_score",
    "render_rubric",
]

log = structlog.get_logger("platoon.judge")

JUDGE_AGENT = "judge"


class JudgeError(RuntimeError):
    """The judge gave no readable score (after its retries), or its model failed."""


@dataclass
class JudgeReply:
    """One reply of a judge model; tokens where the model is reached token by token."""

    text: str
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: str = "stop"


@dataclass
class JudgeResult:
    """The aggregated score and the replies it came from (the judge's reasoning)."""

    score: float
    scores: list[float]
    replies: list[str]

    @property
    def reasoning(self) -> str:
        if len(self.replies) == 1:
            return self.replies[0]
        return "\n\n".join(
            f"[sample {i + 1}: {s:g}] {r}"
            for i, (s, r) in enumerate(zip(self.scores, self.replies, strict=True))
        )


class JudgeModel(Protocol):
    """What a judge samples from; `describe()` names it in cache keys."""

    def describe(self) -> str: ...

    async def complete(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int
    ) -> JudgeReply: ...


class OpenAIJudgeModel:
    """A judge model behind any OpenAI-compatible endpoint (chat completions)."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 120.0):
        import openai

        self.base_url = base_url
        self.model = model
        # The key goes to the configured endpoint only; it is never logged or recorded.
        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or "unused", timeout=timeout, max_retries=0
        )

    def describe(self) -> str:
        return f"openai:{self.base_url}:{self.model}"

    async def aclose(self) -> None:
        await self.client.close()

    async def complete(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int
    ) -> JudgeReply:
        response = await self.client.chat.completions.create(
            model=self.model,
            messages=cast("list[ChatCompletionMessageParam]", messages),  # role and content, as strings
            temperature=temperature,
            max_tokens=max_tokens,
        )
        choice = response.choices[0]
        return JudgeReply(
            text=choice.message.content or "",
            stop_reason="length" if choice.finish_reason == "length" else "stop",
        )


class SamplerJudgeModel:
    """A judge model reached token by token: a platoon `Sampler` (or a coroutine making one, on
    first use) and the renderer that turns messages into its prompt."""

    def __init__(
        self,
        sampler: Sampler | Callable[[], Awaitable[Sampler]],
        renderer: Renderer,
        *,
        name: str = "sampler",
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._sampler = sampler
        self.renderer = renderer
        self.name = name
        self._close = close  # a coroutine function that releases what the sampler holds
        self._lock = anyio.Lock()

    async def aclose(self) -> None:
        if self._close is not None:
            close, self._close = self._close, None
            await close()

    def describe(self) -> str:
        return f"sampler:{self.name}"

    async def sampler(self) -> Sampler:
        async with self._lock:
            if not isinstance(self._sampler, Sampler):
                self._sampler = await self._sampler()
            return self._sampler

    async def complete(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int
    ) -> JudgeReply:
        sampler = await self.sampler()
        prompt = self.renderer.render(messages)
        params = SampleParams(
            max_tokens=max_tokens, temperature=temperature, stop=list(self.renderer.stop_token_ids) or None
        )
        sampled = await sampler.sample(prompt, params, messages=messages)
        tokens = list(sampled.tokens)
        body = tokens[:-1] if tokens and tokens[-1] in self.renderer.stop_token_ids else tokens
        text = self.renderer.tokenizer.decode(body, skip_special_tokens=True)
        return JudgeReply(
            text=text,
            prompt_tokens=list(prompt),
            completion_tokens=tokens,
            logprobs=list(sampled.logprobs),
            stop_reason=sampled.stop_reason,
        )


# --- the rubric ------------------------------------------------------------------------------------

DEFAULT_RUBRIC = """You are grading an AI assistant's attempt at a task.

The task:
{task}

What the assistant did:
{transcript}

Its final answer:
{final_answer}

Judge how well the final answer completes the task. Think briefly, then give your verdict."""


def _fence(tag: str, text: str) -> str:
    """`text` in a <tag> block it cannot close early (its own closing tags are defused)."""
    safe = re.sub(rf"</\s*{tag}\s*>", f"</ {tag}>", text, flags=re.IGNORECASE)
    return f"<{tag}>\n{safe}\n</{tag}>"


def render_rubric(template: str, episode: Episode, score: JudgeScore) -> str:
    """The judge's prompt: the template's placeholders filled, the answer format appended.

    Only `{task}`, `{transcript}`, `{final_answer}`, `{reward}` and `{files}` (the sandbox files
    the judge named, each fenced with its path) are replaced, so other braces (a JSON example in
    the rubric) stay as written.
    """
    values = {
        "{task}": _fence("task", episode.instruction),
        "{transcript}": _fence("transcript", episode.transcript()),
        "{final_answer}": _fence("final_answer", episode.final_answer or "(none)"),
        "{reward}": "none" if episode.env_reward is None else f"{episode.env_reward:g}",
        "{files}": "\n".join(_fence("file", f"{path}\n{text}") for path, text in episode.files.items())
        or "(no files)",
    }
    text = re.sub(r"\{(task|transcript|final_answer|reward|files)\}", lambda m: values[m.group(0)], template)
    return text + "\n\n" + answer_format(score)


PAIRWISE_RUBRIC = """You are comparing two attempts by an AI assistant at the same task.

The task:
{task}

Attempt A:
{attempt_a}

Attempt B:
{attempt_b}

Which attempt completes the task better? Think briefly, then give your verdict."""

PAIR_SCORE = JudgeScore(labels={"A": 1.0, "B": 0.0, "tie": 0.5})


def render_pair(template: str, a: Episode, b: Episode) -> str:
    """The pairwise prompt: `{task}`, and each attempt's transcript fenced as `{attempt_a}` and
    `{attempt_b}`; the verdict format appended."""
    values = {
        "{task}": _fence("task", a.instruction),
        "{attempt_a}": _fence("attempt_a", a.transcript()),
        "{attempt_b}": _fence("attempt_b", b.transcript()),
    }
    text = re.sub(r"\{(task|attempt_a|attempt_b)\}", lambda m: values[m.group(0)], template)
    return text + "\n\nEnd your reply with 'Verdict: A', 'Verdict: B' or 'Verdict: tie'."


def answer_format(score: JudgeScore) -> str:
    if score.json_schema is not None:
        return "End your reply with a JSON object that follows this schema:\n" + json.dumps(
            score.json_schema, ensure_ascii=False
        )
    if score.labels:
        return "End your reply with 'Verdict: X', where X is one of: " + ", ".join(score.labels) + "."
    low, high = score.number or (0.0, 10.0)
    return f"End your reply with 'Score: N', where N is a number from {low:g} to {high:g}."


# --- reading a score ------------------------------------------------------------------------------

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"


def parse_score(text: str, score: JudgeScore) -> float | None:
    """The score in a judge's reply, or None when it holds none that fits `score`.

    Numbers: a `score: N` (or `N/10`) the reply states wins over a bare number; the last one
    counts; out of range is no score; the value is mapped from [low, high] to [0, 1]. Labels: the
    last label named as a word (a `verdict: X` first). JSON: the last object in the reply that
    has `field`, whose value is a number or a label.
    """
    if score.json_schema is not None:
        return _parse_json(text, score)
    if score.labels:
        return _parse_label(text, score.labels)
    return _parse_number(text, score.number or [0.0, 10.0])


def _parse_number(text: str, bounds: Sequence[float]) -> float | None:
    low, high = float(bounds[0]), float(bounds[1])
    stated = re.findall(rf"(?i)\b(?:score|rating|grade)\s*[:=]?\s*\**\s*({_NUMBER})", text)
    candidates = stated or re.findall(rf"({_NUMBER})\s*/\s*{_NUMBER}", text) or re.findall(_NUMBER, text)
    if not candidates:
        return None
    try:
        value = float(candidates[-1])
    except ValueError:
        return None
    if not math.isfinite(value) or not low <= value <= high or high == low:
        return None
    return (value - low) / (high - low)


def _parse_label(text: str, labels: dict[str, float]) -> float | None:
    names = sorted(labels, key=len, reverse=True)
    alternatives = "|".join(re.escape(name) for name in names)
    verdicts = re.findall(rf"(?i)\b(?:verdict|label|answer)\s*[:=]\s*\**\s*({alternatives})\b", text)
    # A bare mention counts only for labels longer than a letter ("a" is also a word).
    words = "|".join(re.escape(name) for name in names if len(name) > 1)
    found = verdicts or (re.findall(rf"(?i)\b({words})\b", text) if words else [])
    if not found:
        return None
    by_lower = {name.lower(): value for name, value in labels.items()}
    return float(by_lower[found[-1].lower()])


def _parse_json(text: str, score: JudgeScore) -> float | None:
    decoder = json.JSONDecoder()
    found: float | None = None
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if not isinstance(value, dict) or score.field not in value:
            continue
        if not _fits_schema(value, score.json_schema or {}):
            continue
        raw = value[score.field]
        if isinstance(raw, bool):
            continue
        if isinstance(raw, int | float) and math.isfinite(raw):
            found = float(raw) if score.number is None else _parse_number(str(raw), score.number)
        elif isinstance(raw, str) and score.labels:
            found = _parse_label(raw, score.labels)
    return found


def _fits_schema(value: Mapping[str, object], schema: Mapping[str, Any]) -> bool:
    """The checks of a JSON schema a judge's answer needs: required keys and property types."""
    types = {
        "number": (int, float),
        "integer": (int,),
        "string": (str,),
        "boolean": (bool,),
        "object": (dict,),
    }
    if any(key not in value for key in schema.get("required", [])):
        return False
    for key, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        wanted = types.get(kind) if isinstance(kind, str) else None
        if key in value and wanted is not None and not isinstance(value[key], wanted):
            return False
        if key in value and isinstance(prop, dict) and "enum" in prop and value[key] not in prop["enum"]:
            return False
    return True


def aggregate(scores: Sequence[float], how: str) -> float:
    if how == "median":
        return float(statistics.median(scores))
    if how == "min":
        return min(scores)
    if how == "max":
        return max(scores)
    if how == "majority":
        counts = Counter(scores)
        best = max(counts.values())
        return next(s for s in scores if counts[s] == best)  # ties: the first one given
    return math.fsum(scores) / len(scores)


# --- the judge --------------------------------------------------------------------------------------


class Judge:
    """Scores episodes with one judge model, as `config` says."""

    def __init__(self, config: JudgeConfig, model: JudgeModel, *, rubric: str | None = None) -> None:
        self.config = config
        self.model = model
        self.rubric = rubric or config.rubric or DEFAULT_RUBRIC
        self.limiter = anyio.CapacityLimiter(config.max_concurrent)
        self.cache: OrderedDict[str, JudgeReply] = OrderedDict()
        self.cache_size = 10_000
        self.calls = 0  # judge model calls made (cache hits not counted)

    async def aclose(self) -> None:
        close = getattr(self.model, "aclose", None)
        if close is not None:
            await close()

    def messages(self, episode: Episode) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.config.system}] if self.config.system else []
        return [
            *messages,
            {"role": "user", "content": render_rubric(self.rubric, episode, self.config.score)},
        ]

    async def score(self, episode: Episode, bus: Bus | None = None) -> JudgeResult:
        """Ask for `samples` replies (concurrently) and aggregate their scores."""
        return await self._judge(self.messages(episode), episode, bus, self.config.score)

    async def compare(self, a: Episode, b: Episode, bus: Bus | None = None) -> JudgeResult:
        """How much better attempt `a` is than `b` at the same task: 1, 0 or 0.5 for a tie, per
        sample (the calls are recorded under `a`'s episode)."""
        messages = [{"role": "system", "content": self.config.system}] if self.config.system else []
        prompt = render_pair(self.config.rubric or PAIRWISE_RUBRIC, a, b)
        return await self._judge([*messages, {"role": "user", "content": prompt}], a, bus, PAIR_SCORE)

    async def _judge(
        self, messages: list[dict[str, str]], episode: Episode, bus: Bus | None, score: JudgeScore
    ) -> JudgeResult:
        results: list[tuple[float, str] | None] = [None] * self.config.samples
        errors: list[JudgeError] = []

        async def one(index: int) -> None:
            try:
                results[index] = await self._sample(messages, index, episode, bus, score)
            except JudgeError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for index in range(self.config.samples):
                tg.start_soon(one, index)
        if errors:
            raise errors[0]
        scores = [r[0] for r in results if r is not None]
        replies = [r[1] for r in results if r is not None]
        return JudgeResult(score=aggregate(scores, self.config.aggregate), scores=scores, replies=replies)

    async def _sample(
        self, messages: list[dict[str, str]], index: int, episode: Episode, bus: Bus | None, score: JudgeScore
    ) -> tuple[float, str]:
        problems = []
        for attempt in range(self.config.retries + 1):
            try:
                reply = await self._reply(messages, index, attempt, episode, bus)
            except Exception as exc:
                problems.append(f"{type(exc).__name__}: {exc}")
                log.warning("judge call failed", episode=episode.episode_id, error=problems[-1])
                continue
            value = parse_score(reply.text, score)
            if value is not None:
                return value, reply.text
            problems.append(f"no score in the reply {reply.text[-200:]!r}")
        raise JudgeError(f"the judge gave no score in {self.config.retries + 1} tries: {problems[-1]}")

    async def _reply(
        self, messages: list[dict[str, str]], index: int, attempt: int, episode: Episode, bus: Bus | None
    ) -> JudgeReply:
        key = self._key(messages, index, attempt)
        if self.config.cache and key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        async with self.limiter:
            started, clock = time.time(), time.perf_counter()
            with anyio.fail_after(self.config.timeout):
                reply = await self.model.complete(
                    messages, temperature=self.config.temperature, max_tokens=self.config.max_tokens
                )
            self.calls += 1
        if bus is not None:
            await bus.publish(
                ModelCallFinished(
                    call_id=new_id(),
                    episode_id=episode.episode_id,
                    agent_id=JUDGE_AGENT,
                    prompt_tokens=reply.prompt_tokens,
                    completion_tokens=reply.completion_tokens,
                    logprobs=reply.logprobs,
                    stop_reason=reply.stop_reason,
                    policy_version=0,
                    kind="judge",
                    completion_text=reply.text,
                    started_at=started,
                    duration_s=time.perf_counter() - clock,
                )
            )
        if self.config.cache:
            self.cache[key] = reply
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        return reply

    def _key(self, messages: list[dict[str, str]], index: int, attempt: int) -> str:
        c = self.config
        content = [self.model.describe(), messages, c.temperature, c.max_tokens, index, attempt]
        return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()
