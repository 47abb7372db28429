"""A command-line agent with no dependencies (run by a sandbox's python3): the model through
the gateway's chat completions, the environment's tools through MCP (JSON-RPC over HTTP)."""

import json
import os
import sys
import urllib.request


def post(url, body, headers=None):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **(headers or {}),
        },
    )
    return json.load(urllib.request.urlopen(request, timeout=30))


def mcp(method, params):
    reply = post(os.environ["MCP_URL"], {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    return reply["result"]


tools = [
    {
        "type": "function",
        "function": {
            "name": t["name"],
            "description": t.get("description", ""),
            "parameters": t["inputSchema"],
        },
    }
    for t in mcp("tools/list", {})["tools"]
]
messages = [{"role": "user", "content": sys.argv[1]}]
auth = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
for _ in range(20):
    reply = post(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        {"model": "platoon-policy", "messages": messages, "tools": tools},
        auth,
    )
    message = reply["choices"][0]["message"]
    messages.append(message)
    for call in message.get("tool_calls") or []:
        result = mcp(
            "tools/call",
            {"name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"])},
        )
        text = "".join(c.get("text", "") for c in result["content"])
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        if result.get("_meta", {}).get("platoon/finished"):
            print(text)
            sys.exit(0)
sys.exit(3)
