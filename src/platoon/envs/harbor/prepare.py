"""What `platoon prepare` fetches and builds for a Harbor dataset, and how a run finds it.

Everything lives in the site cache and is found by content, never fetched at train time:

    <cache>/datasets/hf/<org>/<name>/<commit>/       a fetched `hf://org/name@commit` dataset
    <cache>/datasets/hf/<org>/<name>/<commit>.json   its digest, written once the fetch is whole
    <cache>/harbor/layers/<key>/                     a task's root filesystem layer (bwrap)
    localhost/platoon-harbor:<key>                   a task's image (docker)
    <cache>/locks/<entry>.json                       what one config entry pinned and built

`<key>` is a digest of the task's `environment/` directory, so a changed Dockerfile or build
file gets a new artefact and an unchanged one is shared between tasks and entries.

bubblewrap cannot run a container image. Under bwrap the host's system directories serve as
the base, read-only, and a task's own files come from its Dockerfile when it is simple enough
(one FROM; WORKDIR, COPY/ADD of build files, ENV, ARG, RUN, and instructions that do not
change files): `prepare` runs those steps once and keeps what they wrote in the writable
places (the workdir, /root, ...) as the task's layer; a session without a layer replays them.
"""

from __future__ import annotations

import glob
import json
import os
import posixpath
import re
import shlex
import shutil
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread
import msgspec

from ...sandbox import Sandbox, SandboxError, SandboxSpec, create_sandbox
from ...sandbox.base import exec_phase
from ...sandbox.bwrap import WRITABLE
from .config import EnvironmentConfig
from .dataset import dataset_digest
from .errors import HarborError, TaskDefect
from .spec import sandbox_spec_for
from .task import HarborTask

__all__ = [
    "HF_SCHEME",
    "BuildPlan",
    "BuildStep",
    "apply_plan",
    "build_image",
    "build_layer",
    "bwrap_spec",
    "environment_key",
    "fetch_hf_dataset",
    "find_layer",
    "hf_dataset_dir",
    "image_tag",
    "parse_hf_ref",
    "plan_dockerfile",
    "resolve_dataset",
    "restore_layer",
]

