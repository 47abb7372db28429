"""Local stand-ins for tests and benchmarks: a tiny root filesystem copied from the host,
a podman image made from it, and podman's Docker Engine API service on a unix socket.

No registry is reachable on many machines (CI included), so images are built from host
binaries rather than pulled. Everything is cached under a directory chosen by the caller.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from .errors import SandboxError
from .registry import engine_answers

__all__ = ["MINIMAL_PROGRAMS", "minimal_rootfs", "podman_image", "podman_service"]

MINIMAL_PROGRAMS = (
    "bash", "sh", "cat", "cp", "rm", "mkdir", "ls", "sleep", "timeout", "env", "id", "chmod",
    "mv", "touch", "head", "tail", "tr", "wc", "grep", "sed", "tar", "test", "true", "false",
    "printf", "dirname", "basename", "kill", "echo", "seq", "sort", "stat", "ln", "uname",
)  # fmt: skip

_PASSWD = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"


def minimal_rootfs(dest: str | os.PathLike[str], programs: Sequence[str] = MINIMAL_PROGRAMS) -> Path:
    """Build (once) a merged-/usr root filesystem holding `programs` and their shared libraries.

    The result is reused when `dest` already holds a complete one.
    """
    dest = Path(dest)
    marker = dest / ".platoon-rootfs"
    if marker.exists():
        return dest
    staging = dest.with_name(dest.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    for sub in ("usr/bin", "usr/lib", "usr/lib64", "etc", "tmp", "root", "app", "proc", "dev", "sys"):
        (staging / sub).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        (staging / link).symlink_to(target)
    os.chmod(staging / "tmp", 0o1777)  # nosec B103 # the sandbox's own /tmp (sticky, as on any system)
    (staging / "etc/passwd").write_text(_PASSWD)
    (staging / "etc/group").write_text(_GROUP)
    for name in programs:
        found = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if found is None:
            raise SandboxError(f"cannot build a minimal rootfs: {name!r} is not on this host")
        _copy_into(staging, Path(found), Path("/usr/bin") / name)
        for lib in _shared_libraries(found):
            _copy_into(staging, lib, _usr_path(lib))
    marker_tmp = staging / ".platoon-rootfs"
    marker_tmp.write_text("ok\n")
    try:
        staging.rename(dest)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def _usr_path(path: Path) -> Path:
    """Where a host file lives under merged /usr (the symlinked dirname, the original name)."""
    return Path(os.path.realpath(path.parent)) / path.name


def _copy_into(root: Path, source: Path, target: Path) -> None:
    dest = root / target.relative_to("/")
    if dest.exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(os.path.realpath(source), dest)


def _shared_libraries(binary: str) -> list[Path]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and parts.index("=>") + 1 < len(parts):
            candidate = parts[parts.index("=>") + 1]
        elif parts and parts[0].startswith("/"):
            candidate = parts[0]
        else:
            continue
        if candidate.startswith("/"):
            libs.append(Path(candidate))
    return libs


def _podman(root: Path, *args: str) -> list[str]:
    return [
        "podman",
        "--runtime",
        "runc",
        "--root",
        str(root / "storage"),
        "--runroot",
        str(root / "run"),
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "file",
        *args,
    ]


def podman_image(
    state_dir: str | os.PathLike[str], rootfs: str | os.PathLike[str], name: str = "localhost/platoon-minimal"
) -> str:
    """Import `rootfs` as image `name:latest` into the podman storage under `state_dir` (once)."""
    root = Path(state_dir)
    ref = f"{name}:latest"
    exists = subprocess.run(_podman(root, "image", "exists", ref), capture_output=True, check=False)
    if exists.returncode == 0:
        return ref
    # `with` closes tar's end of the pipe (left open, it warned as an unclosed file).
    with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
        result = subprocess.run(
            _podman(root, "import", "-", ref), stdin=tar.stdout, capture_output=True, check=False
        )
    if result.returncode != 0:
        raise SandboxError(f"podman import failed: {result.stderr.decode(errors='replace').strip()}")
    return ref


@contextlib.contextmanager
def podman_service(state_dir: str | os.PathLike[str], *, ready_timeout: float = 30.0) -> Iterator[str]:
    """Run podman's Docker Engine API service on a fresh unix socket; yields its `unix://` URL.

    Storage lives under `state_dir` so images survive between runs; runc is used because
    podman's default crun cannot set the rlimits some hosts impose.
    """
    if shutil.which("podman") is None:
        raise SandboxError("podman is not installed")
    root = Path(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    sock = root / f"api-{os.getpid()}-{time.monotonic_ns()}.sock"
    log = (root / "service.log").open("ab")
    proc = subprocess.Popen(
        _podman(root, "system", "service", "--time=0", f"unix://{sock}"),
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + ready_timeout
        while not _pings(sock):
            if proc.poll() is not None:
                raise SandboxError(
                    f"podman system service exited with {proc.returncode}; see {root}/service.log"
                )
            if time.monotonic() > deadline:
                raise SandboxError(f"podman system service did not answer within {ready_timeout} s")
            time.sleep(0.05)
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        sock.unlink(missing_ok=True)


def _pings(sock: Path) -> bool:

    return sock.exists() and engine_answers(f"unix://{sock}")
