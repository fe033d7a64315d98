"""How the headline numbers spread over several runs of the pipeline (seeds, CPU kinds, commits).

One run of the tiny default profile is one seed: other seeds move single accuracies by tens of
points (docs/results.md, "other seeds"). `dvc exp show` lists each run's `reports/metrics.json`
side by side, one column per number (four splits x nine methods x two numbers, and the claims);
this module reduces the same files to what a reviewer asks of several runs: per split, each
method's accuracy at the reference budget in every run with its mean and range, in how many
runs each claim held, and claim (c)'s per-run sign tests pooled into one exact test. It reads only
`metrics.json` contents (`selfcest.reports.build_metrics`); where they come from (git revisions,
DVC experiments, files) is the caller's business.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from selfcest.stats import sign_test_p

CLAIM_NAMES = {
    "a": "(a) selfcest beats base by the margin",
    "b": "(b) selfcest's frontier at or above the rivals'",
    "c": "(c) selfcest beats prompted",
    "d": "(d) fewer critical-path tokens than base",
}


def read_metrics(text: str, source: str) -> dict[str, Any]:
    """`metrics.json` text, checked for the shape `build_metrics` writes; errors name `source`."""
    try:
        metrics = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{source}: not JSON ({error})") from None
    benchmarks = metrics.get("benchmarks") if isinstance(metrics, dict) else None
    if not isinstance(benchmarks, dict):
        raise ValueError(f"{source}: no 'benchmarks' mapping (not a selfcest metrics.json)")
    for name, entry in benchmarks.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("methods"), dict):
            raise ValueError(f"{source}: benchmark {name!r} has no 'methods' mapping")
        if not isinstance(entry.get("reference_budget"), int):
            raise ValueError(f"{source}: benchmark {name!r} has no integer 'reference_budget'")
        for method, values in entry["methods"].items():
            # `build_metrics` leaves `accuracy` out for a method without problems at the reference
            # budget (the table shows `-`); where it is there, it is a number
            accuracy = values.get("accuracy", 0.0) if isinstance(values, dict) else None
            if isinstance(accuracy, bool) or not isinstance(accuracy, int | float):
                raise ValueError(
                    f"{source}: benchmark {name!r}, method {method!r} is not a mapping with a numeric 'accuracy'"
                )
    claims = metrics.get("claims", {})
    if not isinstance(claims, dict) or not all(
        isinstance(verdicts, dict) and all(type(v) is int and v in (0, 1) for v in verdicts.values())
        for verdicts in claims.values()
    ):  # a verdict of 2 would count as two runs held, "yes" stop int() with no file named
        raise ValueError(f"{source}: 'claims' is not a mapping of benchmark -> {{claim: 0 or 1}}")
    # `paired` is newer than the other keys: a run from before it has none and is left out of the pool.
    paired = metrics.get("paired", {})
    if not isinstance(paired, dict) or not all(isinstance(v, dict) for v in paired.values()):
        raise ValueError(f"{source}: 'paired' is not a mapping of benchmark -> {{claim: counts}}")
    for name, per_claim in paired.items():
        for key, counts in per_claim.items():
            fields = [
                counts.get(f) if isinstance(counts, dict) else None for f in ("budget", "for", "against")
            ]
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in fields):
                raise ValueError(
                    f"{source}: paired[{name!r}][{key!r}] is not {{budget, for, against}} as whole numbers >= 0"
                )
            # (c)'s counts are taken at the benchmark's reference budget, which the accuracies use too
            if name not in benchmarks or fields[0] != benchmarks[name]["reference_budget"]:
                where = "no such benchmark" if name not in benchmarks else "not its reference budget"
                raise ValueError(f"{source}: paired[{name!r}][{key!r}] is at budget {fields[0]}: {where}")
    return metrics


def _table_header(leading: Sequence[str], labels: Sequence[str], trailing: Sequence[str]) -> list[str]:
    """A Markdown table's header and rule: the `leading` columns, one per run label, the `trailing` ones."""
    columns = [*leading, *(f"`{label}`" for label in labels), *trailing]
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def spread_markdown(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: per benchmark, each method's accuracy at the reference budget per run (label ->
    metrics), mean and range over the runs that have it; then each claim's verdict per run.

    Runs must agree on a benchmark's reference budget (else the accuracies are not comparable):
    a mismatch is a ValueError naming the runs and both budgets. A method or benchmark a run lacks
    shows as `-` and is left out of that row's mean."""
    if len(runs) < 2:
        raise ValueError(f"spread needs at least two runs, got {len(runs)}")
    labels = list(runs)
    benchmarks = list(dict.fromkeys(name for m in runs.values() for name in m["benchmarks"]))
    lines = [
        f"# Spread over {len(labels)} runs",
        "",
        "Runs: " + ", ".join(f"`{label}`" for label in labels) + ".",
        "",
    ]
    for name in benchmarks:
        present = {
            label: runs[label]["benchmarks"][name] for label in labels if name in runs[label]["benchmarks"]
        }
        budgets = {label: entry["reference_budget"] for label, entry in present.items()}
        if len(set(budgets.values())) > 1:
            raise ValueError(
                f"benchmark {name}: the runs' reference budgets differ ("
                + ", ".join(f"{label}: {budget}" for label, budget in budgets.items())
                + "), so their accuracies are not comparable"
            )
        budget = next(iter(budgets.values()))
        methods = list(dict.fromkeys(m for entry in present.values() for m in entry["methods"]))
        lines += [
            f"## `{name}` (accuracy at the reference budget {budget}; {len(present)} of {len(labels)} runs)",
            "",
            *_table_header(["method"], labels, ["mean", "min - max"]),
        ]
        for method in methods:
            values = [
                present[label]["methods"].get(method, {}).get("accuracy") if label in present else None
                for label in labels
            ]
            known = [v for v in values if v is not None]
            mean = statistics.fmean(known) if known else None
            span = f"{_pct(min(known))} - {_pct(max(known))}" if known else "-"
            lines.append(
                f"| `{method}` | " + " | ".join(_pct(v) for v in values) + f" | {_pct(mean)} | {span} |"
            )
        lines.append("")
    lines += [
        "## Claims (1 holds, 0 does not, - not checked or not in the run)",
        "",
        "A `with a caveat` row says how a claim held: 1 with a caveat (a gap within noise, ...), 0",
        "without one, - where it did not hold. `reports/summary.md` names each run's caveats.",
        "",
        *_table_header(["claim", "benchmark"], labels, ["held"]),
    ]
    claim_keys = sorted(
        {key for m in runs.values() for verdicts in m.get("claims", {}).values() for key in verdicts}
    )
    for key in claim_keys:
        for name in benchmarks:
            verdicts = [runs[label].get("claims", {}).get(name, {}).get(key) for label in labels]
            checked = [v for v in verdicts if v is not None]
            if not checked:
                continue
            cells = " | ".join("-" if v is None else str(int(v)) for v in verdicts)
            held = f"{sum(map(int, checked))} of {len(checked)}"
            claim = CLAIM_NAMES.get(key, key)
            # `build_metrics` writes `<claim>_weak` 1 where the claim held with a caveat (a gap
            # within noise, ...), 0 where it held without one, nothing where it did not hold.
            if key.endswith("_weak"):
                base = key.removesuffix("_weak")
                claim = f"{CLAIM_NAMES.get(base, base)}: with a caveat (1) where it held"
                held += " held with a caveat"
            lines.append(f"| {claim} | `{name}` | {cells} | {held} |")
    return "\n".join(lines + _pooled_lines(runs, labels, benchmarks)) + "\n"


