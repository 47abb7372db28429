"""The held-out check of platoon's Harbor support against Harbor's own runner: the same task
directories played by Harbor's oracle and no-op agents (`harbor run`, in a Python 3.12 venv,
on platoon's bubblewrap sandbox through `platoon.envs.harbor.runner_env`) and by platoon's eval
with scripted policies doing the same (the task's own solve.sh through the bash tool; nothing),
their rewards compared task by task, every key of reward.json and each step's of a multi-step
task included.

Used by tests/envs/harbor/test_harbor_runner_check.py and benchmarks/harbor_runner.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import anyio

from platoon.config import load_site
from platoon.harness.toolchain import Toolchain, build_toolchain, find_python, toolchain_dir

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE_DATASET = ROOT / "examples" / "harbor-dataset" / "dataset"
# Harbor and what importing platoon's Harbor modules needs beyond Harbor's own dependencies.
HARBOR = Toolchain(pip=["harbor==0.25.0", "msgspec>=0.18", "structlog>=24"], python="3.12")
ENVIRONMENT = "platoon.envs.harbor.runner_env:PlatoonEnvironment"
Rewards = dict[str, float]

# The dataset the scripted policies look solutions up in (set by whoever runs the check).
DATASET: Path | None = None


def no_python() -> str | None:
    """Why Harbor's runner cannot run here (None: it can)."""
    if find_python(HARBOR.version or "3.12", load_site().pythons) is None:
        return "Harbor needs Python 3.12 and there is none here (the site's pythons:, PATH, pyenv, uv)"
    return None


def harbor_python() -> Path:
    """The interpreter of a venv with Harbor, built once into the site cache (as command-line
    agents' toolchains are); raises ToolchainError saying why it could not be."""
    site = load_site()
    folder = anyio.run(build_toolchain, HARBOR, site.cache, site.pythons)
    return folder / "bin" / "python"


def run_harbor(
    python: Path,
    dataset: Path,
    agents: list[str],
    jobs: Path,
    cache: Path,
    *,
    stopped: dict[str, str] | None = None,
) -> dict[str, dict[str, Rewards]]:
    """One `harbor run` of every task of `dataset` with each of `agents` on platoon's sandbox:
    per agent, each task's rewards (with `steps/<name>/<key>` for a multi-step task's steps),
    by directory name. A trial whose agent Harbor stopped at the task's time limit (and then
    verified, as it does) fails the check unless `stopped` is given: it collects those tasks'
    exception messages."""
    job = {
        "jobs_dir": str(jobs),
        "n_concurrent_trials": 4,
        "quiet": True,
        "environment": {"import_path": ENVIRONMENT, "kwargs": {"cache": str(cache)}},
        "agents": [{"name": agent} for agent in agents],
        "datasets": [{"path": str(dataset)}],
    }
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / "job.json").write_text(json.dumps(job))
    env = {
        **_plain_env(),
        "HOME": str(jobs),  # what Harbor keeps in ~/.cache/harbor stays with the job
        "PYTHONPATH": str(ROOT / "src"),
        "HARBOR_TELEMETRY": "0",  # Harbor reports each job to PostHog unless told not to
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # and litellm fetches model prices
    }
    script = "import sys; from harbor.cli.main import app; sys.argv[0] = 'harbor'; app()"
    argv = [str(python), "-c", script, "run", "-c", str(jobs / "job.json")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"harbor run exited with {done.returncode}: {(done.stderr or done.stdout)[-3000:]}"
        )
    found: dict[str, dict[str, Rewards]] = {agent: {} for agent in agents}
    for path in jobs.glob("*/*/result.json"):
        result = json.loads(path.read_text())
        name = Path(result["config"]["task"]["path"]).name
        exception = result.get("exception_info")
        if exception and stopped is not None and exception.get("exception_type") == "AgentTimeoutError":
            stopped[name] = str(exception.get("exception_message"))
        elif exception:
            raise RuntimeError(f"{name}: Harbor's trial failed: {exception}")
        rewards = dict((result.get("verifier_result") or {}).get("rewards") or {})
        for step in result.get("step_results") or []:
            for key, value in ((step.get("verifier_result") or {}).get("rewards") or {}).items():
                rewards[f"steps/{step['step_name']}/{key}"] = value
        found[result["agent_info"]["name"]][name] = {k: float(v) for k, v in rewards.items()}
    return found


