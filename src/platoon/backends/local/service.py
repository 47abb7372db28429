"""The Tinker API's service: sessions, training models, samplers and futures, and the handler
of each JSON endpoint.

Work is answered with a future at once and runs later: training requests per model in seq_id
order, sampling in the batched `Sampler`. All torch work goes through one worker thread
(`run_sync`), so HTTP stays responsive while a step computes.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Hashable, Mapping
from typing import TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
import structlog
from starlette.responses import JSONResponse, Response

from platoon.backends.local.bodies import (
    Asample,
    CopyWeights,
    CreateModel,
    CreateSamplingSession,
    CreateSession,
    FinishSession,
    LoadWeights,
    LoraConfig,
    ModelRef,
    OptimizerConfig,
    OptimStep,
    RetrieveFuture,
    RetrieveFutures,
    SamplerRef,
    SaveExternal,
    SaveForSampler,
    SaveWeights,
    SessionRef,
)
from platoon.backends.local.checkpoints import check_name
from platoon.backends.local.engine import Engine
from platoon.backends.local.futures import (
    CompletionLog,
    FutureStore,
    Job,
    Outcome,
    SeqError,
    SeqQueue,
    SyncJob,
    failure,
    json_outcome,
    proto_outcome,
)
from platoon.backends.local.losses import DERIVED_INPUTS
from platoon.backends.local.proto import (
    ForwardBackwardCall,
    SampledSequence,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)
from platoon.backends.local.sampler import Sampler, SampleRequest
from platoon.backends.local.sampling_requests import read_sample_request
from platoon.backends.local.specs import AdamParams, EngineError, LoraSpec, WeightsRef, not_offered
from platoon.backends.local.stability import StabilityRecords
from platoon.backends.local.streams import SAMPLE_STREAM, STREAM_TAKES

__all__ = ["Answer", "Session", "TinkerService", "UserError", "error_response"]

T = TypeVar("T")
Answer = dict[str, object] | Response  # a handler's answer: JSON to encode, or a response as is

log = structlog.get_logger(__name__)
CLONE_STRIDE = 1_000_000_000  # a cloned sampling client numbers its requests from clone * this
SEQ_AHEAD = 4096  # how far past a model's next seq_id a training request may be numbered


class UserError(ValueError):
    """A request the server refuses; answered as `{"error", "category": "user"}`."""


class Session:
    """A client's session: its training models and samplers, and how it ended."""

    def __init__(self, session_id: str, request: CreateSession | None = None) -> None:
        self.id = session_id
        self.created_at = time.time()
        self.finished = False
        self.finish_reason: str | None = None  # success, errored or interrupted, as the client said
        self.models: list[str] = []
        self.samplers: list[str] = []
        self.user_metadata = _strings(request.user_metadata if request else None)
        self.display_name = request.display_name if request else None


class _Model:
    def __init__(
        self, session: Session, queue: SeqQueue, rank: int, user_metadata: Mapping[str, object] | None = None
    ) -> None:
        self.session = session
        self.queue = queue
        self.rank = rank
        self.ready = False
        self.unloaded = False
        self.user_metadata = _strings(user_metadata)
        self.last_request = time.time()


def _strings(metadata: Mapping[str, object] | None) -> dict[str, str] | None:
    return {str(k): str(v) for k, v in metadata.items()} if metadata else None


class _SamplerSession:
    def __init__(self, session: Session, weights: WeightsRef, model_path: str | None) -> None:
        self.session = session
        self.weights = weights
        self.model_path = model_path
        self.clones = 0  # clients that joined it (join_sampling_session); the original is 0


