"""Did the policy learn *when* to delegate? Delegation rate and clones per problem by problem size.

Computed from the evaluation cells' per-problem records (`episodes.jsonl`), so it costs no extra
generation: `prompted` is the starting checkpoint with the tool (before RL), `selfcest` the same
model after GRPO.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_EXPRESSION = re.compile(r"Calculate the value of ([0-9+\-*() ]+)\.")


def problem_size(record: Mapping[str, Any]) -> int | None:
    """Arithmetic: number of terms in the expression; QA: number of hops (when known)."""
    if record.get("dataset") == "arithmetic":
        match = _EXPRESSION.search(str(record.get("question", "")))
        if not match:
            return None
        expr = match.group(1).replace(" ", "")
        return len(re.findall(r"(?<=[0-9)])[+\-*]", expr)) + 1
    hops = record.get("num_hops")
    return int(hops) if hops else None


def delegation_by_size(records: Iterable[Mapping[str, Any]], methods: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (dataset, split, method, budget, size): n, delegation rate, clones, accuracy, tokens."""
    groups: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        if record.get("method") not in methods:
            continue
        size = problem_size(record)
        if size is None:
            continue
        key = (record["dataset"], record["split"], record["method"], int(record["budget"]), size)
        groups[key].append(record)
    rows = []
    for (dataset, split, method, budget, size), items in sorted(groups.items()):
        n = len(items)
        rows.append(
            {
                "dataset": dataset,
                "split": split,
                "method": method,
                "budget": budget,
                "size": size,
                "n": n,
                "delegation_rate": round(sum(float(r.get("clones") or 0) > 0 for r in items) / n, 4),
                "clones": round(sum(float(r.get("clones") or 0) for r in items) / n, 4),
                "accuracy": round(sum(float(r.get("correct") or 0) for r in items) / n, 4),
                "gen_tokens": round(sum(float(r.get("generated_tokens") or 0) for r in items) / n, 2),
            }
        )
    return rows
