"""A tiny command-line agent (stdlib only, run by the sandbox's python3): asks the model for a
shell command, runs it where it runs, sends back the output, until the model says "Done."."""

import json
import os
import subprocess
import sys
import urllib.request


def chat(messages):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": "platoon-policy", "messages": messages}).encode(),
        headers={
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            "Content-Type": "application/json",
        },
    )
    return json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]["content"]


messages = [{"role": "user", "content": sys.argv[1]}]
for _ in range(int(sys.argv[2])):
    reply = chat(messages)
    messages.append({"role": "assistant", "content": reply})
    if reply.strip() == "Done.":
        print("finished")
        sys.exit(0)
    done = subprocess.run(["bash", "-c", reply], capture_output=True, text=True)
    messages.append({"role": "user", "content": done.stdout + done.stderr})
sys.exit(3)
