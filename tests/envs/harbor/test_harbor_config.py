import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import msgspec
import pytest
from runner_check import built_harbor_python

from platoon.envs.harbor import HarborError, load_task, resolve_env, sandbox_spec_for
from platoon.envs.harbor import config as harbor_config
from platoon.envs.harbor.config import Author, Healthcheck, PackageInfo, decode_task_config, parse_task_config

FULL = """\
schema_version = "1.4"
source = "terminal-bench"
artifacts = ["/app/out.log"]
multi_step_reward_strategy = "final"
unknown_root_key = "ignored, as Harbor does"

[task]
name = "acme/add-numbers"
version = "2.0"
description = "Add two numbers"
authors = [{ name = "Ada", email = "ada@example.com" }, { name = "Bob" }]
keywords = ["math", "easy"]

[metadata]
difficulty = "easy"
topic = "algebra"
tags = ["arith"]

[verifier]
timeout_sec = 120.0
env = { MODE = "strict", TOKEN = "${PLATOON_TEST_TOKEN:-fallback}" }
user = "tester"
network_mode = "no-network"
environment_mode = "shared"

[agent]
timeout_sec = 300
user = 1000
network_mode = "allowlist"
allowed_hosts = ["pypi.org"]

[environment]
build_timeout_sec = 900.0
docker_image = "ghcr.io/acme/add:1"
os = "Linux"
cpus = 2
memory_mb = 4096
storage_mb = 20480
gpus = 0
gpu_types = ["H100"]
network_mode = "public"
env = { LANG = "C.UTF-8" }
workdir = "/work"
unknown_env_key = 3

[environment.healthcheck]
command = "test -f /ready"
interval_sec = 1.0
retries = 5

[solution]
env = { HINT = "yes" }
"""


def test_every_field_is_parsed(make_task, monkeypatch):
    monkeypatch.delenv("PLATOON_TEST_TOKEN", raising=False)
    task = load_task(make_task(toml=FULL, files={"solution/solve.sh": "echo 42 > /app/answer.txt\n"}))
    c = task.config
    assert (c.schema_version, c.source, c.artifacts, c.multi_step_reward_strategy) == (
        "1.4", "terminal-bench", ["/app/out.log"], "final",
    )  # fmt: skip
    assert c.task == PackageInfo(
        name="acme/add-numbers", version="2.0", description="Add two numbers",
        authors=[Author("Ada", "ada@example.com"), Author("Bob")], keywords=["math", "easy"],
    )  # fmt: skip
    assert task.metadata == {"difficulty": "easy", "topic": "algebra", "tags": ["arith"]}
    v = c.verifier
    assert (v.timeout_sec, v.user, v.network_mode, v.environment_mode) == (
        120.0,
        "tester",
        "no-network",
        "shared",
    )
    assert resolve_env(v.env, allowed=["PLATOON_TEST_TOKEN"]) == {"MODE": "strict", "TOKEN": "fallback"}
    a = c.agent
    assert (a.timeout_sec, a.user, a.network_mode, a.allowed_hosts) == (
        300.0,
        1000,
        "allowlist",
        ["pypi.org"],
    )
    e = c.environment
    assert (e.build_timeout_sec, e.docker_image, e.os, e.cpus, e.memory_mb, e.storage_mb) == (
        900.0, "ghcr.io/acme/add:1", "linux", 2.0, 4096, 20480,
    )  # fmt: skip
    assert (e.gpus, e.gpu_types, e.network_mode, e.env, e.workdir, e.skills_dir) == (
        0, ["H100"], "public", {"LANG": "C.UTF-8"}, "/work", None,
    )  # fmt: skip
    assert e.healthcheck == Healthcheck(command="test -f /ready", interval_sec=1.0, retries=5)
    assert c.solution.env == {"HINT": "yes"}
    assert task.instruction == "Write 42 to /app/answer.txt\n"
    assert task.name == "task" and task.test_script.endswith("task/tests/test.sh")
    assert task.solution_dir.endswith("task/solution") and task.dockerfile.endswith("environment/Dockerfile")
    assert task.compose_file is None


