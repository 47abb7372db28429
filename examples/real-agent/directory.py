"""A staff directory, looked up with a tool: the question is the room of someone's manager, and
only two lookups find it (the person's record names the manager, the manager's record the room).

Three model calls an episode for an agent that knows the way: `lookup` the person, `lookup` the
manager the answer named, then `answer` with the room. Each record is fed back as the tool's
result, so every call after the first depends on what the one before it read. The reward is 1
when the room answered is the manager's and was found in those two lookups, a quarter less for
each lookup more, 0 for a wrong room; a wrong answer ends the episode as a right one does, and an
agent that never answers scores 0 when its calls run out.

Three splits, each with people of its own: `demos` for an expert's demonstrations (SFT), `train`
for RL, `test` held out. A model can only score on a split it never saw by reading the records.
"""

from __future__ import annotations

import json
import random
from typing import Any

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

import platoon as pt

# 116 first names, one to three tokens each for SmolLM2's tokenizer, dealt once into three pools: the expert's demonstrations, the tasks RL trains on, and the held-out test. A name is
# in one split only, so neither SFT nor RL can pass the test by remembering a record.
NAMES = (
    "Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Leo Mia Nora Oscar Paul Quinn "
    "Rosa Sam Tina Uma Victor Wendy Xavier Yara Zane Amy Ben Chloe Dan Eva Fred Gina Hugo Ivy "
    "Jake Kate Liam Maya Ned Olga Pete Rita Seth Tara Ugo Vera Walt Yoko Zoe Abby Brad Cleo Dean "
    "Elsa Finn Gwen Hank Iris Joel Aaron Beth Colin Diana Ethan Fiona George Hannah Isaac Julia "
    "Kevin Laura Mark Nina Owen Petra Ralph Sarah Tom Ursula Vince Willa Yusuf Zara Anton Bella "
    "Cyrus Delia Elmer Flora Gideon Hazel Igor Jade Kirk Lena Milo Nell Otto Pia Reed Sofia Theo "
    "Una Vito Wes Yvette Zeke Arlo Bianca Cedric Dora Emil Freya Gus Hilda"
).split()
_DEALT = random.Random(3).sample(NAMES, len(NAMES))
POOLS = {"demos": _DEALT[:40], "train": _DEALT[40:80], "test": _DEALT[80:]}  # 40, 40, 36


def _tasks(split: str, count: int, seed: int) -> list[dict[str, Any]]:
    """`count` tasks of `split`: a person, their manager (another name of the split's pool) and
    the manager's room (10..99), drawn once by `seed`."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        person, manager = rng.sample(POOLS[split], 2)
        tasks.append(
            {"id": f"{split}-{index}", "person": person, "manager": manager, "room": rng.randint(10, 99)}
        )
    return tasks


SPLITS = {"demos": _tasks("demos", 200, 1), "train": _tasks("train", 200, 2), "test": _tasks("test", 40, 3)}


class Name(BaseModel):
    name: str


class Room(BaseModel):
    room: int


class Directory(Environment):
    """Find the room of a person's manager: `lookup` reads one person's record, `answer` ends."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return list(SPLITS)

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return SPLITS[split]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"Which room is {self.task_spec['person']}'s manager in?")]

    lookups = 0

    @tool
    async def lookup(self, args: Name) -> ToolOutput:
        """Read a person's record."""
        self.lookups += 1
        person, manager = self.task_spec["person"], self.task_spec["manager"]
        name = args.name.strip()
        if name == person:
            text = f"{person}'s manager is {manager}."
        elif name == manager:
            text = f"{manager} is in room {self.task_spec['room']}."
        else:
            text = f"No record for {name}."
        return ToolOutput(blocks=[TextBlock(text=text)], reward=0.0)

    @tool
    async def answer(self, args: Room) -> ToolOutput:
        """Give the room number; this ends the task."""
        right = args.room == self.task_spec["room"]
        return ToolOutput(
            blocks=[TextBlock(text="right" if right else "wrong")],
            reward=score(right, self.lookups),
            finished=True,
        )


def score(right: bool, lookups: int) -> float:
    """1 for the right room found the shortest way (two lookups); each lookup more costs a
    quarter, down to 0.25; a wrong room scores 0. Without the cost, RL rewards an answer reached
    after wasted lookups as much as a direct one, and on this model it learned to loop on
    lookups until its calls ran out (measured: docs/tutorials/real-agent.md)."""
    return max(1.0 - 0.25 * max(lookups - 2, 0), 0.25) if right else 0.0


@pt.harness("directory-agent")
async def agent(ctx: pt.AgentContext) -> pt.AgentResult:
    """Calls a tool every turn (the reply is forced to be one call of one of the tools, so even a
    model that has never seen the format writes a call that parses), each result fed back.

    Under the `recursive` program the root may also call `spawn_subagent`; a subagent's `answer`
    is its report to the agent that spawned it (its final message), not the task's answer."""
    tools = ctx.openai_tools()
    messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.instruction}]
    while ctx.budget.remaining() > 0:
        reply = await ctx.chat(messages, tools=tools, tool_choice="required")
        messages.append({key: value for key, value in reply.message.items() if value is not None})
        for call in reply.tool_calls:
            if ctx.depth > 0 and call["function"]["name"] == "answer":
                return pt.AgentResult("completed", final_message=f"room {_room(call)}")
            result = await ctx.call_tool_call(call)
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result.as_text()})
            if result.finished:
                return pt.AgentResult("completed", final_message=result.as_text())
    return pt.AgentResult("limit", reason="out of model calls")


def _room(call: dict[str, Any]) -> object:
    try:
        return json.loads(call["function"]["arguments"]).get("room")
    except (ValueError, AttributeError):
        return None


ASKED = ("Which room is ", "'s manager in?")
DELEGATED = ("Find the room of ", "'s manager.")


def _call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def expert(messages: list[dict]) -> str:
    """The scripted expert (`--policy scripted:directory:expert`): look the person up, then the
    manager the record names, then answer the room. The reply is the whole call; the gateway
    reads it from after the opening it forced."""
    question = next(m["content"] for m in messages if m["role"] == "user")
    person = ""
    for start, end in (ASKED, DELEGATED):
        if question.startswith(start):
            person = question.removeprefix(start).split(end)[0]
    reply = _call("lookup", {"name": person})
    for message in messages:
        if message["role"] != "tool":
            continue
        text = message["content"]
        if "'s manager is " in text:
            reply = _call("lookup", {"name": text.split("'s manager is ")[1].rstrip(".")})
        elif " is in room " in text:
            reply = _call("answer", {"room": int(text.split(" is in room ")[1].rstrip("."))})
        elif text.startswith("Subagent finished: room "):
            reply = _call("answer", {"room": int(text.removeprefix("Subagent finished: room "))})
    return reply


def team_expert(messages: list[dict]) -> str:
    """The expert of the recursive run (`--policy scripted:directory:team_expert`): asked about
    someone with a long name (five letters or more: about half of the people), it delegates the
    question to a subagent; the others it looks up itself. A subagent (its instruction phrased
    apart) plays as `expert` does. So the policy SFT teaches delegates about half the time, by a
    rule it can carry to people it never saw, and RL decides from there whether delegating pays."""
    question = next(m["content"] for m in messages if m["role"] == "user")
    if question.startswith(ASKED[0]) and not any(m["role"] == "tool" for m in messages):
        person = question.removeprefix(ASKED[0]).split(ASKED[1])[0]
        if len(person) >= 5:
            return _call("spawn_subagent", {"instruction": f"{DELEGATED[0]}{person}{DELEGATED[1]}"})
    return expert(messages)