def _pooled_lines(
    runs: Mapping[str, Mapping[str, Any]], labels: list[str], benchmarks: list[str]
) -> list[str]:
    """Claim (c)'s sign tests pooled over the runs that recorded them (metrics.json `paired`).

    One run's test on 200 problems rests on the few where the two methods differ (18 on seed 42's
    `arithmetic/ood`); several runs' discordant problems, added up, are one exact test of whether RL
    beats the model it starts from as a procedure, not in one draw. Under H0 each discordant problem
    is a fair coin in every run, so the pooled counts are too, provided the runs are independent."""
    table: list[str] = []
    for name in benchmarks:
        paired = {label: runs[label].get("paired", {}).get(name, {}) for label in labels}
        for key in sorted({k for per_claim in paired.values() for k in per_claim}):
            counts = {label: per_claim.get(key) for label, per_claim in paired.items()}
            present = {label: c for label, c in counts.items() if c is not None}
            budgets = {c["budget"] for c in present.values()}
            if len(budgets) > 1:
                raise ValueError(
                    f"benchmark {name}: claim ({key})'s paired counts were taken at different budgets ("
                    + ", ".join(f"{label}: {c['budget']}" for label, c in present.items())
                    + "), so they cannot be pooled"
                )
            wins = sum(c["for"] for c in present.values())
            losses = sum(c["against"] for c in present.values())
            cells = " | ".join("-" if c is None else f"{c['for']} / {c['against']}" for c in counts.values())
            table.append(
                f"| {CLAIM_NAMES.get(key, key)} | `{name}` at {budgets.pop()} | {cells} | "
                f"{wins} / {losses} over {len(present)} run{'s' * (len(present) != 1)} | {sign_test_p(wins, losses):.3g} |"
            )
    if not table:
        return []
    return [
        "",
        "## Claim (c) pooled over the runs (exact sign test)",
        "",
        "Problems only `selfcest` got right / only `prompted` got right at the reference budget, per run,",
        "then added up. Pooling treats the runs as independent draws: runs that share their test",
        "problems and their warm-up (the same seed) are not. `-`: the run has no counts there (the",
        "claim was not checked, or its metrics.json predates them); it is left out of the pool.",
        "",
        *_table_header(["claim", "benchmark"], labels, ["pooled", "p"]),
        *table,
    ]


