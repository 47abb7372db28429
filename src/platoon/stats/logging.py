"""structlog set-up: readable lines on a terminal, one JSON object a line with `--log-format json`."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Literal, TextIO

import structlog

from platoon.config.redact import REDACTED, is_secret_key, redact_text

__all__ = ["configure_logging"]


def _stderr_logger(*args: object) -> structlog.PrintLogger:
    # Look sys.stderr up when a logger is made, not once: tests and embedding applications
    # replace (and close) it, and a logger holding the old one would write to a closed file.
    return structlog.PrintLogger(file=sys.stderr)


class _StderrHandler(logging.StreamHandler):
    """A stream handler that always writes to the current `sys.stderr`."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def _redact_secrets(
    logger: object, method: str, event_dict: MutableMapping[str, object]
) -> MutableMapping[str, object]:
    """No key, token or URL password reaches a log line, whoever logged it."""
    for key, value in event_dict.items():
        if is_secret_key(key) and value:
            event_dict[key] = REDACTED
        elif isinstance(value, str):
            event_dict[key] = redact_text(value)
    return event_dict


def configure_logging(fmt: Literal["console", "json"] = "console", level: str = "info") -> None:
    """Route structlog and the standard library's logging to stderr in one format."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    if numeric > logging.DEBUG:
        # openreward logs every tool call at info, to stdout, through loggers of its own that
        # read this variable when they are made (on import, after this runs).
        os.environ.setdefault("OPENREWARD_LOG_LEVEL", "WARNING")
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso" if fmt == "json" else "%H:%M:%S"),
        _redact_secrets,
    ]
    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, _redact_secrets, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=shared,
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING) if numeric < logging.WARNING else numeric)
    logging.getLogger("platoon").setLevel(numeric)
