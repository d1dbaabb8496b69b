"""structlog set-up, called once by each entry point: JSON when not a TTY, console otherwise."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

__all__ = ("configure_logging",)


class _CurrentStderr:
    """Writes to whatever `sys.stderr` is when a line is logged, not when logging was configured: a process
    (or a test) that replaces `sys.stderr` later, and closes the old one, never gets a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


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
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
