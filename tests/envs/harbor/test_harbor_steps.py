"""Multi-step Harbor tasks: the reward strategies (as Harbor derives them), a session playing its
steps in one sandbox, and an episode on the bus whose program plays every step."""

from __future__ import annotations

import shutil

import pytest
from test_service_bus import harbor_system, play

from platoon.bus.events import EpisodeFinished, EpisodeGraded, ToolReturned
from platoon.envs import TaskInfo
from platoon.envs.harbor import HarborError, load_task
from platoon.envs.harbor.service import HarborBackend
from platoon.envs.harbor.steps import combine_steps, min_reward_failure

pytestmark = pytest.mark.anyio
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
TASK = TaskInfo(split="train", task_id="steps", index=0)


@pytest.mark.parametrize(
    ("strategy", "results", "expected"),
    [
        (None, [{"reward": 1.0, "exact": 1.0}, {"reward": 0.0}], {"reward": 0.5, "exact": 0.5}),
        ("mean", [{"reward": 1.0}, None, {"reward": 0.5}], {"reward": 0.75}),  # no result: not counted
        ("mean", [None, None], None),
        ("final", [{"reward": 1.0}, {"reward": 0.25, "exact": 0.0}], {"reward": 0.25, "exact": 0.0}),
        ("final", [{"reward": 1.0}, None], None),
        ("final", [], None),
    ],
)
def test_combining_steps_as_harbor_does(strategy, results, expected):
    assert combine_steps(strategy, results) == expected


@pytest.mark.parametrize(
    ("rewards", "threshold", "failure"),
    [
        ({"reward": 0.5}, None, None),
        ({"reward": 0.5}, 0.5, None),
        ({"reward": 0.4}, 0.5, "reward=0.4 is below its min_reward 0.5"),
        ({"reward": 1.0}, {"reward": 1.0, "exact": 0.5}, "exact=-inf is below its min_reward 0.5"),
        (None, 0.0, "reward=-inf is below its min_reward 0"),
    ],
)
def test_min_reward_gates_a_step(rewards, threshold, failure):
    assert min_reward_failure(rewards, threshold) == failure


STEP_TEST = """\
#!/bin/bash
reward=0; [ "$(cat /app/{name}.txt 2>/dev/null)" = {name} ] && reward=1
seen=$(ls /tests | tr '\\n' ' ')
echo "{{\\"reward\\": $reward}}" > /logs/verifier/reward.json
echo "$seen" > /app/{name}-saw-tests.txt
"""


def steps_task(make_task, head: str = "", one: str = "", **files: str):
    """Two steps, `one` and `two`: each writes its name to /app/<name>.txt. Step one's workdir
    brings a file and a setup.sh that uses it; step two uses the task's shared tests/helper.
    `head` goes before the steps, `one` into step one's table."""
    return make_task(
        "steps",
        toml=f'{head}[[steps]]\nname = "one"\n{one}[[steps]]\nname = "two"\n',
        instruction=None,
        test_sh=None,
        files={
            "steps/one/instruction.md": "Step one: write one to one.txt\n",
            "steps/one/tests/test.sh": STEP_TEST.format(name="one"),
            "steps/one/workdir/seed.txt": "seeded\n",
            "steps/one/workdir/setup.sh": "cp seed.txt from-setup.txt\n",
            "steps/two/instruction.md": "Step two: write two to two.txt\n",
            "steps/two/tests/test.sh": STEP_TEST.format(name="two"),
            "tests/helper.txt": "shared\n",
            **files,
        },
    )


def test_a_multi_step_task_loads_its_steps(make_task):
    task = load_task(steps_task(make_task))
    assert [s.name for s in task.steps] == ["one", "two"]
    assert task.instruction == "Step one: write one to one.txt\n"
    assert [p.rsplit("/", 2)[-2:] for p in task.steps[1].tests_dirs] == [["steps", "tests"], ["two", "tests"]]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"steps/two/instruction.md": None}, r"steps/two/instruction.md is missing"),
        ({"steps/two/tests/test.sh": None}, r"neither steps/two/tests/test.sh nor tests/test.sh"),
        ({"steps/one/trajectory.json": "{}"}, r"steps/one/trajectory.json: platoon does not seed"),
    ],
)
def test_a_step_with_missing_parts_is_refused(make_task, files, message):
    task = steps_task(make_task, **{k: v for k, v in files.items() if v is not None})
    for rel, text in files.items():
        if text is None:
            (task / rel).unlink()
    with pytest.raises(HarborError, match=message):
        load_task(task)


