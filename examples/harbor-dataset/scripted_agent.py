"""Scripted policies for trying the dataset without a model, written as the tool calls a Qwen3
model would sample:

    platoon rollout train.yaml --task train:#0 --policy scripted:scripted_agent:solve
    platoon eval train.yaml --policy scripted:scripted_agent:solve

`solve` runs the task's own solution/solve.sh through the bash tool, then answers; `wrong`
writes a wrong answer, so the task's tests give it reward 0.
"""

from __future__ import annotations

import json
from pathlib import Path

DATASET = Path(__file__).resolve().parent / "dataset"


def solve(messages: list[dict]) -> str:
    if _ran_a_command(messages):
        return "I wrote the answer to /app/answer.txt."
    return _bash(_solution_for(_instruction(messages)))


def wrong(messages: list[dict]) -> str:
    if _ran_a_command(messages):
        return "Done."
    return _bash("echo not-the-answer > /app/answer.txt")


def _bash(command: str) -> str:
    call = {"name": "bash", "arguments": {"command": command}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def _ran_a_command(messages: list[dict]) -> bool:
    return any(message.get("role") == "tool" for message in messages)


def _instruction(messages: list[dict]) -> str:
    return next(m["content"] for m in messages if m.get("role") == "user")


def _solution_for(instruction: str) -> str:
    for task in sorted(DATASET.iterdir()):
        if (task / "instruction.md").is_file() and (task / "instruction.md").read_text() == instruction:
            return (task / "solution" / "solve.sh").read_text()
    raise LookupError("the instruction matches no task of the example dataset")
