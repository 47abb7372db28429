"""Command-line harnesses: an agent program described by a TOML spec.

platoon starts the program once per episode, by default inside the episode's sandbox (see
"Where the agent runs" below). The program reaches the policy through the
gateway's OpenAI-compatible HTTP (`{gateway_url}`, `{api_key}`), so its model calls are recorded
like any other, and the environment's tools over MCP (`{mcp_url}`). A spec::

    name = "my-agent"
    description = "What the agent is."
    runs_in = "sandbox"                    # the default; "host" runs it as a host process
    command = ["my-agent", "--task", "{instruction}", "--max-turns", "{option.max_turns}"]
    install = ["{python}", "-m", "pip", "install", "my-agent==1.2"]   # once, cached
    timeout = 600                          # seconds; the process group is killed past it

    [toolchain]                            # pinned packages, built once into the site cache
    pip = ["my-agent==1.2"]                # and/or npm = ["@scope/agent@1.2.3"]

    [env]
    OPENAI_BASE_URL = "{gateway_url}"
    OPENAI_API_KEY = "{api_key}"

    [files]                                # written into the episode's work dir
    "mcp.json" = '{{"url": "{mcp_url}"}}'

    [options.max_turns]                    # harness_options, checked before anything runs
    type = "int"                           # int, float, str or bool
    default = 20
    min = 1
    max = 200
    description = "Turns before the agent gives up."

    [exit_codes]                           # exit code -> status; 0 is completed, others error
    3 = "limit"

`checks_tool_calls = true` says the agent validates its tool calls itself (OpenHands answers a bad
one with an error the model sees): the gateway then returns calls whose arguments do not fit the
tools' schemas as calls, not as text. `[toolchain] python = "3.12"` builds its venv with a Python
of that version (see `platoon.harness.toolchain`).

Placeholders: `{instruction}`, `{gateway_url}`, `{gateway_root}` (the same without `/v1`, for
clients that add it themselves), `{api_key}`, `{max_steps}`, `{mcp_url}`,
`{workdir}`, `{option.NAME}`, `{python}` (platoon's interpreter), `{spec_dir}` (the spec's
folder) and `{cache_dir}` (the harness's folder in the site cache, where `install` can put
things), `{toolchain}` (where the toolchain is); `{{` and `}}` are literal braces. `install`
takes only the static ones. The program's stdout (its tail) becomes the agent's final message.

Where the agent runs. `runs_in = "sandbox"`: agent code is untrusted, so the program runs inside
a sandbox, never on the host. The harness asks the agent's env session over the bus to run it
(`AgentProcessRequested`): a session that owns a sandbox (Harbor) runs it there, in the task's
workdir and as the task's agent user, so its commands act on the files the task's tests will
grade (`platoon.envs.agent_process`). An environment with no sandbox answers `unsupported`, and
the harness starts a fresh sandbox of the default provider for the agent, which then reaches the
env's tools over MCP (`{mcp_url}`). Either way the program sees only: the toolchain, read-only at
`/opt/platoon/toolchain` (`{toolchain}/bin` first on PATH); the spec's folder, read-only at
`/opt/platoon/spec` (`{spec_dir}`; `{python}` is the sandbox's `python3`); a home folder (`HOME`, `{workdir}`)
where `[files]` are written; an environment of exactly `[env]` (nothing of the host's: no API
keys, no site config); and, as its only way out, `127.0.0.1:<port>` forwarded to the gateway (and
to the MCP server when the spec uses `{mcp_url}`) through a unix socket (`platoon.sandbox.agent`).
The request names host paths (the toolchain) and host endpoints, so the env service that runs
the sandbox shares the harness's machine and site cache. `runs_in = "host"` runs the program on
the host as before, in a temp dir (`{workdir}`) with the host's environment: trusted code only.

`[toolchain]` is built by `platoon prepare`, or by the first episode that needs it (once, under
a lock; `platoon.harness.toolchain`); `install` still works for host runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import keyword
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import msgspec
import msgspec.structs

from platoon.bus.events import AgentProcessExited, AgentProcessRequested, ModelCallFinished
from platoon.config import load_site
from platoon.envs.agent_process import run_requested_agent
from platoon.harness.context import AgentContext, AgentResult
from platoon.harness.mcp import serve_tools
from platoon.harness.toolchain import (
    MOUNT_POINT,
    Toolchain,
    ToolchainError,
    build_toolchain,
    toolchain_interpreter,
)
from platoon.sandbox import SandboxError, SandboxSpec, create_sandbox
from platoon.sandbox.agent import AGENT_HOME, SPEC_DIR

__all__ = ["CommandHarness", "CommandSpec", "OptionSpec", "SpecError", "load_spec_harness", "parse_spec"]

Status = Literal["completed", "limit", "timeout", "error"]

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][\w.]*)\}|[{}]")
_EPISODE = {"instruction", "gateway_url", "gateway_root", "api_key", "max_steps", "mcp_url", "workdir"}
_STATIC = {"python", "spec_dir", "cache_dir", "toolchain"}
_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}
_TAIL_BYTES = 16_384
_KILL_GRACE_S = 2.0
_SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SpecError(ValueError):
    """A harness spec that cannot be used: the message names the file and the key."""


class OptionSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One entry of a spec's `[options]` table."""

    type: Literal["int", "float", "str", "bool"]
    default: Any = msgspec.UNSET
    min: int | float | None = None
    max: int | float | None = None
    choices: list[Any] | None = None
    description: str = ""


class CommandSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A command-line harness as its TOML file describes it."""

    name: str
    command: list[str]
    description: str = ""
    env: dict[str, str] = {}
    files: dict[str, str] = {}
    install: list[str] = []
    options: dict[str, OptionSpec] = {}
    exit_codes: dict[str, Status] = {}
    timeout: float | None = None
    runs_in: Literal["sandbox", "host"] = "sandbox"
    toolchain: Toolchain = Toolchain()
    output_cap: int = 65_536  # bytes of the tail of stdout and of stderr kept
    # The agent checks its tool calls' arguments itself and answers a bad one with an error it
    # shows the model (OpenHands): the gateway then hands back calls the tools' schemas do not fit.
    checks_tool_calls: bool = False


def load_spec_harness(path: str | os.PathLike[str]) -> CommandHarness:
    """The harness a TOML spec file describes; every problem is a `SpecError` naming its key."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the harness spec: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    return CommandHarness(parse_spec(data, str(path)), path.resolve().parent, path=path.resolve())


def parse_spec(data: Mapping[str, Any], where: str = "<spec>") -> CommandSpec:
    """Check a spec's table strictly: unknown keys, wrong types, unknown placeholders."""
    data = dict(data)
    # Tables keyed by the user's names are checked entry by entry, so an error names the entry.
    options = _convert(data.pop("options", {}), dict[str, Any], "options", where)
    exit_codes = _convert(data.pop("exit_codes", {}), dict[str, Any], "exit_codes", where)
    toolchain = _convert(data.pop("toolchain", {}), Toolchain, "toolchain", where)
    spec = _convert(data, CommandSpec, "", where)
    spec = msgspec.structs.replace(spec, toolchain=toolchain)
    spec = msgspec.structs.replace(
        spec,
        options={k: _convert(v, OptionSpec, f"options.{k}", where) for k, v in options.items()},
        exit_codes={k: _convert(v, Status, f"exit_codes.{k}", where) for k, v in exit_codes.items()},
    )
    problems = list(_problems(spec))
    if problems:
        raise SpecError(f"{where}: {problems[0]}")
    return spec


def _convert(value: Any, kind: Any, key: str, where: str) -> Any:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise SpecError(f"{where}: {_validation_message(str(exc), key)}") from None


def _validation_message(message: str, prefix: str = "") -> str:
    text, _, at = message.partition(" - at `$")
    key = ".".join(p for p in [prefix, re.sub(r"\[(\d+)\]", r".\1", at.rstrip("`")).lstrip(".")] if p)
    if text.startswith(("Object contains unknown field", "Object missing required field")):
        field = text.split("`")[1]
        what = "unknown key" if text.startswith("Object contains") else "missing"
        return f"{key + '.' if key else ''}{field}: {what}"
    text = text.replace("`", "")
    text = f"{text[0].lower()}{text[1:]}"
    return f"{key}: {text}" if key else text


