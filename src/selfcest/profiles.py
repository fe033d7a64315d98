"""Profiles: overlays on params.yaml (for example `profiles/paper.yaml`), turned into the dotted
`key=value` overrides that `dvc exp run -S` takes (Hydra's override grammar).

Why overrides rather than a second params file: DVC tracks one params.yaml per stage, and an
experiment run with overrides records each changed value, so `dvc params diff` and `dvc exp show`
list exactly what the profile changed against the embedded default.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

# A key that a dotted override can spell; `sc@4` or `+` cannot (Hydra reads `@` as a package and
# refuses `+`/`*` in a key), but both are fine as keys inside a mapping value.
_PLAIN_KEY = re.compile(r"[A-Za-z_][\w-]*\Z")


class ProfileError(ValueError):
    """A profile that names a key params.yaml does not have, or a malformed `--set` or file."""


def leaves(
    tree: Mapping[str, Any], prefix: str = "", params: Mapping[str, Any] | None = None
) -> Iterable[tuple[str, Any]]:
    """(dotted key, value) for every leaf a dotted override can name. A mapping is descended into;
    one with a key that is not a plain name is one value (Hydra merges a mapping value into the
    mapping already there, so the keys it does not name keep their values). A list is one value.
    With `params`, a mapping that replaces a value that is not a mapping there (`max_problems: 48`
    set to `{arithmetic: 10, qa: 20}`, which DVC accepts) is one value too."""
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        under = params.get(key) if isinstance(params, Mapping) else None
        descend = params is None or isinstance(under, Mapping)
        if descend and isinstance(value, Mapping) and value and all(_PLAIN_KEY.match(str(k)) for k in value):
            yield from leaves(value, dotted + ".", under if params is not None else None)
        else:
            yield dotted, value


def _has_key(tree: Any, dotted: str) -> bool:
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _under_open_mapping(tree: Any, dotted: str) -> bool:
    """Whether `dotted` is new under a mapping that params.yaml leaves empty (`{}`) for the user to
    fill: keyword arguments such as `eval.sweep.vllm` or `grpo.gate_options`. DVC adds such a key
    with `+key=value` (it refuses a mapping set over `{}` and a new key without `+`)."""
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            return False
        if part not in node:
            return not node
        node = node[part]
    return False


def _value(value: Any) -> str:
    """A value in Hydra's grammar: JSON scalars and lists, strings always quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_value(v)}" for k, v in value.items()) + "}"
    raise ProfileError(f"cannot write {value!r} ({type(value).__name__}) as an override")


def _quote(text: str) -> str:
    """A single-quoted string in Hydra's grammar, which reads a backslash as an escape only in a run
    of backslashes before a quote or the string's end: those runs are doubled and quotes escaped.
    `${...}` is left as it is: an interpolation, as in params.yaml (`seed: ${seed}`)."""
    escaped = re.sub(r"\\+(?='|\Z)", lambda run: run.group(0) * 2, text)
    return "'" + escaped.replace("'", "\\'") + "'"


@functools.cache
def _override_parser() -> OverridesParser:
    """Hydra's override parser, built on first use (not at import: `selfcest spread` imports this
    module for `read_yaml` alone)."""
    return OverridesParser.create()


