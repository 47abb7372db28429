"""The held-out check: Harbor's own runner (0.25, its oracle and no-op agents, its verifier and
reward parsing) and platoon's eval play the same task directories, the example dataset's and a
multi-step task, and agree on every reward task by task: the `reward`, each side metric of
reward.json, and each step's. Harbor runs on platoon's bubblewrap sandbox
(`platoon.envs.harbor.runner_env`), from a Python 3.12 venv built once into the site cache."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import runner_check
from runner_check import EXAMPLE_DATASET, compare, run_harbor, run_platoon, table, write_steps_task

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]

AGENTS = (("oracle", "solve"), ("nop", "noop"))  # Harbor's agents, and platoon's scripted policies like them


@pytest.fixture(scope="module")
def harbor_python():
    why = runner_check.no_python()
    if why is not None:
        pytest.skip(why)
    started = time.monotonic()
    python = runner_check.harbor_python()  # once: later runs find it in the site cache
    print(f"Harbor's venv ready in {time.monotonic() - started:.1f} s")
    return python


def test_platoon_and_harbors_own_runner_agree_task_by_task(harbor_python, tmp_path):
    dataset = tmp_path / "dataset"
    shutil.copytree(EXAMPLE_DATASET, dataset)
    write_steps_task(dataset)
    cache = tmp_path / "cache"
    harbor = run_harbor(harbor_python, dataset, [agent for agent, _ in AGENTS], tmp_path / "jobs", cache)
    ours = {agent: run_platoon(dataset, policy, tmp_path / agent, cache) for agent, policy in AGENTS}
    runs = {agent: (ours[agent], harbor[agent]) for agent, _ in AGENTS}
    print(table(runs))

    for agent, (ours, theirs) in runs.items():
        assert compare(ours, theirs) == [], agent
        assert len(theirs) == 9  # every task of the example dataset, and the multi-step one
    oracle, nop = runs["oracle"][1], runs["nop"][1]
    assert {task: rewards["reward"] for task, rewards in oracle.items()} == dict.fromkeys(oracle, 1.0)
    assert {task: rewards["reward"] for task, rewards in nop.items()} == dict.fromkeys(nop, 0.0)
    assert oracle["csv-row-count"] == {"reward": 1.0, "answered": 1.0}  # reward.json's side metric
    # The steps' mean, in which the first step's missing `kept` counts 0, and each step's own.
    assert nop["notes-steps"]["kept"] == 0.5 and nop["notes-steps"]["steps/shout/kept"] == 1.0
    assert oracle["notes-steps"]["steps/count/reward"] == oracle["notes-steps"]["steps/shout/reward"] == 1.0


def test_an_agent_past_the_tasks_time_limit_is_graded_as_harbors_runner_grades_it(harbor_python, tmp_path):
    """Harbor's oracle runs a solution that outlasts `[agent].timeout_sec`; mini-swe-agent (a real
    command-line agent) runs its first line, then waits on a policy that never answers. Both are
    stopped at the task's limit, and the task's tests grade what each left: the same rewards."""
    import anyio

    from platoon.bus.eventlog import read_events
    from platoon.bus.events import EpisodeFinished
    from platoon.harness import get_harness

    anyio.run(get_harness("mini-swe-agent").install)  # its toolchain, once into the site cache
    dataset = tmp_path / "dataset"
    write_steps_task(dataset, "slow-answer", runner_check.SLOW_TASK)
    cache = tmp_path / "cache"
    stopped: dict[str, str] = {}
    with ThreadPoolExecutor(1) as pool:  # both wait out the task's limit: side by side
        theirs = pool.submit(
            run_harbor, harbor_python, dataset, ["oracle"], tmp_path / "jobs", cache, stopped=stopped
        )
        ours = run_platoon(dataset, "slow_mini", tmp_path / "mini", cache, harness="mini-swe-agent")
        harbor = theirs.result()
    print(table({"oracle / mini-swe-agent": (ours, harbor["oracle"])}))

    assert "timed out after 20.0 seconds" in stopped["slow-answer"]  # Harbor stopped its agent
    assert compare(ours, harbor["oracle"]) == []
    assert ours["slow-answer"] == {"reward": 1.0, "answered": 1.0, "finished": 0.0}
    [finished] = [e for e in read_events(tmp_path / "mini") if isinstance(e, EpisodeFinished)]
    assert finished.status == "limit"  # the record says which limit fired
    assert finished.reason.startswith("mini-swe-agent was stopped by the task's 20 s timeout")
