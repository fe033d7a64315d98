"""Two budget sweeps side by side: what changed between two runs, as a table and as static plots.

`dvc metrics diff` compares `reports/metrics.json` (the reference budget and the frontier areas)
and `dvc plots diff` draws every cell of `reports/sweep.csv` for two revisions, but DVC renders its
plots as HTML that loads Vega from a CDN, so offline (this project's machines) a reviewer sees a
blank page. This module is the offline stand-in for the plots: it takes the rows of two sweeps and

- lists every cell (benchmark, method, budget) whose accuracy or token costs differ, or that only
  one run has (`sweep_changes`, `changes_markdown`);
- draws accuracy against each cost with both runs in one figure, a colour per method and a line
  style per run (`plot_revisions`), as PNG files.

It reads no revision itself (the `selfcest compare` command hands it the two files' texts from
git) and knows nothing of DVC. The wall-clock columns (`seconds`, `latency_seconds`) belong to
the machine that ran a cell, so they are never reported as changes.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from selfcest.reports import COSTS, benchmark

KEY_COLUMNS = ("dataset", "split", "method", "budget")
INT_COLUMNS = ("budget", "n")
COMPARED_COLUMNS = (
    "n",
    "accuracy",
    "f1",
    "gen_tokens",
    "total_tokens",
    "critical_tokens",
    "clones",
    "protocol_error_rate",
)
"""What a change is made of: everything a cell measures except its wall-clock columns."""
REQUIRED_COLUMNS = (*KEY_COLUMNS, "n", "accuracy", *COSTS)
TOLERANCE = 5e-7
"""The CSV rounds to 6 decimals: smaller differences are rounding."""

Row = dict[str, Any]
Key = tuple[str, str, int]


def cell_key(row: Row) -> Key:
    """What names a cell of the sweep: (benchmark, method, budget)."""
    return row["benchmark"], row["method"], row["budget"]


def read_sweep_csv(text: str, source: str) -> list[Row]:
    """The rows of a `reports/sweep.csv`, typed (`budget` and `n` int, measures float, blank NaN).

    `source` names the file (and revision) in errors, which also give the line and column."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{source}: missing column(s) {missing}; the header is {header}")
    numeric = [c for c in header if c in COMPARED_COLUMNS or c in INT_COLUMNS]  # the costs are compared
    rows: list[Row] = []
    seen: dict[Key, int] = {}
    for raw in reader:
        line = reader.line_num  # the file's line (DictReader skips blank lines, so no counter)
        if None in raw or any(value is None for value in raw.values()):
            fields = len(header) + len(raw.get(None) or []) - sum(v is None for v in raw.values())
            raise ValueError(f"{source}, line {line}: {fields} fields where the header has {len(header)}")
        row: Row = dict(raw)
        for column in numeric:
            value = (raw.get(column) or "").strip()
            try:
                if column in INT_COLUMNS:
                    row[column] = int(value)
                else:
                    row[column] = float(value) if value else math.nan
            except ValueError:
                raise ValueError(
                    f"{source}, line {line}, column {column!r}: {value!r} is not a number"
                ) from None
        row["benchmark"] = benchmark(row["dataset"], row["split"])
        key = cell_key(row)
        if key in seen:
            raise ValueError(f"{source}, line {line}: cell {key} repeats line {seen[key]}")
        seen[key] = line
        rows.append(row)
    return rows


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= TOLERANCE
    return a == b


def sweep_changes(old: Sequence[Row], new: Sequence[Row]) -> list[dict[str, Any]]:
    """Every cell that differs between two sweeps, in the new sweep's order (then the old's):
    `status` is `changed` (some compared column differs), `added` (only in new) or `removed`."""
    before = {cell_key(r): r for r in old}
    after = {cell_key(r): r for r in new}
    changes: list[dict[str, Any]] = []
    for key in [*after, *(k for k in before if k not in after)]:
        a, b = before.get(key), after.get(key)
        if a is not None and b is not None:
            columns = [c for c in COMPARED_COLUMNS if c in a and c in b and not _same(a[c], b[c])]
            if not columns:
                continue
            status = "changed"
        else:
            columns, status = [], "added" if a is None else "removed"
        changes.append(
            {"benchmark": key[0], "method": key[1], "budget": key[2], "status": status,
             "columns": columns, "old": a, "new": b}
        )  # fmt: skip
    return changes


FORMATS = {
    "n": "{:d}",
    "accuracy": "{:.1%}",
    "f1": "{:.3f}",
    "protocol_error_rate": "{:.1%}",
    "clones": "{:.2f}",
}
"""How `changes_markdown` prints a column (tokens: one decimal)."""


