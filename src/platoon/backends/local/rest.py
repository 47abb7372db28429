"""The REST half of the Tinker API, as the SDK's `RestClient` calls it.

Training runs (a run is a training model, `{session}:train:{n}`), their checkpoints
(`tinker://<run>/<weights|sampler_weights>/<name>`: list, delete, publish, TTL), sessions,
samplers and weights info. Runs and checkpoints are read from the checkpoint directory, so they
outlive a restart of the server; sessions and samplers live in memory.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from platoon.backends.local.bodies import Ttl
from platoon.backends.local.checkpoints import CheckpointInfo
from platoon.backends.local.service import Answer, Session, TinkerService
from platoon.backends.local.specs import EngineError, LoraSpec
from platoon.backends.local.unoffered import refusal

__all__ = ["rest_routes"]

OWNER = "local"  # this server has one user: whoever holds its key


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat()


def _checkpoint(c: CheckpointInfo) -> dict[str, object]:
    return {
        "checkpoint_id": c.checkpoint_id,
        "checkpoint_type": "training" if c.kind == "weights" else "sampler",
        "time": _when(c.time),
        "tinker_path": c.tinker_path,
        "size_bytes": c.size_bytes,
        "public": c.public,
        "expires_at": _when(c.expires_at) if c.expires_at is not None else None,
    }


def _page(request: Request) -> tuple[int, int]:
    try:
        limit = max(0, min(int(request.query_params.get("limit", 20)), 1000))
        offset = max(0, int(request.query_params.get("offset", 0)))
    except ValueError:
        raise EngineError("limit and offset must be integers") from None
    return limit, offset


def _error(message: str, status: int) -> Response:
    return JSONResponse({"error": message, "category": "user"}, status_code=status)


class _Ttl(msgspec.Struct):
    ttl_seconds: Ttl | None = None


class _WeightsInfo(msgspec.Struct):
    tinker_path: str


class _SearchCursor(msgspec.Struct):
    last_created_at: datetime.datetime
    last_session_id: str


class _Status(msgspec.Struct):
    type: str
    reasons: list[str] | None = None


class _Search(msgspec.Struct):
    session_id: str | None = None
    project_ids: list[str] | None = None
    user_metadata: dict[str, str] = {}
    display_name: str | None = None
    statuses: list[_Status] | None = None
    limit: int = 50
    cursor: _SearchCursor | None = None


def _status(session: Session) -> dict[str, object]:
    if not session.finished:
        return {"type": "active"}
    return {"type": "client_finished", "reason": {"type": session.finish_reason or "success"}}


def _matches(search: _Search, session: Session) -> bool:
    """A session matches by id or by display name (either, when both are given), by every
    metadata pair, and by any of the statuses."""
    named = search.session_id is not None or search.display_name is not None
    if named:
        by_id = search.session_id == session.id
        name = (session.display_name or "").lower()
        words = (search.display_name or "").lower().split()
        by_name = bool(words) and all(w in name for w in words)
        if not (by_id or by_name):
            return False
    metadata = session.user_metadata or {}
    if any(metadata.get(k) != v for k, v in search.user_metadata.items()):
        return False
    if search.statuses is not None:
        status = _status(session)
        reason = session.finish_reason or "success"
        if not any(
            q.type == status["type"]
            and (q.type != "client_finished" or q.reasons is None or reason in q.reasons)
            for q in search.statuses
        ):
            return False
    return True


def rest_routes(service: TinkerService) -> list[Route]:
    """The routes, under /api/v1, that answer the SDK's RestClient."""
    rest = _Rest(service)
    v1 = "/api/v1"
    return [
        Route(f"{v1}/training_runs", _endpoint(rest.list_runs), methods=["GET"]),
        Route(f"{v1}/training_runs/{{run_id}}", _endpoint(rest.get_run), methods=["GET"]),
        Route(
            f"{v1}/training_runs/{{run_id}}/checkpoints", _endpoint(rest.list_checkpoints), methods=["GET"]
        ),
        Route(
            f"{v1}/training_runs/{{run_id}}/checkpoints/{{rest:path}}",
            _endpoint(rest.checkpoint),
            methods=["GET", "DELETE", "POST", "PUT"],
        ),
        Route(f"{v1}/checkpoints", _endpoint(rest.user_checkpoints), methods=["GET"]),
        Route(f"{v1}/sessions", _endpoint(rest.list_sessions), methods=["GET"]),
        Route(f"{v1}/sessions/search", _endpoint(rest.search_sessions), methods=["POST"]),
        Route(f"{v1}/sessions/{{session_id}}", _endpoint(rest.get_session), methods=["GET"]),
        Route(f"{v1}/weights_info", _endpoint(rest.weights_info), methods=["POST"]),
    ]


