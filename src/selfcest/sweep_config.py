"""Per-dataset sweep settings that both the evaluation cells and the report read.

Its own module so that an evaluation cell can check the report's settings before it runs (a
reference budget that is not one of the budgets) without depending on the report's code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from selfcest.param_checks import check_keys, is_int_setting

DATASETS = ("arithmetic", "qa", "math")
"""The benchmark families a per-dataset setting may name (`stages/evaluate.py --dataset`)."""


def per_dataset(value: Any, dataset: str, default: Any = None, *, setting: str = "setting") -> Any:
    """A setting given once for every dataset, or as a mapping per dataset (missing: `default`).

    A mapping's keys must be datasets: a misspelt `arithmetc: 48` would otherwise leave arithmetic
    at the default (every problem, or no budgets at all) unnoticed. `setting` names it in the error."""
    if isinstance(value, Mapping):
        check_keys(setting, value, DATASETS)
        return value.get(dataset, default)
    return default if value is None else value


SWEEP_KEYS = frozenset(
    {
        "max_problems",
        "seed",
        "bootstrap_resamples",
        "batch_size",
        "threads",
        "workers",
        "device",
        "engine",
        "vllm",
        "avg_temperature",
        "avg_top_p",
    }
)
"""The settings under `eval.sweep` that the evaluation cells read (`stages/evaluate.py`)."""


def check_sweep_keys(sweep: Mapping[str, Any] | None) -> None:
    """Refuse a key under `eval.sweep` that no cell reads: a misspelt `max_problem: 48` ran every
    problem of every split (hours on the paper's models), a misspelt `bootstrap_resample` the
    default 1000, unnoticed."""
    check_keys("eval.sweep", sweep, SWEEP_KEYS)


def check_method_names(models: Mapping[str, Any] | None) -> None:
    """Refuse a method name listed under two checkpoints of `eval.models`: the report keys rows and
    per-problem outcomes by method, so the two cells' results would be merged under one name (and
    `sweep.csv` would repeat a (split, method, budget) row). To point a method at another
    checkpoint, move its entry; to compare two, give them two names."""
    homes: dict[str, list[str]] = {}
    for checkpoint, methods in (models or {}).items():
        for method in methods or {}:
            homes.setdefault(method, []).append(checkpoint)
    twice = {method: where for method, where in homes.items() if len(where) > 1}
    if twice:
        listed = "; ".join(f"{m} under {', '.join(where)}" for m, where in twice.items())
        raise ValueError(f"eval.models: a method name may appear under one checkpoint only: {listed}")


@dataclass
class Settings:
    """What a benchmark's report compares at: its budgets, reference budget and frontier range."""

    budgets: list[int]
    reference_budget: int
    auc_max_tokens: float


def settings_for(eval_params: Mapping[str, Any], dataset: str) -> Settings:
    """`eval.budgets`, `eval.report.reference_budget` and `eval.report.auc_max_tokens` for one
    dataset; each may be one value for all datasets or a mapping per dataset. Defaults: the middle
    budget, and the largest budget as the end of the frontier range. A reference budget that is not
    one of the budgets is an error, and so is a budget that is not a positive whole number or one
    listed twice."""
    report = eval_params.get("report") or {}
    # `None` (unset) is no budgets; any other value goes to _budgets, so a budget of 0 or `false`
    # is refused there by name instead of read as "no budgets".
    listed = per_dataset(eval_params.get("budgets"), dataset, setting="eval.budgets")
    budgets = _budgets([] if listed is None else listed, dataset)
    reference = per_dataset(report.get("reference_budget"), dataset, setting="eval.report.reference_budget")
    if reference is None:
        reference = budgets[len(budgets) // 2] if budgets else 0
    elif not is_int_setting(reference):
        # int() would read 128.9 as 128 and "128" as 128 unnoticed, as _budgets refuses for the budgets
        raise ValueError(
            f"eval.report.reference_budget for {dataset} must be a whole number of generated tokens, "
            f"got {reference!r}"
        )
    if budgets and reference not in budgets:
        # No cell runs at it: metrics.json would silently lose every accuracy and claim (c) its budget.
        raise ValueError(
            f"eval.report.reference_budget for {dataset} is {reference}, which is not one of "
            f"eval.budgets.{dataset} {budgets}"
        )
    auc_max = per_dataset(report.get("auc_max_tokens"), dataset, setting="eval.report.auc_max_tokens")
    if auc_max is None:
        auc_max = max(budgets, default=1)
    elif (
        isinstance(auc_max, bool)
        or not isinstance(auc_max, int | float)
        or not math.isfinite(auc_max)
        or not auc_max > 0
    ):
        # The frontier area divides by it: the report would stop after the whole sweep had run, or
        # (at YAML's `.inf`) write NaN areas into metrics.json.
        raise ValueError(
            f"eval.report.auc_max_tokens for {dataset} must be a positive number of tokens, got {auc_max!r}"
        )
    auc_max = float(auc_max)
    return Settings(budgets, reference, auc_max)


def _budgets(values: Any, dataset: str) -> list[int]:
    """`eval.budgets.<dataset>`, sorted. A budget of 0 or below would run a cell of rows that can
    generate nothing (`int()` would cut 8.5 to 8 and read "64" as 64 unnoticed), and one listed
    twice would run twice and give the report two rows of one (method, budget)."""
    if not isinstance(values, list | tuple):
        values = [values]
    bad = [b for b in values if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if bad:
        raise ValueError(
            f"eval.budgets.{dataset} must be positive whole numbers of generated tokens, got {bad!r} "
            f"in {list(values)!r}"
        )
    twice = sorted({b for b in values if list(values).count(b) > 1})
    if twice:
        raise ValueError(f"eval.budgets.{dataset} lists {twice} more than once: {list(values)!r}")
    return sorted(values)