def _plain_env() -> dict[str, str]:
    """The environment Harbor runs with: this one's system settings, none of its keys."""
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
    return {k: os.environ[k] for k in keep if k in os.environ}


def run_platoon(
    dataset: Path, policy: str, run_dir: Path, cache: Path, harness: str = "platoon-bash"
) -> dict[str, Rewards]:
    """platoon's eval of every task of `dataset` (its train split: no holdout) with `harness`
    and the scripted `policy` (`solve`, `noop` or `slow_mini` of this module)."""
    from platoon.api import evaluate
    from platoon.config import load_config

    global DATASET
    DATASET = dataset
    config_path = run_dir / "check.yaml"
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path.write_text(CONFIG.format(dataset=dataset, cache=cache, harness=harness))
    config = load_config(config_path)
    report = anyio.run(
        lambda: evaluate(config, run_dir, policy=f"scripted:{__name__}:{policy}", split="train")
    )
    found: dict[str, Rewards] = {}
    for task in report.tasks:
        if task.failures or len(task.rewards) != 1:
            raise RuntimeError(f"{task.task_id}: platoon's episode failed: {task.failures}")
        [reward] = task.rewards
        parts = task.parts[0] if task.parts else {}
        found[task.task_id] = {**parts, **({} if reward is None else {"reward": reward})}
    return found


CONFIG = """\
environments:
  - name: check
    service: harbor
    service_kwargs: {{dataset: "{dataset}", provider: bwrap, cache: "{cache}"}}
    harness: {harness}
train:
  model_name: Qwen/Qwen3-4B-Instruct-2507
  renderer_name: qwen3_instruct
  workflow_config:
    rollout_config: {{max_steps: 4}}
eval: {{group_size: 1}}
stats: {{wandb: {{mode: disabled}}}}
"""


# A multi-step task: two steps in one sandbox, each with its own tests, solution and side
# metrics; `kept` is only the last step's, so its mean counts the first step's missing key as 0.
STEPS_TASK = {
    "task.toml": """\
schema_version = "1.4"
multi_step_reward_strategy = "mean"

[metadata]
topic = "steps"

[agent]
timeout_sec = 60.0

[verifier]
timeout_sec = 30.0

[environment]
network_mode = "no-network"

[[steps]]
name = "count"

[[steps]]
name = "shout"
""",
    "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY notes.txt /app/notes.txt\n",
    "environment/notes.txt": "buy milk\ncall bob\nfix the bike\n",
    "steps/count/instruction.md": "Write the number of lines of /app/notes.txt to /app/count.txt.\n",
    "steps/count/solution/solve.sh": "#!/bin/bash\nwc -l < /app/notes.txt > /app/count.txt\n",
    "steps/count/tests/test.sh": """\
#!/bin/bash
answer=$(tr -d '[:space:]' < /app/count.txt 2>/dev/null)
answered=0; [ -n "$answer" ] && answered=1
reward=0; [ "$answer" = 3 ] && reward=1
printf '{"reward": %s, "answered": %s}\\n' "$reward" "$answered" > /logs/verifier/reward.json
""",
    "steps/shout/instruction.md": "Write /app/notes.txt in upper case to /app/shout.txt.\n",
    "steps/shout/solution/solve.sh": "#!/bin/bash\ntr a-z A-Z < /app/notes.txt > /app/shout.txt\n",
    "steps/shout/tests/test.sh": """\
#!/bin/bash
reward=0; [ "$(cat /app/shout.txt 2>/dev/null)" = "$(tr a-z A-Z < /app/notes.txt)" ] && reward=1
answered=0; [ -s /app/shout.txt ] && answered=1
kept=0; [ "$(wc -l < /app/notes.txt)" = 3 ] && kept=1
printf '{"reward": %s, "answered": %s, "kept": %s}\\n' "$reward" "$answered" "$kept" > /logs/verifier/reward.json
""",
}


# A task whose solution writes its answer, then works past the agent's 20 s (time for a command-line
# agent to start on a loaded machine and run its first command): Harbor's oracle is stopped at the
# limit and the tests grade what it left (the answer, not the finish).
SLOW_TASK = {
    "task.toml": """\
schema_version = "1.4"

[agent]
timeout_sec = 20.0

[verifier]
timeout_sec = 30.0

[environment]
network_mode = "no-network"
""",
    "instruction.md": "Write 42 to /app/answer.txt, then write done to /app/finished.txt.\n",
    "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\n",
    "solution/solve.sh": "#!/bin/bash\necho 42 > /app/answer.txt\nsleep 120\necho done > /app/finished.txt\n",
    "tests/test.sh": """\
#!/bin/bash
answered=0; [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ] && answered=1
finished=0; [ -s /app/finished.txt ] && finished=1
printf '{"reward": %s, "answered": %s, "finished": %s}\\n' "$(( answered + finished ))" "$answered" "$finished" \\
  > /logs/verifier/reward.json
""",
}


