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


def configure(level: str = "INFO", stream: TextIO | None = None, json: bool | None = None) -> None:
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