def _problems(spec: CommandSpec) -> Iterator[str]:
    if not spec.name.strip():
        yield "name: must not be empty"
    if not spec.command:
        yield "command: must name a program"
    if spec.timeout is not None and spec.timeout <= 0:
        yield "timeout: must be positive"
    if spec.output_cap <= 0:
        yield "output_cap: must be positive"
    for key, pins in (("pip", spec.toolchain.pip), ("npm", spec.toolchain.npm)):
        for i, pin in enumerate(pins):
            if not _pinned(key, pin):
                yield f"toolchain.{key}.{i}: {pin!r} is not pinned to one version"
    for name, option in spec.options.items():
        if not name.isidentifier() or keyword.iskeyword(name):
            yield f"options.{name}: an option's name must be a Python identifier"
        yield from (f"options.{name}.{p}" for p in _option_problems(option))
    for code, _ in spec.exit_codes.items():
        if not re.fullmatch(r"-?\d+", code):
            yield f"exit_codes.{code}: an exit code must be an integer"
    for file in spec.files:
        p = Path(file)
        if p.is_absolute() or ".." in p.parts or not p.parts:
            yield f"files.{file}: must be a path inside the work dir"
    # (key, template, whether it may use episode values and options)
    templates = [(f"command.{i}", a, True) for i, a in enumerate(spec.command)]
    templates += [(f"env.{k}", v, True) for k, v in spec.env.items()]
    templates += [(f"files.{k}", v, True) for k, v in spec.files.items()]
    templates += [(f"install.{i}", a, False) for i, a in enumerate(spec.install)]
    for key, template, per_episode in templates:
        try:
            names = _placeholders(template)
        except ValueError as exc:
            yield f"{key}: {exc}"
            continue
        for name in names:
            known = _STATIC | _EPISODE | {f"option.{o}" for o in spec.options} if per_episode else _STATIC
            if name not in known:
                yield f"{key}: unknown placeholder {{{name}}}"


def _pinned(kind: str, pin: str) -> bool:
    if kind == "pip":
        return (
            re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]+\])?==[A-Za-z0-9.+!-]+", pin)
            is not None
        )
    return re.fullmatch(r"(@[a-z0-9._-]+/)?[a-z0-9._-]+@\d[\w.+-]*", pin) is not None


def _option_problems(option: OptionSpec) -> Iterator[str]:
    for key, bound in (("min", option.min), ("max", option.max)):
        if bound is None:
            continue
        if option.type in ("str", "bool"):
            yield f"{key}: only int and float options have a range, not {option.type}"
        elif option.type == "int" and not isinstance(bound, int):
            yield f"{key}: must be an integer for an int option"
    if option.choices is not None:
        if option.type not in ("int", "str"):
            yield f"choices: only int and str options have choices, not {option.type}"
        elif not option.choices:
            yield "choices: must list at least one value"
        else:
            wrong = [c for c in option.choices if type(c) is not _TYPES[option.type]]
            if wrong:
                yield f"choices: {wrong[0]!r} is not a {option.type}"
    if option.default is not msgspec.UNSET:
        try:
            msgspec.convert(option.default, _option_type(option))
        except msgspec.ValidationError as exc:
            yield f"default: {_validation_message(str(exc))}"
        except TypeError:
            pass  # a broken range or choices, reported above


def _placeholders(template: str) -> list[str]:
    names = []
    for match in _PLACEHOLDER.finditer(template):
        if match.group(0) in ("{{", "}}"):
            continue
        if match.group(1) is None:
            raise ValueError(f"a lone {match.group(0)!r} (write {{{{ or }}}} for a literal brace)")
        names.append(match.group(1).strip())
    return names


