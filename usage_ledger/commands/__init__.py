"""The `ledger` command's subcommands, grouped by the package whose work they run, and the helpers
they share (`support`). Part of the composition root (`usage_ledger.cli`): the layers hold no CLI code."""
