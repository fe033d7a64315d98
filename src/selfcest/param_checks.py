"""Checks shared by every reader of a `params.yaml` section.

Sections are read with defaults, so a misspelt key would run as its default, unnoticed; each reader
refuses keys it does not know, with one message shape that names the section's params path."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def check_keys(section: str, values: Mapping[str, Any] | None, known: Iterable[str]) -> None:
    """Refuse a key under the params section `section` (its path, e.g. `eval.sweep`) that is none of
    its `known` settings. A section that is not a mapping (`sweep: 48`, a list, a bare string) is
    refused by name too: iterating it would fail inside Python, or read a string as its letters."""
    known = set(known)  # once: a generator would be spent by the first use
    if values is None:
        return
    if not isinstance(values, Mapping):
        raise ValueError(f"{section}: expected a mapping of settings, got {values!r}")
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{section}: unknown key(s) {unknown}; its settings are {sorted(known)}")


def is_int_setting(value: Any) -> bool:
    """An integer setting's value: YAML's true/false are Python ints, but they are not counts."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_setting(value: Any, where: str, *, minimum: int) -> int:
    """One integer setting, at least `minimum`; otherwise a ValueError naming the setting `where`."""
    if not is_int_setting(value) or value < minimum:
        raise ValueError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def fraction_setting(value: Any, where: str) -> float:
    """One share setting, a number in [0, 1]; otherwise a ValueError naming the setting `where`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{where}: expected a number in [0, 1], got {value!r}")
    return float(value)