def _cell(row: Row | None, column: str) -> str:
    if row is None or column not in row or (isinstance(row[column], float) and math.isnan(row[column])):
        return "-"
    return FORMATS.get(column, "{:.1f}").format(row[column])


def changes_markdown(changes: Sequence[Mapping[str, Any]], old_label: str, new_label: str) -> str:
    """A Markdown table of `sweep_changes`: each cell's accuracy and costs as `old -> new`."""
    lines = [
        f"# Sweep changes: `{old_label}` -> `{new_label}`",
        "",
        "Cells (benchmark, method, budget) whose accuracy, F1, token costs, clones, protocol-error "
        "rate or n differ by more than the CSV's rounding, or that one run lacks. Wall-clock columns "
        "are the machine's and are not compared.",
        "",
    ]
    if not changes:
        return "\n".join([*lines, "No cell changed.", ""])
    shown = {
        "n": "n",
        "accuracy": "accuracy",
        "f1": "F1",
        "gen_tokens": "gen tok",
        "total_tokens": "total tok",
        "critical_tokens": "crit tok",
        "clones": "clones",
        "protocol_error_rate": "proto err",
    }
    lines += [
        "| benchmark | method | budget | status | " + " | ".join(shown.values()) + " | changed |",
        "|---" * (len(shown) + 5) + "|",
    ]
    for c in changes:
        pairs = []
        for column in shown:
            a, b = _cell(c["old"], column), _cell(c["new"], column)
            if a == b and column in c["columns"]:  # a change below the format's rounding: the CSV's digits
                a, b = (f"{row[column]:.6f}".rstrip("0").rstrip(".") for row in (c["old"], c["new"]))
            pairs.append(a if a == b else f"{a} -> {b}")
        lines.append(
            f"| {c['benchmark']} | `{c['method']}` | {c['budget']} | {c['status']} | "
            + " | ".join(pairs)
            + f" | {', '.join(c['columns']) or '-'} |"
        )
    counts = {s: sum(c["status"] == s for c in changes) for s in ("changed", "added", "removed")}
    lines += ["", ", ".join(f"{n} {s}" for s, n in counts.items()) + ".", ""]
    return "\n".join(lines)


def plot_revisions(runs: Mapping[str, Sequence[Row]], cost: str, path: Path | str) -> None:
    """Accuracy against one cost for every benchmark the runs have (a panel each): a colour per
    method, the same in every panel, and a line style per run (the first dashed with open markers,
    the last solid), points in budget order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    if cost not in COSTS:
        raise ValueError(f"cost must be one of {list(COSTS)}, got {cost!r}")
    labels = list(runs)
    all_rows = [r for rows in runs.values() for r in rows]
    benchmarks = list(dict.fromkeys(r["benchmark"] for r in all_rows))
    methods = list(dict.fromkeys(r["method"] for r in all_rows))
    if not benchmarks:
        raise ValueError("no rows to plot")
    colours = plt.get_cmap("tab10")
    dashed = ["--", ":", "-."]  # cycled: five runs or more reuse them (zip below is strict)
    styles = [dashed[i % len(dashed)] for i in range(len(labels) - 1)] + ["-"]
    columns = min(2, len(benchmarks))
    grid_rows = math.ceil(len(benchmarks) / columns)
    fig, axes = plt.subplots(grid_rows, columns, figsize=(6.0 * columns, 4.2 * grid_rows), squeeze=False)
    for ax, name in zip(axes.flat, benchmarks, strict=False):
        for label, style in zip(labels, styles, strict=True):
            for m, method in enumerate(methods):
                points = sorted(
                    (r for r in runs[label] if r["benchmark"] == name and r["method"] == method),
                    key=lambda r: r["budget"],
                )
                if not points:
                    continue
                last = label == labels[-1]
                ax.plot(
                    [r[cost] for r in points],
                    [r["accuracy"] for r in points],
                    linestyle=style,
                    marker="o",
                    color=colours(m % 10),
                    markerfacecolor=colours(m % 10) if last else "none",
                    linewidth=1.6 if last else 1.1,
                )
        ax.set_title(name)
        ax.set_xlabel(f"mean {COSTS[cost]} per problem")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(benchmarks) :]:
        ax.axis("off")
    handles = [
        Line2D([], [], color=colours(m % 10), marker="o", label=method) for m, method in enumerate(methods)
    ]
    handles += [
        Line2D([], [], color="black", linestyle=style, label=label)
        for label, style in zip(labels, styles, strict=True)
    ]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(f"accuracy vs {COSTS[cost]}: " + " vs ".join(labels))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
