"""enroot provider: a named container created from a squashfs image.

start: `enroot import -o STATE/image.sqsh docker://IMAGE` (unless spec.image is a
.sqsh file), then `enroot create --name NAME IMAGE.sqsh`; exec: `enroot start --root
--rw [--mount 'SRC DST none x-create=auto,rbind[,ro]'] [--env K=V] NAME bash -c 'cd CWD || exit 1; CMD'`; stop:
`enroot remove --force NAME`. enroot shares the host's network and applies no CPU or
memory limits, so a spec without network is refused rather than run connected.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path

import anyio.to_thread

from ._process import OUTPUT_LIMIT, run_process
from .base import CommandSandbox, remove_tree
from .errors import SandboxError
from .spec import SandboxSpec

__all__ = ["EnrootSandbox"]


class EnrootSandbox(CommandSandbox):
    """Run commands in an enroot container; only `user` None or "root" (enroot --root)."""

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        binary: str = "enroot",
        state_dir: str | os.PathLike[str] | None = None,
        output_limit: int = OUTPUT_LIMIT,
    ) -> None:
        super().__init__(spec, output_limit=output_limit)
        self.binary = binary
        self.state_dir = state_dir
        self.name = f"platoon-{uuid.uuid4().hex[:12]}"
        self._state: Path | None = None
        self._created = False

    async def _run(self, *args: str) -> None:
        result = await run_process([self.binary, *args])
        if result.return_code != 0:
            raise SandboxError(f"enroot {args[0]} failed: {result.stderr.decode(errors='replace').strip()}")

    async def start(self) -> None:
        if self._started:
            return
        if not self.spec.network:
            raise SandboxError("enroot shares the host network; it cannot run a sandbox without network")
        if not self.spec.image:
            raise SandboxError("enroot needs spec.image (a .sqsh file or a docker image name)")
        if any(ch.isspace() for m in self.spec.mounts for ch in m.source + m.target):
            raise SandboxError("enroot mounts cannot contain whitespace (fstab form)")
        if shutil.which(self.binary) is None:
            raise SandboxError(f"{self.binary} is not installed")
        image = self.spec.image
        if not image.endswith(".sqsh"):
            self._state = Path(tempfile.mkdtemp(prefix="platoon-enroot-", dir=self.state_dir))
            squashfs = str(self._state / "image.sqsh")
            await self._run("import", "-o", squashfs, image if "://" in image else f"docker://{image}")
            image = squashfs
        await self._run("create", "--name", self.name, image)
        self._created = True
        self._started = True
        await self._make_workdir()

    def _exec_argv(self, command: str, *, cwd: str, env: Mapping[str, str], user: str | None) -> list[str]:
        if user not in (None, "root", "0"):
            raise SandboxError(f"enroot cannot run commands as user {user!r}")
        argv = [self.binary, "start", "--root", "--rw"]
        for mount in self.spec.mounts:
            options = "x-create=auto,rbind" + (",ro" if mount.read_only else "")
            argv += ["--mount", f"{mount.source} {mount.target} none {options}"]  # fstab form
        for key, value in {**self.spec.env, **env}.items():
            argv += ["--env", f"{key}={value}"]
        # enroot start has no working-directory option.
        return [*argv, self.name, "bash", "-c", f"cd -- {shlex.quote(cwd)} || exit 1\n{command}"]

    async def stop(self) -> None:
        self._started = False
        try:
            if self._created:
                self._created = False
                await self._run("remove", "--force", self.name)
        finally:
            if self._state is not None:
                state, self._state = self._state, None
                await anyio.to_thread.run_sync(remove_tree, state)
