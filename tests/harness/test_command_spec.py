"""TOML harness specs are parsed strictly: every problem names its file and key."""

from __future__ import annotations

import pytest

from platoon.harness.command import SpecError, load_spec_harness, parse_spec

BASE = {"name": "agent", "command": ["agent", "{instruction}"]}


def problem(**changes) -> str:
    with pytest.raises(SpecError) as exc:
        parse_spec(BASE | changes, "agent.toml")
    return str(exc.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"comand": ["x"]}, "agent.toml: comand: unknown key"),
        ({"options": {"n": {"type": "int", "deflt": 3}}}, "agent.toml: options.n.deflt: unknown key"),
        ({"options": {"n": {"type": "integer"}}}, "agent.toml: options.n.type: invalid enum value 'integer'"),
        ({"command": "agent"}, "agent.toml: command: expected array, got str"),
        ({"command": []}, "agent.toml: command: must name a program"),
        ({"command": ["a", "{instructions}"]}, "agent.toml: command.1: unknown placeholder {instructions}"),
        ({"env": {"K": "{option.n}"}}, "agent.toml: env.K: unknown placeholder {option.n}"),
        (
            {"files": {"a.json": '{"k": 1}'}},
            "agent.toml: files.a.json: a lone '{' (write {{ or }} for a literal brace)",
        ),
        ({"files": {"../a": "x"}}, "agent.toml: files.../a: must be a path inside the work dir"),
        ({"install": ["pip", "{instruction}"]}, "agent.toml: install.1: unknown placeholder {instruction}"),
        ({"exit_codes": {"three": "limit"}}, "agent.toml: exit_codes.three: an exit code must be an integer"),
        ({"exit_codes": {"3": "failed"}}, "agent.toml: exit_codes.3: invalid enum value 'failed'"),
        ({"timeout": 0}, "agent.toml: timeout: must be positive"),
        (
            {"options": {"n-max": {"type": "int"}}},
            "agent.toml: options.n-max: an option's name must be a Python identifier",
        ),
        (
            {"options": {"n": {"type": "int", "min": 1.5}}},
            "agent.toml: options.n.min: must be an integer for an int option",
        ),
        (
            {"options": {"n": {"type": "str", "max": 3}}},
            "agent.toml: options.n.max: only int and float options have a range, not str",
        ),
        (
            {"options": {"n": {"type": "float", "choices": [1.0]}}},
            "agent.toml: options.n.choices: only int and str options have choices, not float",
        ),
        (
            {"options": {"n": {"type": "str", "choices": ["a", 1]}}},
            "agent.toml: options.n.choices: 1 is not a str",
        ),
        (
            {"options": {"n": {"type": "int", "default": 0, "min": 1}}},
            "agent.toml: options.n.default: expected int >= 1",
        ),
        (
            {"options": {"n": {"type": "str", "default": "c", "choices": ["a", "b"]}}},
            "agent.toml: options.n.default: invalid enum value 'c'",
        ),
    ],
)
def test_spec_problems_name_the_key(changes, message):
    assert problem(**changes) == message


def test_missing_keys_and_files(tmp_path):
    with pytest.raises(SpecError, match=r"^agent.toml: command: missing$"):
        parse_spec({"name": "agent"}, "agent.toml")
    with pytest.raises(SpecError, match=r"nothing.toml: cannot read the harness spec: No such file"):
        load_spec_harness(tmp_path / "nothing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text('name = "x\n')
    with pytest.raises(SpecError, match=r"broken.toml: not valid TOML"):
        load_spec_harness(broken)


def test_a_full_spec_parses(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text(
        """
name = "my-agent"
description = "An agent."
command = ["{python}", "-c", "print({{1: 2}})", "{option.mode}", "{max_steps}"]
install = ["{python}", "-c", "pass", "{cache_dir}"]
timeout = 30.5
[env]
KEY = "{api_key}"
[files]
"conf/settings.json" = '{{"url": "{mcp_url}", "dir": "{workdir}"}}'
[options.mode]
type = "str"
default = "fast"
choices = ["fast", "slow"]
[options.rate]
type = "float"
min = 0
[exit_codes]
0 = "completed"
-9 = "timeout"
"""
    )
    agent = load_spec_harness(path)
    assert (agent.name, agent.spec.timeout, agent.exit_codes) == (
        "my-agent",
        30.5,
        {0: "completed", -9: "timeout"},
    )
    assert agent.uses_mcp and agent.spec_dir == tmp_path
    assert agent.options_type.__name__ == "MyAgentOptions"
    assert agent.options_type(rate=0.5).mode == "fast"
