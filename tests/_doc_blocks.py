"""The fenced blocks of README.md and docs/*.md, and what each shell block is for the doc test (tests/test_docs.py).

A shell block is one fenced as `sh`, `bash`, `shell` or `console`, or an unfenced-language block whose first line is a
command (`ledger …`, `$ …`, `make …`, …). Each is one of:

- runnable (the default for a language-tagged shell block): `console` blocks run their `$ ` lines (a line ending in
  `\\` continues on the next; the other lines are output, shown to the reader, not compared), `sh` blocks run every
  line;
- `<!-- doc-test: synopsis -->` on the line before: usage lines (`ledger report runs [--run R]`): each names a
  subcommand that exists and only options that command has;
- `<!-- doc-test: skip REASON -->`: not run, for a reason named in SKIP_REASONS (a GPU, a server, Docker, …).

An untagged block that looks like commands must say which (a block with no language is how the auditing doc's
checkpoint commands drifted: nothing ran them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ("SKIP_REASONS", "Block", "doc_files", "read_blocks")

SHELL_LANGUAGES = frozenset({"sh", "bash", "shell", "console"})
SKIP_REASONS = {
    "make": "builds the project's environments or runs the whole suite (tests/test_demo.py runs `make demo`)",
    "server": "starts a server that runs until stopped (serve, emulate, ui), or needs one the docs do not start",
    "gpu": "needs a GPU or the real-vLLM environment (tests/realvllm)",
    "postgres": "needs a PostgreSQL server at the URL it names",
    "clickhouse": "needs a ClickHouse server",
    "docker": "needs a Docker engine",
    "user-files": "reads the user's own files (labels, returns) that no doc makes",
    "long": "runs for many minutes (the fault soak, a benchmark)",
}
_MARK = re.compile(r"<!--\s*doc-test:\s*(synopsis|skip\s+(\S+))\s*-->")
_LOOKS_LIKE_COMMANDS = re.compile(r"(\$ |ledger |\.venv/bin/|make |export |python |curl |docker |[A-Z_]+=\S+ )")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    mark: str | None  # "synopsis", "skip", or None
    skip_reason: str | None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def is_shell(self) -> bool:
        first = next((line.strip() for line in self.text.splitlines() if line.strip()), "")
        return self.language in SHELL_LANGUAGES or (not self.language and bool(_LOOKS_LIKE_COMMANDS.match(first)))

    @property
    def runnable(self) -> bool:
        return self.is_shell and self.mark is None

    def commands(self) -> list[str]:
        """The commands to run, continuation lines joined as the shell would see them."""
        lines = self.text.splitlines()
        if self.language != "console":
            return [self.text]
        out: list[str] = []
        continuing = False
        for line in lines:
            if continuing:
                out[-1] += "\n" + line
            elif line.startswith("$ "):
                out.append(line[2:])
            else:
                continue
            continuing = line.endswith("\\")
        return out


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def read_blocks(path: Path, root: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opening = re.match(r"^\s*(```+|~~~+)\s*([\w-]*)", lines[i])  # indented: a block in a list item
        if not opening:
            i += 1
            continue
        fence, language, start = opening.group(1), opening.group(2), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].lstrip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        before = lines[start - 1] if start else ""
        mark = _MARK.search(before)
        blocks.append(
            Block(
                path=path.relative_to(root),
                line=start + 1,
                language=language,
                text="\n".join(body) + "\n",
                mark=None if mark is None else ("skip" if mark.group(2) else "synopsis"),
                skip_reason=mark.group(2) if mark else None,
            )
        )
    return blocks