def test_defaults_follow_harbor(make_task):
    c = load_task(make_task()).config
    assert c.schema_version == "1.4" and c.task is None and c.metadata == {}
    assert (c.verifier.timeout_sec, c.verifier.env, c.verifier.user) == (600.0, {}, None)
    assert (c.agent.timeout_sec, c.agent.user) == (None, None)
    e = c.environment
    assert (e.build_timeout_sec, e.docker_image, e.os, e.cpus, e.memory_mb, e.network_mode) == (
        600.0, None, "linux", None, None, None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"memory": "4G", "storage": "10G"}, {"memory_mb": 4096, "storage_mb": 10240}),
        ({"memory": "512M"}, {"memory_mb": 512}),
        ({"memory": "1.5g"}, {"memory_mb": 1536}),
        ({"memory": "2G", "memory_mb": 2048}, {"memory_mb": 2048}),
        ({"allow_internet": False}, {"network_mode": "no-network"}),
        ({"allow_internet": True}, {"network_mode": "public"}),
        ({"allow_internet": False, "network_mode": "public"}, {"network_mode": "public"}),
    ],
)
def test_legacy_keys(env, expected):
    config = parse_task_config({"version": "1.0", "environment": env})
    assert config.schema_version == "1.0"
    got = msgspec.to_builtins(config.environment)
    assert {k: got.get(k) for k in expected} == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"verifier": {"timeout_sec": "soon"}}, r"Expected `float`, got `str` - at `verifier.timeout_sec`"),
        ({"environment": {"memory": "4GB"}}, r"environment.memory='4GB' is not a size"),
        ({"environment": {"memory": "4G", "memory_mb": 1}}, r"conflicts with environment.memory_mb"),
        ({"environment": {"network_mode": "open"}}, r"at `environment.network_mode`"),
        ({"environment": {"cpus": 0}}, r"environment.cpus must be a positive number"),
        ({"environment": {"memory_mb": -5}}, r"environment.memory_mb must be a positive"),
        ({"verifier": {"timeout_sec": float("nan")}}, r"verifier.timeout_sec must be a positive"),
        ({"agent": {"timeout_sec": 0}}, r"agent.timeout_sec must be a positive"),
        ({"environment": {"gpus": -1}}, r"gpus must not be negative"),
        ({"environment": {"allowed_hosts": ["x.org"]}}, r"allowed_hosts is only valid with network_mode"),
        ({"environment": {"workdir": "app"}}, r"workdir must be an absolute path"),
        ({"environment": {"os": "Windows"}}, r"windows"),
        ({"task": {"name": "no-org"}}, r"task.name must look like 'org/name'"),
        ({"task": {"name": "a/../b"}}, r"task.name must look like"),
        (
            {"verifier": {"environment_mode": "shared", "environment": {}}},
            r"contradicts \[verifier.environment\]",
        ),
        ({"environment": {"gpus": 1}}, r"environment.gpus = 1: platoon's sandboxes provide no GPU"),
        ({"verifier": {"environment": {"gpus": 2}}}, r"verifier.environment.gpus = 2"),
        ({"environment": {"tpu": {"type": "v6e", "topology": "2x4"}}}, r"environment.tpu: .* no TPU"),
        (
            {"environment": {"mcp_servers": [{"name": "m", "url": "http://m"}]}},
            r"environment.mcp_servers: platoon does not run",
        ),
        ({"environment": {"skills_dir": "/skills"}}, r"environment.skills_dir: .* do not load"),
        (
            {"verifier": {"collect": [{"command": "x", "service": "db"}]}},
            r"verifier.collect.0.service = 'db': platoon runs only the main",
        ),
        ({"artifacts": [{"source": "/x", "service": "db"}]}, r"artifacts.0.service = 'db'"),
        ({"artifacts": ["/app/../etc"]}, r"artifacts.0 source '/app/../etc' must be a path without '..'"),
        (
            {"artifacts": [{"source": "/x", "destination": "../up"}]},
            r"artifacts.0.destination '../up' must be a relative",
        ),
        ({"artifacts": [{"source": "/x", "destination": "manifest.json"}]}, r"'manifest.json' is reserved"),
        ({"steps": [{"name": "a/b"}]}, r"steps.0.name 'a/b' is not a portable directory name"),
        ({"steps": [{"name": "One"}, {"name": "one"}]}, r"steps.1.name 'one' repeats another step's name"),
        (
            {"steps": [{"name": "one", "agent": {"timeout_sec": -1}}]},
            r"steps.0.agent.timeout_sec must be a positive",
        ),
        (
            {"steps": [{"name": "one", "verifier": {"collect": [{"command": "x", "service": "db"}]}}]},
            r"steps.0.verifier.collect.0.service",
        ),
        (
            {"environment": {"healthcheck": {"command": "x", "retries": -1}}},
            r"healthcheck.retries must not be negative",
        ),
        (
            {"verifier": {"environment": {"memory": "lots"}}},
            r"verifier.environment.memory='lots' is not a size",
        ),
        ({"environment": {"allow_internet": "yes"}}, r"allow_internet must be true or false"),
        ({"verifier": {"timeout_sec": 1e308}}, r"verifier.timeout_sec must be at most 604800 \(a week\)"),
        ({"agent": {"timeout_sec": 1e9}}, r"agent.timeout_sec must be at most 604800"),
        ({"schema_version": "99"}, r"schema_version '99' is not one platoon reads"),
        ({"schema_version": "2.0"}, r"schema_version '2.0' is not one platoon reads"),
    ],
)
def test_invalid_values_are_refused_with_the_key(raw, message):
    with pytest.raises(HarborError, match=message):
        parse_task_config(raw)


