"""Every number a client chooses, on every route of `platoon serve tinker`, at its extremes.

Each field is sent negative, zero, 2^31, 2^63, 1e30 and of the wrong type. A value past the
field's bound (the table in docs/security.md, `BOUNDS` here) is a 400 naming the field, answered
before any work; a value within it is never a 5xx, and a sample it starts never fails as the
server's fault. Throughout, /healthz answers within a second and the server's memory stays flat.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import httpx
import pytest
from served import Served

pytestmark = [pytest.mark.torch, pytest.mark.slow]

KEY = "tml-fuzz-key"
EXTREMES: list[object] = [-1, 0, 2**31, 2**63, 1e30, "x"]
I64 = 2**63 - 1
TTL = 10 * 365 * 24 * 3600


def _int(lo: float, hi: float) -> Callable[[object], bool]:
    return lambda v: type(v) is int and lo <= v <= hi


def _number(
    lo: float, hi: float, *, open_lo: bool = False, open_hi: bool = False
) -> Callable[[object], bool]:
    def within(v: object) -> bool:
        if type(v) not in (int, float):
            return False
        x = float(v)  # type: ignore[arg-type]
        return (lo < x if open_lo else lo <= x) and (x < hi if open_hi else x <= hi)

    return within


# What each field takes: the table of docs/security.md.
BOUNDS: dict[str, Callable[[object], bool]] = {
    "num_samples": _int(1, 1024),
    "topk_prompt_logprobs": _int(0, 1024),
    "topk_sample_logprobs": _int(0, 1024),
    "prompt_alt_tokens_k": _int(0, float("inf")),
    "prompt_logprobs_last_n": _int(0, float("inf")),
    "max_tokens": _int(1, float("inf")),
    "seed": _int(-(2**63), I64),
    "temperature": _number(0, float("inf")),
    "top_k": _int(-1, float("inf")),
    "top_p": _number(0, 1, open_lo=True),
    "seq_id": _int(0, I64),
    "model_seq_id": _int(0, I64),
    "sampling_session_seq_id": _int(0, I64),
    "rank": _int(1, 1024),
    "ttl_seconds": _int(-TTL, TTL),
    "cloned_sampler_id": _int(0, I64),
    "prev_cursor": _int(0, I64),
    "timeout": _number(0, float("inf")),
    "learning_rate": _number(0, float("inf")),
    "beta1": _number(0, 1, open_hi=True),
    "beta2": _number(0, 1, open_hi=True),
    "eps": _number(0, float("inf")),
    "weight_decay": _number(0, float("inf")),
    "grad_clip_norm": _number(0, float("inf")),
    "limit": _int(1, 200),
}


class World:
    """A session, a training model and a sampler on the server, made through its own routes."""

    def __init__(self, http: httpx.Client, model: str) -> None:
        self.http = http
        self.model = model
        self.session = self.post("create_session", {}).json()["session_id"]
        created = self.post(
            "create_model",
            {"session_id": self.session, "model_seq_id": 0, "base_model": model, "lora_config": {"rank": 2}},
        )
        self.model_id = self.result(created.json()["request_id"])["model_id"]
        self.next_seq = 1
        saved = self.post("save_weights", {"model_id": self.model_id, "seq_id": self.seq(), "path": "fuzz"})
        self.state = self.result(saved.json()["request_id"])["path"]
        self.sampler = self.post(
            "create_sampling_session",
            {"session_id": self.session, "sampling_session_seq_id": 0, "base_model": model},
        ).json()["sampling_session_id"]
        # One completion on the sampler, so a retrieve_futures from cursor 0 answers at once.
        sampled = self.post("asample", {**self.sample_body(), "sampling_session_id": self.sampler})
        self.result(sampled.json()["request_id"])

    def seq(self) -> int:
        self.next_seq += 1
        return self.next_seq - 1

    def post(self, route: str, body: object) -> httpx.Response:
        path = route if route.startswith("/") else f"/api/v1/{route}"
        return self.http.post(path, json=body)

    def result(self, request_id: str) -> dict:
        while True:
            answer = self.http.post("/api/v1/retrieve_future", json={"request_id": request_id})
            if answer.status_code != 408:
                assert answer.status_code == 200, answer.text
                return answer.json() if answer.headers["content-type"].startswith("application/json") else {}

    def sample_body(self) -> dict:
        return {
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
            "sampling_params": {"max_tokens": 2, "seed": 1, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
            "num_samples": 1,
            "base_model": self.model,
            "topk_prompt_logprobs": 0,
            "topk_sample_logprobs": 0,
            "prompt_alt_tokens_k": 0,
            "prompt_logprobs_last_n": 0,
        }


def routes(w: World) -> Iterator[tuple[str, dict, list[str], bool]]:
    """(route, a valid body, its fields to fuzz, whether it is a model's ordered request)."""
    m, s = w.model_id, w.session
    adam = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0}
    adam["grad_clip_norm"] = 0.0
    yield "create_session", {"tags": ["a"], "user_metadata": {"k": "v"}}, ["tags", "user_metadata"], False
    body = {"session_id": s, "model_seq_id": 100, "base_model": w.model, "lora_config": {"rank": 2}}
    yield "create_model", body, ["session_id", "model_seq_id", "base_model", "lora_config.rank"], False
    yield "get_info", {"model_id": m}, ["model_id"], False
    yield "session_heartbeat", {"session_id": s}, ["session_id"], False
    body = {"model_id": m, "seq_id": 0, "adam_params": adam}
    yield "optim_step", body, ["seq_id", *(f"adam_params.{k}" for k in adam)], True
    body = {"model_id": m, "seq_id": 0, "path": "fuzzed", "overwrite": True, "ttl_seconds": 60}
    yield "save_weights", body, ["seq_id", "ttl_seconds", "path"], True
    body = {"model_id": m, "seq_id": 0, "sampling_session_seq_id": 50, "kind": "snapshot"}
    yield "save_weights_for_sampler", body, ["seq_id", "sampling_session_seq_id"], True
    body = {"path": w.state, "session_id": s, "model_seq_id": 200, "base_model": w.model}
    yield "load_weights", body, ["model_seq_id", "path"], False
    yield "load_weights", {"path": w.state, "model_id": m, "seq_id": 0}, ["seq_id"], True
    yield "save_weights_external", {"model_id": m, "path": "x", "seq_id": 0}, ["seq_id"], True
    body = {"session_id": s, "sampling_session_seq_id": 300, "base_model": w.model}
    yield "create_sampling_session", body, ["sampling_session_seq_id", "base_model"], False
    sampled = [
        "num_samples",
        "seq_id",
        "topk_prompt_logprobs",
        "topk_sample_logprobs",
        "prompt_alt_tokens_k",
        "prompt_logprobs_last_n",
        *(f"sampling_params.{k}" for k in ("max_tokens", "seed", "temperature", "top_k", "top_p")),
    ]
    yield "asample", w.sample_body(), [*sampled, "base_model"], False
    yield "/platoon/v1/sample_stream", w.sample_body(), sampled, False
    target = {"sampling_session_id": w.sampler, "cloned_sampler_id": 0}
    body = {"target": target, "prev_cursor": 0, "timeout": 0, "retrieved_request_ids": []}
    # timeout first: a later prev_cursor of 2^31 acknowledges the completion it would answer with
    yield "retrieve_futures", body, ["timeout", "target.cloned_sampler_id", "prev_cursor"], False
    yield "retrieve_future", {"request_id": "nope"}, ["request_id"], False
    yield "cancel_future", {"request_id": "nope"}, ["request_id"], False
    yield "join_sampling_session", {"sampling_session_id": w.sampler}, ["sampling_session_id"], False
    body = {"source_path": w.state, "destination_project_id": "p", "ttl_seconds": 60}
    yield "copy_weights", body, ["ttl_seconds", "source_path"], False
    yield "sessions/search", {"limit": 10}, ["limit"], False
    yield "weights_info", {"tinker_path": w.state}, ["tinker_path"], False


