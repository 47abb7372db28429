"""Harbor's own runner on platoon's sandboxes: an environment class for `harbor run -e`.

Harbor (0.25, Python >= 3.12) runs trials only in containers or clouds. This class lets its
runner (trials and jobs, its agents, its verifier and reward parsing) run a task in the
sandbox platoon's own sessions start for it (`TaskSandboxes`: bubblewrap by default, the
Dockerfile's files replayed or restored from `platoon prepare`'s layer), so the two can be
compared on the same task directories with no container engine:

    harbor run -p DATASET -a oracle -e platoon.envs.harbor.runner_env:PlatoonEnvironment \\
        --ek cache=~/.cache/platoon

It needs `harbor` and platoon importable in one Python >= 3.12; nothing else of platoon
imports this module. Environment kwargs (`--ek`): `provider` (default bwrap), `cache` (where
`platoon prepare` put layers; default the site profile's) and `state_dir` (bwrap's).
"""

from __future__ import annotations

import os
from pathlib import Path

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from platoon.config import load_site
from platoon.sandbox import Sandbox, resolve_provider
from platoon.sandbox.base import exec_phase

from .errors import HarborError
from .sandboxes import TaskSandboxes
from .task import HarborTask, load_task

__all__ = ["PlatoonEnvironment"]


class PlatoonEnvironment(BaseEnvironment):
    """A Harbor environment whose every command runs in a platoon sandbox of the task.

    Network: the sandbox has it when any phase Harbor plans is `public`, and each command
    runs without it while the current phase's policy is not (`set_network_policy`); an
    allowlist is refused, as no platoon provider filters hosts. A separate verifier
    environment is refused (platoon's own sessions run one; this class does not yet).
    """

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: EnvironmentConfig,
        *args: object,
        provider: str = "bwrap",
        cache: str | None = None,
        state_dir: str | None = None,
        **kwargs: object,
    ) -> None:
        # Read by the base class's checks, which run in its __init__.
        self._task = _task_of(Path(environment_dir))
        self._separate = "__verifier" in session_id
        options = {"state_dir": os.path.expanduser(state_dir)} if state_dir else {}
        self._sandboxes = TaskSandboxes(
            resolve_provider(provider),
            os.path.expanduser(cache) if cache else load_site().cache,
            options,
        )
        self._box: Sandbox | None = None
        super().__init__(
            environment_dir, environment_name, session_id, trial_paths, task_env_config, *args, **kwargs
        )
        policies = [self.network_policy, *self._phase_network_policies]
        self._network = any(p.network_mode == NetworkMode.PUBLIC for p in policies)
        self._offline = self.network_policy.network_mode != NetworkMode.PUBLIC

    @staticmethod
    def type() -> str:
        return "platoon"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True, dynamic_network_policy=True)

    def _validate_definition(self) -> None:
        if self._separate:
            raise ValueError("platoon's environment class runs no separate verifier environment")

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        self._offline = network_policy.network_mode != NetworkMode.PUBLIC

    async def start(self, force_build: bool) -> None:
        try:
            self._box = await self._sandboxes.start(self._task, None, self._network)
        except HarborError as exc:
            raise RuntimeError(f"task {self._task.name}: {exc}") from None

    async def stop(self, delete: bool) -> None:
        if self._box is not None:
            box, self._box = self._box, None
            await box.stop()

    def _started(self) -> Sandbox:
        if self._box is None:
            raise RuntimeError("the platoon sandbox is not started")
        return self._box

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._started().upload(source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._started().upload(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._started().download(source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._started().download(source_dir, target_dir)

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        user = self._resolve_user(user)
        result = await exec_phase(
            self._started(),
            command,
            offline=self._offline,
            cwd=cwd,
            env=self._merge_env(env),
            timeout=timeout_sec or None,
            user=None if user is None else str(user),
        )
        if result.timed_out:  # as Harbor's docker environment reports it
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=result.return_code)


def _task_of(environment_dir: Path) -> HarborTask:
    """The task whose environment Harbor starts: the nearest folder above with a task.toml."""
    for folder in environment_dir.resolve().parents:
        if (folder / "task.toml").is_file():
            try:
                return load_task(folder)
            except HarborError as exc:
                raise ValueError(str(exc)) from None
    raise ValueError(f"{environment_dir}: no task.toml above it")