def parse_set(item: str) -> tuple[str, Any]:
    """`key=value` as `dvc exp run -S` reads it: the value in Hydra's override grammar (`3e-05` a
    float, `off` and `010` strings, `[a, b]` a list, `{k: v}` a mapping; quote other strings)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ProfileError(f"--set expects key=value, got {item!r}")
    if key.startswith("+") and not key.startswith("++"):
        # As `dvc exp run -S +key=value` spells a new key. Stripped: profile_overrides checks the key
        # and adds the `+` itself where DVC needs it (under a mapping params.yaml leaves empty).
        key = key[1:]
    if key.startswith(("+", "~")):
        raise ProfileError(f"--set {item!r}: only key=value or +key=value (Hydra's ++ and ~ are not taken)")
    try:
        override = _override_parser().parse_override(f"{key}={raw}")
    except HydraException as exc:
        raise ProfileError(
            f"--set {item!r}: not a value of `dvc exp run -S` (Hydra's override grammar; quote a string "
            f"with spaces or special characters: {key}='...'): {exc}"
        ) from exc
    if override.is_sweep_override():
        raise ProfileError(f"--set {item!r}: a sweep (several values) is not one override")
    if any(part.isdigit() for part in key.split(".")):
        # `-S eval.budgets.qa.0=32` sets a list's item in DVC; merged here it would become the
        # mapping {0: 32}, which DVC refuses
        raise ProfileError(
            f"--set {item!r}: give the whole list (e.g. eval.budgets.qa=[32,128,256]), not one item"
        )
    return key, override.value()


def _merge(
    base: Mapping[str, Any],
    update: Mapping[str, Any],
    replaced: dict[str, Any] | None = None,
    prefix: str = "",
) -> dict[str, Any]:
    """`update` merged into `base` as DVC applies an override: mappings key by key, any other value
    replacing (a scalar set over a mapping replaces everything under its key). A mapping set over a
    value of `base` that is no mapping (a profile's `max_problems: null`) is recorded in `replaced`
    (dotted key -> that value): DVC applies that value first and the mapping over it, so that
    params.yaml's own entries under the key do not come back."""
    merged = dict(base)
    for key, value in update.items():
        both = isinstance(merged.get(key), Mapping) and isinstance(value, Mapping)
        if both:
            merged[key] = _merge(merged[key], value, replaced, f"{prefix}{key}.")
            continue
        if replaced is not None and isinstance(value, Mapping) and key in merged:
            replaced.setdefault(f"{prefix}{key}", merged[key])
        merged[key] = value
    return merged


def _unknown_nested(value: Any, known: Any, dotted: str) -> list[str]:
    """The dotted keys inside the mapping `value` that the params mapping `known` lacks (none where
    `known` is no mapping, which the value replaces, or an empty one, left open for the user)."""
    if not isinstance(value, Mapping) or not isinstance(known, Mapping) or not known:
        return []
    found: list[str] = []
    for key, item in value.items():
        if key not in known:
            found.append(f"{dotted}.{key}")
        else:
            found += _unknown_nested(item, known[key], f"{dotted}.{key}")
    return found


def _get(tree: Mapping[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    """`a.b=v` as the tree `{a: {b: v}}`."""
    for part in reversed(dotted.split(".")):
        value = {part: value}
    return value


def profile_overrides(
    profile: Mapping[str, Any],
    params: Mapping[str, Any],
    extra: Iterable[str] = (),
    params_name: str = "params.yaml",
) -> list[str]:
    """`key=value` overrides for every leaf of `profile`, then `extra` (`key=value` strings, read by
    `parse_set`), which win. A mapping in `extra` is merged leaf by leaf, as DVC merges it, so the
    profile's other values under its key stay; any other value replaces everything under its key.
    Every key must already exist in `params`: an override of a key that does not exist would be a
    typo that DVC adds silently with `+` or refuses without it. The exception: a key under a
    mapping that params.yaml leaves empty (`eval.sweep.vllm: {}`), which becomes `+key=value`.
    A mapping in `extra` over a profile value that is no mapping comes, as one value, after that
    value's own override (`max_problems=null`, then `max_problems={qa:10}`), as DVC would apply the
    two in turn: params.yaml's other entries under the key do not come back.
    `params_name` names the params file in errors."""
    tree: dict[str, Any] = dict(profile)
    replaced: dict[str, Any] = {}
    for item in extra:
        tree = _merge(tree, _nested(*parse_set(item)), replaced)
    merged = dict(leaves(tree, params=params))
    # A reset is needed only where it is a valid override: not under a key that goes as one value,
    # its own or another reset's (that value carries the whole mapping), and not for a key
    # params.yaml lacks (nothing to reset there; DVC would refuse it, or need a `+`).
    replaced = {
        k: v
        for k, v in replaced.items()
        if not any(k.startswith(f"{m}.") for m in (*merged, *replaced)) and _has_key(params, k)
    }
    for key in replaced:  # the mapping as one value after its reset: DVC refuses new keys under null
        merged = {k: v for k, v in merged.items() if not k.startswith(f"{key}.")}
        merged[key] = _get(tree, key)
    missing = [key for key in merged if not _has_key(params, key)]
    added = {key for key in missing if _under_open_mapping(params, key)}
    unknown = [key for key in missing if key not in added]
    # A mapping that goes as one value (a key Hydra cannot spell in a dotted override, `sc@4`) is
    # merged into params.yaml's mapping there: a key inside it that params.yaml lacks is a typo, or
    # a new key that DVC refuses inside a mapping (`Could not override`), so it is named here.
    unknown += [
        nested
        for key, value in merged.items()
        if key not in missing and key not in replaced
        for nested in _unknown_nested(value, _get(params, key), key)
    ]
    if unknown:
        raise ProfileError(f"keys that {params_name} does not have: {', '.join(unknown)}")
    first = [f"{key}={_value(value)}" for key, value in replaced.items()]
    return first + [f"{'+' if key in added else ''}{key}={_value(value)}" for key, value in merged.items()]


def read_yaml(text: str, source: Path | str) -> Any:
    """`text` read as DVC reads params.yaml: YAML 1.2, so `3e-05` is a number and `no` a string
    (PyYAML's YAML 1.1 reads them the other way round). Invalid YAML is a ProfileError naming `source`."""
    try:
        return YAML(typ="safe", pure=True).load(text)
    except YAMLError as exc:
        raise ProfileError(f"{source}: not valid YAML: {exc}") from exc


def load_profile(path: Path | str) -> dict[str, Any]:
    """A profile (or params) file, read by `read_yaml`: a mapping of params.yaml keys."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:  # a ValueError: else a traceback instead of the file's name
        raise ProfileError(f"{path}: not UTF-8 text: {exc}") from exc
    data = read_yaml(text, path)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping of params.yaml keys, got {type(data).__name__}")
    return data


def dvc_set_args(overrides: Iterable[str]) -> str:
    """`-S 'key=value' ...`, quoted for a POSIX shell."""
    return " ".join(f"-S {shlex.quote(o)}" for o in overrides)
