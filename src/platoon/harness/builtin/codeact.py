"""`platoon-codeact`: the model writes Python that calls the environment's tools as functions.

The code runs in a separate Python process (`_codeact_kernel.py`), never in platoon's: one
persistent session per agent, in a temporary work dir, with a minimal environment (no API
keys of platoon's). A tool call in the code is sent back to the harness over the kernel's
stdin/stdout and run through `AgentContext.call_tool`, so it is recorded like any other. What
the code prints comes back to the model as the next message. A cell that runs past
`timeout_s` is stopped by killing the process group, and the next cell starts a fresh session.
"""

from __future__ import annotations

import builtins
import json
import keyword
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.abc
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream

from platoon.bus.events import ToolSpec
from platoon.harness.builtin.react import cut
from platoon.harness.context import AgentContext, AgentResult
from platoon.harness.registry import harness

__all__ = ["CodeActOptions", "Kernel", "PythonFunction", "codeact", "extract_code", "python_functions"]

KERNEL = Path(__file__).with_name("_codeact_kernel.py")

INSTRUCTIONS = """\
Solve the task by writing Python code. Put the code in a ```python block; it runs in a \
persistent Python session and you see what it prints. The environment's tools are these Python \
functions; each returns the tool's answer as a string and raises ToolError when the tool fails:"""

FINISH = "When the task is done, reply without a code block; that reply is your final answer."

_CODE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_JSON_TYPES = {
    "integer": "int",
    "number": "float",
    "string": "str",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
}
_MAX_LINE = 64 * 1024 * 1024


class CodeActOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    system_prompt: Annotated[
        str | None, msgspec.Meta(description="replaces the default instructions; the tool listing follows it")
    ] = None
    timeout_s: Annotated[float, msgspec.Meta(gt=0, description="seconds one code block may run")] = 30.0
    max_output_chars: Annotated[
        int, msgspec.Meta(ge=100, description="longer output is cut to its start and end")
    ] = 4000


class PythonFunction(msgspec.Struct, frozen=True):
    """A tool as the code sees it: `py_name` is a valid Python name for the tool `name`."""

    name: str
    py_name: str
    description: str
    parameters: list[dict[str, Any]]
    signature: str


@harness("platoon-codeact", options=CodeActOptions)
async def codeact(ctx: AgentContext) -> AgentResult:
    """The model writes Python that calls the tools as functions; it runs in a subprocess."""
    options: CodeActOptions = ctx.options or CodeActOptions()
    functions = python_functions(await ctx.list_tools())
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt(options, functions)},
        {"role": "user", "content": ctx.instruction},
    ]
    async with Kernel(
        ctx, functions, timeout_s=options.timeout_s, output_limit=options.max_output_chars
    ) as kernel:
        while ctx.budget.remaining() > 0:
            reply = await ctx.chat(messages)
            messages.append({key: value for key, value in reply.message.items() if value is not None})
            code = extract_code(reply.text)
            if code is None:
                return AgentResult("completed", final_message=reply.text)
            observation = await kernel.run(code)
            if kernel.finished is not None:
                return AgentResult("completed", final_message=kernel.finished)
            messages.append({"role": "user", "content": observation})
    return AgentResult("limit", reason="out of model calls")


def extract_code(text: str) -> str | None:
    """The Python code of a reply (its ```python blocks in order), or None when it has none."""
    blocks = _CODE.findall(text)
    return "\n".join(b.rstrip() for b in blocks) if blocks else None


def system_prompt(options: CodeActOptions, functions: list[PythonFunction]) -> str:
    listing = "\n\n".join(f.signature for f in functions) or "(no tools)"
    return f"{options.system_prompt or INSTRUCTIONS}\n\n```python\n{listing}\n```\n\n{FINISH}"


def python_functions(tools: list[ToolSpec]) -> list[PythonFunction]:
    """The tools as Python functions: names made valid and unique, a signature for the prompt."""
    taken: set[str] = set()
    functions = []
    for tool in tools:
        py_name = re.sub(r"\W", "_", tool.name) or "tool"
        if py_name[0].isdigit():
            py_name = f"_{py_name}"
        while keyword.iskeyword(py_name) or hasattr(builtins, py_name) or py_name in taken:
            py_name += "_"
        taken.add(py_name)
        schema = tool.input_schema or {}
        required = set(schema.get("required") or ())
        properties: dict[str, Any] = schema.get("properties") or {}
        parameters = [{"name": n, "required": n in required} for n in properties]
        parameters.sort(key=lambda p: not p["required"])  # required first, as Python needs
        functions.append(
            PythonFunction(
                tool.name,
                py_name,
                tool.description,
                parameters,
                _signature(py_name, tool, properties, parameters),
            )
        )
    return functions


