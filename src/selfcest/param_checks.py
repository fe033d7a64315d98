"""Checks shared by every reader of a `params.yaml` section.

Sections are read with defaults, so a misspelt key would run as its default, unnoticed; each reader
refuses keys it does not know, with one message shape that names the section's params path."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def check_keys(section: str, values: Mapping[str, Any] | None, known: Iterable[str]) -> None:
    """Refuse a key under the params section `section` (its path, e.g. `eval.sweep`) that is none of
    its `known` settings."""
    unknown = sorted(set(values or {}) - set(known))
    if unknown:
        raise ValueError(f"{section}: unknown key(s) {unknown}; its settings are {sorted(known)}")


def is_int_setting(value: Any) -> bool:
    """An integer setting's value: YAML's true/false are Python ints, but they are not counts."""
    return isinstance(value, int) and not isinstance(value, bool)