def _set(body: dict, dotted: str, value: object) -> dict:
    out = copy.deepcopy(body)
    *parents, leaf = dotted.split(".")
    node = out
    for part in parents:
        node = node[part]
    node[leaf] = value
    return out


def _values(body: dict, dotted: str) -> list[object]:
    node: object = body
    for part in dotted.split("."):
        node = node.get(part, 0)  # type: ignore[attr-defined]  # absent: a number left out
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return EXTREMES
    return [5, None, "y" * 100_000]  # a string field: the wrong type, null, a very long one


@pytest.fixture(scope="module")
def server(tiny_model):
    served = Served(
        ["serve", "tinker", "--model", str(tiny_model), "--port", "0", "--device", "cpu"],
        ready=r"Tinker API for .* at http",
        env={"PLATOON_SERVER_API_KEY": KEY},
    )
    yield served, served.output.split(" at ", 1)[1].split()[0]
    served.close()


def test_every_field_at_its_extremes_is_refused_up_front_or_served(server, tiny_model):
    server, url = server
    with httpx.Client(base_url=url, headers={"x-api-key": KEY}, timeout=60) as http:
        world = World(http, str(tiny_model))
        start = server.memory_mib("VmRSS")
        refused = served = 0
        for route, body, fields, ordered in routes(world):
            for field in fields:
                for value in _values(body, field):
                    sent = _set(body, field, value)
                    if ordered and field != "seq_id":
                        sent["seq_id"] = world.next_seq  # a turn of its own: a refusal uses it up too
                    answer = _send(http, route, sent)
                    leaf = field.rpartition(".")[2]
                    where = f"{route} {field}={str(value)[:20]}: {answer.status_code} {answer.text[:300]}"
                    assert answer.status_code < 500, where
                    if leaf in BOUNDS and not BOUNDS[leaf](value):
                        assert answer.status_code == 400, where
                        assert leaf in answer.json()["error"], where
                        refused += 1
                    elif answer.status_code == 200:
                        served += 1
                        _settled(world, route, answer, where)
                    if ordered and field != "seq_id":
                        world.next_seq += 1  # queued, or refused and used up (never for a bad seq_id)
                # Whatever came before, the server answers others at once (a timeout, not a
                # measured duration: httpx raises past it).
                assert http.get("/api/v1/healthz", timeout=1.0).status_code == 200
        grown = server.memory_mib("VmHWM") - start
    assert refused > 150 and served > 20, (refused, served)
    assert grown < 256, f"the server's peak memory grew {grown:.0f} MiB"


