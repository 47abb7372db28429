"""Secrets out of everything a run writes: run files, logs, the event log.

A value is secret when its key says so (`api_key`, `token`, `password`, `secret`,
`credentials`, ...) or when it is a URL with a password in it (`nats://user:pass@host`,
`https://user:token@host`). Secrets are replaced, never dropped, so a reader sees that a value
was there; a config with redacted secrets takes them again from the environment or a flag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REDACTED", "is_secret_key", "redact", "redact_text"]

REDACTED = "<redacted>"
_SECRET_KEY = re.compile(
    r"(^|[_.\-])(api[_\-]?key|apikey|token|access[_\-]?token|password|passwd|secret|secrets|"
    r"credential|credentials|creds|authorization|private[_\-]?key|nkey|jwt)$",
    re.IGNORECASE,
)
_NOT_SECRET = {"tokenizer", "max_tokens", "tokens", "key_path", "monkey"}
# scheme://user:password@ -> scheme://user:<redacted>@
_URL_CREDENTIALS = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*:)(?P<secret>[^@\s/]+)@")
# key=value on a command line, for keys that are secret
_ASSIGNMENT = re.compile(r"(?P<key>[\w.\-]+)(?P<op>\+?=)(?P<value>\S+)")


def is_secret_key(key: str) -> bool:
    """Whether a mapping key names a secret (`api_key`, `nats.token`, `X-API-Key`, ...)."""
    name = str(key)
    if name.lower() in _NOT_SECRET:
        return False
    return bool(_SECRET_KEY.search(name))


def redact_text(text: str) -> str:
    """`text` with URL passwords and `secret_key=value` assignments replaced."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m['head']}{REDACTED}@", text)

    def assignment(match: re.Match[str]) -> str:
        key = match["key"].rsplit(".", 1)[-1]
        if is_secret_key(key):
            return f"{match['key']}{match['op']}{REDACTED}"
        return match.group(0)

    return _ASSIGNMENT.sub(assignment, text)


def redact(value: Any) -> Any:
    """A copy of plain data (dicts, lists, strings) with its secrets replaced."""
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if is_secret_key(k) and value_is_set(v) else redact(v)) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def value_is_set(value: Any) -> bool:
    return value not in (None, "", [], {})
