"""Which earlier turns of an agent get the tokens sampled for them: the same whether the agent's
last call is remembered or not."""

from __future__ import annotations

import json

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
