"""Imports: calls, labels and returns recorded from files (`ledger import`, `labels import`,
`returns import`) as ledger events.

A writer beside the gateway, not a reader (DESIGN §9): everything here ends in `append_events`. It
reads through `answers` (a run's calls and stored answers, to extract labels from) and `projections`,
and appends through `ledger`; nothing imports it but the CLI.
"""

from __future__ import annotations

from usage_ledger.imports.importer import import_file
from usage_ledger.imports.label_import import Recorded, extract_labels, import_labels, import_returns

__all__ = (
    "Recorded",
    "extract_labels",
    "import_file",
    "import_labels",
    "import_returns",
)
