"""A command-line agent for platoon's tests, written as a user would write one: the `openai`
client talks to the model (platoon's gateway), the `mcp` client to the environment's tools.

    openai_mcp_agent.py INSTRUCTION MAX_TURNS MODEL

It reads OPENAI_BASE_URL, OPENAI_API_KEY and PLATOON_MCP_URL from the environment, prints the
final answer, and exits with 3 when it runs out of turns.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from openai import AsyncOpenAI


async def main(instruction: str, max_turns: int, model: str) -> int:
    client = AsyncOpenAI(max_retries=0)
    async with (
        streamable_http_client(os.environ["PLATOON_MCP_URL"]) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = await session.list_tools()
        tools = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description or "", "parameters": t.inputSchema},
            }
            for t in listed.tools
        ]
        messages: list[dict] = [{"role": "user", "content": instruction}]
        for _ in range(max_turns):
            response = await client.chat.completions.create(model=model, messages=messages, tools=tools)
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                print(message.content)
                return 0
            for call in message.tool_calls:
                result = await session.call_tool(call.function.name, json.loads(call.function.arguments))
                text = "".join(block.text for block in result.content if block.type == "text")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
                if (result.meta or {}).get("platoon/finished"):
                    print(text)
                    return 0
    print(f"no answer after {max_turns} turns", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3])))
