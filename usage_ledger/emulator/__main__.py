"""`python -m usage_ledger.emulator [--port 8200] [--profile moe|dense] [--speed X] ...`"""

from __future__ import annotations

import sys

from usage_ledger.emulator.commands import main

if __name__ == "__main__":
    sys.exit(main())