def _signature(
    py_name: str, tool: ToolSpec, properties: dict[str, Any], parameters: list[dict[str, Any]]
) -> str:
    if all(p["name"].isidentifier() and not keyword.iskeyword(p["name"]) for p in parameters):
        args = []
        for p in parameters:
            kind = _JSON_TYPES.get(str((properties[p["name"]] or {}).get("type")), "Any")
            args.append(f"{p['name']}: {kind}" if p["required"] else f"{p['name']}: {kind} | None = None")
        head = f"def {py_name}({', '.join(args)}) -> str:"
    else:
        head = f"def {py_name}(**arguments) -> str:"
    doc = [tool.description.strip()] if tool.description.strip() else []
    for name, prop in properties.items():
        if isinstance(prop, dict) and prop.get("description"):
            doc.append(f"{name}: {prop['description']}")
    body = '    """' + "\n    ".join(doc) + '"""' if doc else "    ..."
    return f"{head}\n{body}"


class Kernel:
    """The Python process that runs an agent's code, restarted after a timeout or crash."""

    def __init__(
        self, ctx: AgentContext, functions: list[PythonFunction], *, timeout_s: float, output_limit: int
    ) -> None:
        self.ctx = ctx
        self.functions = functions
        self.by_py_name = {f.py_name: f for f in functions}
        self.timeout_s = timeout_s
        self.output_limit = output_limit
        self.finished: str | None = None  # the tool output that ended the episode
        self.pid: int | None = None
        self._process: anyio.abc.Process | None = None
        self._lines: BufferedByteReceiveStream | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None

    async def __aenter__(self) -> Kernel:
        self._workdir = tempfile.TemporaryDirectory(prefix="platoon-codeact-")
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self._stop()
        if self._workdir is not None:
            self._workdir.cleanup()

    async def run(self, code: str) -> str:
        """Run one cell; what the model should see next (output, error, or why it stopped)."""
        try:
            with anyio.fail_after(self.timeout_s):
                if self._process is None:
                    await self._start()
                await self._send({"code": code})
                while True:
                    message = await self._receive()
                    if "done" not in message:
                        await self._send(await self._call(message))
                        continue
                    return self._observation(message["done"], message.get("error"))
        except TimeoutError:
            await self._stop()
            return (
                f"The code ran past its {self.timeout_s:g} s limit and was stopped. The Python session "
                "was restarted: variables from earlier blocks are gone."
            )
        except (
            anyio.EndOfStream,
            anyio.BrokenResourceError,
            anyio.IncompleteRead,
            anyio.DelimiterNotFound,
            ValueError,
        ) as exc:
            exit_code = await self._stop(grace=1.0)
            why = f"exited with code {exit_code}" if exit_code is not None else f"stopped answering ({exc})"
            return f"The Python process {why}. The next block starts a fresh session."

    async def _start(self) -> None:
        assert self._workdir is not None
        workdir = self._workdir.name
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
        }
        self._process = await anyio.open_process(
            [sys.executable, "-I", str(KERNEL)],
            cwd=workdir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self._process.stdout is not None
        self._lines = BufferedByteReceiveStream(self._process.stdout)
        tools = [msgspec.structs.asdict(f) for f in self.functions]
        await self._send({"tools": tools, "output_limit": self.output_limit})
        self.pid = (await self._receive())["ready"]

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._process is not None and self._process.stdin is not None
        await self._process.stdin.send(json.dumps(message).encode() + b"\n")

    async def _receive(self) -> dict[str, Any]:
        assert self._lines is not None
        line = await self._lines.receive_until(b"\n", _MAX_LINE)
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError(f"the kernel sent {line[:80]!r}")
        return message

    async def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        function = self.by_py_name.get(message.get("call", ""))
        name = function.name if function else str(message.get("call"))
        result = await self.ctx.call_tool(name, message.get("arguments") or {})
        if result.finished and self.finished is None:
            self.finished = result.as_text()
        return {"output": result.output, "error": result.error, "finished": result.finished}

    def _observation(self, output: str, error: str | None) -> str:
        parts = []
        if output.strip():
            parts.append(f"Output:\n{output.rstrip()}")  # the kernel kept its start and end
        if error:
            parts.append(f"Error:\n{cut(error.rstrip(), self.output_limit)}")
        return "\n\n".join(parts) or "The code ran and printed nothing."

    async def _stop(self, grace: float = 0.0) -> int | None:
        """Kill the kernel's process group, after `grace` seconds to exit on its own; its exit
        code if it exited by itself."""
        process, self._process, self._lines = self._process, None, None
        if process is None:
            return None
        with anyio.move_on_after(grace):
            await process.wait()
        code = process.returncode
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        await process.wait()
        await process.aclose()
        return code
