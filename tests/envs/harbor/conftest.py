"""Fixtures for Harbor tests: tiny task directories written into tmp, and podman."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

CHECK_ANSWER = """\
#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def write_task(
    root: Path,
    name: str = "task",
    *,
    toml: str = "",
    instruction: str = "Write 42 to /app/answer.txt\n",
    test_sh: str | None = CHECK_ANSWER,
    dockerfile: str | None = "FROM debian:bookworm-slim\nWORKDIR /app\n",
    files: dict[str, str] | None = None,
) -> Path:
    """A task directory with the given parts; `files` adds more (relative path -> text)."""
    task = root / name
    task.mkdir(parents=True)
    (task / "task.toml").write_text(textwrap.dedent(toml) or 'schema_version = "1.4"\n')
    if instruction is not None:
        (task / "instruction.md").write_text(instruction)
    if test_sh is not None:
        (task / "tests").mkdir()
        (task / "tests" / "test.sh").write_text(test_sh)
        (task / "tests" / "test.sh").chmod(0o755)
    if dockerfile is not None:
        (task / "environment").mkdir()
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
    return task


@pytest.fixture
def make_task(tmp_path):
    def make(name: str = "task", **kwargs) -> Path:
        return write_task(tmp_path / "tasks", name, **kwargs)

    return make


SUM_DOCKERFILE = "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY question.txt /app/question.txt\n"
SUM_TEST = """\
#!/bin/bash
[ "$(cat /app/answer.txt 2>/dev/null)" = "42" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""


@pytest.fixture
def sum_task(make_task) -> Path:
    """A task whose agent adds the two numbers of /app/question.txt into /app/answer.txt."""
    return make_task(
        "sum",
        instruction="Add the two numbers of question.txt and write the sum to answer.txt.\n",
        test_sh=SUM_TEST,
        dockerfile=SUM_DOCKERFILE,
        files={"environment/question.txt": "19 23\n"},
    )