def test_env_templates(monkeypatch):
    monkeypatch.setenv("PLATOON_T", "host")
    allowed = ["PLATOON_T", "PLATOON_NOPE"]
    assert resolve_env({"a": "${PLATOON_T}", "b": "${PLATOON_NOPE:-d}", "c": "x${PLATOON_T}", "d": "${PLATOON_T:-d}"}, allowed=allowed) == {
        "a": "host", "b": "d", "c": "x${PLATOON_T}", "d": "host",
    }  # fmt: skip
    with pytest.raises(HarborError, match=r"'PLATOON_NOPE' .* not set"):
        resolve_env({"a": "${PLATOON_NOPE}"}, allowed=allowed)


def test_a_task_reads_only_the_host_variables_its_entry_passes(monkeypatch):
    """A task is untrusted: naming the trainer's key in a template must not hand it over."""
    monkeypatch.setenv("TINKER_API_KEY", "tml-secret")
    with pytest.raises(HarborError, match=r"'TINKER_API_KEY' .* \(service_kwargs.pass_env\)"):
        resolve_env({"LEAKED": "${TINKER_API_KEY}"})
    assert resolve_env({"LEAKED": "${TINKER_API_KEY:-none}"}) == {"LEAKED": "none"}
    assert resolve_env({"KEY": "${TINKER_API_KEY}"}, allowed=["TINKER_API_KEY"]) == {"KEY": "tml-secret"}


def test_sandbox_spec_maps_image_workdir_resources_and_network(make_task, tmp_path):
    task = load_task(make_task(toml=FULL))
    spec = sandbox_spec_for(task)
    assert (spec.image, spec.workdir, spec.cpus, spec.memory_mb, spec.network, spec.env) == (
        "ghcr.io/acme/add:1", "/work", 2.0, 4096, True, {"LANG": "C.UTF-8"},
    )  # fmt: skip
    plain = load_task(make_task("plain"))
    assert sandbox_spec_for(plain).network is False  # the task did not ask
    assert sandbox_spec_for(plain, default_network=True).network is True
    assert sandbox_spec_for(plain, rootfs=tmp_path).rootfs == str(tmp_path)
    assert sandbox_spec_for(plain).workdir == "/app"
    for name, mode in (("off", "no-network"), ("allow", "allowlist")):
        toml = f'[environment]\nnetwork_mode = "{mode}"\n'
        assert sandbox_spec_for(load_task(make_task(name, toml=toml))).network is False
    legacy = load_task(make_task("legacy", toml="[environment]\nallow_internet = true\n"))
    assert sandbox_spec_for(legacy).network is True


