"""Import the `openreward` SDK without paying for the model clients it never uses here.

`import openreward` runs the package's `__init__`, which imports its rollout-upload and
chat-backend modules, and with them the `anthropic`, `openai` and `google.genai` clients:
about 2 s of a 3 s start, for names that only appear in type hints and in code paths platoon
never takes (uploading rollouts to the OpenReward platform, its hosted chat backends).

After `defer_sdk_clients()`, the SDK's first import (by platoon or by a user's environment
module) runs with those three packages stood in for by `Deferred` placeholders. A placeholder
is a name, not a module: the first time it is really used (called, subclassed, an attribute
read off it at run time, an `isinstance` check) it imports the real package and from then on
is that object. After the SDK is imported the placeholders leave `sys.modules`, so any later
`import openai` (a user's harness, litellm, a test) gets the real package, untouched. A package
imported before the SDK is used as is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import operator
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Protocol, cast

__all__ = ["DEFERRED", "Deferred", "defer_sdk_clients", "quiet_sdk"]

# The SDK's optional clients: (a) heavy, (b) only named at import time, never used there.
DEFERRED = ("anthropic", "openai", "google.genai")

# The SDK logs every tool call at INFO to stdout and checks PyPI for updates when a client or
# server starts: noise on the terminal and a network call inside a training run.
_QUIET = {"OPENREWARD_LOG_LEVEL": "WARNING", "OPENREWARD_DISABLE_UPDATE_CHECK": "1"}


def quiet_sdk() -> None:
    """Turn the SDK's logging down and its update check off, unless the user set them."""
    for key, value in _QUIET.items():
        os.environ.setdefault(key, value)


_importing = False


class _Subscriptable(Protocol):
    def __getitem__(self, item: object, /) -> object: ...


class Deferred:
    """A stand-in for `module` (and `attrs` read off it) until its first real use."""

    __slots__ = ("_attrs", "_module", "_target")

    def __init__(self, module: str, attrs: tuple[str, ...] = ()) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_attrs", attrs)
        object.__setattr__(self, "_target", None)

    def resolve(self) -> object:
        """The real object, imported on first use: a module, or whatever was read off it."""
        target = object.__getattribute__(self, "_target")
        if target is None:
            target = importlib.import_module(object.__getattribute__(self, "_module"))
            for attr in object.__getattribute__(self, "_attrs"):
                target = getattr(target, attr)
            object.__setattr__(self, "_target", target)
        return target

    def _as_class(self) -> type:
        """The real object where the placeholder is used as a class (subclassed, `isinstance`):
        the SDK names only classes that way, and Python raises TypeError as it would otherwise."""
        return cast(type, self.resolve())

    def __getattr__(self, name: str) -> object:
        if not _importing:
            return getattr(self.resolve(), name)
        if name.startswith("__") and name.endswith("__"):
            # typing and the import system probe for dunders; the SDK's own import must not
            # turn that into importing the client.
            raise AttributeError(name)
        # Still importing the SDK: `gdm_types.Content` in a signature stays a placeholder.
        module = object.__getattribute__(self, "_module")
        attrs = object.__getattribute__(self, "_attrs")
        return Deferred(module, (*attrs, name))

    # What is done to a placeholder is done to the real object, which raises TypeError as it
    # would if it does not support it: the casts say only what the operation asks of it.
    def __call__(self, *args: object, **kwargs: object) -> object:
        return cast("Callable[..., object]", self.resolve())(*args, **kwargs)

    def __mro_entries__(self, bases: tuple[type, ...]) -> tuple[type, ...]:
        return (self._as_class(),)

    def __instancecheck__(self, obj: object) -> bool:
        return isinstance(obj, self._as_class())

    def __subclasscheck__(self, cls: type) -> bool:
        return issubclass(cls, self._as_class())

    def __getitem__(self, item: object) -> object:
        return cast(_Subscriptable, self.resolve())[item]

    def __or__(self, other: object) -> object:
        return operator.or_(self.resolve(), other)

    def __ror__(self, other: object) -> object:
        return operator.or_(other, self.resolve())

    def __repr__(self) -> str:
        name = ".".join((object.__getattribute__(self, "_module"), *object.__getattribute__(self, "_attrs")))
        return f"<deferred {name}>"


class _DeferredModule(types.ModuleType):
    """What `import anthropic.types` finds while the SDK imports: its names are placeholders."""

    def __getattr__(self, name: str) -> Deferred:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Deferred(self.__name__, (name,))


class _ClientFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the deferred clients, as `_DeferredModule`s, while the SDK's `__init__` runs."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.made: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not any(fullname == name or fullname.startswith(name + ".") for name in self.names):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _DeferredModule(spec.name)
        module.__path__ = []
        self.made.append(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass

    def forget(self) -> None:
        """Our placeholders leave `sys.modules` (and a real parent such as `google`)."""
        for name in self.made:
            if isinstance(sys.modules.get(name), _DeferredModule):
                del sys.modules[name]
            parent, _, child = name.rpartition(".")
            module = sys.modules.get(parent)
            if module is not None and isinstance(getattr(module, child, None), _DeferredModule):
                delattr(module, child)


class _SDKLoader(importlib.abc.Loader):
    """The SDK's own loader, run with the clients deferred."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        global _importing
        clients = _ClientFinder(tuple(name for name in DEFERRED if name not in sys.modules))
        sys.meta_path.insert(0, clients)
        _importing = True
        try:
            self.loader.exec_module(module)
        finally:
            _importing = False
            sys.meta_path.remove(clients)
            clients.forget()


class _SDKFinder(importlib.abc.MetaPathFinder):
    """Catches the first `import openreward`, by anyone, and hands it `_SDKLoader`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "openreward":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _SDKLoader(spec.loader)
        return spec


def defer_sdk_clients() -> None:
    """From now on, the first `import openreward` defers the SDK's optional model clients."""
    if "openreward" not in sys.modules and not any(isinstance(f, _SDKFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SDKFinder())
