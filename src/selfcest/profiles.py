"""Profiles: overlays on params.yaml (for example `profiles/paper.yaml`), turned into the dotted
`key=value` overrides that `dvc exp run -S` takes (Hydra's override grammar).

Why overrides rather than a second params file: DVC tracks one params.yaml per stage, and an
experiment run with overrides records each changed value, so `dvc params diff` and `dvc exp show`
list exactly what the profile changed against the embedded default.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml


class ProfileError(ValueError):
    """A profile that names a key params.yaml does not have, or a malformed `--set`."""


def leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    """(dotted key, value) for every leaf; a mapping value is descended into, a list is one value."""
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from leaves(value, dotted + ".")
        else:
            yield dotted, value


def _has_key(tree: Any, dotted: str) -> bool:
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _value(value: Any) -> str:
    """A value in Hydra's grammar: JSON scalars and lists, strings always quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_value(v)}" for k, v in value.items()) + "}"
    raise ProfileError(f"cannot write {value!r} ({type(value).__name__}) as an override")


def profile_overrides(
    profile: Mapping[str, Any], params: Mapping[str, Any], extra: Iterable[str] = ()
) -> list[str]:
    """`key=value` overrides for every leaf of `profile`, then `extra` (`key=value` strings, values
    read as YAML, which win). Every key must already exist in `params`: an override of a key that
    does not exist would be a typo that DVC adds silently with `+` or refuses without it."""
    merged: dict[str, Any] = dict(leaves(profile))
    for item in extra:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ProfileError(f"--set expects key=value, got {item!r}")
        key = key.strip()
        for covered in [k for k in merged if k.startswith(key + ".")]:
            del merged[covered]  # a whole mapping set here replaces the profile's values under it
        merged[key] = yaml.safe_load(raw)
    unknown = [key for key in merged if not _has_key(params, key)]
    if unknown:
        raise ProfileError(f"keys that params.yaml does not have: {', '.join(unknown)}")
    return [f"{key}={_value(value)}" for key, value in merged.items()]


def load_profile(path: Path | str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping of params.yaml keys, got {type(data).__name__}")
    return data


def dvc_set_args(overrides: Iterable[str]) -> str:
    """`-S 'key=value' ...`, quoted for a POSIX shell."""
    return " ".join(f"-S {shlex.quote(o)}" for o in overrides)
