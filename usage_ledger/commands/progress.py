"""Progress bars of `ledger import` and `ledger rebuild` on a terminal (none when piped)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn, TimeRemainingColumn
from rich.text import Text

__all__ = ("advance", "progress", "stage")


class _Count(ProgressColumn):
    """`done/total unit`, or `done unit` while the total is unknown (rich's format spec fails on None)."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        total = "" if task.total is None else f"/{task.total:,.0f}"
        return Text(f"{task.completed:,.0f}{total} {self.unit}")


class _Rate(ProgressColumn):
    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} {self.unit}/s" if speed else "")


def progress(unit: str) -> Progress:
    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description}", markup=False),  # a file name is not markup
        BarColumn(),
        _Count(unit),
        _Rate(unit),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def advance(bar: Progress, task: TaskID) -> Callable[[int, int], None]:
    return lambda done, total: bar.update(task, completed=done, total=total)


def stage(bar: Progress, task: TaskID, what: str) -> Callable[[str], None]:
    # refresh: a step can outlast many refreshes
    return lambda text: bar.update(task, description=f"{what}: {text}", refresh=True)