class TinkerService:
    """Sessions, models, samplers and futures; the HTTP handlers live on it."""

    def __init__(
        self,
        engine: Engine,
        *,
        model_name: str,
        api_key: str | None = None,
        poll_timeout: float = 25.0,
        max_batch: int = 64,
        batch_invariant: bool = False,
        client_config: Mapping[str, object] | None = None,
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.api_key = api_key
        self.poll_timeout = poll_timeout
        self.futures = FutureStore()
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, _Model] = {}
        self.samplers: dict[str, _SamplerSession] = {}
        self._lane = anyio.CapacityLimiter(1)
        self.sampler = Sampler(engine, self.run_sync, max_batch=max_batch, batch_invariant=batch_invariant)
        self._tg: anyio.abc.TaskGroup | None = None
        self._names = {model_name, str(engine.model_dir)}
        # The SDK's feature flags this server answers client/config with (all off by default,
        # as hosted Tinker's are; a test or an operator may turn the ones served here on).
        self.client_flags = {"pjwt_auth_enabled": False, **(client_config or {})}
        self.stability = StabilityRecords()
        self.completions = CompletionLog()
        self._cancel: dict[str, anyio.CancelScope] = {}

    async def run_sync(self, fn: Callable[[], T]) -> T:
        """Run torch work in the single worker thread."""
        return await anyio.to_thread.run_sync(fn, limiter=self._lane)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self.sampler.run)
            yield
            tg.cancel_scope.cancel()

    def _spawn(self, fn: Callable[[], Coroutine[object, object, None]]) -> None:
        assert self._tg is not None, "the service runs inside its lifespan"
        self._tg.start_soon(fn)

    # ---- lookups ----

    def _session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise UserError(f"unknown session_id {session_id!r}")
        if session.finished:
            raise UserError(f"session {session_id} has finished")
        return session

    def _model(self, model_id: str) -> _Model:
        model = self.models.get(model_id)
        if model is None or not model.ready:
            raise UserError(self._unknown_model(model_id))
        if model.unloaded:
            raise UserError(f"model {model_id} was unloaded")
        if model.session.finished:
            raise UserError(f"session {model.session.id} of model {model_id} has finished")
        model.last_request = time.time()
        return model

    def _unknown_model(self, model_id: str) -> str:
        """Why a model id is unknown and what to do: after a restart, which checkpoint to resume from."""
        message = f"unknown model_id {model_id!r}: this server holds training models in memory and does not hold this one"
        try:
            saved = [c for c in self.engine.checkpoints(model_id, prune=False) if c.kind == "weights"]
        except EngineError:
            saved = []
        if not saved:
            return (
                f"{message} (was the server restarted?). Nothing of it was saved here, so its training "
                "state is lost: start the run again, or `platoon train --resume RUN_DIR` to go on from "
                "the run's last checkpoint"
            )
        return (
            f"{message}, but its checkpoints survive: the server was restarted. The training client "
            f"cannot go on; its last saved state is {saved[-1].tinker_path}. Resume with `platoon train "
            "--resume RUN_DIR` (it loads the last checkpoint into a new model), or load that path with "
            "ServiceClient.create_training_client_from_state_with_optimizer"
        )

    def _check_base_model(self, base_model: str | None) -> None:
        if base_model is not None and base_model not in self._names:
            raise UserError(f"unknown base_model {base_model!r}; this server serves {self.model_name!r}")

    # ---- running work ----

    def _future(
        self, key: Hashable | None, work: Callable[[], Awaitable[Outcome]], target: Hashable | None = None
    ) -> tuple[str, bool]:
        """New work answered by a future. With a `target` (a sampler and clone) the work can be
        cancelled (`cancel_future`) and its completion is reported to `retrieve_futures`."""
        request_id, new = self.futures.create(key)
        if new:
            self._spawn(lambda: self._settle(request_id, work, target))
        return request_id, new

    async def _settle(
        self, request_id: str, work: Callable[[], Awaitable[Outcome]], target: Hashable | None = None
    ) -> None:
        outcome = failure(f"request {request_id} was cancelled by the client")
        with anyio.CancelScope() as scope:
            if target is not None:
                self._cancel[request_id] = scope
            try:
                outcome = await work()
            except (EngineError, UserError, SeqError) as exc:
                outcome = failure(str(exc))
            except Exception as exc:
                log.exception("request failed", request_id=request_id)
                outcome = failure(f"internal error: {exc!r}", "server")
            finally:
                self._cancel.pop(request_id, None)
        self.futures.resolve(request_id, outcome)
        if target is not None:
            self.completions.add(target, request_id, outcome)

    def _queued(
        self,
        model_id: str,
        seq_id: int,
        work: Callable[[], Awaitable[Outcome]] | None = None,
        *,
        compute: Callable[[], Outcome] | None = None,
    ) -> str:
        """A training request: deduplicated on (model_id, seq_id), run in seq_id order.

        `work` runs on the event loop; `compute` (torch work with no server state to touch) runs
        in the worker thread, together with the compute of the requests queued right behind it.
        """
        key = ("train", model_id, seq_id)
        retried = self.futures.of_key(key)
        if retried is not None:
            return retried
        model = self._model(model_id)  # an unknown model, or one that ended: a 400
        try:
            model.queue.check(seq_id)
        except SeqError as exc:
            raise UserError(str(exc)) from None
        request_id, _ = self.futures.create(key)
        try:
            if compute is not None:
                job: Job = SyncJob(
                    _guarded(request_id, compute), lambda outcome: self.futures.resolve(request_id, outcome)
                )
            else:
                assert work is not None
                job = lambda: self._settle(request_id, work)  # noqa: E731
            model.queue.submit(seq_id, request_id, job)
        except SeqError as exc:
            self.futures.resolve(request_id, failure(str(exc)))
        return request_id

    def skip(self, model_id: str, seq_id: int, message: str) -> None:
        """Use up `seq_id` of a model with a failed request (its body was refused)."""

        async def refused() -> Outcome:
            raise UserError(message)

        if model_id in self.models:
            with contextlib.suppress(UserError):  # a model that ended, or a seq_id out of reach
                self._queued(model_id, seq_id, refused)

    async def _start_model(self, model_id: str, model: _Model) -> None:
        model.ready = True
        self._spawn(lambda: self._drive(model_id, model))

    async def _drive(self, model_id: str, model: _Model) -> None:
        left = await model.queue.run()
        for request_id in left:
            self.futures.resolve(request_id, failure(f"session {model.session.id} finished first"))
        # The entry stays (a few bytes) so later requests learn that the session finished.
        await self.run_sync(lambda: self.engine.release_model(model_id))

    # ---- handlers ----

    async def client_config(self, body: bytes) -> Answer:
        return dict(self.client_flags)

    async def dynamic_config(self, body: bytes) -> Answer:
        # Cancelling is served: an abandoned sample stops at once instead of running on.
        return {"sample_cancel_enabled": True}

    async def create_session(self, body: bytes) -> Answer:
        request = msgspec.json.decode(body, type=CreateSession)
        session_id = f"local-{uuid.uuid4().hex[:12]}"
        self.sessions[session_id] = Session(session_id, request)
        return {"session_id": session_id, "type": "create_session"}

    async def heartbeat(self, body: bytes) -> Answer:
        ref = msgspec.json.decode(body, type=SessionRef)
        session = self.sessions.get(ref.session_id)
        if session is None:
            return error_response(f"unknown session_id {ref.session_id!r}", 404)
        if session.finished:
            return error_response(f"session {ref.session_id} has finished", 410)
        return {"type": "session_heartbeat"}

    async def finish_session(self, session_id: str, body: bytes = b"") -> Answer:
        session = self.sessions.get(session_id)
        if session is None:
            return error_response(f"unknown session_id {session_id!r}", 404)
        if not session.finished:
            session.finished = True
            try:
                session.finish_reason = msgspec.json.decode(body or b"{}", type=FinishSession).reason.type
            except msgspec.DecodeError:
                session.finish_reason = "success"
            for model_id in session.models:
                model = self.models.get(model_id)
                if model is not None:
                    model.queue.close()
            for sampler_id in session.samplers:
                sampler = self.samplers.get(sampler_id)
                if sampler is not None and sampler.weights.key is not None:
                    weights = sampler.weights
                    await self.run_sync(functools.partial(self.engine.drop_weights, weights))
            self.stability.forget_session(session_id)
            samplers = set(session.samplers)
            self.completions.forget(lambda target: isinstance(target, tuple) and target[0] in samplers)
        return {}

    async def create_model(self, body: bytes) -> Answer:
        req = msgspec.json.decode(body, type=CreateModel)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        session = self._session(req.session_id)
        self._check_base_model(req.base_model)
        _check_optimizer(req.optimizer_config)
        lora = req.lora_config or LoraConfig()
        spec = LoraSpec(lora.rank, lora.seed, lora.train_mlp, lora.train_attn, lora.train_unembed)
        if not (spec.train_mlp or spec.train_attn or spec.train_unembed):
            raise UserError("lora_config trains nothing: enable train_mlp, train_attn or train_unembed")

        async def work() -> Outcome:
            if model_id in self.models:
                raise UserError(f"model {model_id} already exists")
            await self.run_sync(lambda: self.engine.create_model(model_id, spec))
            model = _Model(
                session,
                SeqQueue(first=1, run_group=self.run_sync, ahead=SEQ_AHEAD),
                spec.rank,
                req.user_metadata,
            )
            self.models[model_id] = model
            session.models.append(model_id)
            await self._start_model(model_id, model)
            return json_outcome({"model_id": model_id, "type": "create_model"})

        request_id, _ = self._future(("model", req.session_id, req.model_seq_id), work)
        return {"request_id": request_id, "model_id": model_id}

    async def get_info(self, body: bytes) -> Answer:
        ref = msgspec.json.decode(body, type=ModelRef)
        model = self._model(ref.model_id)
        return {
            "model_id": ref.model_id,
            "model_data": {
                "arch": getattr(self.engine.base.config, "model_type", None),
                "model_name": self.model_name,
                # The served name: a client elsewhere loads the tokenizer by it (hub name or path).
                "tokenizer_id": self.model_name,
            },
            "is_lora": True,
            "lora_rank": model.rank,
            "type": "get_info",
        }

    async def forward_backward(self, body: bytes) -> Answer:
        # A large batch parses and is checked on a worker thread: the server keeps answering
        # meanwhile. It is checked whole (lengths, ids, loss) before it is queued: a 400, not a
        # failed future.
        small = len(body) <= 2**20
        call = (
            decode_forward_backward(body)
            if small
            else await anyio.to_thread.run_sync(decode_forward_backward, body)
        )
        self._model(call.model_id)
        refused = self._derive_inputs(call)
        if refused is not None:
            raise UserError(refused)
        check = functools.partial(self.engine.check_batch, call.data, call.loss_fn, call.config)
        check() if small else await anyio.to_thread.run_sync(check)

        def compute() -> Outcome:
            logprobs, metrics = self.engine.forward_backward(
                call.model_id,
                call.data,
                call.loss_fn,
                call.config,
                forward_only=call.forward_only,
                # reproducible sampling whose rows batch: the trainer scores as it samples
                like_sampler=self.sampler.batch_invariant and self.sampler.rows_batched,
            )
            return proto_outcome(encode_forward_backward_output(logprobs, metrics))

        request_id = self._queued(call.model_id, call.seq_id, compute=compute)
        return {"request_id": request_id, "model_id": call.model_id}

    def _derive_inputs(self, call: ForwardBackwardCall) -> str | None:
        """stable_reinforce's per-token inputs from each datum's provenance and the sampler's
        records, added in place (on the event loop, which owns the records); or why not."""
        if call.loss_fn != "stable_reinforce":
            return None
        model = self.models[call.model_id]
        try:
            for i, datum in enumerate(call.data):
                sent = DERIVED_INPUTS & set(datum.inputs)
                if sent:
                    raise UserError(
                        f"datum {i}: loss_fn_inputs {sorted(sent)} are derived by the server from "
                        "provenance; do not send them"
                    )
                datum.inputs.update(self.stability.resolve(model.session.id, i, datum))
        except (UserError, EngineError) as exc:
            return str(exc)
        return None

    async def optim_step(self, body: bytes) -> Answer:
        req = msgspec.json.decode(body, type=OptimStep)
        params = _adam(req)

        def compute() -> Outcome:
            metrics = self.engine.optim_step(req.model_id, params)
            return json_outcome({"metrics": metrics, "type": "optim_step"})

        return {
            "request_id": self._queued(req.model_id, req.seq_id, compute=compute),
            "model_id": req.model_id,
        }

    async def save_weights(self, body: bytes) -> Answer:
        req = msgspec.json.decode(body, type=SaveWeights)
        if req.path is not None:
            check_name(req.path)

        async def work() -> Outcome:
            name = req.path or f"state-{uuid.uuid4().hex[:8]}"
            path = await self.run_sync(
                lambda: self.engine.save_state(req.model_id, name, overwrite=req.overwrite)
            )
            await self._expire(path, req.ttl_seconds)
            return json_outcome({"path": path, "type": "save_weights"})

        return {"request_id": self._queued(req.model_id, req.seq_id, work), "model_id": req.model_id}

    async def save_weights_for_sampler(self, body: bytes) -> Answer:
        req = msgspec.json.decode(body, type=SaveForSampler)
        if req.path is not None:
            check_name(req.path)
        elif req.kind not in ("inflight", "snapshot"):
            raise UserError(f"unknown sampling client kind {req.kind!r}")

        async def work() -> Outcome:
            if req.path is not None:
                path = await self.run_sync(lambda: self.engine.save_for_sampler(req.model_id, req.path or ""))
                await self._expire(path, req.ttl_seconds)
                return json_outcome({"path": path, "type": "save_weights_for_sampler"})
            if req.sampling_session_seq_id is None:
                raise UserError("save_weights_for_sampler needs a path or a sampling_session_seq_id")
            model = self._model(req.model_id)
            if req.kind == "inflight":
                weights = WeightsRef(model_id=req.model_id)
            elif req.kind == "snapshot":
                weights = await self.run_sync(lambda: self.engine.snapshot(req.model_id))
            else:
                raise UserError(f"unknown sampling client kind {req.kind!r}")
            sampler_id = self._add_sampler(model.session, req.sampling_session_seq_id, weights, None)
            return json_outcome({"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"})

        return {"request_id": self._queued(req.model_id, req.seq_id, work), "model_id": req.model_id}

    async def load_weights(self, body: bytes) -> Answer:
        req = msgspec.json.decode(body, type=LoadWeights)
        if req.model_id is not None:

            async def load() -> Outcome:
                await self.run_sync(
                    lambda: self.engine.load_state(req.model_id or "", req.path, optimizer=req.optimizer)
                )
                return json_outcome({"path": req.path, "type": "load_weights"})

            return {"request_id": self._queued(req.model_id, req.seq_id or 0, load), "model_id": req.model_id}
        if req.session_id is None or req.model_seq_id is None:
            raise UserError("load_weights needs model_id and seq_id, or session_id and model_seq_id")
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        session = self._session(req.session_id)
        self._check_base_model(req.base_model)
        if not req.optimizer:
            _check_optimizer(req.optimizer_config)

        async def create() -> Outcome:
            if model_id in self.models:
                raise UserError(f"model {model_id} already exists")
            await self.run_sync(
                lambda: self.engine.create_from_state(model_id, req.path, optimizer=req.optimizer)
            )
            model = _Model(
                session,
                SeqQueue(first=1, run_group=self.run_sync, ahead=SEQ_AHEAD),
                self.engine.lora_rank(model_id),
            )
            self.models[model_id] = model
            session.models.append(model_id)
            await self._start_model(model_id, model)
            return json_outcome({"path": req.path, "model_id": model_id, "type": "load_weights"})

        request_id, _ = self._future(("model", req.session_id, req.model_seq_id), create)
        return {"request_id": request_id, "model_id": model_id}

    async def _expire(self, tinker_path: str, ttl_seconds: int | None) -> None:
        if ttl_seconds:
            run, _, checkpoint_id = tinker_path.removeprefix("tinker://").partition("/")
            when = time.time() + ttl_seconds
            await self.run_sync(lambda: self.engine.mark_checkpoint(run, checkpoint_id, expires_at=when))

    def _add_sampler(self, session: Session, seq_id: int, weights: WeightsRef, model_path: str | None) -> str:
        sampler_id = f"{session.id}:sample:{seq_id}"
        self.samplers[sampler_id] = _SamplerSession(session, weights, model_path)
        session.samplers.append(sampler_id)
        return sampler_id

    async def create_sampling_session(self, body: bytes) -> Answer:
        req = msgspec.json.decode(body, type=CreateSamplingSession)
        session = self._session(req.session_id)
        sampler_id = f"{session.id}:sample:{req.sampling_session_seq_id}"
        if sampler_id in self.samplers:
            return {"sampling_session_id": sampler_id, "type": "create_sampling_session"}
        if req.model_path is not None:
            path = req.model_path
            weights = await self.run_sync(lambda: self.engine.sampler_weights(path))
        else:
            if req.base_model is None:
                raise UserError("create_sampling_session needs model_path or base_model")
            self._check_base_model(req.base_model)
            weights = WeightsRef()
        self._add_sampler(session, req.sampling_session_seq_id, weights, req.model_path)
        return {"sampling_session_id": sampler_id, "type": "create_sampling_session"}

    async def get_sampler(self, sampler_id: str) -> Answer:
        sampler = self.samplers.get(sampler_id)
        if sampler is None:
            return error_response(f"unknown sampler {sampler_id!r}", 404)
        return {"sampler_id": sampler_id, "base_model": self.model_name, "model_path": sampler.model_path}

    async def asample(self, body: bytes) -> Answer:
        # Read and checked whole before it is answered (a large prompt on a worker thread): a
        # request the sampler would refuse is a 400, and nothing is built for one (num_samples
        # of 2e7 once built 2e7 ids here, and stalled the server for 18 s, before it was refused).
        read = functools.partial(self._checked_sample, body)
        req, request = read() if len(body) <= 2**20 else await anyio.to_thread.run_sync(read)
        key = ("sample", req.sampling_session_id, req.seq_id) if req.seq_id is not None else None
        num = req.num_samples

        target = None
        if req.sampling_session_id is not None:
            target = (req.sampling_session_id, (req.seq_id or 0) // CLONE_STRIDE)

        async def work() -> Outcome:
            result = await self.sampler.sample(request)
            if req.record_stability_info:
                self._record(req, request_id, request.prompt, result.sequences)
            return proto_outcome(
                encode_sample_response(
                    result.sequences, result.prompt_logprobs, result.topk_prompt, result.cache_hit_tokens
                )
            )

        request_id, _ = self._future(key, work, target)
        return {"request_id": request_id, "sample_sequence_ids": [f"{request_id}:{i}" for i in range(num)]}

    def _checked_sample(self, body: bytes) -> tuple[Asample, SampleRequest]:
        req = msgspec.json.decode(body, type=Asample)
        request = self.sample_request(req)
        self.sampler.check(request)
        if req.record_stability_info and req.sampling_session_id is None:
            raise UserError("record_stability_info needs a sampling session (a sampling client)")
        return req, request

    def _record(
        self, req: Asample, request_id: str, prompt: list[int], sequences: list[SampledSequence]
    ) -> None:
        """Keep what stable_reinforce will check a datum's provenance against."""
        sampler = self.samplers.get(req.sampling_session_id or "")
        if sampler is None:
            raise UserError("record_stability_info needs a sampling session (a sampling client)")
        ids = [f"{request_id}:{i}" for i in range(len(sequences))]
        self.stability.record(sampler.session.id, ids, prompt, sequences)

    def sample_request(self, req: Asample) -> SampleRequest:
        if req.sampling_session_id is not None:
            sampler = self.samplers.get(req.sampling_session_id)
            if sampler is None:
                raise UserError(f"unknown sampling_session_id {req.sampling_session_id!r}")
            if sampler.session.finished:
                raise UserError(f"session {sampler.session.id} has finished")
            weights = sampler.weights
        elif req.model_path is not None:
            raise UserError("sampling by model_path needs a sampling session; create one first")
        else:
            self._check_base_model(req.base_model)
            weights = WeightsRef()
        return read_sample_request(req, weights, self.engine.eos_ids, self.engine.max_context)

    async def retrieve_futures(self, body: bytes) -> Answer:
        """A sampling client's completions after its cursor (long-polled, as retrieve_future)."""
        req = msgspec.json.decode(body, type=RetrieveFutures)
        if req.target.sampling_session_id not in self.samplers:
            return error_response(f"unknown sampling_session_id {req.target.sampling_session_id!r}", 404)
        for request_id in req.retrieved_request_ids:
            self.futures.retrieved(request_id)
        timeout = self.poll_timeout if req.timeout is None else max(0.0, min(req.timeout, self.poll_timeout))
        target = (req.target.sampling_session_id, req.target.cloned_sampler_id)
        events, cursor = await self.completions.after(target, req.prev_cursor, timeout)
        completions = [
            {"state": "finished", "request_id": e.request_id, "response_payload_uncompressed_size": e.size}
            if e.ok
            else {"state": "failed", "request_id": e.request_id}
            for e in events
        ]
        return {"completions": completions, "cursor": cursor}

    async def cancel_future(self, body: bytes) -> Answer:
        """Stop a sampling request its client gave up on; it then fails as cancelled."""
        req = msgspec.json.decode(body, type=RetrieveFuture)
        if not self.futures.known(req.request_id):
            return error_response(f"unknown request_id {req.request_id!r}", 404)
        scope = self._cancel.get(req.request_id)
        if scope is not None:
            scope.cancel()
        elif self.futures.outcome(req.request_id) is None:
            raise UserError(f"request {req.request_id} cannot be cancelled: only sampling requests can")
        return {}

    async def join_sampling_session(self, body: bytes) -> Answer:
        """A clone id for an unpickled sampling client, so its seq_ids never meet another's."""
        req = msgspec.json.decode(body, type=SamplerRef)
        sampler = self.samplers.get(req.sampling_session_id)
        if sampler is None:
            return error_response(f"unknown sampling_session_id {req.sampling_session_id!r}", 404)
        if sampler.session.finished:
            return error_response(f"session {sampler.session.id} has finished", 410)
        sampler.clones += 1
        return {"type": "join_sampling_session", "client_counter": sampler.clones}

    async def unload_model(self, body: bytes) -> Answer:
        """Free a training model before its session ends; requests still queued fail."""
        ref = msgspec.json.decode(body, type=ModelRef)
        model = self._model(ref.model_id)
        model.unloaded = True
        model.queue.close()
        return {"model_id": ref.model_id, "type": "unload_model"}

    async def copy_weights(self, body: bytes) -> Answer:
        """Copy a checkpoint into a new training run (one that holds no trainable model)."""
        req = msgspec.json.decode(body, type=CopyWeights)
        if req.session_id is not None and req.model_seq_id is not None:
            self._session(req.session_id)
            run_id = f"{req.session_id}:train:{req.model_seq_id}"
            if run_id in self.models:
                raise UserError(f"training run {run_id} already exists")
        elif req.destination_project_id is not None:
            run_id = f"copy-{uuid.uuid4().hex[:12]}"  # one owner, no projects: any id is this server
        else:
            raise UserError("copy_weights needs destination_project_id, or session_id and model_seq_id")
        path = await self.run_sync(lambda: self.engine.copy_checkpoint(req.source_path, run_id))
        await self._expire(path, req.ttl_seconds)
        return {"tinker_path": path}

    async def save_weights_external(self, body: bytes) -> Answer:
        """Refused in its place in the model's order, so the requests behind it still run."""
        req = msgspec.json.decode(body, type=SaveExternal)

        async def refused() -> Outcome:
            raise UserError(
                not_offered(
                    "save_weights_external (external weights with signed download URLs)",
                    "save_state or save_weights_for_sampler write the checkpoint under the server's "
                    "--checkpoint-dir, where its files can be read",
                )
            )

        return {"request_id": self._queued(req.model_id, req.seq_id or 0, refused), "model_id": req.model_id}

    async def retrieve_future(self, body: bytes) -> Answer:
        req = msgspec.json.decode(body, type=RetrieveFuture)
        if not self.futures.known(req.request_id):
            return error_response(f"unknown request_id {req.request_id!r}", 404)
        outcome = await self.futures.wait(req.request_id, self.poll_timeout)
        if outcome is None:
            return JSONResponse(
                {"type": "try_again", "request_id": req.request_id, "queue_state": "active"}, status_code=408
            )
        return Response(outcome.body, media_type=outcome.content_type)

    def capabilities(self) -> dict[str, object]:
        return {
            "supported_models": [
                {
                    "model_name": self.model_name,
                    "max_context_length": self.engine.max_context,
                    "trainable": True,
                    "sampleable": True,
                }
            ],
            # Not read by the SDK (it ignores unknown fields); for people and tools asking the
            # server, and for platoon's own client: the routes platoon adds to the Tinker API.
            "platoon": {
                **self.engine.facts(),
                "routes": {"sample_stream": SAMPLE_STREAM},
                "sample_stream_takes": STREAM_TAKES,
            },
        }


def _guarded(request_id: str, compute: Callable[[], Outcome]) -> Callable[[], Outcome]:
    """`compute`, with its errors turned into the failure the SDK reads."""

    def run() -> Outcome:
        try:
            return compute()
        except (EngineError, UserError, SeqError) as exc:
            return failure(str(exc))
        except Exception as exc:
            log.exception("request failed", request_id=request_id)
            return failure(f"internal error: {exc!r}", "server")

    return run


def _adam(req: OptimStep) -> AdamParams:
    """An optim_step's Adam settings, checked (in range, finite) before it is queued."""
    if req.adam_params is None:
        kind = (req.optimizer_params or {}).get("type", "unknown")
        raise UserError(f"optimizer {kind!r} is not supported; use AdamParams")
    try:
        params = msgspec.convert(req.adam_params, AdamParams)
    except msgspec.ValidationError as exc:
        raise UserError(f"adam_params: {exc}") from None
    infinite = [f for f in params.__struct_fields__ if not math.isfinite(getattr(params, f))]
    if infinite:
        raise UserError(f"adam_params: {infinite[0]} must be finite")
    return params


def _check_optimizer(config: OptimizerConfig | None) -> None:
    if config is not None and config.type != "adamw":
        raise UserError(f"optimizer {config.type!r} is not supported; this server trains with adamw")


def error_response(message: str, status: int = 400, category: str = "user") -> Response:
    return JSONResponse({"error": message, "category": category}, status_code=status)