HF_SCHEME = "hf://"
IMAGE_REPOSITORY = "localhost/platoon-harbor"
_LAYER_MARKER = "layer.json"
# Instructions that change no file of the image: the sandbox has no entrypoint or ports.
_NO_FILES = {"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "MAINTAINER", "HEALTHCHECK", "STOPSIGNAL", "VOLUME"}
_ARCHIVE = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
_VAR = re.compile(r"\$(?:\{(\w+)(?::-([^}]*))?\}|(\w+))")
# Writable places under bwrap that a layer keeps; /tmp, /logs, /tests, /solution are per run.
_SCRATCH = {"/tmp", "/var/tmp", "/logs", "/tests", "/solution"}  # nosec B108 # a path inside the sandbox, not the host's /tmp


# --- datasets on the Hugging Face Hub -------------------------------------------------------------


def parse_hf_ref(ref: str) -> tuple[str, str]:
    """`hf://org/name@commit` -> ("org/name", "commit"); the commit pins what trains."""
    body = ref.removeprefix(HF_SCHEME)
    repo_id, sep, commit = body.partition("@")
    parts = repo_id.split("/")
    if (
        not ref.startswith(HF_SCHEME)
        or len(parts) != 2
        or not all(re.fullmatch(r"[\w.-]+", p) and p not in (".", "..") for p in parts)
    ):
        raise HarborError(f"dataset {ref!r}: expected hf://<org>/<name>@<commit>")
    if not sep or not re.fullmatch(r"[\w.-]+", commit):
        raise HarborError(f"dataset {ref!r}: pin a commit, hf://{repo_id}@<commit>")
    return repo_id, commit


def hf_dataset_dir(ref: str, cache: str | os.PathLike[str]) -> Path:
    """Where the fetched dataset `ref` lives in the cache."""
    repo_id, commit = parse_hf_ref(ref)
    return Path(cache, "datasets", "hf", *repo_id.split("/"), commit)


def resolve_dataset(dataset: str | os.PathLike[str], cache: str | os.PathLike[str]) -> Path:
    """The local directory of a dataset: itself, or where `platoon prepare` fetched an `hf://` one.

    A fetched dataset whose files changed since the fetch is refused.
    """
    text = os.fspath(dataset)
    if not text.startswith(HF_SCHEME):
        return Path(text).expanduser().resolve()
    directory = hf_dataset_dir(text, cache)
    marker = directory.with_name(directory.name + ".json")
    if not marker.is_file() or not directory.is_dir():
        raise HarborError(
            f"dataset {text} is not in the cache ({directory}); run `platoon prepare CONFIG` first"
        )
    pinned = json.loads(marker.read_text())["digest"]
    if dataset_digest(directory) != pinned:
        raise HarborError(
            f"dataset {text} changed in the cache since it was fetched; run `platoon prepare` again"
        )
    return directory


def fetch_hf_dataset(ref: str, cache: str | os.PathLike[str]) -> tuple[Path, bool]:
    """Download `ref` with huggingface_hub into the cache (once); returns (directory, fetched now)."""
    repo_id, commit = parse_hf_ref(ref)
    directory = hf_dataset_dir(ref, cache)
    marker = directory.with_name(directory.name + ".json")
    if marker.is_file() and directory.is_dir():
        return directory, False
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise HarborError(f"fetching {ref} needs huggingface_hub: pip install huggingface_hub") from None
    staging = directory.with_name(f"{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        snapshot_download(repo_id, repo_type="dataset", revision=commit, local_dir=staging)
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise HarborError(f"fetching {ref} failed: {type(exc).__name__}: {exc}") from None
    shutil.rmtree(staging / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)
    digest = dataset_digest(directory)
    marker.write_text(json.dumps({"repo_id": repo_id, "commit": commit, "digest": digest}, indent=2))
    return directory, True


# --- a task's Dockerfile as replayable steps ------------------------------------------------------


class BuildStep(msgspec.Struct, frozen=True, kw_only=True):
    """One file-changing Dockerfile step: make a directory, copy build files, or run a command."""

    kind: Literal["mkdir", "copy", "run"]
    line: int
    target: str = ""
    sources: list[str] = []
    chmod: str | None = None
    command: str = ""
    workdir: str = "/"
    env: dict[str, str] = {}


class BuildPlan(msgspec.Struct, frozen=True, kw_only=True):
    """A simple Dockerfile: its base image (not used by bwrap), steps, final ENV and WORKDIR."""

    base: str
    steps: list[BuildStep]
    env: dict[str, str]
    workdir: str | None


def environment_key(task: HarborTask) -> str | None:
    """The content digest of the task's `environment/` (None without one)."""
    if task.environment_dir is None:
        return None
    return dataset_digest(task.environment_dir).removeprefix("sha256:")[:32]


def image_tag(task: HarborTask) -> str | None:
    """The image `prepare` builds from the task's Dockerfile."""
    key = environment_key(task)
    return None if key is None or task.dockerfile is None else f"{IMAGE_REPOSITORY}:{key}"


def plan_dockerfile(task: HarborTask) -> BuildPlan:
    """The steps of the task's Dockerfile; HarborError says why one needs a container engine."""
    if task.dockerfile is None or task.environment_dir is None:
        raise HarborError(f"task {task.name}: has no Dockerfile")
    context = Path(task.environment_dir)
    args: dict[str, str] = {}
    env: dict[str, str] = {}
    base: str | None = None
    workdir, explicit = "/", None
    steps: list[BuildStep] = []
    for number, line in _logical_lines(Path(task.dockerfile).read_text()):
        word, _, rest = line.partition(" ")
        instruction, rest = word.upper(), rest.strip()
        where = f"Dockerfile:{number}"
        scope = {**args, **env}
        if instruction == "FROM":
            if base is not None:
                raise HarborError(f"{where}: multi-stage builds need a container engine")
            base = _expand(next((w for w in rest.split() if not w.startswith("--")), ""), scope)
        elif base is None and instruction != "ARG":
            raise TaskDefect(f"{where}: {instruction} before FROM")
        elif instruction == "ARG":
            name, sep, default = rest.partition("=")
            if sep:
                args[name.strip()] = _expand(default.strip().strip("\"'"), scope)
        elif instruction == "ENV":
            env.update({k: _expand(v, scope) for k, v in _env_pairs(rest, where)})
        elif instruction == "WORKDIR":
            workdir = explicit = posixpath.normpath(posixpath.join(workdir, _expand(rest, scope)))
            steps.append(BuildStep(kind="mkdir", line=number, target=workdir))
        elif instruction in ("COPY", "ADD"):
            steps.append(_copy_step(instruction, rest, number, context, workdir, scope))
        elif instruction == "RUN":
            if rest.startswith("--"):
                raise HarborError(f"{where}: RUN options ({rest.split()[0]}) need a container engine")
            command = shlex.join(_json_list(rest, where)) if rest.startswith("[") else rest
            steps.append(BuildStep(kind="run", line=number, command=command, workdir=workdir, env=scope))
        elif instruction == "USER":
            if _expand(rest, scope).split(":")[0] not in ("root", "0"):
                raise HarborError(f"{where}: USER {rest} needs a container engine")
        elif instruction not in _NO_FILES:
            raise HarborError(f"{where}: {instruction} needs a container engine")
    if base is None:
        raise TaskDefect("Dockerfile has no FROM")
    return BuildPlan(base=base, steps=steps, env=env, workdir=explicit)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and (not stripped or stripped.startswith("#")):
            continue  # blank lines and comments inside a continued instruction
        start = start or number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append((start, (pending + stripped).strip()))
        pending, start = "", 0
    if pending:
        lines.append((start, pending.strip()))
    return lines


def _expand(text: str, scope: Mapping[str, str]) -> str:
    return _VAR.sub(lambda m: scope.get(m[1] or m[3], m[2] or ""), text)


def _env_pairs(rest: str, where: str) -> list[tuple[str, str]]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:
        return [(words[0], rest.split(None, 1)[1] if len(words) > 1 else "")]  # legacy `ENV key value`
    pairs = [word.partition("=") for word in words]
    if any(not sep for _, sep, _ in pairs):
        raise TaskDefect(f"{where}: ENV expects key=value pairs")
    return [(key, value) for key, _, value in pairs]


def _json_list(rest: str, where: str) -> list[str]:
    try:
        items = json.loads(rest)
    except json.JSONDecodeError:
        raise TaskDefect(f"{where}: malformed JSON form {rest!r}") from None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise TaskDefect(f"{where}: the JSON form must be a list of strings")
    return items


def _copy_step(
    instruction: str, rest: str, number: int, context: Path, workdir: str, scope: Mapping[str, str]
) -> BuildStep:
    where = f"Dockerfile:{number}"
    words = rest.split()
    chmod = None
    while words and words[0].startswith("--"):
        flag, _, value = words.pop(0).partition("=")
        if flag == "--chmod":
            chmod = value
        elif flag not in ("--chown", "--link"):
            raise HarborError(f"{where}: {instruction} {flag} needs a container engine")
    items = _json_list(" ".join(words), where) if words and words[0].startswith("[") else words
    items = [_expand(item, scope) for item in items]
    if len(items) < 2:
        raise TaskDefect(f"{where}: {instruction} needs a source and a destination")
    *sources, dest = items
    found: list[str] = []
    for source in sources:
        if "://" in source or (instruction == "ADD" and source.endswith(_ARCHIVE)):
            raise HarborError(f"{where}: ADD of {source!r} needs a container engine")
        matches = sorted(glob.glob(glob.escape(str(context)) + "/" + source.lstrip("/")))
        if not matches:
            missing = posixpath.join("environment", source.lstrip("/"))
            raise TaskDefect(
                f"{where}: {instruction} source {source!r} is not in environment/: the task has no {missing}"
            )
        # Directories keep a trailing slash, so replaying needs no look at the host's files.
        found += [os.path.normpath(m) + ("/" if os.path.isdir(m) else "") for m in matches]
    target = posixpath.normpath(posixpath.join(workdir, dest))
    as_dir = dest.endswith("/") or len(found) > 1
    return BuildStep(
        kind="copy", line=number, target=target + ("/" if as_dir else ""), sources=found, chmod=chmod
    )


async def apply_plan(
    sandbox: Sandbox, plan: BuildPlan, *, timeout: float | None = None, offline: bool = False
) -> None:
    """Replay the plan's steps in a started sandbox; HarborError names the step that failed.
    `offline` runs them without the sandbox's network (the task's own has none)."""
    for step in plan.steps:
        if step.kind == "mkdir":
            await _check(sandbox, step, f"mkdir -p -- {shlex.quote(step.target)}", "/", {}, timeout)
        elif step.kind == "run":
            await _check(sandbox, step, step.command, step.workdir, step.env, timeout, offline)
        else:
            await _copy(sandbox, step, timeout)


async def _copy(sandbox: Sandbox, step: BuildStep, timeout: float | None) -> None:
    target = step.target.rstrip("/") or "/"
    into_dir = step.target.endswith("/")
    if not into_dir and len(step.sources) == 1 and not step.sources[0].endswith("/"):
        probe = await sandbox.exec(f"test -d {shlex.quote(target)}", cwd="/")
        into_dir = probe.return_code == 0
    await _check(
        sandbox,
        step,
        f"mkdir -p -- {shlex.quote(target if into_dir else posixpath.dirname(target))}",
        "/",
        {},
        timeout,
    )
    placed = []
    for source in step.sources:
        name = posixpath.basename(source.rstrip("/"))
        remote = posixpath.join(target, name) if into_dir and not source.endswith("/") else target
        try:
            await sandbox.upload(source, remote)
        except SandboxError as exc:
            raise HarborError(f"Dockerfile:{step.line}: copying {name} failed: {exc}") from None
        placed.append(remote)
    if step.chmod:
        command = f"chmod -R {shlex.quote(step.chmod)} -- {shlex.join(placed)}"
        await _check(sandbox, step, command, "/", {}, timeout)


async def _check(
    sandbox: Sandbox,
    step: BuildStep,
    command: str,
    cwd: str,
    env: Mapping[str, str],
    timeout: float | None,
    offline: bool = False,
) -> None:
    result = await exec_phase(sandbox, command, offline=offline, cwd=cwd, env=env, timeout=timeout)
    if result.timed_out:
        raise HarborError(f"Dockerfile:{step.line}: {step.kind} timed out after {timeout:g} s")
    if result.return_code != 0:
        output = (result.stderr.strip() or result.stdout.strip())[-300:]
        raise HarborError(f"Dockerfile:{step.line}: {step.kind} failed (exit {result.return_code}): {output}")


# --- layers (bwrap) and images (docker) -----------------------------------------------------------


def find_layer(task: HarborTask, cache: str | os.PathLike[str]) -> Path | None:
    """The prepared layer of the task, if `prepare` built one."""
    key = environment_key(task)
    if key is None:
        return None
    directory = Path(cache, "harbor", "layers", key)
    return directory if (directory / _LAYER_MARKER).is_file() else None


def bwrap_spec(
    task: HarborTask,
    plan: BuildPlan | None,
    pass_env: Sequence[str] = (),
    *,
    environment: EnvironmentConfig | None = None,
    network: bool | None = None,
) -> SandboxSpec:
    """The sandbox of a task under bwrap: the host as base, with the Dockerfile's WORKDIR and ENV
    (`environment` and `network` as `sandbox_spec_for` takes them)."""
    spec = sandbox_spec_for(task, pass_env=pass_env, environment=environment, network=network)
    if plan is None:
        return spec
    workdir = (environment or task.config.environment).workdir or plan.workdir or spec.workdir
    return msgspec.structs.replace(spec, workdir=workdir, env={**plan.env, **spec.env})


def layer_dirs(plan: BuildPlan, workdir: str) -> list[str]:
    """The writable places a layer keeps: the workdir, /root, and any other a step wrote to."""
    kept = {posixpath.normpath(workdir), "/root"}
    for step in plan.steps:
        for root in WRITABLE:
            if (step.target + "/").startswith(root + "/") and root not in _SCRATCH:
                kept.add(root)
    return sorted(kept)


async def build_layer(
    task: HarborTask, plan: BuildPlan, cache: str | os.PathLike[str], **provider_options: Any
) -> Path:
    """Run the plan once in a bwrap sandbox and keep what it wrote (see the module docstring)."""
    spec = bwrap_spec(task, plan)
    key = environment_key(task)
    assert key is not None
    final = Path(cache, "harbor", "layers", key)
    staging = final.with_name(f"{key}.partial-{os.getpid()}")
    await anyio.to_thread.run_sync(lambda: shutil.rmtree(staging, ignore_errors=True))
    dirs = layer_dirs(plan, spec.workdir)
    try:
        async with create_sandbox(spec, "bwrap", **provider_options) as box:
            await apply_plan(box, plan, timeout=task.config.environment.build_timeout_sec)
            for directory in dirs:
                await box.download(directory, staging / "files" / directory.lstrip("/"))
    except (SandboxError, HarborError):
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(staging, ignore_errors=True))
        raise
    (staging / _LAYER_MARKER).write_text(json.dumps({"dirs": dirs, "base": plan.base}, indent=2))
    await anyio.to_thread.run_sync(lambda: shutil.rmtree(final, ignore_errors=True))
    staging.rename(final)
    return final


async def restore_layer(sandbox: Sandbox, layer: Path) -> None:
    """Put a prepared layer's files in place in a started sandbox."""
    for directory in json.loads((layer / _LAYER_MARKER).read_text())["dirs"]:
        source = layer / "files" / directory.lstrip("/")
        if source.is_dir():
            await sandbox.upload(source, directory)


async def build_image(task: HarborTask, url: str | None = None) -> str:
    """Build the task's Dockerfile into `image_tag(task)` through the Docker Engine API (aiodocker)."""
    tag = image_tag(task)
    if tag is None or task.environment_dir is None:
        raise HarborError(f"task {task.name}: has no Dockerfile to build")
    import aiodocker

    docker = aiodocker.Docker(url=url)
    try:
        with tempfile.TemporaryFile() as context:
            await anyio.to_thread.run_sync(_pack_context, Path(task.environment_dir), context)
            with anyio.fail_after(task.config.environment.build_timeout_sec):
                await docker.images.build(fileobj=context, encoding="application/x-tar", tag=tag, rm=True)
    except aiodocker.DockerError as exc:
        raise HarborError(f"task {task.name}: image build failed: {exc.message}") from None
    except TimeoutError:
        raise HarborError(f"task {task.name}: image build passed build_timeout_sec") from None
    finally:
        await docker.close()
    return tag


def _pack_context(directory: Path, fileobj: Any) -> None:
    with tarfile.open(fileobj=fileobj, mode="w") as tar:
        tar.add(str(directory), arcname=".")
    fileobj.seek(0)
