"""Helpers shared by the stage scripts: reading params.yaml and writing JSON outputs.

Params are read with OmegaConf rather than PyYAML because PyYAML parses `3e-05` as a string.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

PARAMS_FILE = Path("params.yaml")


def load_params(path: Path = PARAMS_FILE) -> dict[str, Any]:
    """Return params.yaml as plain Python containers (interpolations resolved)."""
    config = OmegaConf.load(path)
    return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]


def write_json(path: Path | str, payload: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def file_sha256(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
