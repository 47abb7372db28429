"""Outbound network for a sandbox without the host's loopback: a network namespace of its own
with user-mode networking (slirp4netns) in front.

Sharing the host's network namespace (bwrap's `--share-net`) would let task code reach every
service the host listens on at 127.0.0.1: NATS, the training service, env servers. Instead a
sandbox with network gets a namespace held open by a sleeping process; slirp4netns gives it a
`tap0` with NAT to the outside and, with `--disable-host-loopback`, refuses connections to the
host's loopback through its gateway address. Every command of the sandbox enters that namespace.

slirp4netns opens the sandbox's connections as host sockets, so one to the host's own address
(192.0.2.2, say) would reach every service bound to 0.0.0.0 there. The namespace therefore gets a
`prohibit` route for each address the host's kernel takes as its own (its `local` routes, IPv4:
slirp4netns gives the sandbox no IPv6). The routes belong to a namespace of the host's user
namespace, so root inside the sandbox (root of a user namespace only) cannot remove them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess

import anyio
import anyio.abc
import anyio.to_thread

from .errors import SandboxError

__all__ = ["SandboxNetwork"]

_TOOLS = ("slirp4netns", "unshare", "nsenter", "ip")
# slirp4netns's built-in DNS forwarder inside the namespace.
RESOLV_CONF = "nameserver 10.0.2.3\n"
_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


class SandboxNetwork:
    """A network namespace that reaches the outside through slirp4netns, never the host's loopback."""

    def __init__(self) -> None:
        self._holder: anyio.abc.Process | None = None
        self._slirp: anyio.abc.Process | None = None

    @staticmethod
    def unavailable() -> str | None:
        """Why a sandbox cannot have network here, or None when it can."""
        missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
        if missing:
            return f"{', '.join(missing)} not installed (Debian: apt-get install slirp4netns util-linux iproute2)"
        if os.geteuid() != 0:
            return "a network namespace of its own needs root here; run the task without network"
        return None

    async def start(self) -> None:
        reason = self.unavailable()
        if reason is not None:
            raise SandboxError(f"a sandbox with network must not share the host's loopback, and {reason}")
        hold = ["unshare", "--net", "--"]
        if shutil.which("setpriv"):  # the holder dies with us even if we are killed
            hold += ["setpriv", "--pdeathsig", "KILL", "--"]
        self._holder = await anyio.open_process(
            [*hold, "sleep", "infinity"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=_ENV,
        )
        pid = self._holder.pid
        own = os.readlink("/proc/self/ns/net")
        with anyio.move_on_after(10):
            # unshare(2) happens right after exec, with nothing to wait on but the namespace link.
            while _netns(pid) in (own, None) and self._holder.returncode is None:  # noqa: ASYNC110
                await anyio.sleep(0.002)
        if _netns(pid) in (own, None):
            await self.stop()
            raise SandboxError("could not create a network namespace for the sandbox")
        read_end, write_end = os.pipe()
        try:
            self._slirp = await anyio.open_process(
                [
                    "slirp4netns",
                    "--configure",
                    "--mtu=65520",
                    "--disable-host-loopback",
                    f"--ready-fd={write_end}",
                    str(pid),
                    "tap0",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=[write_end],
                env=_ENV,
            )
            os.close(write_end)
            write_end = -1
            ready = await anyio.to_thread.run_sync(os.read, read_end, 1)
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
        if not ready:
            await self.stop()
            raise SandboxError("slirp4netns could not configure the sandbox's network")
        try:
            await self._block_the_host(pid)
        except (OSError, subprocess.CalledProcessError, ValueError, KeyError) as exc:
            await self.stop()
            raise SandboxError(f"could not keep the host's own addresses from the sandbox: {exc}") from None

    async def _block_the_host(self, pid: int) -> None:
        """A `prohibit` route in the namespace for every address of the host (see the module)."""
        shown = await anyio.run_process(
            ["ip", "-4", "-j", "route", "show", "table", "local", "type", "local"], env=_ENV
        )
        own = [route["dst"] for route in json.loads(shown.stdout)]
        commands = "".join(f"route add prohibit {address}\n" for address in own)
        await anyio.run_process(
            ["nsenter", f"--net=/proc/{pid}/ns/net", "--", "ip", "-batch", "-"],
            input=commands.encode(),
            env=_ENV,
        )

    def enter(self, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace."""
        if self._holder is None:
            raise SandboxError("the sandbox's network is not started")
        return ["nsenter", f"--net=/proc/{self._holder.pid}/ns/net", "--", *argv]

    async def stop(self) -> None:
        for process in (self._slirp, self._holder):
            if process is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()
                await process.aclose()
        self._slirp = self._holder = None


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None
