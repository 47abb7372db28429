"""Tar streams for moving files into and out of sandboxes.

Extraction never follows the archive outside the destination: entries and links that
would escape are dropped, so a sandboxed program cannot plant a host path.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import BinaryIO

from .errors import SandboxError


def upload_target(local: Path, remote: str) -> tuple[str, str]:
    """Where an upload lands: (directory to extract into, name inside the archive)."""
    if not local.exists():
        raise SandboxError(f"upload source {str(local)!r} does not exist")
    if local.is_dir():
        return remote, "."
    return posixpath.dirname(remote), posixpath.basename(remote)


def pack(local: Path, fileobj: BinaryIO, arcname: str) -> None:
    """Write `local` (a file, or a directory's contents when arcname is '.') as a tar."""

    def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(str(local), arcname=arcname, filter=as_root)
    fileobj.seek(0)


def _inside(info: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    try:
        return tarfile.data_filter(info, dest)
    except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
        return None  # a link pointing out of the tree stays behind
    except tarfile.FilterError as exc:
        raise SandboxError(f"refusing archive entry {info.name!r}: {exc}") from exc


def unpack(tar: tarfile.TarFile, name: str, local: Path) -> None:
    """Extract entry `name` (a file or a directory tree) of `tar` to `local`."""
    local.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=local.parent, prefix=".platoon-download-") as tmp:
        tar.extractall(tmp, filter=_inside)  # nosec B202 # filter=_inside refuses entries and links leaving the destination
        got = Path(tmp) / name
        if not got.exists() and not got.is_symlink():
            raise SandboxError(f"archive did not hold {name!r}")
        if got.is_dir() and local.is_dir():
            for child in got.iterdir():
                target = local / child.name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif target.exists() or target.is_symlink():
                    target.unlink()
                os.replace(child, target)
        else:
            if local.is_dir() and not local.is_symlink():
                shutil.rmtree(local)
            os.replace(got, local)