class _Rest:
    """The RestClient's endpoints over one service: its training runs, checkpoints, sessions."""

    def __init__(self, service: TinkerService) -> None:
        self.service = service
        self.engine = service.engine

    def training_run(self, run_id: str) -> dict[str, object] | None:
        model = self.service.models.get(run_id)
        checkpoints = self.engine.checkpoints(run_id)
        if model is None and not checkpoints:
            return None
        training = [c for c in checkpoints if c.kind == "weights"]
        sampler = [c for c in checkpoints if c.kind == "sampler_weights"]
        if model is not None:
            rank, metadata, last = model.rank, model.user_metadata, model.last_request
        else:
            spec: LoraSpec = self.engine.weights_info(checkpoints[-1].tinker_path)
            rank, metadata, last = spec.rank, None, checkpoints[-1].time
        return {
            "training_run_id": run_id,
            "base_model": self.service.model_name,
            "model_owner": OWNER,
            "is_lora": True,
            "corrupted": False,
            "lora_rank": rank,
            "last_request_time": _when(last),
            "last_checkpoint": _checkpoint(training[-1]) if training else None,
            "last_sampler_checkpoint": _checkpoint(sampler[-1]) if sampler else None,
            "user_metadata": metadata,
        }

    def run_ids(self) -> list[str]:
        live = sorted(self.service.models, key=lambda m: self.service.models[m].last_request, reverse=True)
        return live + [r for r in self.engine.runs_on_disk() if r not in self.service.models]

    async def list_runs(self, request: Request) -> Answer:
        ids = self.run_ids()
        limit, offset = _page(request)
        runs = [
            r
            for r in (
                await self.service.run_sync(
                    lambda: [self.training_run(i) for i in ids[offset : offset + limit]]
                )
            )
            if r
        ]
        return {"training_runs": runs, "cursor": {"offset": offset, "limit": limit, "total_count": len(ids)}}

    async def get_run(self, request: Request) -> Answer:
        run_id = request.path_params["run_id"]
        run = await self.service.run_sync(lambda: self.training_run(run_id))
        return run if run is not None else _error(f"unknown training run {run_id!r}", 404)

    async def list_checkpoints(self, request: Request) -> Answer:
        run_id = request.path_params["run_id"]
        checkpoints = await self.service.run_sync(lambda: self.engine.checkpoints(run_id))
        if not checkpoints and run_id not in self.service.models:
            return _error(f"unknown training run {run_id!r}", 404)
        return {"checkpoints": [_checkpoint(c) for c in checkpoints], "cursor": None}

    async def user_checkpoints(self, request: Request) -> Answer:
        def every() -> list[CheckpointInfo]:
            found = [c for run in self.engine.runs_on_disk() for c in self.engine.checkpoints(run)]
            return sorted(found, key=lambda c: c.time, reverse=True)

        checkpoints = await self.service.run_sync(every)
        limit, offset = _page(request)
        return {
            "checkpoints": [_checkpoint(c) for c in checkpoints[offset : offset + limit]],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(checkpoints)},
        }

    async def checkpoint(self, request: Request) -> Answer:
        """DELETE a checkpoint; POST/DELETE `.../publish`; PUT `.../ttl`."""
        run_id, rest = request.path_params["run_id"], request.path_params["rest"]
        checkpoint_id, _, action = rest.rpartition("/") if rest.count("/") >= 2 else (rest, "", "")
        method = request.method
        if action == "" and method == "DELETE":
            await self.service.run_sync(lambda: self.engine.delete_checkpoint(run_id, checkpoint_id))
        elif action == "publish" and method in {"POST", "DELETE"}:
            public = method == "POST"
            await self.service.run_sync(
                lambda: self.engine.mark_checkpoint(run_id, checkpoint_id, public=public)
            )
        elif action == "ttl" and method == "PUT":
            ttl = msgspec.json.decode(await request.body() or b"{}", type=_Ttl).ttl_seconds
            expires = time.time() + ttl if ttl else None
            await self.service.run_sync(
                lambda: self.engine.mark_checkpoint(run_id, checkpoint_id, expires_at=expires)
            )
        elif action == "" and method == "GET":
            found = [
                c
                for c in await self.service.run_sync(lambda: self.engine.checkpoints(run_id))
                if c.checkpoint_id == checkpoint_id
            ]
            return _checkpoint(found[0]) if found else _error(f"no checkpoint {checkpoint_id!r}", 404)
        else:
            return _error(f"{method} {request.url.path} is not supported by this server", 404)
        return Response(status_code=204)

    async def list_sessions(self, request: Request) -> Answer:
        ids = list(reversed(self.service.sessions))
        limit, offset = _page(request)
        return {"sessions": ids[offset : offset + limit]}

    async def get_session(self, request: Request) -> Answer:
        session = self.service.sessions.get(request.path_params["session_id"])
        if session is None:
            return _error(f"unknown session {request.path_params['session_id']!r}", 404)
        return {
            "training_run_ids": list(session.models),
            "sampler_ids": list(session.samplers),
            "user_metadata": session.user_metadata,
            "display_name": session.display_name,
        }

    async def search_sessions(self, request: Request) -> Answer:
        search = msgspec.json.decode(await request.body() or b"{}", type=_Search)
        if search.project_ids is not None:
            return refusal("projects", "this server has one owner and no projects; leave project_ids out")
        if not 1 <= search.limit <= 200:
            return _error("limit must be between 1 and 200", 400)

        def key(session: Session) -> tuple[datetime.datetime, str]:
            return datetime.datetime.fromtimestamp(session.created_at, datetime.UTC), session.id

        found = sorted(
            (s for s in self.service.sessions.values() if _matches(search, s)), key=key, reverse=True
        )
        if search.cursor is not None:
            after = (search.cursor.last_created_at, search.cursor.last_session_id)
            found = [s for s in found if key(s) < after]
        page = found[: search.limit]

        def summary(session: Session) -> dict[str, object]:
            saved = [c for run in session.models for c in self.engine.checkpoints(run)]
            return {
                "session_id": session.id,
                "created_at": _when(session.created_at),
                "owner": OWNER,
                "project_id": OWNER,
                "status": _status(session),
                "checkpoints_count": len(saved),
                "display_name": session.display_name,
                "user_metadata": session.user_metadata,
                "checkpoint_storage_bytes": sum(c.size_bytes for c in saved),
            }

        sessions = await self.service.run_sync(lambda: [summary(s) for s in page])
        more = len(found) > len(page)
        last = page[-1] if page else None
        cursor = (
            {"last_created_at": _when(last.created_at), "last_session_id": last.id} if more and last else None
        )
        return {"sessions": sessions, "next_cursor": cursor}

    async def weights_info(self, request: Request) -> Answer:
        path = msgspec.json.decode(await request.body(), type=_WeightsInfo).tinker_path
        spec = await self.service.run_sync(lambda: self.engine.weights_info(path))
        return {
            "base_model": self.service.model_name,
            "optimizer_config": {"type": "adamw"},
            "is_lora": True,
            "lora_rank": spec.rank,
            "train_unembed": spec.train_unembed,
            "train_mlp": spec.train_mlp,
            "train_attn": spec.train_attn,
        }


def _endpoint(handler: Callable[[Request], Awaitable[Answer]]) -> Callable[[Request], Awaitable[Response]]:
    async def answer(request: Request) -> Response:
        try:
            result = await handler(request)
        except (EngineError, msgspec.DecodeError) as exc:
            missing = "unknown" in str(exc) or "no checkpoint" in str(exc)
            return _error(str(exc), 404 if missing else 400)
        return result if isinstance(result, Response) else JSONResponse(result)

    return answer
