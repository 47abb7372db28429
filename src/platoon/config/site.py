"""The site profile: facts of a machine or cluster that no project config should repeat.

Where runs are written, where fetched and built artefacts are cached, and which sandbox runtime
starts task sandboxes. Read from ``$PLATOON_SITE`` if set, else ``~/.config/platoon/site.yaml``
(``$XDG_CONFIG_HOME`` honoured); a machine without one gets the defaults.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from .load import read_file
from .schema import FilePath
from .validate import ConfigError, convert

__all__ = ["Site", "load_site", "site_path"]


class Site(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Where runs and caches live and which sandbox runtime is used, on this machine."""

    runs: FilePath = "~/platoon-runs"  # where a config without log_path writes its runs
    cache: FilePath = "~/.cache/platoon"  # what platoon prepare fetches and builds
    # The sandbox runtime: auto, bwrap, docker, singularity, enroot, or a plugin's. Kept as given:
    # the sandbox registry names a typo when a service resolves it (the contracts know no components).
    provider: str = "auto"
    # Python interpreters a command-line agent's toolchain may be built with, when it needs
    # another version than the sandbox's (OpenHands needs 3.12); tried before those platoon finds.
    pythons: list[FilePath] = []


def site_path() -> Path:
    """Where the site profile is read from."""
    named = os.environ.get("PLATOON_SITE")
    if named:
        return Path(named).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(config_home) / "platoon" / "site.yaml"


def load_site(path: str | os.PathLike[str] | None = None) -> Site:
    """The site profile, strictly checked; its relative paths are taken from the profile's folder.

    A profile named by ``path`` or ``$PLATOON_SITE`` must exist; the default one may be absent.
    """
    explicit = path is not None or bool(os.environ.get("PLATOON_SITE"))
    given = Path(path) if path is not None else site_path()
    where = Path(os.path.abspath(given))
    data = read_file(where) if explicit or where.exists() else {}
    for f in msgspec.structs.fields(Site):  # defaults go through path resolution too, for ~
        data.setdefault(f.name, f.default if f.default is not msgspec.NODEFAULT else f.default_factory())
    try:
        site = convert(data, Site, base_dir=where.parent)
    except ConfigError as exc:
        raise ConfigError([f"{given}: {problem}" for problem in exc.problems]) from None
    return site
