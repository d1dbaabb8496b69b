"""structlog set-up, called once by each entry point: JSON when not a TTY, console otherwise."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

__all__ = ("configure_logging",)


def configure_logging(level: str = "info", fmt: Literal["auto", "json", "console"] = "auto") -> None:
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