def _send(http: httpx.Client, route: str, body: dict) -> httpx.Response:
    path = route if route.startswith("/") else f"/api/v1/{route}"
    if route.endswith("sample_stream"):
        with http.stream("POST", path, json=body) as streamed:
            streamed.read() if streamed.status_code != 200 else next(streamed.iter_bytes(), b"")
            return httpx.Response(
                streamed.status_code, content=b"" if streamed.status_code == 200 else streamed.content
            )
    return http.post(path, json=body)


def _settled(world: World, route: str, answer: httpx.Response, where: str) -> None:
    """A sample accepted with a 200 ends as a result or a user's error, never the server's."""
    if route != "asample":
        return
    request_id = answer.json()["request_id"]
    world.http.post("/api/v1/cancel_future", json={"request_id": request_id})  # max_tokens 2^31: long
    outcome = world.http.post("/api/v1/retrieve_future", json={"request_id": request_id})
    assert outcome.status_code == 200, where
    if outcome.headers["content-type"].startswith("application/json"):
        assert outcome.json().get("category") != "server", f"{where} -> {outcome.text[:300]}"


def test_a_huge_num_samples_is_refused_before_anything_is_built(server, tiny_model):
    """num_samples = 2e7 (a 174-byte body) once stalled the server 18 s, answered 829 MiB and
    took it to 3.3 GB before the sampler refused it."""
    server, url = server
    body = {
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
        "sampling_params": {"max_tokens": 2},
        "num_samples": 20_000_000,
        "base_model": str(tiny_model),
    }
    start = server.memory_mib("VmRSS")
    with httpx.Client(base_url=url, headers={"x-api-key": KEY}, timeout=5.0) as http:
        answer = http.post("/api/v1/asample", json=body)
        assert answer.status_code == 400
        assert answer.json()["error"].endswith("Expected `int` <= 1024 - at `$.num_samples`")
        assert http.get("/api/v1/healthz", timeout=1.0).status_code == 200
        # And the other refusals that once came as a 200 and a failed future.
        for changed, says in (
            ({"base_model": "not/this-model"}, "unknown base_model"),
            ({"sampling_params": {"max_tokens": 0}}, "max_tokens"),
            ({"prompt": {"chunks": [{"type": "encoded_text", "tokens": [10**6]}]}}, "outside the vocabulary"),
        ):
            answer = http.post("/api/v1/asample", json={**body, "num_samples": 1, **changed})
            assert answer.status_code == 400 and says in answer.json()["error"], answer.text
        session = http.post("/api/v1/create_session", json={}).json()["session_id"]
        model = {"session_id": session, "model_seq_id": 0, "base_model": "not/this-model"}
        answer = http.post("/api/v1/create_model", json=model)
        assert answer.status_code == 400 and "unknown base_model" in answer.json()["error"], answer.text
    assert server.memory_mib("VmHWM") - start < 64