# Harbor's own models, from the venv README's test command builds (tests/envs/harbor/runner_check.py)
# or from the interpreter PLATOON_HARBOR_PYTHON names.
HARBOR_PYTHON = os.environ.get("PLATOON_HARBOR_PYTHON") or str(built_harbor_python() or "")
needs_harbor = pytest.mark.skipif(
    not HARBOR_PYTHON,
    reason="Harbor's venv is not built: python tests/envs/harbor/runner_check.py (or set PLATOON_HARBOR_PYTHON)",
)
_DUMP = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    from harbor.models.task.config import TaskConfig
    c = TaskConfig.model_validate_toml(open(sys.argv[1]).read())
    print(json.dumps(c.model_dump(mode="json")))
    """
)
# Every kind of field at once, the refused ones too (decoded, not yet refused).
EVERY_KIND = """schema_version = "1.4"
artifacts = ["/app/out.log", { source = "/app/logs", destination = "logs", exclude = ["*.tmp"] }]
multi_step_reward_strategy = "final"

[[steps]]
name = "one"
min_reward = 0.5
artifacts = ["/app/one.txt"]
[steps.agent]
timeout_sec = 30
network_mode = "no-network"
[steps.verifier]
timeout_sec = 20
env = { STEP = "1" }
[steps.healthcheck]
command = "true"
start_interval_sec = 0.5

[[steps]]
name = "two"
min_reward = { reward = 1.0, exact = 0.5 }
[steps.verifier.environment]
memory = "1G"
allow_internet = false

[verifier]
collect = [{ command = "dump-state", timeout_sec = 5, user = "root" }]
[verifier.environment]
docker_image = "verifier:1"
cpus = 1

[environment]
cpus = 2
gpus = 0
gpu_types = ["H100"]
skills_dir = "/skills"
tpu = { type = "v6e", topology = "2x4" }
mcp_servers = [{ name = "files", transport = "stdio", command = "mcp-files", args = ["-q"] }]
network_mode = "allowlist"
allowed_hosts = ["pypi.org"]
"""


def _normalized(ours: object, theirs: object) -> object:
    """Ours as Harbor dumps it: an unset environment network is Harbor's default, `public`, and
    empty MCP headers are left out."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out = {k: _normalized(v, theirs.get(k)) for k, v in ours.items()}
        if "build_timeout_sec" in ours and out.get("network_mode") is None:
            out["network_mode"] = "public"
        if "transport" in ours and not ours.get("headers"):
            out.pop("headers", None)
        return out
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [_normalized(a, b) for a, b in zip(ours, theirs, strict=True)]
    return ours


@needs_harbor
@pytest.mark.parametrize(
    "toml",
    [
        FULL.replace("unknown_root_key", "# unknown").replace('"${PLATOON_TEST_TOKEN:-fallback}"', '"x"'),
        'version = "1.0"\n[environment]\nmemory = "4G"\nstorage = "10G"\nallow_internet = false\n',
        "[verifier]\ntimeout_sec = 30\n[agent]\nuser = 0\n",
        EVERY_KIND,
    ],
)
def test_matches_harbors_own_models(tmp_path, toml):
    import tomllib

    path = tmp_path / "task.toml"
    path.write_text(toml)
    theirs = json.loads(
        subprocess.run([HARBOR_PYTHON, "-c", _DUMP, str(path)], capture_output=True, check=True).stdout
    )
    ours = msgspec.to_builtins(decode_task_config(tomllib.loads(toml)))
    assert _normalized(ours, theirs) == theirs


# --- the docs table of every field ------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[3] / "docs" / "how-to" / "harbor-tasks.md"
# Where each table of the schema is documented: a step's `agent` and `verifier` are `[agent]` and
# `[verifier]`, every `environment` is `[environment]`.
_CANONICAL = {
    harbor_config.TaskConfig: "",
    harbor_config.PackageInfo: "task.",
    harbor_config.Author: "task.authors.",
    harbor_config.VerifierConfig: "verifier.",
    harbor_config.EnvironmentConfig: "environment.",
    harbor_config.TpuSpec: "environment.tpu.",
    harbor_config.Healthcheck: "environment.healthcheck.",
    harbor_config.MCPServerConfig: "environment.mcp_servers.",
    harbor_config.VerifierCollectConfig: "verifier.collect.",
    harbor_config.AgentConfig: "agent.",
    harbor_config.SolutionConfig: "solution.",
    harbor_config.ArtifactConfig: "artifacts.",
    harbor_config.StepConfig: "steps.",
}
# Read, and mapped to a current field, but not a field of its own.
_LEGACY = {"environment.allow_internet"}


