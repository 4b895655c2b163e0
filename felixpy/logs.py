"""structlog set-up: JSON when the log stream is not a terminal, console format otherwise.

Stable keys (``table=``, ``ip_version=``, ``chain=``, ``set_id=``); batch
summaries at info, per-item detail at debug.  Logs go to stderr: with Felix's
external-driver protocol the driver's stdout/stderr are copied into Felix's.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
           "ERROR": logging.ERROR, "FATAL": logging.CRITICAL, "CRITICAL": logging.CRITICAL,
           "PANIC": logging.CRITICAL}


_configured_level: str | None = None  # set once configure() has run in this process


def configure(level: str = "INFO", stream: TextIO | None = None, json: bool | None = None) -> None:
    global _configured_level
    _configured_level = level.upper()
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def set_level(level: str) -> None:
    """Apply ``LogSeverityScreen`` as resolved with the datastore's ``ConfigUpdate`` (the CLI configured
    logging from the file and environment before any feed arrived).  No-op unless :func:`configure`
    has run in this process (an in-process daemon under test leaves the test's logging alone)."""
    global _configured_level
    if _configured_level is None or _configured_level == level.upper():
        return
    structlog.get_logger(__name__).info("Log level from config", old=_configured_level, new=level.upper())
    _configured_level = level.upper()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level.upper(),
                                                                                        logging.INFO)))