@needs_bwrap
async def test_a_session_plays_each_step_and_combines_their_rewards(make_task, tmp_path):
    steps_task(make_task)
    harbor = HarborBackend(tmp_path / "tasks", provider="bwrap", cache=str(tmp_path / "cache"))
    session = await harbor.open(TASK, {})
    try:
        assert session.step_count == 2 and session.instruction.startswith("Step one")
        setup = await session.call_tool("bash", {"command": "cat from-setup.txt; echo one > one.txt"})
        assert setup.output == "seeded\n[exit code 0]"  # the step's workdir files, and its setup.sh ran
        assert await session.next_step() == "Step two: write two to two.txt\n"
        # The first step's tests were put away before the second step's agent came.
        between = await session.call_tool(
            "bash", {"command": "ls -A /tests /logs/verifier; cat one-saw-tests.txt"}
        )
        assert between.output == "/logs/verifier:\n\n/tests:\nhelper.txt test.sh \n[exit code 0]"
        await session.call_tool("bash", {"command": "echo wrong > two.txt"})
        assert await session.next_step() is None
        grade = await session.grade()
        saw = await session.sandbox.exec("cat /app/two-saw-tests.txt")
    finally:
        await session.close()
    assert (grade.reward, grade.reason) == (0.5, None)
    assert grade.rewards == {"reward": 0.5, "steps/one/reward": 1.0, "steps/two/reward": 0.0}
    assert saw.stdout == "helper.txt test.sh \n"  # the task's tests, then the step's own


@needs_bwrap
async def test_a_step_below_its_min_reward_ends_the_task(make_task, tmp_path):
    steps_task(make_task, one="min_reward = 1.0\n")
    harbor = HarborBackend(tmp_path / "tasks", provider="bwrap", cache=str(tmp_path / "cache"))
    session = await harbor.open(TASK, {})
    try:
        await session.call_tool("bash", {"command": "echo nope > one.txt"})
        assert await session.next_step() is None
        grade = await session.grade()
    finally:
        await session.close()
    assert (grade.reward, grade.rewards) == (0.0, {"reward": 0.0, "steps/one/reward": 0.0})
    assert grade.reason == "step 'one' ended the task: reward=0 is below its min_reward 1"


@needs_bwrap
async def test_the_final_strategy_takes_the_last_step_and_unplayed_steps_are_said(make_task, tmp_path):
    steps_task(make_task, head='multi_step_reward_strategy = "final"\n')
    harbor = HarborBackend(tmp_path / "tasks", provider="bwrap", cache=str(tmp_path / "cache"))
    session = await harbor.open(TASK, {})
    try:
        await session.call_tool("bash", {"command": "echo one > one.txt"})
        grade = await session.grade()  # graded after step one: a program that plays one step
    finally:
        await session.close()
    assert grade.reward == 1.0
    assert grade.reason == "steps two were not played"


def step_policy(messages: list[dict]) -> str:
    """Each run of the harness sees its step's instruction: do what it says, then stop."""
    instruction = next(m["content"] for m in messages if m.get("role") == "user")
    if any(m.get("role") == "assistant" for m in messages):
        return "Done."
    name = "one" if "Step one" in instruction else "two"
    return f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "echo {name} > {name}.txt"}}}}\n</tool_call>'


@needs_bwrap
@pytest.mark.parametrize("program", ["single", "compacting"])
async def test_an_episode_plays_every_step_on_the_bus(toy_tokenizer, make_task, tmp_path, program):
    task = steps_task(make_task)
    options = {"compact_at_tokens": 100_000} if program == "compacting" else {}
    entry = {"program": program, "program_options": options}
    async with harbor_system(toy_tokenizer, task.parent, step_policy, tmp_path / "state", **entry) as bus:
        events = await play(bus, "steps")
    commands = [e.output for e in events if isinstance(e, ToolReturned)]
    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    assert commands == ["[exit code 0]", "[exit code 0]"]  # one command per step
    assert (finished.status, finished.num_model_calls) == ("completed", 4)
    assert (graded.reward, graded.reason) == (1.0, None)
    assert graded.rewards == {"reward": 1.0, "steps/one/reward": 1.0, "steps/two/reward": 1.0}
