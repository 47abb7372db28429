"""Which earlier turns of an agent get the tokens sampled for them: the same whether the agent's
last call is remembered or not."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from platoon.gateway.memo import encoded_each
from platoon.gateway.sessions import AgentSession, Budget, sampled_turns, turn_key


def _session() -> AgentSession:
    return AgentSession(episode_id="e", agent_id="a", key="k", budget=Budget(None, None))


def _turn(arguments: object, content: str | None = None) -> dict:
    call = {"id": "c", "type": "function", "function": {"name": "run", "arguments": arguments}}
    return {"role": "assistant", "content": content, "tool_calls": [call]}


def test_remembered_keys_give_what_fresh_ones_do():
    """Call after call, with a session that remembers its last call's turns and one that never
    does; arguments as objects that are equal in Python but not as JSON (1, 1.0, true) included."""
    remembering = _session()
    turns = [_turn('{"n": 1}'), _turn({"n": 1}), _turn({"n": 1.0}), _turn({"n": True}), _turn(None, "ok")]
    for n, turn in enumerate(turns):
        remembering.sampled.setdefault(turn_key(turn), []).append([n])
    user = {"role": "user", "content": "go"}
    calls = [
        [user, turns[0]],
        [user, turns[0], user, turns[1]],
        [user, turns[0], user, turns[2]],  # equal to turns[1] in Python, not as JSON
        [user, turns[0], user, turns[3]],
        [user, turns[1], user, turns[0], user, turns[0]],  # a turn sampled once, sent twice
        [user, turns[4], user, turns[0]],
    ]
    for messages in calls:
        fresh = _session()
        fresh.sampled = remembering.sampled
        expected = sampled_turns(fresh, messages)
        assert sampled_turns(remembering, messages) == expected, messages
    assert sampled_turns(remembering, [user, turns[2]]) == {1: [2]}
    assert sampled_turns(remembering, [user, turns[3]]) == {1: [3]}


def test_a_turn_sampled_again_is_spliced_by_its_occurrence():
    session = _session()
    turn = _turn(json.dumps({"cmd": "ls"}))
    session.sampled[turn_key(turn)] = [[1]]
    messages = [turn, {"role": "tool", "content": "x"}, turn]
    assert sampled_turns(session, messages) == {0: [1], 2: [1]}
    session.sampled[turn_key(turn)].append([2])  # sampled a second time since
    assert sampled_turns(session, messages) == {0: [1], 2: [2]}


def test_a_turn_changed_in_place_since_the_last_call_gets_its_new_key():
    """In process, a harness's own dicts reach the gateway: one edited since is read again."""
    session = _session()
    turn = _turn('{"cmd": "ls"}')
    session.sampled[turn_key(turn)] = [[1]]
    messages = [{"role": "user", "content": "go"}, turn]
    assert sampled_turns(session, messages) == {1: [1]}
    turn["tool_calls"][0]["function"]["arguments"] = '{"cmd": "rm -rf /"}'
    assert sampled_turns(session, messages) == {}


def _whole_reading(session: AgentSession, messages: list[dict]) -> dict[int, list[int]]:
    alone = _session()
    alone.sampled = {key: list(samplings) for key, samplings in session.sampled.items()}
    return sampled_turns(alone, messages, encoded_each(messages))


def test_a_turn_sampled_since_the_last_call_is_spliced_by_its_occurrence_there_too():
    """A call that repeats the last one's messages reads only what it adds, unless what was
    sampled since changes what the repeated ones get."""
    session = _session()
    turn, other = _turn('{"cmd": "ls"}'), _turn('{"cmd": "pwd"}')
    session.remember(turn_key(turn), [1])
    messages = [turn, {"role": "tool", "content": "x"}, other]
    assert sampled_turns(session, messages, encoded_each(messages)) == {0: [1]}
    session.remember(turn_key(other), [2])  # `other`, never sampled at the last call, now is
    session.remember(turn_key(turn), [3])
    messages += [{"role": "tool", "content": "y"}, turn]
    expected = {0: [1], 2: [2], 4: [3]}
    assert sampled_turns(session, messages, encoded_each(messages)) == expected
    assert _whole_reading(session, messages) == expected


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_call_read_from_the_last_one_gives_what_a_whole_reading_does(data):
    """Histories that grow, are cut and edited, with turns sampled between calls (some more
    than once, some sent more often than sampled): reading only what a call adds to the last
    one's messages gives, call after call, what reading them all does."""
    session = _session()
    pool = [_turn(f'{{"n": {k}}}') for k in range(3)] + [_turn({"n": 1}), _turn({"n": 1.0})]
    user = {"role": "user", "content": "go"}
    messages: list[dict] = []
    for step in range(data.draw(st.integers(1, 14))):
        action = data.draw(st.sampled_from(["grow", "grow", "cut", "edit", "sample", "sample"]))
        k = data.draw(st.integers(0, len(pool) - 1))
        if action == "grow":
            messages = [*messages, user, pool[k]]
        elif action == "cut" and messages:
            messages = messages[: data.draw(st.integers(0, len(messages)))]
        elif action == "edit" and messages:
            messages = list(messages)
            messages[data.draw(st.integers(0, len(messages) - 1))] = pool[k]
        else:
            session.remember(turn_key(pool[k]), [step, k])
        expected = _whole_reading(session, messages)
        assert sampled_turns(session, messages, encoded_each(messages)) == expected, (step, messages)


def test_a_call_read_without_its_encodings_is_not_taken_for_the_next():
    """Only a reading that knows the messages as written is taken for the next call's."""
    session = _session()
    turn = _turn('{"cmd": "ls"}')
    session.remember(turn_key(turn), [1])
    session.remember(turn_key(turn), [2])
    messages = [turn, {"role": "tool", "content": "x"}, turn]
    assert sampled_turns(session, messages) == {0: [1], 2: [2]}
    assert sampled_turns(session, messages, encoded_each(messages)) == {0: [1], 2: [2]}