def write_steps_task(dataset: Path, name: str = "notes-steps", files: Mapping[str, str] = STEPS_TASK) -> Path:
    """Write `files` (STEPS_TASK, or SLOW_TASK) into `dataset` as task `name`."""
    task = dataset / name
    for rel, text in files.items():
        path = task / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if path.suffix == ".sh":
            path.chmod(0o755)
    return task


# --- the scripted policies: Harbor's oracle and no-op agents, through platoon's bash tool -------


def solve(messages: list[dict]) -> str:
    """Run the solve.sh of the task (or step) whose instruction this is, then answer."""
    if any(m.get("role") == "tool" for m in messages):
        return "Done."
    instruction = next(m["content"] for m in messages if m.get("role") == "user")
    call = {"name": "bash", "arguments": {"command": _solution_for(instruction)}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


async def slow_mini(messages: list[dict]) -> str:
    """mini-swe-agent's first command is the first line of the task's solve.sh; its next turn
    never comes (a policy slower than the task's agent time limit)."""
    if any(m.get("role") == "assistant" for m in messages):
        await anyio.sleep_forever()
    prompt = "\n".join(str(m["content"]) for m in messages if m.get("role") == "user")
    first = next(
        line for line in _solution_for(prompt, within=True).splitlines() if line and not line.startswith("#")
    )
    call = {"name": "bash", "arguments": {"command": first}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def noop(messages: list[dict]) -> str:
    """Answer at once, running nothing (Harbor's `nop` agent)."""
    return "Done."


def _solution_for(instruction: str, *, within: bool = False) -> str:
    """The solve.sh of the task whose instruction this is (`within`: that the text holds, as an
    agent's own prompt template holds it)."""
    assert DATASET is not None, "run_platoon sets the dataset"
    for text in DATASET.glob("**/instruction.md"):
        if text.read_text() == instruction or (within and text.read_text().strip() in instruction):
            return (text.parent / "solution" / "solve.sh").read_text()
    raise LookupError(f"no task of {DATASET} has this instruction")


# --- the comparison ---------------------------------------------------------------------------


def compare(ours: Mapping[str, Rewards], theirs: Mapping[str, Rewards]) -> list[str]:
    """Each difference between the two runs' rewards, task by task and key by key."""
    problems = []
    for task in sorted(set(ours) | set(theirs)):
        mine, harbor = ours.get(task), theirs.get(task)
        if mine is None or harbor is None:
            problems.append(f"{task}: only {'Harbor' if mine is None else 'platoon'} has a result")
        elif mine != harbor:
            problems.append(f"{task}: platoon {mine} != Harbor {harbor}")
    return problems


def table(runs: Mapping[str, tuple[Mapping[str, Rewards], Mapping[str, Rewards]]]) -> str:
    """One row per task and key: each agent's reward from platoon and from Harbor's runner."""
    agents = list(runs)
    tasks = sorted({t for ours, theirs in runs.values() for t in (*ours, *theirs)})
    head = ["task", "key", *(f"{a} {side}" for a in agents for side in ("platoon", "harbor"))]
    rows = [head]
    for task in tasks:
        keys = sorted(
            {k for ours, theirs in runs.values() for k in (*ours.get(task, {}), *theirs.get(task, {}))},
            key=lambda k: (k != "reward", k),
        )
        for key in keys:
            cells = [task, key]
            for ours, theirs in runs.values():
                for side in (ours, theirs):
                    value = side.get(task, {}).get(key)
                    cells.append("-" if value is None else f"{value:g}")
            rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def built_harbor_python() -> Path | None:
    """The interpreter of Harbor's venv if it is built already (README's test command builds it
    with `python tests/envs/harbor/runner_check.py`), without building it."""
    python = toolchain_dir(HARBOR, load_site().cache) / "bin" / "python"
    return python if python.exists() else None


if __name__ == "__main__":  # build Harbor's venv ahead, as `platoon harness install` does agents'
    print(f"Harbor's runner: ready ({harbor_python()})")
