"""OpenAI-format conversations as recorded episodes (`platoon.train.conversations`): rendered
with the policy's renderer as the gateway renders a live episode, so a conversation exported
from a run gives back the very tokens the run recorded."""

from __future__ import annotations

import json

import pytest
from recordings import record

from platoon.bus import read_events
from platoon.bus.chat import message_dict
from platoon.bus.events import ChatReplied, ChatRequested, ModelCallFinished
from platoon.gateway.renderers import get_renderer
from platoon.train.conversations import is_conversations, read_conversations, rendered_calls
from platoon.train.recorded import RecordedError, Where, sft_datums

GUESS = {
    "type": "function",
    "function": {
        "name": "guess",
        "description": "Guess the number.",
        "parameters": {"type": "object", "properties": {"number": {"type": "integer"}}},
    },
}


def conversation(*guesses_and_answers: tuple[int, str], weight0: int | None = None) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": "Find the number between 0 and 15."}]
    for n, (guess, answer) in enumerate(guesses_and_answers):
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": "guess", "arguments": json.dumps({"number": guess})},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        if weight0 == n:
            message["weight"] = 0
        messages += [message, {"role": "tool", "tool_call_id": f"c{n}", "content": answer}]
    return messages


@pytest.fixture
def renderer(toy_tokenizer):
    return get_renderer("qwen3_instruct", toy_tokenizer, tool_call_parser="hermes")


def test_a_runs_episode_rendered_from_its_messages_gives_back_its_recorded_tokens(site, renderer):
    expert = record(site / "expert", "bisect", tasks=6)
    events = list(read_events(expert))
    replies = {e.reply_to: e.message for e in events if isinstance(e, ChatReplied)}
    last: dict[str, ChatRequested] = {}
    for e in events:
        if isinstance(e, ChatRequested):
            last[e.episode_id] = e
    recorded: dict[str, list[ModelCallFinished]] = {}
    for e in events:
        if isinstance(e, ModelCallFinished):
            recorded.setdefault(e.episode_id, []).append(e)
    assert len(last) == 6
    for episode_id, request in last.items():
        messages = [message_dict(m) for m in (*request.messages, replies[request.request_id])]
        calls = rendered_calls(messages, request.tools, renderer)
        assert [c.prompt_tokens for c in calls] == [c.prompt_tokens for c in recorded[episode_id]]
        assert [c.completion_tokens for c in calls] == [c.completion_tokens for c in recorded[episode_id]]


def test_a_conversations_file_trains_its_assistant_turns_and_keeps_its_rewards(
    tmp_path, renderer, toy_tokenizer
):
    path = tmp_path / "chats.jsonl"
    rows = [
        {
            "messages": conversation((7, "higher"), (11, "lower"), (9, "correct")),
            "tools": [GUESS],
            "reward": 1,
        },
        {
            "messages": conversation((7, "lower"), (3, "higher")),
            "tools": [GUESS],
            "reward": 0.0,
            "split": "b",
        },
        conversation((7, "higher"), (11, "correct"), weight0=0),  # a bare list; its first turn shown only
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert is_conversations(path) and not is_conversations(tmp_path)
    identity = {"name": "toy", "fingerprint": "sha256:x"}
    run = read_conversations(path, renderer, identity)
    assert [e.reward for e in run.episodes] == [1.0, 0.0, None]
    assert [len(e.agents["root"].calls) for e in run.episodes] == [3, 2, 1]
    assert run.tokenizer_of("default") == identity
    kept = [e for e in run.episodes if Where.parse(["reward>=1"]).keeps(e)]
    assert [e.episode_id for e in kept] == ["chats.jsonl:1"]
    assert [e.split for e in run.episodes if Where.parse(["split=b"]).keeps(e)] == ["b"]
    datums = sft_datums(run.episodes, lambda e, a: "default")["default"]
    assert len(datums) == 3  # each conversation's turns chain into one sequence
    first = datums[0]
    weighted = toy_tokenizer.decode([t for t, w in zip(first.target_tokens, first.weights, strict=True) if w])
    assert weighted.count("<tool_call>") == 3 and weighted.count("<|im_end|>") == 3
    assert "higher" not in weighted and "Find the number" not in weighted
    shown_only = toy_tokenizer.decode(
        [t for t, w in zip(datums[2].target_tokens, datums[2].weights, strict=True) if w]
    )
    assert '"number": 11' in shown_only and '"number": 7' not in shown_only


def test_a_bad_line_is_named_by_its_file_and_number(tmp_path, renderer):
    path = tmp_path / "chats.jsonl"
    identity = {"name": "toy", "fingerprint": "sha256:x"}
    path.write_text(json.dumps({"messages": conversation((7, "correct"))}) + "\n{not json\n")
    with pytest.raises(RecordedError, match=r"chats.jsonl:2: not JSON"):
        read_conversations(path, renderer, identity)
    path.write_text(json.dumps({"chat": []}) + "\n")
    with pytest.raises(RecordedError, match=r"chats.jsonl:1: a line is"):
        read_conversations(path, renderer, identity)
    path.write_text(
        json.dumps([{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "x"}]) + "\n"
    )
    with pytest.raises(RecordedError, match=r"chats.jsonl:1: messages.0.role"):
        read_conversations(path, renderer, identity)


@pytest.mark.torch
def test_sft_learns_from_a_conversations_file(site, tiny_model):
    import anyio

    from platoon.api import sft
    from platoon.config import validate_config

    path = site / "chats.jsonl"
    chats = [conversation((7, "higher"), (11, "lower"), (9, "correct")), conversation((7, "correct"))]
    path.write_text("".join(json.dumps({"messages": m, "tools": [GUESS], "reward": 1}) + "\n" for m in chats))
    config = {
        "train": {
            "backend": "local",
            "model_name": tiny_model,
            "renderer_name": "qwen3_instruct",
            "lora_rank": 4,
        },
        "sft": {"epochs": 2, "batch_size": 2},
    }
    last = anyio.run(
        lambda: sft(validate_config(config), run_dir=site / "sft", sources=[path], console=False)
    )
    assert last["train/datums"] == 2 and last["policy/version"] == 2
    assert last["train/trained_tokens"] == sum(
        len(c.completion_tokens) for line in chats for c in _calls(line, tiny_model)
    )


def _calls(messages, tiny_model):
    from platoon.models.loading import load_tokenizer

    return rendered_calls(messages, [GUESS], get_renderer("qwen3_instruct", load_tokenizer(tiny_model)))
