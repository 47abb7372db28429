"""`platoon init NAME`: a new project that runs at once: an ORS environment, a harness, a
scripted policy, a config, and a test that plays a task through all of them."""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from typing import Any

from platoon.cli import CommandError

ENV = '''"""{title}: an ORS environment. Replace the task and the reward with yours."""

from __future__ import annotations

from typing import Any

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel, Field


class Answer(BaseModel):
    text: str = Field(description="Your answer.")


class {cls}(Environment):
    """Each task asks for a word back. The answer tool rewards 1 for exactly that word, and a
    near miss by the share of its letters that are the word's: a shaped reward, so that even a
    model that never says the word has something to learn from."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        words = ["apple", "river", "stone", "cloud", "maple", "ember", "orbit", "tulip"]
        return [{{"id": f"{{split}}-{{word}}", "word": word}} for word in words]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"Answer with the word {{self.task_spec['word']!r}}, using the answer tool.")]

    @tool
    async def answer(self, args: Answer) -> ToolOutput:
        """Give your answer; it ends the episode."""
        word, said = self.task_spec["word"], args.text.strip().lower()
        letters = [c for c in said if c.isalpha()]
        reward = 1.0 if said == word else sum(c in word for c in letters) / max(len(letters), 1)
        return ToolOutput(blocks=[TextBlock(text="right" if reward == 1 else "wrong")], reward=reward, finished=True)
'''

HARNESS = '''"""The agent: a tool-calling loop over the environment's tools, registered as `{harness}`."""

from __future__ import annotations

import json

import platoon as pt


@pt.harness("{harness}")
async def agent(ctx: pt.AgentContext) -> pt.AgentResult:
    tools = ctx.openai_tools()
    messages: list[dict] = [{{"role": "user", "content": ctx.instruction}}]
    while ctx.budget.remaining() > 0:
        reply = await ctx.chat(messages, tools=tools)
        messages.append({{k: v for k, v in reply.message.items() if v is not None}})
        if not reply.tool_calls:  # no tool call: the text is the answer
            await ctx.call_tool("answer", {{"text": reply.text or ""}})
            return pt.AgentResult("completed", final_message=reply.text)
        for call in reply.tool_calls:
            result = await ctx.call_tool(call["function"]["name"], json.loads(call["function"]["arguments"] or "{{}}"))
            messages.append({{"role": "tool", "tool_call_id": call["id"], "content": result.as_text()}})
            if result.finished:
                return pt.AgentResult("completed", final_message=result.as_text())
    return pt.AgentResult("limit")
'''

SCRIPTED = '''"""A scripted policy for tests and demos: it answers with the word the task asks for, in
plain text, which the harness submits as the answer (a model may also call the answer tool)."""

from __future__ import annotations

import re


def solve(messages: list[dict]) -> str:
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    return re.search(r"the word '(\\w+)'", prompt).group(1)
'''

CONFIG = """# {title}. Run from this directory:
#   PYTHONPATH=. platoon rollout config.yaml --task train:train-apple --policy scripted:scripted:solve
#   PYTHONPATH=. platoon eval config.yaml --policy scripted:scripted:solve
#   PYTHONPATH=. platoon train config.yaml     # the tiny model, on the embedded backend (CPU):
#                                              # its reward climbs from about 0.3 to about 0.5 in 30 s
environments:
  - name: {name}
    service: python://env:{cls}
    harness: {harness}
    package: harness                  # imported first, so @pt.harness("{harness}") registers
train:
  backend: local
  model_name: platoon-tiny-qwen3      # built into the site cache on first use; or a real model
  reproducible: true                  # the same seed, the same run to the last bit
  renderer_name: qwen3_instruct
  lora_rank: 16
  batch_size: 4                       # tasks a step
  max_training_steps: 30
  seed: 2                             # task order and every sample derive from it
  optimizer: {{learning_rate: 0.03}}
  workflow_config:
    group_size: 8                     # attempts a task, compared with each other
    rollout_config:
      max_steps: 1
      inference_params: {{max_completion_tokens: 8}}
eval:
  every: 0
  group_size: 1
stats:
  experiment_name: {name}
"""

TEST = '''"""The project end to end with a scripted policy: a rollout and an eval, on CPU, in seconds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from platoon.cli import main
from platoon.config.site import load_site

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def project(tmp_path, monkeypatch):
    # Runs of the test's own; the machine's cache, so the tiny model and tokenizers build once.
    cache = load_site().cache
    (tmp_path / "site.yaml").write_text(f"runs: {{tmp_path / 'runs'}}\\ncache: {{cache}}\\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    monkeypatch.chdir(HERE)
    monkeypatch.syspath_prepend(str(HERE))
    yield
    for module in ("env", "harness", "scripted"):
        sys.modules.pop(module, None)


def test_a_rollout_solves_a_task(capsys):
    assert main(["rollout", "config.yaml", "--task", "train:train-apple", "--policy", "scripted:scripted:solve"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "reward: 1"


def test_an_eval_solves_the_test_split(capsys):
    assert main(["eval", "config.yaml", "--policy", "scripted:scripted:solve"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["reward_mean"] == 1.0 and summary["episodes"] == 8
'''

README = """# {title}

A platoon project: `env.py` (an ORS environment), `harness.py` (the agent), `scripted.py` (a
scripted policy for tests), `config.yaml` (what a run plays and trains).

```
PYTHONPATH=. platoon rollout config.yaml --task train:train-apple --policy scripted:scripted:solve
python -m pytest
PYTHONPATH=. platoon train config.yaml
```
"""


def init(args: Any) -> int:
    name = args.name
    if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        raise CommandError(f"{name!r}: a project name is lower-case letters, digits and dashes")
    directory = Path(args.directory or name)
    if directory.exists() and any(directory.iterdir()):
        raise CommandError(f"{directory} exists and is not empty")
    module = name.replace("-", "_")
    if keyword.iskeyword(module):
        raise CommandError(f"{name!r} is a Python keyword; choose another name")
    values = {
        "name": name,
        "title": name.replace("-", " ").capitalize(),
        "cls": "".join(part.capitalize() for part in name.split("-")) + "Env",
        "harness": f"{name}-agent",
    }
    files = {
        "env.py": ENV,
        "harness.py": HARNESS,
        "scripted.py": SCRIPTED,
        "config.yaml": CONFIG,
        f"test_{module}.py": TEST,
        "README.md": README,
    }
    directory.mkdir(parents=True, exist_ok=True)
    for filename, template in files.items():
        (directory / filename).write_text(template.format(**values))
    print(f"made {directory}/: {', '.join(files)}")
    print(f"next: cd {directory} && python -m pytest")
    return 0
