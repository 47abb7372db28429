"""Grading by the task's own tests, as Harbor's verifier does.

Old rewards are deleted, `tests/` (a step's: the task's tests, then its own) is uploaded to
/tests after the agent is done,
`test.sh` runs within `verifier.timeout_sec` with its output in
/logs/verifier/test-stdout.txt, and the reward is read from reward.json (a flat object
of finite numbers) or else reward.txt (one number). The exit status of test.sh is
ignored. A missing or malformed reward is a Grade with a reason, never an exception.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec

from ...sandbox import Sandbox, SandboxError
from ...sandbox.base import exec_phase
from .errors import HarborError
from .task import HarborStep, HarborTask, resolve_env

__all__ = ["Grade", "grade", "parse_rewards", "read_rewards"]

VERIFIER_DIR = "/logs/verifier"


class Grade(msgspec.Struct, frozen=True):
    """Every number the verifier reported, the one chosen as the reward (None when there
    is none), and why not."""

    rewards: dict[str, float]
    reward: float | None
    reason: str | None = None


async def grade(
    sandbox: Sandbox,
    task: HarborTask,
    *,
    logs_dir: str | os.PathLike[str] | None = None,
    pass_env: Sequence[str] = (),
    step: HarborStep | None = None,
    offline: bool = False,
) -> Grade:
    """Run `task`'s tests (or `step`'s, of a multi-step task) in the (started) `sandbox` and read
    the reward; `offline` runs them without the sandbox's network (the verifier phase has none).

    `logs_dir`, when given, receives /logs/verifier (test-stdout.txt and the reward files).
    """
    verifier = task.config.verifier
    timeout, user = verifier.timeout_sec, verifier.user
    sources = [task.tests_dir]
    variables = dict(verifier.env)
    if step is not None:
        own = step.config.verifier
        timeout, sources = own.timeout_sec, step.tests_dirs
        user = own.user if own.user is not None else user
        variables |= own.env
    try:
        env = resolve_env(variables, allowed=pass_env)
    except HarborError as exc:
        return Grade({}, None, f"verifier env: {exc}")
    try:
        # Nothing the agent left in /tests or as a reward may reach the verifier.
        prepared = await sandbox.exec(
            "shopt -s dotglob nullglob && rm -rf /tests/* && "
            f"mkdir -p {VERIFIER_DIR} && rm -f {VERIFIER_DIR}/reward.txt {VERIFIER_DIR}/reward.json",
            cwd="/",
        )
        if not prepared.ok:
            return Grade({}, None, f"could not prepare {VERIFIER_DIR}: {prepared.stderr.strip()}")
        for source in sources:
            await sandbox.upload(source, "/tests")
        result = await exec_phase(
            sandbox,
            f"bash /tests/test.sh > {VERIFIER_DIR}/test-stdout.txt 2>&1",
            offline=offline,
            env=env,
            timeout=timeout,
            user=None if user is None else str(user),
        )
        if result.timed_out:
            await _keep_logs(sandbox, logs_dir)
            return Grade({}, None, f"verifier timed out after {timeout:g} s")
        with tempfile.TemporaryDirectory(prefix="platoon-verifier-") as tmp:
            local = Path(logs_dir) if logs_dir is not None else Path(tmp)
            await sandbox.download(VERIFIER_DIR, local)
            return read_rewards(local)
    except SandboxError as exc:
        return Grade({}, None, f"sandbox failed during grading: {exc}")


async def _keep_logs(sandbox: Sandbox, logs_dir: str | os.PathLike[str] | None) -> None:
    if logs_dir is None:
        return
    with anyio.CancelScope(shield=True):
        try:
            await sandbox.download(VERIFIER_DIR, logs_dir)
        except SandboxError:
            pass  # the timeout is the reason reported; partial logs are a bonus


def read_rewards(verifier_dir: Path) -> Grade:
    """Read reward.json, else reward.txt, from a downloaded /logs/verifier."""
    for name in ("reward.json", "reward.txt"):
        path = verifier_dir / name
        if path.is_file():
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                return Grade({}, None, f"{name} is not UTF-8 text")
            return parse_rewards(name, text)
    return Grade({}, None, "the verifier wrote neither reward.json nor reward.txt")


def parse_rewards(name: str, text: str) -> Grade:
    """Harbor's reward files: reward.json `{"reward": 1, "acc": 0.5}` (the `reward` key,
    or the only value, is the reward) or reward.txt holding one number."""
    if not text.strip():
        return Grade({}, None, f"{name} is empty")
    if name == "reward.txt":
        try:
            value = float(text.strip())
        except ValueError:
            return Grade({}, None, f"reward.txt does not hold a number: {text.strip()[:80]!r}")
        if not math.isfinite(value):
            return Grade({}, None, f"reward.txt holds a non-finite number ({value})")
        return Grade({"reward": value}, value)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return Grade({}, None, f"reward.json is not valid JSON: {exc}")
    if not isinstance(data, dict) or not data:
        return Grade({}, None, "reward.json must be a non-empty flat object of numbers")
    rewards: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            return Grade({}, None, f"reward.json: {key!r} is not a number")
        if not math.isfinite(value):
            return Grade({}, None, f"reward.json: {key!r} is not finite ({value})")
        rewards[key] = float(value)
    if "reward" in rewards:
        return Grade(rewards, rewards["reward"])
    if len(rewards) == 1:
        return Grade(rewards, next(iter(rewards.values())))
    return Grade(rewards, None, "reward.json has several values and no 'reward' key")