def _our_fields() -> set[str]:
    inspect = msgspec.inspect
    fields = set()
    for cls, prefix in _CANONICAL.items():
        fields |= {prefix + f.name for f in inspect.type_info(cls).fields}
    return fields


def _documented() -> dict[str, str]:
    rows = re.findall(r"^\| `([\w.]+)` \| (.+) \|$", DOCS.read_text(), re.M)
    return dict(rows)


def test_every_field_of_the_schema_has_a_row_in_the_docs_table_and_no_row_is_stale():
    documented = _documented()
    ours = _our_fields()
    assert ours - set(documented) == set(), "fields without a row in docs/how-to/harbor-tasks.md"
    assert set(documented) - ours - _LEGACY == set(), "rows for fields the code does not have"


def test_every_table_of_the_schema_is_mapped_to_its_rows():
    """A new struct in config.py must say where its rows are (else its fields go unchecked)."""
    inspect = msgspec.inspect
    seen, todo = set(), [harbor_config.TaskConfig]
    while todo:
        cls = todo.pop()
        seen.add(cls)
        for field in inspect.type_info(cls).fields:
            stack = [field.type]
            while stack:
                kind = stack.pop()
                if isinstance(kind, inspect.StructType) and kind.cls not in seen:
                    todo.append(kind.cls)
                stack += [getattr(kind, a) for a in ("item_type", "value_type") if hasattr(kind, a)]
                stack += list(getattr(kind, "types", ()))
    assert seen == set(_CANONICAL)


def test_what_the_table_calls_refused_is_refused():
    """Each row that says **refused** names a field whose setting the loader refuses."""
    refused = {field for field, text in _documented().items() if "**refused**" in text}
    assert refused == {
        "artifacts.service",
        "verifier.collect.service",
        "environment.os",
        "environment.gpus",
        "environment.tpu",
        "environment.skills_dir",
        "environment.mcp_servers",
    }


_WALK = textwrap.dedent(
    """
    import json, typing, warnings
    warnings.simplefilter("ignore")
    from pydantic import BaseModel
    from harbor.models.task import config as c
    canonical = {
        c.TaskConfig: "", c.PackageInfo: "task.", c.Author: "task.authors.", c.VerifierConfig: "verifier.",
        c.EnvironmentConfig: "environment.", c.TpuSpec: "environment.tpu.",
        c.HealthcheckConfig: "environment.healthcheck.", c.MCPServerConfig: "environment.mcp_servers.",
        c.VerifierCollectConfig: "verifier.collect.", c.AgentConfig: "agent.", c.SolutionConfig: "solution.",
        c.ArtifactConfig: "artifacts.", c.StepConfig: "steps.",
    }
    fields, seen, todo = set(), set(), [c.TaskConfig]
    while todo:
        model = todo.pop()
        seen.add(model)
        for name, info in model.model_fields.items():
            fields.add(canonical[model] + name)
            stack = [info.annotation]
            while stack:
                kind = stack.pop()
                if isinstance(kind, typing.ForwardRef):
                    kind = kind.__forward_arg__
                if isinstance(kind, str):  # a forward reference by name (or a Literal's value)
                    kind = getattr(c, kind, None)
                if isinstance(kind, type) and issubclass(kind, BaseModel):
                    if kind not in seen:
                        todo.append(kind)
                else:
                    stack += list(typing.get_args(kind))
    print(json.dumps(sorted(fields)))
    """
)


@needs_harbor
def test_our_schema_has_every_field_of_harbors():
    """A Harbor release that adds a field fails here until the field is honoured or refused."""
    theirs = set(
        json.loads(subprocess.run([HARBOR_PYTHON, "-c", _WALK], capture_output=True, check=True).stdout)
    )
    assert theirs == _our_fields() | _LEGACY