def _fill(template: str, values: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        text = match.group(0)
        if text in ("{{", "}}"):
            return text[0]
        return values[match.group(1).strip()]

    return _PLACEHOLDER.sub(replace, template)


def _option_type(option: OptionSpec) -> Any:
    base: Any = _TYPES[option.type]
    if option.choices:
        base = Literal[tuple(option.choices)]
    meta: dict[str, Any] = {}
    if option.min is not None:
        meta["ge"] = option.min
    if option.max is not None:
        meta["le"] = option.max
    if option.description:
        meta["description"] = option.description
    return Annotated[base, msgspec.Meta(**meta)] if meta else base


def options_struct(spec: CommandSpec) -> type | None:
    """The msgspec Struct that `harness_options` must convert to (None when there are no options)."""
    if not spec.options:
        return None
    fields: list[Any] = []
    for name, option in spec.options.items():
        kind = _option_type(option)
        fields.append((name, kind) if option.default is msgspec.UNSET else (name, kind, option.default))
    title = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", spec.name) if part)
    return msgspec.defstruct(
        f"{title or 'Command'}Options", fields, kw_only=True, forbid_unknown_fields=True, frozen=True
    )


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class CommandHarness:
    """A command-line agent run as a subprocess per episode (see the module docstring)."""

    def __init__(self, spec: CommandSpec, spec_dir: Path | None = None, *, path: Path | None = None) -> None:
        self.spec = spec
        self.path = path  # the spec file, when it came from one
        self.name = spec.name
        self.description = spec.description
        self.spec_dir = spec_dir or Path.cwd()
        self.checks_tool_calls = spec.checks_tool_calls
        self.options_type = options_struct(spec)
        self.exit_codes = {int(code): status for code, status in spec.exit_codes.items()}
        used = {
            n for t in [*spec.command, *spec.env.values(), *spec.files.values()] for n in _placeholders(t)
        }
        self.uses_mcp = "mcp_url" in used
        self.uses_cache_dir = "cache_dir" in used
        self.uses_spec_dir = "spec_dir" in used
        self._installed = False
        self._install_lock: anyio.Lock | None = None
        self._toolchain: Path | None = None

    def __repr__(self) -> str:
        return f"<command harness {self.name} {self.spec_dir}>"

    def _static_values(self) -> dict[str, str]:
        return {
            "python": sys.executable,
            "spec_dir": str(self.spec_dir),
            "cache_dir": str(self.cache_dir()),
            "toolchain": self._toolchain_path(),
        }

    def _toolchain_path(self) -> str:
        """`{toolchain}`: the mount point inside a sandbox, the cached folder on the host."""
        if self.spec.runs_in == "sandbox":
            return MOUNT_POINT
        if self._toolchain is not None:
            return str(self._toolchain)
        return ""

    def cache_dir(self) -> Path:
        """The harness's folder in the site cache (created on first use)."""

        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name)
        path = Path(load_site().cache) / "harnesses" / slug
        path.mkdir(parents=True, exist_ok=True)
        return path

    async def install(self) -> None:
        """Run the spec's `install` command once; a marker in the cache dir remembers it."""
        if self._installed or not (self.spec.install or self.spec.toolchain):
            self._installed = True
            return
        if self._install_lock is None:
            self._install_lock = anyio.Lock()
        async with self._install_lock:
            if self._installed:
                return
            if self.spec.toolchain:
                try:
                    site = load_site()
                    self._toolchain = await build_toolchain(self.spec.toolchain, site.cache, site.pythons)
                except ToolchainError as exc:
                    raise SpecError(f"harness {self.name!r}: its toolchain did not build: {exc}") from None
            if not self.spec.install:
                self._installed = True
                return
            values = self._static_values()
            argv = [_fill(a, values) for a in self.spec.install]
            digest = hashlib.sha256("\0".join(argv).encode()).hexdigest()[:16]
            marker = Path(values["cache_dir"]) / f".installed-{digest}"
            if not marker.exists():
                try:
                    done = await anyio.run_process(argv, cwd=self.spec_dir, check=False)
                except OSError as exc:
                    raise SpecError(f"harness {self.name!r}: cannot run its install command: {exc}") from None
                if done.returncode != 0:
                    tail = _tail_text(done.stderr or done.stdout)
                    raise SpecError(
                        f"harness {self.name!r}: its install command exited with code {done.returncode}: {tail}"
                    )
                marker.write_text(" ".join(argv) + "\n")
            self._installed = True

    async def run(self, ctx: AgentContext) -> AgentResult:
        try:
            await self.install()
        except SpecError as exc:
            return AgentResult("error", reason=str(exc))
        if not ctx.gateway_url:
            return AgentResult(
                "error", reason="the gateway does not serve HTTP, which a command-line harness needs"
            )
        if self.spec.runs_in == "sandbox":
            return await self._run_in_sandbox(ctx)
        with tempfile.TemporaryDirectory(prefix="platoon-harness-") as workdir:
            async with contextlib.AsyncExitStack() as stack:
                values = self._values(ctx, workdir)
                if self.uses_mcp:
                    values["mcp_url"] = await stack.enter_async_context(serve_tools(ctx))
                _write_files(workdir, {name: _fill(t, values) for name, t in self.spec.files.items()})
                argv = [_fill(a, values) for a in self.spec.command]
                env = {**os.environ, **{k: _fill(v, values) for k, v in self.spec.env.items()}}
                await stack.enter_async_context(count_model_calls(ctx))
                return await self._launch(ctx, argv, env, workdir)

    def _values(self, ctx: AgentContext, workdir: str) -> dict[str, str]:
        values = {
            "instruction": ctx.instruction,
            "gateway_url": ctx.gateway_url or "",
            "gateway_root": _root(ctx.gateway_url or ""),
            "api_key": ctx.api_key,
            "max_steps": str(ctx.budget.remaining()),
            "mcp_url": "",
            "workdir": workdir,
            "python": sys.executable,
            "spec_dir": str(self.spec_dir),
            "cache_dir": str(self.cache_dir()) if self.uses_cache_dir else "",
            "toolchain": self._toolchain_path(),
        }
        if self.options_type is not None:
            options = ctx.options if ctx.options is not None else msgspec.convert({}, self.options_type)
            for name in self.spec.options:
                values[f"option.{name}"] = _text(getattr(options, name))
        return values

    async def _run_in_sandbox(self, ctx: AgentContext) -> AgentResult:
        """Run the program in the episode's sandbox, or a fresh one (see the module docstring)."""

        assert ctx.gateway_url is not None
        gateway = urlsplit(ctx.gateway_url)
        ports = random.sample(range(20_000, 60_000), 2)
        forwards = {ports[0]: gateway.netloc}
        async with contextlib.AsyncExitStack() as stack:
            values = self._values(ctx, AGENT_HOME)
            values["python"] = "python3"  # the sandbox's
            values["spec_dir"] = SPEC_DIR
            values["gateway_url"] = urlunsplit(("http", f"127.0.0.1:{ports[0]}", gateway.path, "", ""))
            values["gateway_root"] = f"http://127.0.0.1:{ports[0]}"
            if self.uses_mcp:
                mcp = urlsplit(await stack.enter_async_context(serve_tools(ctx)))
                forwards[ports[1]] = mcp.netloc
                values["mcp_url"] = urlunsplit(("http", f"127.0.0.1:{ports[1]}", mcp.path, "", ""))
            path = f"{MOUNT_POINT}/bin:{_SANDBOX_PATH}" if self.spec.toolchain else _SANDBOX_PATH
            env = {"PATH": path, **{k: _fill(v, values) for k, v in self.spec.env.items()}}
            payload = {
                "argv": [_fill(a, values) for a in self.spec.command],
                "env": env,
                "files": {name: _fill(t, values) for name, t in self.spec.files.items()},
            }
            request = AgentProcessRequested(
                episode_id=ctx.episode_id,
                agent_id=ctx.agent_id,
                env=ctx.task.env,
                payload=json.dumps(payload),
                forwards=forwards,
                toolchain=str(self._toolchain) if self._toolchain is not None else None,
                interpreter=toolchain_interpreter(self._toolchain) if self._toolchain is not None else None,
                spec_dir=str(self.spec_dir) if self.uses_spec_dir else None,
                timeout=self.spec.timeout,
                output_cap=self.spec.output_cap,
            )
            await stack.enter_async_context(count_model_calls(ctx))
            reply = await ctx.bus.request(request, timeout=None)
            if reply.unsupported:
                reply = await _run_in_fresh_sandbox(request)
        return self._exited(ctx, reply)

    def _exited(self, ctx: AgentContext, reply: AgentProcessExited) -> AgentResult:
        final = reply.stdout.strip()[-4000:] or None
        if reply.timed_out and reply.task_limit:
            # Harbor's rule: an agent out of the task's time is stopped and graded on what it left.
            why = f"{self.name} was stopped by {reply.error or 'the task time limit'} (the task's agent time limit)"
            return AgentResult("limit", final, f"{why}; the task's tests grade what it left")
        if reply.timed_out:  # the agent's own limit (its spec's `timeout`): an error, not graded
            limit = reply.error or f"its {self.spec.timeout} s timeout"
            return AgentResult("timeout", final, f"{self.name} passed {limit}")
        if reply.return_code is None:
            return AgentResult("error", final, f"{self.name} did not run: {reply.error or 'no reason given'}")
        result = self._result(ctx, reply.return_code, final, reply.stderr)
        if result.status == "completed" and ctx.budget.used == 0:
            return AgentResult("error", final, f"{self.name} exited without calling the model")
        return result

    async def _launch(
        self, ctx: AgentContext, argv: list[str], env: dict[str, str], workdir: str
    ) -> AgentResult:
        try:
            process = await anyio.open_process(
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, so a kill reaches its children
            )
        except OSError as exc:
            return AgentResult("error", reason=f"cannot start {argv[0]!r}: {exc.strerror or exc}")
        stdout, stderr = _Tail(), _Tail()
        timed_out = False
        try:
            async with anyio.create_task_group() as tg:
                assert process.stdout is not None and process.stderr is not None
                tg.start_soon(stdout.drain, process.stdout)
                tg.start_soon(stderr.drain, process.stderr)
                with anyio.move_on_after(self.spec.timeout) as scope:
                    await process.wait()
                timed_out = scope.cancelled_caught
                # The program is done (or out of time); whatever it left running goes with it,
                # which also ends the pipes the readers wait on, unless something escaped the
                # process group with them: the readers get one more second.
                await _stop(process)
                tg.cancel_scope.deadline = anyio.current_time() + 1.0
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
                await process.aclose()
        final = stdout.text().strip()[-4000:] or None
        if timed_out:
            return AgentResult("timeout", final, f"{self.name} passed its {self.spec.timeout} s timeout")
        return self._result(ctx, process.returncode, final, stderr.text())

    def _result(self, ctx: AgentContext, code: int | None, final: str | None, stderr: str) -> AgentResult:
        status: Status = self.exit_codes.get(code, "completed" if code == 0 else "error")  # type: ignore[arg-type]
        if status == "completed":
            return AgentResult("completed", final)
        if code is not None and code < 0:
            how = (
                f"was killed by {signal.Signals(-code).name}"
                if -code in signal.valid_signals()
                else f"exited with {code}"
            )
        else:
            how = f"exited with code {code}"
        reason = f"{self.name} {how}"
        tail = _tail_text(stderr.encode())
        if tail:
            reason += f": {tail}"
        if status == "error" and ctx.budget.max_steps is not None and ctx.budget.remaining() == 0:
            # It most likely failed because the gateway refused calls past the budget.
            return AgentResult("limit", final, f"out of model calls; {reason}")
        return AgentResult(status, final, reason)


