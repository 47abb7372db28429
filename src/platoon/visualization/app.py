"""The viewer's JSON API and its page (starlette).

Every endpoint takes the run by id (`run=`), looks it up in the `RunSet` the app was made with,
and answers JSON; errors are JSON too (`{"error": ...}`), never a traceback page. Requests whose
Host is not the server's own are refused, so a web page elsewhere cannot read runs through the
browser (DNS rebinding). A viewer shared beyond loopback has a key: the address it prints carries
it once (`?key=`), and the browser keeps it in a cookie for that server only. The page is static
files shipped in the package: no CDN, no build step.
"""

from __future__ import annotations

import hmac
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TypeAlias, TypedDict
from urllib.parse import urlencode

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from platoon.bus.events import ModelCallFinished
from platoon.visualization.episodes import EpisodeView, call_tokens, episode_view
from platoon.visualization.index import EpisodeRow, Failure, MetricRow, SqlValue, StepRow
from platoon.visualization.runs import JSON, Run, RunInfo, RunSet

__all__ = ["Answer", "Api", "make_app", "static_dir"]


# What each endpoint answers, as the page reads it.
class RunsAnswer(TypedDict):
    root: str | None
    runs: list[RunInfo]


class RunDetail(RunInfo):
    config: str | None  # config.yaml's text
    lock: JSON  # lock.json, as it reads
    lock_problem: str | None
    failures: list[Failure]


class MetricsAnswer(TypedDict):
    run: str
    rows: list[MetricRow]
    problems: list[str]


class StepsAnswer(TypedDict):
    run: str
    steps: list[StepRow]
    facets: dict[str, list[SqlValue]]


class EpisodesAnswer(TypedDict):
    run: str
    episodes: list[EpisodeRow]
    total: int


class EpisodePage(EpisodeView):
    run: str
    group: list[EpisodeRow]  # the episodes of its group, best first


class PollAnswer(TypedDict):
    run: str
    log_bytes: int
    episodes: int
    metrics_bytes: int
    status: str | None


# A model call's answer is `call_tokens`'s, with the run and the tokenizer's error.
Answer: TypeAlias = (
    RunsAnswer
    | RunDetail
    | MetricsAnswer
    | StepsAnswer
    | EpisodesAnswer
    | EpisodePage
    | PollAnswer
    | dict[str, object]
)

_encoder = msgspec.json.Encoder()
_MAX_ROWS = 5000


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def static_dir() -> Path:
    return Path(str(resources.files("platoon.visualization") / "static"))


