"""`platoon-codeact`: the model's Python runs in a separate process that calls the tools back
through the harness; output, errors, timeouts and crashes come back to the model."""

from __future__ import annotations

import os
import re

import anyio
import pytest
from agents.episodes import guessing

from platoon.bus.events import EpisodeFinished, EpisodeGraded, ModelCallFinished, ToolCalled, ToolSpec
from platoon.harness import HarnessError, get_harness, validate_options
from platoon.harness.builtin.codeact import extract_code, python_functions

pytestmark = pytest.mark.anyio

PID = "```python\nimport os\nprint('pid', os.getpid())\nlo, hi = 1, 100\n```"
SEARCH = """Now the search.
```python
while True:
    mid = (lo + hi) // 2
    answer = guess(mid)
    print(mid, answer)
    if answer == "higher":
        lo = mid + 1
    elif answer == "lower":
        hi = mid - 1
    else:
        break
```"""


class Recording:
    """A scripted policy that keeps the conversations it was shown."""

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)
        self.seen: list[list[dict]] = []

    def __call__(self, messages: list[dict]) -> str:
        self.seen.append(messages)
        return self.replies[len(self.seen) - 1]


async def test_codeact_plays_guess_the_number_in_a_subprocess(toy_tokenizer):
    policy = Recording(PID, SEARCH)
    async with guessing(toy_tokenizer, policy, "platoon-codeact") as system:
        events = await system.play("train-42")

    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    assert (finished.status, finished.final_message, finished.num_model_calls) == ("completed", "Correct!", 2)
    assert graded.reward == 1.0
    assert [e.arguments for e in events if isinstance(e, ToolCalled)][-1] == {"number": 42}
    assert len([e for e in events if isinstance(e, ModelCallFinished)]) == 2
    # The first block's output came back to the model, from another process.
    observation = policy.seen[1][-1]["content"]
    pid = int(re.search(r"pid (\d+)", observation).group(1))
    assert pid != os.getpid()
    system_prompt = policy.seen[0][0]["content"]
    assert "def guess(number: int) -> str:" in system_prompt and "Your guess, from 1 to 100." in system_prompt


@pytest.mark.slow
async def test_errors_timeouts_and_crashes_come_back_to_the_model(toy_tokenizer):
    policy = Recording(
        "```python\nx = 41\n1 / 0\n```",
        "```python\nguess('many')\n```",
        "```python\nimport time\nprint('start', flush=True)\ntime.sleep(30)\n```",
        "```python\nprint(x)\n```",
        "```python\nimport os\nos._exit(7)\n```",
        "```python\nx = 2\nprint('x' * 100000)\nx * 21\n```",
        "I give up.",
    )
    options = {"timeout_s": 1.0, "max_output_chars": 200}
    async with guessing(toy_tokenizer, policy, "platoon-codeact", harness_options=options) as system:
        events = await system.play("train-42")

    observations = [seen[-1]["content"] for seen in policy.seen[1:]]
    assert "ZeroDivisionError: division by zero" in observations[0]
    assert 'File "<cell>", line 2' in observations[0] and "1 / 0" in observations[0]
    assert "ToolError" in observations[1]
    assert "ran past its 1 s limit" in observations[2]
    assert "NameError: name 'x' is not defined" in observations[3]  # the session restarted
    assert "exited with code 7" in observations[4]
    assert "bytes of output cut" in observations[5] and observations[5].rstrip().endswith("42")
    assert len(observations[5]) < 600
    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    assert (finished.status, finished.final_message) == ("completed", "I give up.")


@pytest.mark.slow
async def test_a_timed_out_cell_is_killed_with_its_children(toy_tokenizer, tmp_path):
    pids = tmp_path / "pids"
    code = (
        "```python\nimport os, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(60)\n```"
    )
    policy = Recording(code, "Done.")
    async with guessing(toy_tokenizer, policy, "platoon-codeact", harness_options={"timeout_s": 1}) as system:
        await system.play()

    for pid in map(int, pids.read_text().split()):
        assert await gone(pid)


async def gone(pid: int, within: float = 2.0) -> bool:
    """Whether `pid` dies within `within` seconds (a SIGKILL takes a moment to land)."""
    for _ in range(int(within / 0.01)):
        if not _alive(pid):
            return True
        await anyio.sleep(0.01)
    return not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: it only waits for a parent that is gone or not ours.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1][0] != "Z"


def test_code_blocks_and_tool_names():
    assert extract_code("Hi.\n```python\na = 1\n```\ntext\n```py\nb = 2\n```") == "a = 1\nb = 2"
    assert extract_code("cut off\n```python\nprint(1)") == "print(1)"
    assert extract_code("No code, just ```text```.") is None
    tools = [
        ToolSpec(name="print"),
        ToolSpec(name="web-search", input_schema={"type": "object", "properties": {"q": {"type": "string"}}}),
        ToolSpec(name="web_search"),
        ToolSpec(name="odd", input_schema={"properties": {"a-b": {}}, "required": ["a-b"]}),
    ]
    functions = python_functions(tools)
    assert [f.py_name for f in functions] == ["print_", "web_search", "web_search_", "odd"]
    assert functions[1].signature.startswith("def web_search(q: str | None = None) -> str:")
    assert functions[3].signature.startswith("def odd(**arguments) -> str:")


def test_codeact_options_are_checked():
    codeact = get_harness("platoon-codeact")
    with pytest.raises(HarnessError) as exc:
        validate_options(codeact, {"timeout_s": 0}, "environments.1.harness_options")
    assert str(exc.value) == "environments.1.harness_options.timeout_s: expected float > 0.0"
    with pytest.raises(HarnessError) as exc:
        validate_options(codeact, {"max_output_chars": "lots"})
    assert str(exc.value) == "harness_options.max_output_chars: expected int, got str"
