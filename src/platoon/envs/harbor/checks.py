"""Refusals: what platoon will not run, found before anything starts.

Files that leave the task directory through links, special files, compose services
that are privileged or reach into the host, and build steps that escape their context.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import HarborError

__all__ = ["COMPOSE_FILES", "check_compose", "check_dockerfile", "check_tree"]

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
_HOST_NAMESPACES = ("network_mode", "pid", "ipc", "uts", "userns_mode", "cgroup")
_DANGEROUS_CAPS = {
    "ALL", "SYS_ADMIN", "SYS_MODULE", "SYS_RAWIO", "SYS_BOOT", "SYS_TIME", "SYS_PTRACE",
    "DAC_READ_SEARCH", "NET_ADMIN", "MAC_ADMIN", "MAC_OVERRIDE", "BPF", "PERFMON", "SYSLOG",
}  # fmt: skip
_UNCONFINED = re.compile(r"(seccomp|apparmor)[:=]unconfined|label[:=]disable|systempaths[:=]unconfined")


def check_tree(root: Path) -> None:
    """Refuse links that resolve outside `root` and files that are not regular files,
    directories or links."""
    real_root = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                target = os.path.realpath(path)
                if os.path.commonpath([real_root, target]) != real_root:
                    raise HarborError(f"{rel} links to {os.readlink(path)!r}, outside the task directory")
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise HarborError(f"{rel} is a special file (device, fifo or socket)")


def _escapes(base: Path, root: Path, relative: str) -> bool:
    """Whether `relative` (a host path written in a file under `base`) leaves `root`."""
    if os.path.isabs(relative) or relative.startswith("~"):
        return True
    target = os.path.realpath(base / relative)
    real_root = os.path.realpath(root)
    return os.path.commonpath([real_root, target]) != real_root


def check_compose(path: Path, root: Path) -> None:
    """Refuse privileged services, host namespaces, devices, dangerous capabilities and
    bind mounts of host paths outside the task directory; require a `main` service."""
    rel = path.relative_to(root)
    try:
        doc = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise HarborError(f"{rel} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise HarborError(f"{rel} has no services mapping")
    if "main" not in doc["services"]:
        raise HarborError(f"{rel} has no service named 'main'")
    base = path.parent
    for name, service in doc["services"].items():
        if not isinstance(service, dict):
            raise HarborError(f"{rel}: service {name!r} is not a mapping")
        where = f"{rel}: service {name!r}"
        if service.get("privileged"):
            raise HarborError(f"{where} is privileged")
        for key in _HOST_NAMESPACES:
            if str(service.get(key, "")).startswith("host"):
                raise HarborError(f"{where} uses the host's {key.split('_')[0]} namespace")
        if service.get("devices"):
            raise HarborError(f"{where} maps host devices")
        caps = {str(cap).upper().removeprefix("CAP_") for cap in service.get("cap_add") or ()}
        if caps & _DANGEROUS_CAPS:
            raise HarborError(f"{where} adds capabilities {', '.join(sorted(caps & _DANGEROUS_CAPS))}")
        for option in service.get("security_opt") or ():
            if _UNCONFINED.search(str(option)):
                raise HarborError(f"{where} disables confinement ({option})")
        for volume in service.get("volumes") or ():
            source = _bind_source(volume)
            if source is not None and _escapes(base, root, source):
                raise HarborError(f"{where} mounts host path {source!r}, outside the task directory")
        build = service.get("build")
        context = (
            build
            if isinstance(build, str)
            else (build or {}).get("context")
            if isinstance(build, dict)
            else None
        )
        if context is not None and "://" not in str(context) and _escapes(base, root, str(context)):
            raise HarborError(f"{where} builds from {context!r}, outside the task directory")
        if isinstance(build, dict) and build.get("dockerfile") and context is not None:
            if _escapes(base / str(context), root, str(build["dockerfile"])):
                raise HarborError(f"{where} uses a Dockerfile outside the task directory")
        env_files = service.get("env_file") or ()
        for env_file in [env_files] if isinstance(env_files, str | dict) else env_files:
            file = env_file.get("path") if isinstance(env_file, dict) else env_file
            if file is not None and _escapes(base, root, str(file)):
                raise HarborError(f"{where} reads env_file {file!r}, outside the task directory")
    for name, volume in (doc.get("volumes") or {}).items():
        device = ((volume or {}).get("driver_opts") or {}).get("device") if isinstance(volume, dict) else None
        if device is not None:
            raise HarborError(f"{rel}: volume {name!r} binds host device or path {device!r}")


def _bind_source(volume: Any) -> str | None:
    """The host side of a compose volume entry if it is a bind mount, else None."""
    if isinstance(volume, dict):
        if volume.get("type") == "bind":
            return str(volume.get("source", ""))
        return None
    text = str(volume)
    if ":" not in text:
        return None  # an anonymous volume
    source = text.split(":", 1)[0]
    return source if source.startswith((".", "/", "~")) or "/" in source else None


def check_dockerfile(path: Path, root: Path) -> None:
    """Refuse COPY/ADD sources that climb out of the build context and insecure RUNs."""
    rel = path.relative_to(root)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise HarborError(f"{rel} is not UTF-8 text") from None
    for number, line in enumerate(text.replace("\\\n", " ").splitlines(), 1):
        words = line.split()
        if not words:
            continue
        instruction = words[0].upper()
        if instruction == "RUN" and any(w.startswith("--security=insecure") for w in words[1:]):
            raise HarborError(f"{rel}:{number}: RUN --security=insecure is refused")
        if instruction in ("COPY", "ADD") and not any(w.startswith("--from") for w in words[1:]):
            sources = [w for w in words[1:-1] if not w.startswith("--")]
            for source in sources:
                if "://" in source:
                    continue
                if ".." in posixpath.normpath(source.strip("\"'[],")).split("/"):
                    raise HarborError(
                        f"{rel}:{number}: {instruction} source {source!r} leaves the build context"
                    )