def short_ref(revision: str | None, revisions: Sequence[str | None]) -> str:
    """A full ref by its last part (`refs/exps/ab/c0ffee.../seed43` -> `seed43`) where no other ref
    given ends the same; DVC keeps experiment names unique per baseline commit only, so two
    baselines' `seed43` become `seed43@abc0ffe` (the baseline's first 7 hex digits)."""
    if not revision or not revision.startswith("refs/"):
        return revision or "workspace"
    name = revision.rsplit("/", 1)[-1]
    same_name = [r for r in revisions if r and r.startswith("refs/") and r.rsplit("/", 1)[-1] == name]
    if len(set(same_name)) < 2:
        return name
    parts = revision.split("/")
    # refs/exps/<2 hex>/<38 hex>/<name>: the baseline commit is the two middle parts
    baseline = "".join(parts[2:4]) if len(parts) == 5 and parts[1] == "exps" else "/".join(parts[1:-1])
    return f"{name}@{baseline[:7]}"


def run_labels(revisions: Sequence[str | None], seeds: Sequence[Sequence[int]]) -> list[str]:
    """`REV (seed N)` labels (`seeds N, M` when a run's params hold several), the working tree as
    `workspace`, a full ref by its last part (with its baseline where two refs share it); the same
    revision given twice is refused."""
    repeated = sorted({r or "workspace" for r in revisions if revisions.count(r) > 1})
    if repeated:
        raise ValueError(f"the same run given twice: {', '.join(repeated)}")
    names = [short_ref(revision, revisions) for revision in revisions]
    # A short name shared by two revisions (a branch `seed43` and an experiment `seed43`): both
    # keep their whole revision, which the check above made distinct.
    names = [
        (revision or "workspace") if names.count(name) > 1 else name
        for name, revision in zip(names, revisions, strict=True)
    ]
    labels = [
        name
        + (f" ({'seed' if len(values) == 1 else 'seeds'} {', '.join(map(str, values))})" if values else "")
        for name, values in zip(names, seeds, strict=True)
    ]
    # Runs are keyed by label: two runs under one label would silently pool as one.
    shared = sorted({label for label in labels if labels.count(label) > 1})
    if shared:
        raise ValueError(f"two runs would share the label {', '.join(shared)}: name them apart")
    return labels
