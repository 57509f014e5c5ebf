"""Write proto/ from the contracts (`make proto`). Removes files no model produces any more."""

from __future__ import annotations

import sys
from pathlib import Path

from suzumio.contracts.proto import documents

ROOT = Path(__file__).resolve().parent.parent / "proto"


def main() -> int:
    wanted = documents()
    for old in ROOT.rglob("*.json"):
        if old.relative_to(ROOT).as_posix() not in wanted:
            old.unlink()
    for rel, text in wanted.items():
        path = ROOT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    print(f"proto/: {len(wanted)} documents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
