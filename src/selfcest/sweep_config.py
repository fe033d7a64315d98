"""Per-dataset sweep settings that both the evaluation cells and the report read.

Its own module so that an evaluation cell can check the report's settings before it runs (a
reference budget that is not one of the budgets) without depending on the report's code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def per_dataset(value: Any, dataset: str, default: Any = None) -> Any:
    """A setting given once for every dataset, or as a mapping per dataset (missing: `default`)."""
    if isinstance(value, Mapping):
        return value.get(dataset, default)
    return default if value is None else value


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
    one of the budgets is an error."""
    report = eval_params.get("report") or {}
    budgets = sorted(int(b) for b in per_dataset(eval_params.get("budgets"), dataset, []) or [])
    reference = per_dataset(report.get("reference_budget"), dataset)
    reference = int(reference) if reference is not None else (budgets[len(budgets) // 2] if budgets else 0)
    if budgets and reference not in budgets:
        # No cell runs at it: metrics.json would silently lose every accuracy and claim (c) its budget.
        raise ValueError(
            f"eval.report.reference_budget for {dataset} is {reference}, which is not one of "
            f"eval.budgets.{dataset} {budgets}"
        )
    auc_max = per_dataset(report.get("auc_max_tokens"), dataset)
    auc_max = float(auc_max) if auc_max is not None else float(max(budgets, default=1))
    return Settings(budgets, reference, auc_max)
