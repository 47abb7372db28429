"""Every number an agent chooses, on every model route of `platoon gateway serve`, at its extremes.

The gateway held when it was first attacked; this keeps it so, with the same extremes as the
Tinker server's fuzz (`test_request_bounds`): past its bound (the table in docs/security.md) a
value is a 400 naming the field, within it never a 5xx, and /healthz answers within a second.
"""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow

EXTREMES: list[object] = [-1, 0, 2**31, 2**63, 1e30, "x"]
WINDOW = 131072  # the scripted policy's context window: max_tokens beyond it is refused
POLICY = 'def echo(messages):\n    return "you said: " + str(messages[-1]["content"])\n'


def _int(lo: float, hi: float):
    return lambda v: type(v) is int and lo <= v <= hi


def _number(lo: float, hi: float):
    return lambda v: type(v) in (int, float) and lo <= v <= hi


TOKENS = _int(1, WINDOW)
CHAT = {
    "max_tokens": TOKENS,
    "max_completion_tokens": TOKENS,
    "n": _int(1, 16),
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "top_k": _int(-1, 2**31 - 1),
    "seed": _int(-(2**63), 2**63 - 1),
    "top_logprobs": _int(0, 20),
    "presence_penalty": _number(0, 0),  # the gateway samples the policy as is: only 0
    "frequency_penalty": _number(0, 0),
    "logprobs": lambda v: False,  # a boolean: no number is one
}
RESPONSES = {"max_output_tokens": TOKENS, "temperature": _number(0, 2), "top_p": _number(0, 1)}
MESSAGES = {
    "max_tokens": TOKENS,
    "temperature": _number(0, 1),
    "top_p": _number(0, 1),
    "top_k": _int(-1, 2**31 - 1),
}
# The gateway reads these as max_tokens: a value past its range is named so.
ALIASES = {"max_completion_tokens": "max_tokens", "max_output_tokens": "max_tokens"}
MESSAGE = [{"role": "user", "content": "hi"}]
ROUTES = {
    "/v1/chat/completions": ({"model": "platoon-policy", "messages": MESSAGE}, CHAT),
    "/v1/responses": ({"model": "platoon-policy", "input": "hi"}, RESPONSES),
    "/v1/messages": ({"model": "platoon-policy", "max_tokens": 10, "messages": MESSAGE}, MESSAGES),
    "/v1/messages/count_tokens": ({"model": "platoon-policy", "messages": MESSAGE}, {}),
}


def test_every_field_at_its_extremes_is_refused_or_served(serve, tmp_path):
    (tmp_path / "echo_policy.py").write_text(POLICY)
    gateway = serve(
        ["gateway", "serve", "--policy", "scripted:echo_policy:echo"],
        ready=r"^Ctrl-C",
        env={"PYTHONPATH": str(tmp_path)},
    )
    printed = dict(line.strip().partition(" ")[::2] for line in gateway.lines)
    root = printed["gateway"].split()[0].removesuffix("/v1")
    key = printed["key"].strip()
    refused = 0
    with httpx.Client(base_url=root, headers={"authorization": f"Bearer {key}"}, timeout=30) as http:
        for route, (body, bounds) in ROUTES.items():
            assert http.post(route, json=body).status_code == 200
            for field, within in bounds.items():
                for value in EXTREMES:
                    answer = http.post(route, json={**body, field: value})
                    where = f"{route} {field}={value}: {answer.status_code} {answer.text[:300]}"
                    assert answer.status_code < 500, where
                    if not within(value):
                        assert answer.status_code == 400, where
                        assert field in answer.text or ALIASES.get(field, field) in answer.text, where
                        refused += 1
                    else:
                        assert answer.status_code == 200, where
            assert http.get("/healthz", timeout=1.0).status_code == 200
    assert refused > 80, refused
