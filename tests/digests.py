"""Content digests of a folder's files, for tests that compare what two runs wrote."""

from __future__ import annotations

import hashlib
from pathlib import Path


def tree_digest(folder: Path) -> dict[str, str]:
    """Each file below `folder`, by its path relative to it, mapped to the SHA-256 of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
