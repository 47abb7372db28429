from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platoon.bus import codec
from platoon.bus.events import Datum, EvalFinished, Event, event_types, register_event

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)


def strategy(t: msgspec.inspect.Type) -> st.SearchStrategy[Any]:
    """A hypothesis strategy for any msgspec type an event may use."""
    i = msgspec.inspect
    match t:
        case i.BoolType():
            return st.booleans()
        case i.IntType():
            return st.integers(-(2**62), 2**62)
        case i.FloatType():
            return st.floats(allow_nan=False, width=64)
        case i.StrType():
            return st.text(max_size=20)
        case i.NoneType():
            return st.none()
        case i.LiteralType():
            return st.sampled_from(t.values)
        case i.ListType():
            return st.lists(strategy(t.item_type), max_size=5)
        case i.DictType():
            return st.dictionaries(strategy(t.key_type), strategy(t.value_type), max_size=4)
        case i.UnionType():
            return st.one_of([strategy(x) for x in t.types])
        case i.AnyType():
            return json_values
        case i.StructType() if t.cls is Datum:
            return st.integers(0, 5).flatmap(
                lambda n: st.builds(
                    Datum,
                    model_input=st.lists(st.integers(0, 2**31), min_size=n, max_size=n),
                    target_tokens=st.lists(st.integers(0, 2**31), min_size=n, max_size=n),
                    logprobs=st.lists(st.floats(-50, 0), min_size=n, max_size=n),
                    advantages=st.lists(st.floats(-5, 5), min_size=n, max_size=n),
                    weights=st.lists(st.floats(0, 1), min_size=n, max_size=n),
                    episode_id=st.text(max_size=8),
                    policy_version=st.integers(0, 100),
                )
            )
        case i.StructType():
            fields = {f.name: strategy(f.type) for f in t.fields}
            return st.fixed_dictionaries(fields).map(lambda kw: t.cls(**kw))
    raise AssertionError(f"no strategy for {t}")


@pytest.mark.slow
@pytest.mark.parametrize("cls", event_types(), ids=lambda c: c.__name__)
def test_every_event_type_round_trips(cls):
    @settings(max_examples=25, deadline=None)
    @given(strategy(msgspec.inspect.type_info(cls)))
    def check(event):
        assert codec.decode(codec.encode(event)) == event
        assert msgspec.json.decode(codec.to_json(event))["type"] == cls.__name__

    check()


def test_a_plugin_event_round_trips_once_registered():
    @register_event
    class PluginThing(Event, frozen=True, kw_only=True):
        payload: dict[str, int]

    event = PluginThing(payload={"a": 1})
    assert codec.decode(codec.encode(event)) == event


def test_tags_must_be_unique():
    class Clash(Event, frozen=True, kw_only=True, tag="RunFinished"):
        pass

    with pytest.raises(ValueError, match="already used"):
        register_event(Clash)


def test_unknown_tag_fails_to_decode():
    class Unregistered(Event, frozen=True, kw_only=True):
        x: int = 1

    with pytest.raises(msgspec.DecodeError):
        codec.decode(codec.encode(Unregistered()))


def test_a_field_since_removed_still_decodes():
    """Old event logs hold fields an event has since dropped (EvalFinished.report_path, never
    set): unknown fields are skipped, so those logs still read."""
    old = msgspec.msgpack.encode(
        {"type": "EvalFinished", "step": 3, "metrics": {"eval/reward": 0.5}, "report_path": "eval.json"}
    )
    assert codec.decode(old) == EvalFinished(step=3, metrics={"eval/reward": 0.5})
