"""Every route and request type the pinned tinker SDK knows, driven with the SDK against the
embedded server: served, or refused by name as a service refuses what it does not offer.

The routes are read from the SDK's own source (every call that names an `/api/...` path), so
an SDK upgrade that adds a route fails `test_every_sdk_route_is_driven` until the route is
served or refused (`platoon.backends.local.unoffered`) and a driver below says which.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import pickle
import typing
import uuid
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker import types
from tinker._compat import model_dump
from tinker.cli.auth_api import AuthApiError, TinkerAuthApi
from tinker.lib.client_connection_pool_type import ClientConnectionPoolType

pytestmark = pytest.mark.torch

SERVED_NAME = "platoon-test/tiny"  # not the model's directory: get_info must say this name
KEY = "tml-conformance"
HTTP_METHODS = {"get", "post", "put", "delete", "patch"}


def sdk_routes() -> set[tuple[str, str]]:
    """(METHOD, path) of every request the installed SDK's code makes; `{}` stands for a path
    parameter. Its tests are left out; its command line is not."""
    root = Path(tinker.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        if path.name.endswith("_test.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            args = node.args
            if name.strip("_") in HTTP_METHODS:
                method, target = name.strip("_").upper(), args[0]
            elif name in {"_request", "request"} and len(args) > 1 and isinstance(args[0], ast.Constant):
                method, target = str(args[0].value).upper(), args[1]
            else:
                continue
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                route = target.value
            elif isinstance(target, ast.JoinedStr):
                route = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in target.values)
            else:
                continue
            if route.startswith("/api/"):
                found.add((method, route.removeprefix("/api/v1")))
    return found


ROUTES = sdk_routes()  # read once, at import (parsing under pytest's deep stack has tripped CPython)


# ---- the world every driver works in --------------------------------------------------------


class World:
    def __init__(self, url: str, service: tinker.ServiceClient) -> None:
        self.url = url
        self.service = service
        self.rest = tinker.RestClient(base_url=url, api_key=KEY)
        self.training = service.create_lora_training_client(base_model=SERVED_NAME, rank=4, seed=0).result()
        self.training.forward_backward([_datum()], "cross_entropy").result()
        self.training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        self.state = self.training.save_state("state-0").result().path
        self.sampler_path = self.training.save_weights_for_sampler("sampler-0").result().path
        self.session_id = service.holder.get_session_id()
        self.saved = 0

    def raw(self, call: Callable[[tinker.AsyncTinker], typing.Awaitable[object]]) -> object:
        """Run `call` with the SDK's own low-level client (its request and response types), for
        routes the SDK calls only from inside (heartbeat, telemetry, config)."""

        async def go() -> object:
            with self.service.holder.aclient(ClientConnectionPoolType.SESSION) as client:
                return await call(client)

        return self.service.holder.run_coroutine_threadsafe(go()).result()

    def checkpoint(self, name: str) -> str:
        self.saved += 1
        return self.training.save_state(f"{name}-{self.saved}").result().path


def _datum(tokens: list[int] | None = None) -> types.Datum:
    tokens = tokens or [3, 4, 5, 6, 7, 8]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


@pytest.fixture(scope="module")
def world(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """A server with the SDK's optional sampling features turned on (retrieve_futures polling,
    server-allocated clone ids, server-side custom losses), so the SDK takes those routes."""
    from anyio.from_thread import start_blocking_portal

    from platoon.backends.local import running_server

    flags: dict[str, object] = {
        "sample_use_retrieve_futures": True,
        "sample_join_sampling_session": True,
        "custom_loss_server_side": True,
    }
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            running_server(
                str(tiny_model),
                name=SERVED_NAME,
                device="cpu",
                api_key=KEY,
                checkpoint_dir=tmp_path_factory.mktemp("conformance"),
                client_config=flags,
            )
        ) as url,
    ):
        service = tinker.ServiceClient(base_url=url, api_key=KEY, project_id="any-project")
        try:
            yield World(url, service)
        finally:
            service.close("success").result()


def refused(feature: str, error: type[Exception] = tinker.BadRequestError):
    return pytest.raises(error, match=f"{feature}.* is not offered by platoon's Tinker server")


# ---- the drivers, one per route ---------------------------------------------------------------

DRIVERS: dict[tuple[str, str], Callable[[World], None]] = {}


def drives(*routes: tuple[str, str]):
    def register(fn: Callable[[World], None]) -> Callable[[World], None]:
        for route in routes:
            DRIVERS[route] = fn
        return fn

    return register


@drives(("POST", "/client/config"), ("POST", "/create_session"))
def _session(w: World) -> None:
    config = w.raw(
        lambda c: c.service.client_config(request=types.ClientConfigRequest(sdk_version=tinker.__version__))
    )
    assert config.sample_use_retrieve_futures and not config.pjwt_auth_enabled
    created = w.raw(
        lambda c: c.service.create_session(
            request=types.CreateSessionRequest(tags=["x"], user_metadata=None, sdk_version="0")
        )
    )
    assert created.session_id != w.session_id
    assert w.rest.get_session(created.session_id).result().training_run_ids == []


@drives(("POST", "/client/dynamic_config"))
def _dynamic_config(w: World) -> None:
    request = types.ClientConfigRequest(sdk_version=tinker.__version__)
    assert w.raw(lambda c: c.service.client_dynamic_config(request=request)).sample_cancel_enabled


@drives(("POST", "/session_heartbeat"), ("POST", "/sessions/{}/finish"))
def _heartbeat_and_finish(w: World) -> None:
    assert w.raw(lambda c: c.service.session_heartbeat(session_id=w.session_id)) is not None
    other = tinker.ServiceClient(base_url=w.url, api_key=KEY)
    other.create_sampling_client(base_model=SERVED_NAME).result()  # starts its session
    session_id = other.holder.get_session_id()
    other.close("interrupted").result()
    with pytest.raises(tinker.APIStatusError) as info:
        w.raw(lambda c: c.service.session_heartbeat(session_id=session_id))
    assert info.value.status_code == 410  # the SDK's sign to stop its heartbeat loop


@drives(("POST", "/telemetry"))
def _telemetry(w: World) -> None:
    request = types.TelemetrySendRequest(
        events=[], platform="linux", sdk_version=tinker.__version__, session_id=w.session_id, process_uuid="p"
    )
    assert w.raw(lambda c: c.telemetry.send(request=request)).status == "accepted"


@drives(("GET", "/healthz"), ("GET", "/get_server_capabilities"))
def _health(w: World) -> None:
    assert w.raw(lambda c: c.service.health_check()).status == "ok"
    models = w.raw(lambda c: c.service.get_server_capabilities()).supported_models
    assert [m.model_name for m in models] == [SERVED_NAME]
    assert w.rest.get_server_capabilities().result().supported_models == models


@drives(("POST", "/create_model"), ("POST", "/get_info"))
def _model_and_info(w: World) -> None:
    info = w.training.get_info()
    assert info.model_data.model_name == SERVED_NAME
    assert info.model_data.tokenizer_id == SERVED_NAME  # the served name, loadable elsewhere
    assert info.lora_rank == 4


@drives(("POST", "/forward_backward"), ("POST", "/optim_step"), ("POST", "/retrieve_future"))
def _train(w: World) -> None:
    before = w.training.forward([_datum()], "cross_entropy").result().metrics["loss:sum"]
    w.training.forward_backward([_datum()], "cross_entropy").result()
    w.training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert w.training.forward([_datum()], "cross_entropy").result().metrics["loss:sum"] < before


@drives(("POST", "/save_weights"), ("POST", "/load_weights"))
def _state(w: World) -> None:
    loss = w.training.forward([_datum()], "cross_entropy").result().metrics["loss:sum"]
    path = w.checkpoint("state-load")
    restored = w.service.create_training_client_from_state_with_optimizer(path).result()
    assert restored.forward([_datum()], "cross_entropy").result().metrics["loss:sum"] == pytest.approx(loss)


@drives(
    ("POST", "/save_weights_for_sampler"),
    ("POST", "/create_sampling_session"),
    ("POST", "/asample"),
    ("POST", "/retrieve_futures"),
    ("GET", "/samplers/{}"),
)
def _sample(w: World) -> None:
    # With sample_use_retrieve_futures on, the SDK learns of each completion by polling
    # retrieve_futures for the whole sampling session, then fetches the result.
    sampler = w.service.create_sampling_client(model_path=w.sampler_path).result()
    out = sampler.sample(
        types.ModelInput.from_ints([5, 6, 7]), 2, types.SamplingParams(max_tokens=4, seed=1)
    ).result()
    assert [len(s.tokens) for s in out.sequences] <= [4, 4] and out.sequences[0].sequence_id
    # A client created from a sampler id alone asks the server for its base model.
    assert w.rest.get_sampler(sampler._sampling_session_id).result().base_model == SERVED_NAME


@drives(("POST", "/join_sampling_session"))
def _join(w: World) -> None:
    sampler = w.service.create_sampling_client(base_model=SERVED_NAME).result()
    params = types.SamplingParams(max_tokens=3, seed=5, temperature=0.0)
    prompt = types.ModelInput.from_ints([9, 8, 7])
    original = sampler.sample(prompt, 1, params).result()
    clone = pickle.loads(pickle.dumps(sampler))  # a worker's copy: it asks for its clone id
    copied = clone.sample(prompt, 1, params).result()
    assert clone._cloned_sampler_id == 1
    assert copied.sequences[0].tokens == original.sequences[0].tokens


@drives(("POST", "/cancel_future"))
def _cancel(w: World) -> None:
    sampler = w.service.create_sampling_client(base_model=SERVED_NAME).result()
    target = types.SamplingSessionFuturesTarget(sampling_session_id=sampler._sampling_session_id)

    async def abandon() -> None:
        long = types.SamplingParams(max_tokens=2000, stop=[], seed=0)
        future = sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 8, long)
        with pytest.raises(TimeoutError):
            await future.result_async(timeout=0.3)

    asyncio.run(abandon())
    # The SDK sent cancel_future; the request ends as failed, long before 8 x 2000 tokens.
    request = types.FuturesRetrieveRequest(target=target, prev_cursor=0, timeout=20)
    completions = w.raw(lambda c: c.futures.retrieve_multi(request=request)).completions
    assert [c.state for c in completions] == ["failed"]
    retrieve = model_dump(types.FutureRetrieveRequest(request_id=completions[0].request_id))
    answer = w.raw(
        lambda c: c.post("/api/v1/retrieve_future", body=retrieve, cast_to=types.RequestFailedResponse)
    )
    assert "cancelled by the client" in answer.error


@drives(("POST", "/copy_weights"))
def _copy(w: World) -> None:
    copied = w.service.copy_weights(w.sampler_path).result()
    assert copied != w.sampler_path and copied.endswith("/sampler_weights/sampler-0")
    a = w.service.create_sampling_client(model_path=w.sampler_path).result()
    b = w.service.create_sampling_client(model_path=copied).result()
    params = types.SamplingParams(max_tokens=4, seed=2, temperature=0.0)
    prompt = types.ModelInput.from_ints([4, 5, 6])
    assert (
        a.sample(prompt, 1, params).result().sequences[0].tokens
        == b.sample(prompt, 1, params).result().sequences[0].tokens
    )
    state_copy = w.rest.copy_weights(w.state, "another-project", ttl_seconds=3600).result()
    assert w.rest.get_weights_info_by_tinker_path(state_copy).result().lora_rank == 4


@drives(("POST", "/create_custom_loss"))
def _custom_loss(w: World) -> None:
    def neg_ll(logprobs, weights):
        loss = -(logprobs * weights).sum()
        return loss, {"custom/neg_ll:sum": loss}

    with refused("server-side custom losses"):
        w.service.create_custom_loss(neg_ll, input_ranks={"logprobs": 1, "weights": 1}).result()


@drives(("POST", "/save_weights_external"))
def _save_external(w: World) -> None:
    with refused("save_weights_external", tinker.RequestFailedError):
        w.training.save_weights_external("ext").result()
    # Refused in its turn: the client's next request still runs.
    assert w.training.forward([_datum()], "cross_entropy").result().metrics["loss:sum"] > 0


@drives(("GET", "/training_runs/{}/checkpoints/{}/external_weights_urls"))
def _external_urls(w: World) -> None:
    with refused("external weights"):
        w.rest.get_external_weights_urls(f"tinker://{w.training.model_id}/external_weights/ext").result()


@drives(("GET", "/training_runs"), ("GET", "/training_runs/{}"), ("GET", "/training_runs/{}/checkpoints"))
def _runs(w: World) -> None:
    run_id = w.training.model_id
    assert run_id in [r.training_run_id for r in w.rest.list_training_runs().result().training_runs]
    assert w.rest.get_training_run(run_id).result().lora_rank == 4
    paths = [c.tinker_path for c in w.rest.list_checkpoints(run_id).result().checkpoints]
    assert w.state in paths and w.sampler_path in paths


@drives(("GET", "/checkpoints"), ("POST", "/weights_info"))
def _checkpoints(w: World) -> None:
    assert w.state in [c.tinker_path for c in w.rest.list_user_checkpoints().result().checkpoints]
    assert w.rest.get_weights_info_by_tinker_path(w.state).result().lora_rank == 4


@drives(
    ("POST", "/training_runs/{}/checkpoints/{}/publish"),
    ("DELETE", "/training_runs/{}/checkpoints/{}/publish"),
    ("PUT", "/training_runs/{}/checkpoints/{}/ttl"),
    ("DELETE", "/training_runs/{}/checkpoints/{}"),
)
def _checkpoint_marks(w: World) -> None:
    path = w.checkpoint("marks")

    def listed() -> types.Checkpoint | None:
        found = w.rest.list_checkpoints(w.training.model_id).result().checkpoints
        return next((c for c in found if c.tinker_path == path), None)

    w.rest.publish_checkpoint_from_tinker_path(path).result()
    assert listed().public
    w.rest.unpublish_checkpoint_from_tinker_path(path).result()
    assert not listed().public
    w.rest.set_checkpoint_ttl_from_tinker_path(path, 7200).result()
    assert listed().expires_at is not None
    w.rest.delete_checkpoint_from_tinker_path(path).result()
    assert listed() is None


@drives(("GET", "/sessions"), ("GET", "/sessions/{}"), ("POST", "/sessions/search"))
def _sessions(w: World) -> None:
    assert w.session_id in w.rest.list_sessions().result().sessions
    assert w.training.model_id in w.rest.get_session(w.session_id).result().training_run_ids
    warnings.simplefilter("ignore", tinker.ExperimentalWarning)  # search_sessions is marked experimental
    mark = {"run": uuid.uuid4().hex}
    request = types.CreateSessionRequest(tags=[], user_metadata=mark, sdk_version="0")
    second = w.raw(lambda c: c.service.create_session(request=request)).session_id
    by_metadata = w.rest.search_sessions(types.SessionSearchRequest(user_metadata=mark)).result()
    assert [s.session_id for s in by_metadata.sessions] == [second]
    found = w.rest.search_sessions(types.SessionSearchRequest(session_id=w.session_id)).result()
    assert [s.session_id for s in found.sessions] == [w.session_id]
    assert found.sessions[0].status.type == "active" and found.sessions[0].checkpoints_count >= 2
    page = w.rest.search_sessions(types.SessionSearchRequest(limit=1)).result()
    assert len(page.sessions) == 1 and page.next_cursor is not None
    rest = w.rest.search_sessions(types.SessionSearchRequest(limit=200, cursor=page.next_cursor)).result()
    assert page.sessions[0].session_id not in [s.session_id for s in rest.sessions]


@drives(("GET", "/sessions/{}/trace_export"))
def _trace(w: World) -> None:
    with refused("trace export"):
        w.rest.export_session_trace(w.session_id).result()


@drives(("PUT", "/sessions/{}/project"))
def _project(w: World) -> None:
    with refused("projects"):
        w.rest.assign_session_project(w.session_id, "p").result()


@drives(("POST", "/auth/token"))
def _jwt(w: World) -> None:
    with refused("JWT authentication"):
        w.raw(lambda c: c.service.auth_token())


@drives(("GET", "/auth/apikey/me"), ("DELETE", "/auth/apikey/me"))
def _key_accounts(w: World) -> None:
    with httpx.Client() as http:
        api = TinkerAuthApi(http, base_url=w.url)
        with pytest.raises(AuthApiError, match=r"API key accounts .* is not offered"):
            api.get_self_api_key(KEY)
        with pytest.raises(AuthApiError, match=r"API key revocation .* is not offered"):
            api.delete_self_api_key(KEY)


@drives(("GET", "/audit"), ("GET", "/billing/usage/events"), ("GET", "/billing/usage/checkpoints/current"))
def _admin(w: World) -> None:
    admin = tinker.AdminClient(base_url=w.url, api_key=KEY)
    with refused("audit logs"):
        admin.get_audit_log().result()
    with refused("billing"):
        admin.get_billing_usage(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)).result()
    with refused("billing"):
        admin.get_current_checkpoint_storage_usage().result()


def test_every_sdk_route_is_driven():
    routes = ROUTES
    assert len(routes) > 40, "the SDK's routes were not found in its code"
    undecided = sorted(routes - set(DRIVERS))
    assert not undecided, f"the tinker SDK names routes this server neither serves nor refuses: {undecided}"
    assert not set(DRIVERS) - routes, "a driver for a route the SDK no longer names"


@pytest.mark.parametrize("route", sorted(ROUTES), ids=" ".join)
def test_route(world: World, route: tuple[str, str]):
    DRIVERS[route](world)


# ---- request types and losses ----------------------------------------------------------------

REQUEST_ROUTES = {
    "ClientConfigRequest": ("POST", "/client/config"),
    "CopyWeightsRequest": ("POST", "/copy_weights"),
    "CreateCustomLossRequest": ("POST", "/create_custom_loss"),
    "CreateModelRequest": ("POST", "/create_model"),
    "CreateSamplingSessionRequest": ("POST", "/create_sampling_session"),
    "CreateSessionRequest": ("POST", "/create_session"),
    "ForwardBackwardRequest": ("POST", "/forward_backward"),
    "ForwardRequest": ("POST", "/forward_backward"),
    "FutureRetrieveRequest": ("POST", "/retrieve_future"),
    "FuturesRetrieveRequest": ("POST", "/retrieve_futures"),
    "GetBillingUsageRequest": ("GET", "/billing/usage/events"),
    "GetCurrentCheckpointStorageUsageRequest": ("GET", "/billing/usage/checkpoints/current"),
    "GetInfoRequest": ("POST", "/get_info"),
    "JoinSamplingSessionRequest": ("POST", "/join_sampling_session"),
    "LoadWeightsRequest": ("POST", "/load_weights"),
    "OptimStepRequest": ("POST", "/optim_step"),
    "SampleRequest": ("POST", "/asample"),
    "SaveWeightsExternalRequest": ("POST", "/save_weights_external"),
    "SaveWeightsForSamplerRequest": ("POST", "/save_weights_for_sampler"),
    "SaveWeightsRequest": ("POST", "/save_weights"),
    "SessionHeartbeatRequest": ("POST", "/session_heartbeat"),
    "SessionSearchRequest": ("POST", "/sessions/search"),
    "TelemetrySendRequest": ("POST", "/telemetry"),
    "UnloadModelRequest": ("POST", "/unload_model"),  # a type with no caller in the SDK: served
}


def test_every_request_type_has_its_route():
    names = {n for n, v in vars(types).items() if n.endswith("Request") and inspect.isclass(v)}
    assert names == set(REQUEST_ROUTES), "a request type of the SDK with no route decided here"
    driven = set(DRIVERS) | {("POST", "/unload_model")}
    assert set(REQUEST_ROUTES.values()) <= driven


def test_unload_model(world: World):
    doomed = world.service.create_lora_training_client(base_model=SERVED_NAME, rank=2).result()
    request = types.UnloadModelRequest(model_id=doomed.model_id)
    answer = world.raw(
        lambda c: c.post("/api/v1/unload_model", body=model_dump(request), cast_to=types.UnloadModelResponse)
    )
    assert answer.model_id == doomed.model_id
    with pytest.raises(tinker.BadRequestError, match="was unloaded"):
        doomed.forward([_datum()], "cross_entropy").result()


def _loss_datum(w: World, loss_fn: str) -> types.Datum:
    """A datum with the inputs `loss_fn` takes: sampled with stability records for
    stable_reinforce, whose provenance names the sequence."""
    sampler = w.training.save_weights_and_get_sampling_client(record_stability_info=True).result()
    prompt = [10, 11, 12, 13]
    seq = sampler.sample(
        types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=3, stop=[], seed=4)
    )
    seq = seq.result().sequences[0]
    n, p = len(seq.tokens), len(prompt)
    inputs: dict[str, object] = {
        "target_tokens": prompt[1:] + seq.tokens,
        "logprobs": [0.0] * (p - 1) + list(seq.logprobs),
        "advantages": [0.0] * (p - 1) + [1.0] * n,
    }
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(prompt + seq.tokens[:-1]), loss_fn_inputs=inputs
    )
    if loss_fn in {"cross_entropy", "custom"}:
        return _datum(prompt + seq.tokens)
    if loss_fn == "stable_reinforce":
        return datum.with_provenance(
            model_input=[
                types.PromptProvenanceSpan(sequence_id=seq.sequence_id, length=p),
                types.SampledProvenanceSpan(sequence_id=seq.sequence_id, length=n - 1),
            ],
            loss_fn_inputs=[
                types.PromptProvenanceSpan(sequence_id=seq.sequence_id, offset=1, length=p - 1),
                types.SampledProvenanceSpan(sequence_id=seq.sequence_id, length=n),
            ],
        )
    return datum


LOSS_CONFIG = {"dro": {"beta": 0.05}}


@pytest.mark.parametrize("loss_fn", typing.get_args(types.LossFnType))
def test_every_loss_the_sdk_names(world: World, loss_fn: str):
    datum = _loss_datum(world, loss_fn)
    if loss_fn == "custom":
        with pytest.raises(tinker.BadRequestError, match="server-side custom losses"):
            world.training.forward([datum], loss_fn).result()
        return
    out = world.training.forward([datum], loss_fn, LOSS_CONFIG.get(loss_fn)).result()
    assert np.isfinite(out.metrics["loss:sum"]) and out.loss_fn_outputs[0]["logprobs"].shape == [
        datum.model_input.length
    ]
