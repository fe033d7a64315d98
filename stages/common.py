"""Helpers shared by the stage scripts: reading params.yaml and writing JSON outputs.

Params are read with OmegaConf rather than PyYAML because PyYAML parses `3e-05` as a string.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from selfcest.hashing import file_sha256
from selfcest.param_checks import int_setting

__all__ = [
    "PARAMS_FILE",
    "SUPPORT_FILES",
    "file_sha256",
    "held_out_expressions",
    "load_params",
    "read_jsonl",
    "resolve_source",
    "setup_logging",
    "write_json",
]

PARAMS_FILE = Path("params.yaml")
log = logging.getLogger("stages")
# Every stage runs through these besides its own script: part of a training run's or eval cell's
# code fingerprint (`selfcest.checkpoints.code_sha256`), so an edit here never resumes a killed run.
SUPPORT_FILES = (Path(__file__).resolve(), Path(__file__).resolve().with_name("__init__.py"))


def load_params(path: Path = PARAMS_FILE) -> dict[str, Any]:
    """Return params.yaml as plain Python containers (interpolations resolved).

    Every `seed` in it (the top-level one and any section's own) must be a non-negative integer:
    the engines' per-request seeds (numpy's `SeedSequence`) refuse a negative one, which would
    otherwise stop the pipeline at its first sampled generation, after the warm-up."""
    config = OmegaConf.load(path)
    params = OmegaConf.to_container(config, resolve=True)
    for where, value in _seeds(params):
        int_setting(value, f"{path}: {where}", minimum=0)
    return params  # type: ignore[return-value]


def _seeds(node: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    """(params path, value) of every mapping key named `seed` under `node`."""
    if isinstance(node, dict):
        for key, value in node.items():
            inner = f"{where}.{key}" if where else str(key)
            if key == "seed":
                yield inner, value
            else:
                yield from _seeds(value, inner)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _seeds(value, f"{where}.{index}")


def write_json(path: Path | str, payload: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


QUARANTINE_FILE_STEM = "quarantine"
"""The data stages write every quarantined record to `<out>/quarantine.jsonl`, beside `<split>.jsonl`."""
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def check_split_names(names: Iterable[str], setting: str) -> None:
    """Refuse a split name that cannot be its own `<name>.jsonl` beside the others: `quarantine`
    (its records were overwritten by the quarantine list, the report still counting them kept), or
    one that is not a plain file name (`../x` would write outside the stage's folder)."""
    for name in names:
        if name == QUARANTINE_FILE_STEM or not _SPLIT_NAME.match(str(name)):
            raise ValueError(
                f"{setting}: a split may not be named {name!r}: split names are plain file names "
                f"(letters, digits, '_', '.', '-'), and {QUARANTINE_FILE_STEM!r} holds the quarantine"
            )


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; a line that is not JSON stops with its file and line number."""
    return [record for _, record in iter_jsonl(path)]


def iter_jsonl(path: Path | str) -> Iterator[tuple[int, Any]]:
    """(line number, record) of each non-blank line of a JSON-lines file, read one at a time; a line
    that is not JSON stops with its file and line number."""
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}, line {lineno}: not a JSON record: {exc}") from exc
            yield lineno, record


def held_out_expressions(paths: Iterable[Path | str]) -> list[str]:
    """The `expr` of every record of the held-out arithmetic split files `paths`, in file order: the
    sums the warm-up's clone conversations may not ask and GRPO's clone rows may not hold. A record
    without an `expr` string stops with its file and line (both stages read them; one reader keeps
    their errors alike)."""
    exprs: list[str] = []
    for path in paths:
        for lineno, record in iter_jsonl(path):
            if not isinstance(record, dict) or not isinstance(record.get("expr"), str):
                raise ValueError(f"{path}, line {lineno}: a held-out split's record needs an 'expr' string")
            exprs.append(record["expr"])
    return exprs


def resolve_source(path: str, params_key: str) -> str:
    """A source path as the readers take it: URLs (s3://, memory://, ...) pass through with a
    warning, local paths stay relative to the working directory. `params_key` names the setting
    that holds the path, for the warning's advice."""
    if "://" not in path:
        return str(Path(path))
    # DVC tracks the stage's local deps only: a URL read here is not one of them, so a new version
    # of that object would not rerun the stage. `dvc import-url` into data/sources/ (a dep of the
    # stage) records the object's ETag and `dvc update` brings in a new version (README).
    log.warning(
        "%s: read from a URL that DVC does not track (a change there does not rerun this stage); "
        "for lineage, `dvc import-url` it into data/sources/ and point %s there",
        path,
        params_key,
    )
    return path