class Api:
    """What each endpoint answers, as plain functions of query parameters (the export calls
    them too, so the static copy holds exactly what the server would answer)."""

    def __init__(self, runs: RunSet) -> None:
        self.runs = runs

    def run(self, params: dict[str, str]) -> Run:
        run_id = params.get("run")
        run = self.runs.lookup(run_id) if run_id else None
        if run is None:
            raise ApiError(404, f"no run {run_id!r} among the runs this viewer serves")
        return run

    def runs_list(self, params: dict[str, str]) -> RunsAnswer:
        self.runs.rescan()
        return {
            "root": str(self.runs.root) if self.runs.root else None,
            "runs": [run.info() for run in self.runs],
        }

    def run_detail(self, params: dict[str, str]) -> RunDetail:
        run = self.run(params)
        info = run.info()
        lock, lock_problem = run.lock()
        return {
            **info,
            "config": run.config_text(),
            "lock": lock,
            "lock_problem": lock_problem,
            "failures": run.index.failures() if run.index.log_path.is_file() else [],
        }

    def metrics(self, params: dict[str, str]) -> MetricsAnswer:
        run = self.run(params)
        run.refresh()
        rows, problems = run.metrics()
        return {"run": run.id, "rows": rows, "problems": problems}

    def steps(self, params: dict[str, str]) -> StepsAnswer:
        run = self.run(params)
        run.refresh()
        has_log = run.index.log_path.is_file()
        return {
            "run": run.id,
            "steps": run.index.steps() if has_log else [],
            "facets": run.index.facets() if has_log else {},
        }

    def episodes(self, params: dict[str, str]) -> EpisodesAnswer:
        run = self.run(params)
        if not run.index.log_path.is_file():
            return {"run": run.id, "episodes": [], "total": 0}
        run.refresh()
        filters = {
            k: v
            for k, v in params.items()
            if k not in ("run", "sort", "order", "limit", "offset") and v != ""
        }
        try:
            limit = min(int(params.get("limit", _MAX_ROWS)), _MAX_ROWS)
            offset = max(int(params.get("offset", 0)), 0)
            rows, total = run.index.episodes(
                filters=filters,
                sort=params.get("sort", "reward"),
                descending=params.get("order", "desc") != "asc",
                limit=limit,
                offset=offset,
            )
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        return {"run": run.id, "episodes": rows, "total": total}

    def episode(self, params: dict[str, str]) -> EpisodePage:
        run = self.run(params)
        episode_id = params.get("id", "")
        if not run.index.log_path.is_file():
            raise ApiError(404, "this run has no event log")
        run.refresh()
        row = run.index.episode_row(episode_id)
        if row is None:
            raise ApiError(404, f"no episode {episode_id!r} in this run")
        view = episode_view(row, run.index.episode_records(episode_id))
        group = (
            run.index.episodes(filters={"group_id": row["group_id"]}, sort="reward")[0]
            if row["group_id"]
            else []
        )
        return {**view, "run": run.id, "group": group}

    def call(self, params: dict[str, str]) -> dict[str, object]:
        run = self.run(params)
        episode_id, call_id = params.get("episode", ""), params.get("call", "")
        if not run.index.log_path.is_file():
            raise ApiError(404, "this run has no event log")
        run.refresh()
        call = next(
            (
                r.event
                for r in run.index.episode_records(episode_id)
                if isinstance(r.event, ModelCallFinished) and r.event.call_id == call_id
            ),
            None,
        )
        if call is None:
            raise ApiError(404, f"no model call {call_id!r} in episode {episode_id!r}")
        out = call_tokens(
            call, run.index.datums(episode_id), run.tokenizer(), normalization=run.loss_normalization()
        )
        out["run"] = run.id
        out["tokenizer_error"] = run.tokenizer_error
        return out

    def poll(self, params: dict[str, str]) -> PollAnswer:
        """What changes while a run trains: the page reloads its data when this does."""
        run = self.run(params)
        run.refresh()
        summary = run.index.summary() if run.index.log_path.is_file() else None
        metrics = run.path / "metrics.jsonl"
        return {
            "run": run.id,
            "log_bytes": summary["log_bytes"] if summary else 0,
            "episodes": summary["episodes"] if summary else 0,
            "metrics_bytes": metrics.stat().st_size if metrics.is_file() else 0,
            "status": run.status(summary) if summary else None,
        }

    ENDPOINTS = ("runs", "run", "metrics", "steps", "episodes", "episode", "call", "poll")

    def answer(self, name: str, params: dict[str, str]) -> Answer:
        handlers: dict[str, Callable[[dict[str, str]], Answer]] = {
            "runs": self.runs_list,
            "run": self.run_detail,
            "metrics": self.metrics,
            "steps": self.steps,
            "episodes": self.episodes,
            "episode": self.episode,
            "call": self.call,
            "poll": self.poll,
        }
        handler = handlers.get(name)
        if handler is None:
            raise ApiError(404, f"no API endpoint {name!r}")
        return handler(params)


KEY_COOKIE = "platoon-view-key"


class KeyGate:
    """Every request presents the viewer's key: its cookie, or `?key=` once, which sets it."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if self._is_key(request.cookies.get(KEY_COOKIE)):
            await self.app(scope, receive, send)
            return
        if self._is_key(request.query_params.get("key")):
            # Into the cookie, and out of the address bar (and of what the page links to).
            rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "key"])
            response: Response = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), 303)
            response.set_cookie(KEY_COOKIE, self.key, httponly=True, samesite="strict")
        else:
            response = PlainTextResponse(
                "This viewer wants its key: open the address `platoon view` printed (it ends in ?key=...).\n",
                status_code=401,
            )
        await response(scope, receive, send)

    def _is_key(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.key.encode())


def make_app(runs: RunSet, *, allowed_hosts: list[str] | None = None, key: str | None = None) -> Starlette:
    """The viewer's ASGI app over `runs`; with a `key`, every request must present it (`KeyGate`)."""
    api = Api(runs)
    static = static_dir()

    async def index(request: Request) -> Response:
        return FileResponse(static / "index.html", headers={"Cache-Control": "no-store"})

    async def endpoint(request: Request) -> Response:
        name = request.path_params["name"]
        params = dict(request.query_params)
        try:
            data = await anyio.to_thread.run_sync(api.answer, name, params)
        except ApiError as exc:
            return _json({"error": str(exc)}, exc.status)
        except Exception as exc:  # one bad run must not cost the page: say what went wrong
            print(f"platoon view: {name} {params}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return _json({"error": f"{type(exc).__name__}: {exc}"}, 500)
        return _json(data)

    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)  # the one exception it handles
        return _json({"error": exc.detail}, exc.status_code)

    hosts = ["127.0.0.1", "localhost", "::1", "[::1]", *(allowed_hosts or [])]
    return Starlette(
        routes=[
            Route("/", index),
            Route("/api/{name}", endpoint),
            Mount("/static", StaticFiles(directory=static), name="static"),
        ],
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=hosts),
            *([Middleware(KeyGate, key=key)] if key else []),
        ],
        exception_handlers={HTTPException: not_found},
    )


def _json(data: object, status: int = 200) -> Response:
    return Response(
        _encoder.encode(data),
        status_code=status,
        media_type="application/json",
        headers={"Cache-Control": "no-store"},
    )