async def _run_in_fresh_sandbox(request: AgentProcessRequested) -> AgentProcessExited:
    """An environment without a sandbox: the agent still gets one (its code is untrusted)."""

    try:
        async with create_sandbox(SandboxSpec(workdir="/work")) as box:
            return await run_requested_agent(box, request)
    except SandboxError as exc:
        return AgentProcessExited(reply_to=request.request_id, error=f"no sandbox for the agent: {exc}")


def _root(url: str) -> str:
    """`scheme://host:port` of a URL: what clients that add `/v1` themselves want (Anthropic's)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", "")) if parts.netloc else ""


def _write_files(workdir: str, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        target = Path(workdir, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


class _Tail:
    """The last bytes a pipe carried."""

    def __init__(self, size: int = _TAIL_BYTES) -> None:
        self.size = size
        self.data = bytearray()

    async def drain(self, stream: anyio.abc.ByteReceiveStream) -> None:
        async for chunk in stream:
            self.data += chunk
            del self.data[: -self.size]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _tail_text(data: bytes | None, limit: int = 2000) -> str:
    text = (data or b"").decode("utf-8", errors="replace").strip()
    return text if len(text) <= limit else "..." + text[-limit:]


async def _stop(process: anyio.abc.Process) -> None:
    """Terminate the process group (SIGTERM, then SIGKILL after a grace period) and reap it."""
    if process.returncode is None:
        _signal_group(process.pid, signal.SIGTERM)
        with anyio.move_on_after(_KILL_GRACE_S):
            await process.wait()
    _signal_group(process.pid, signal.SIGKILL)
    await process.wait()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


@contextlib.asynccontextmanager
async def count_model_calls(ctx: AgentContext) -> AsyncIterator[None]:
    """Count the agent's policy calls (made over HTTP, not through `ctx.chat`) on its budget."""

    def count(event: ModelCallFinished) -> None:
        if event.agent_id == ctx.agent_id and event.kind == "policy":
            ctx.budget.used += 1

    async with ctx.bus.stream(ModelCallFinished, name=f"harness:{ctx.agent_id}") as calls:

        async def consume() -> None:
            async for event in calls:
                count(event)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
        # Calls answered just before the program exited may still wait in the buffer.
        while True:
            with anyio.move_on_after(0) as scope:
                event = await calls.receive()
            if scope.cancelled_caught:
                break
            count(event)
