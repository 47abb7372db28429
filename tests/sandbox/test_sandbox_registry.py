import socket
import threading
from importlib.metadata import EntryPoint

import pytest

from platoon.sandbox import (
    ENTRY_POINT_GROUP,
    SandboxError,
    SandboxSpec,
    create_sandbox,
    default_provider,
    engine_answers,
    get_provider,
    provider_names,
    register_provider,
    resolve_provider,
)
from platoon.sandbox import registry as registry_module
from platoon.sandbox.apptainer import ApptainerSandbox, SingularitySandbox
from platoon.sandbox.bwrap import BwrapSandbox
from platoon.sandbox.docker import DockerSandbox
from platoon.sandbox.enroot import EnrootSandbox


def test_builtin_providers_by_name():
    assert {"bwrap", "docker", "apptainer", "singularity", "enroot"} <= set(provider_names())
    assert get_provider("bwrap") is BwrapSandbox
    assert get_provider("docker") is DockerSandbox
    assert get_provider("apptainer") is ApptainerSandbox
    assert get_provider("singularity") is SingularitySandbox
    assert get_provider("enroot") is EnrootSandbox
    box = create_sandbox(SandboxSpec(), provider="bwrap", copy_rootfs=False)
    assert isinstance(box, BwrapSandbox) and box.copy_rootfs is False


def test_unknown_provider_names_the_known_ones():
    with pytest.raises(SandboxError, match=r"unknown sandbox provider 'nope' \(known: .*bwrap"):
        get_provider("nope")


def test_a_configured_provider_resolves_auto_and_names_a_typo(monkeypatch):
    """The site profile keeps what was written; the registry checks it when a service resolves it."""
    monkeypatch.setattr(registry_module, "default_provider", lambda: "bwrap")
    assert resolve_provider("auto") == "bwrap"
    assert resolve_provider("docker") == "docker"
    with pytest.raises(SandboxError, match="unknown sandbox provider 'dockr'; did you mean 'docker'"):
        resolve_provider("dockr")


def test_registered_provider(monkeypatch):
    monkeypatch.setattr(registry_module, "_registered", {})
    made = []

    def factory(spec, **options):
        made.append((spec, options))
        return BwrapSandbox(spec)

    register_provider("mine", factory)
    assert "mine" in provider_names()
    create_sandbox(SandboxSpec(), "mine", flag=1)
    assert made[0][1] == {"flag": 1}
    with pytest.raises(SandboxError, match="need a name and a callable"):
        register_provider("", factory)


def test_entry_point_providers_load_only_when_named(monkeypatch):
    eps = [
        EntryPoint("plugged", "platoon.sandbox.bwrap:BwrapSandbox", ENTRY_POINT_GROUP),
        EntryPoint("broken", "platoon_no_such_module:Box", ENTRY_POINT_GROUP),
    ]

    def fake_entry_points(*, group, name=None):
        assert group == ENTRY_POINT_GROUP
        return [ep for ep in eps if name is None or ep.name == name]

    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points)
    assert {"plugged", "broken"} <= set(provider_names())
    assert get_provider("plugged") is BwrapSandbox
    with pytest.raises(SandboxError, match=r"'broken' .* failed to load"):
        get_provider("broken")


class _FakeEngine:
    """A unix-socket server answering every request with `status`."""

    def __init__(self, path, status: bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen()
        self.status = status
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 " + self.status + b"\r\nContent-Length: 2\r\n\r\nOK")


def test_default_provider_is_docker_only_when_an_engine_answers(tmp_path, monkeypatch):
    ok = _FakeEngine(tmp_path / "ok.sock", b"200 OK")
    bad = _FakeEngine(tmp_path / "bad.sock", b"500 Internal Server Error")
    try:
        assert engine_answers(f"unix://{tmp_path}/ok.sock")
        assert not engine_answers(f"unix://{tmp_path}/bad.sock")
        assert not engine_answers(f"unix://{tmp_path}/absent.sock")
        assert not engine_answers("ssh://host")
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/ok.sock")
        assert default_provider() == "docker"
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/absent.sock")
        assert default_provider() == "bwrap"
    finally:
        ok.sock.close()
        bad.sock.close()
