"""Named environments, number search, and how `build_env_service` picks a backend."""

from __future__ import annotations

import sys
import types

import pytest
from env_test_helpers import ScriptedBackend, call_tool, open_session, serving

from platoon.bus.events import GradeRequested, TasksRequested
from platoon.envs import EnvError, EnvService, build_env_service
from platoon.envs.named import load_named_env, parse_env_name
from platoon.envs.number_search import NumberSearch
from platoon.envs.ors import OrsBackend

pytestmark = pytest.mark.anyio


async def test_number_search_plays_by_binary_search() -> None:
    service = build_env_service("ns", env="platoon-number-search@1")
    async with serving(service) as bus:
        listed = await bus.request(TasksRequested(env="ns", split="train"))
        assert len(listed.tasks) == 10_000 and listed.tasks[41].task_id == "train-41"
        opened = await open_session(bus, "ns", "train-41", split="train")
        assert "between 0 and 1023" in opened.instruction
        assert [t.name for t in opened.tools] == ["guess"]
        lo, hi, guesses = 0, 1023, 0
        while True:
            guesses += 1
            reply = await call_tool(bus, "ns", "guess", {"number": (lo + hi) // 2})
            if reply.finished:
                break
            assert reply.reward == 0.0 and reply.output in ("higher", "lower")
            lo, hi = ((lo + hi) // 2 + 1, hi) if reply.output == "higher" else (lo, (lo + hi) // 2 - 1)
        assert (reply.output, reply.reward) == ("correct", 1.0) and guesses <= 10
        grade = await bus.request(GradeRequested(episode_id="ep", agent_id="root", env="ns"))
        assert grade.reward == 1.0
    assert service.open_sessions == 0


async def test_number_search_without_a_hit_scores_zero() -> None:
    service = build_env_service("ns", env="platoon-number-search")
    async with serving(service) as bus:
        await open_session(bus, "ns", "test-0", split="test")
        out_of_range = await call_tool(bus, "ns", "guess", {"number": 5000})
        assert out_of_range.output == "5000 is out of range: the number is between 0 and 1023"
        grade = await bus.request(GradeRequested(episode_id="ep", agent_id="root", env="ns"))
        assert (grade.reward, grade.reason) == (0.0, None)


def test_number_search_tasks_are_deterministic_and_configurable() -> None:
    first, second = NumberSearch.list_tasks("test"), NumberSearch.list_tasks("test")
    assert first == second and len(first) == 1000
    assert first[0] == {"id": "test-0", "lo": 0, "hi": 1023, "secret": 557}  # the same on every machine
    assert NumberSearch.list_tasks("train")[:50] != first[:50]
    small = OrsBackend(NumberSearch, options={"hi": 15, "test_size": 5}).env_cls
    assert small.name() == "NumberSearch" and small.version == 1
    assert [t["hi"] for t in small.list_tasks("test")] == [15] * 5
    assert all(0 <= t["secret"] <= 15 for t in small.list_tasks("test"))
    assert len(NumberSearch.list_tasks("test")) == 1000  # the original is untouched
    with pytest.raises(
        EnvError, match=r"bad options for NumberSearch: lo \(9\) must not be greater than hi \(3\)"
    ):
        OrsBackend(NumberSearch, options={"lo": 9, "hi": 3})
    with pytest.raises(EnvError, match="bad options for NumberSearch"):
        OrsBackend(NumberSearch, options={"size": 3})


def test_named_environment_errors() -> None:
    assert parse_env_name("platoon-number-search@1") == ("platoon-number-search", "1")
    assert parse_env_name("platoon-number-search") == ("platoon-number-search", None)
    assert load_named_env("platoon-number-search@1") is NumberSearch
    with pytest.raises(EnvError, match="is version 1, but the config asks for 2"):
        load_named_env("platoon-number-search@2")
    with pytest.raises(EnvError, match=r"unknown environment 'nope' \(known: .*platoon-number-search"):
        build_env_service("x", env="nope@1")
    with pytest.raises(EnvError, match="NAME or NAME@VERSION"):
        parse_env_name("nope@")


def test_choosing_a_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EnvError, match="exactly one of `service` and `env`"):
        build_env_service("x")
    with pytest.raises(EnvError, match="exactly one of `service` and `env`"):
        build_env_service("x", service="python://a:B", env="platoon-number-search")
    with pytest.raises(EnvError, match="unknown service 'gym'"):
        build_env_service("x", service="gym")

    ors = build_env_service("x", service="platoon.envs.number_search:NumberSearch", tool_timeout=3)
    assert isinstance(ors, EnvService) and isinstance(ors.backend, OrsBackend) and ors.tool_timeout == 3
    custom = build_env_service(
        "x", service="env_test_helpers:ScriptedBackend", service_kwargs={"copyable": False}
    )
    assert isinstance(custom.backend, ScriptedBackend) and not custom.backend.copyable
    with pytest.raises(EnvError, match="json:dumps is neither an ORS Environment class nor an env backend"):
        build_env_service("x", service="json:dumps", service_kwargs={"obj": 1})

    fake = types.ModuleType("platoon.envs.harbor.service")

    class HarborBackend(ScriptedBackend):
        def __init__(self, *, dataset: str) -> None:
            super().__init__()
            self.dataset = dataset

    fake.HarborBackend = HarborBackend  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "platoon.envs.harbor.service", fake)
    harbor = build_env_service("h", service="harbor", service_kwargs={"dataset": "./tasks", "secrets": ["K"]})
    assert isinstance(harbor.backend, HarborBackend) and harbor.backend.dataset == "./tasks"
    with pytest.raises(EnvError, match="bad service_kwargs for harbor"):
        build_env_service("h", service="harbor", service_kwargs={"datasets": "./tasks"})
