"""Reports from the budget-sweep cells: CSV, compact metrics, Pareto plots, a computed summary, traces.

Everything here is computed from the cells' outputs (`rows.json`, `episodes.jsonl.gz`); nothing is
written by hand. The module imports neither torch nor the runtime, so the report stage starts fast.

Frontier definitions (cost x = mean tokens per problem, accuracy y in [0, 1]):

- A method's *frontier* F(x) is the best accuracy it reaches among its points (one per budget)
  that cost at most x tokens, and 0 when none is that cheap: a non-decreasing step function
  (the monotone Pareto frontier of its points).
- Its *frontier area* (AUC) over [0, X] is (1 / X) * integral_0^X F(x) dx, in [0, 1]: 1 means
  perfect accuracy at zero cost, and every token a method needs before it gets anything right
  counts against it. X is fixed per report (`eval.report.auc_max_tokens`, by default the largest
  budget), so areas are comparable across methods; with tree-wide budgets no method's point
  costs more generated tokens than the largest budget, so nothing lies beyond X.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfcest.stats import paired_gap, sign_test, wilson_interval
from selfcest.sweep_config import Settings, check_method_names, per_dataset, settings_for  # noqa: F401 (re-exported)

HOLDS = "HOLDS"
FAILS = "DOES NOT HOLD"
NOT_CHECKED = "NOT CHECKED"
EPS = 1e-9
"""Accuracies are means over the same problems; differences below this are ties."""

COLUMNS = [
    "dataset",
    "split",
    "benchmark",
    "method",
    "checkpoint",
    "budget",
    "n",
    "accuracy",
    "ci_low",
    "ci_high",
    "wilson_low",
    "wilson_high",
    "f1",
    "f1_ci_low",
    "f1_ci_high",
    "gen_tokens",
    "total_tokens",
    "critical_tokens",
    "seconds",
    "latency_seconds",
    "clones",
    "protocol_error_rate",
]
COSTS = {
    "gen_tokens": "generated tokens",
    "total_tokens": "total tokens (with prompts)",
    "critical_tokens": "critical-path tokens",
}


def benchmark(dataset: str, split: str) -> str:
    return f"{dataset}/{split}"


# --------------------------------------------------------------------------- loading cells
@dataclass
class Sweep:
    """Every cell's rows, plus what was expected and is missing."""

    rows: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    """rows.json payloads (status `ok` or `missing`), without their rows."""
    cell_dirs: dict[tuple[str, str, str], Path] = field(default_factory=dict)
    """(dataset, split, checkpoint) -> directory holding that cell's episodes.jsonl.gz."""

    def benchmarks(self) -> list[str]:
        return list(dict.fromkeys(r["benchmark"] for r in self.rows))

    def for_benchmark(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["benchmark"] == name]


def configured_cells(eval_params: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    """(dataset, split, checkpoint) of every cell the params ask for. A method listed under two
    checkpoints is refused (`sweep_config.check_method_names`)."""
    check_method_names(eval_params.get("models"))
    checkpoints = list(eval_params.get("models") or {})
    splits = eval_params.get("splits") or {}
    return {
        (dataset, split, c) for dataset, names in splits.items() for split in names or [] for c in checkpoints
    }


def load_sweep(root: Path | str, allowed: set[tuple[str, str, str]] | None = None) -> Sweep:
    """Read every `<dataset>/<split>/<checkpoint>/rows.json` under `root` (absent root: empty sweep).

    With `allowed`, cells outside it are ignored: DVC leaves the outputs of cells that left the
    matrix on disk, and a report must not mix those stale results in.
    """
    root = Path(root)
    rows: list[dict[str, Any]] = []
    cells: list[dict[str, Any]] = []
    dirs: dict[tuple[str, str, str], Path] = {}
    for path in sorted(root.glob("*/*/*/rows.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        if (
            allowed is not None
            and (payload["dataset"], payload["split"], payload["checkpoint"]) not in allowed
        ):
            continue
        cell_rows = payload.pop("rows", [])
        cells.append(payload)
        dirs[(payload["dataset"], payload["split"], payload["checkpoint"])] = path.parent
        for row in cell_rows:
            rows.append({**row, "benchmark": benchmark(row["dataset"], row["split"]), **_wilson(row)})
    return Sweep(rows, cells, dirs)


def _accuracy_interval(row: Mapping[str, Any]) -> tuple[float, float]:
    """A row's Wilson interval (computed when the row did not come through `load_sweep`)."""
    if "wilson_low" not in row:
        row = {**row, **_wilson(row)}
    return row["wilson_low"], row["wilson_high"]


def _wilson(row: Mapping[str, Any]) -> dict[str, float]:
    """The accuracy's Wilson 95% interval (`wilson_low`, `wilson_high`), from its n and mean.

    The cells' `ci_low`/`ci_high` are the percentile bootstrap the sweep asks for; at 0/n and n/n it
    has zero width, so the summary shows this interval for accuracy and the CSV carries both."""
    low, high = wilson_interval(float(row["accuracy"]) * int(row["n"]), int(row["n"]))
    return {"wilson_low": low, "wilson_high": high}


def checkpoint_weights(sweep: Sweep) -> dict[str, dict[str, Any]]:
    """Per evaluated checkpoint: the sha256 of its weights as its cells recorded it (None when no
    cell recorded one; `mixed` lists every hash when its cells saw different weights, which means
    the sweep mixes results of two trainings) and the methods its cells ran."""
    found: dict[str, dict[str, Any]] = {}
    for cell in sweep.cells:
        if cell.get("status") != "ok":
            continue
        entry = found.setdefault(cell["checkpoint"], {"hashes": [], "methods": []})
        if cell.get("weights_sha256") and cell["weights_sha256"] not in entry["hashes"]:
            entry["hashes"].append(cell["weights_sha256"])
        entry["methods"] += [m for m in cell.get("methods", []) if m not in entry["methods"]]
    return {
        checkpoint: {
            "weights_sha256": entry["hashes"][0] if len(entry["hashes"]) == 1 else None,
            "mixed": entry["hashes"] if len(entry["hashes"]) > 1 else [],
            "methods": entry["methods"],
        }
        for checkpoint, entry in found.items()
    }


def same_weight_groups(weights: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """Checkpoints that hold byte-identical weights, in groups of two or more: their methods are one
    model measured twice, so any difference between them is the evaluation's own sampling."""
    groups: dict[str, list[str]] = {}
    for checkpoint, entry in weights.items():
        if entry["weights_sha256"]:
            groups.setdefault(entry["weights_sha256"], []).append(checkpoint)
    return [sorted(group) for group in groups.values() if len(group) > 1]


Outcomes = Mapping[tuple[str, int], Mapping[str, float]]
"""(method, budget) -> problem id -> correctness, one benchmark's per-problem results."""


def load_outcomes(sweep: Sweep, name: str) -> dict[tuple[str, int], dict[str, float]]:
    """Per-problem correctness of every (method, budget) of benchmark `name`, from the cells' episode
    files (the rows hold only means; paired comparisons need the problems)."""
    outcomes: dict[tuple[str, int], dict[str, float]] = {}
    for (dataset, split, _), directory in sweep.cell_dirs.items():
        if benchmark(dataset, split) != name:
            continue
        for record in episode_records(directory / "episodes.jsonl.gz"):
            key = (record["method"], int(record["budget"]))
            outcomes.setdefault(key, {})[str(record["problem_id"])] = float(record["correct"])
    return outcomes


@dataclass
class PairedEvidence:
    """How two methods' per-problem outcomes compare: the paired bootstrap interval of the gap and
    the exact sign test over the problems where they differ."""

    low: float
    high: float
    wins: int
    losses: int
    p_value: float
    n: int

    @property
    def text(self) -> str:
        return (
            f" (paired bootstrap 95% interval of the gap [{100 * self.low:+.1f}, {100 * self.high:+.1f}] pts; "
            f"sign test over the {self.wins + self.losses} problems where they differ: {self.wins} for, "
            f"{self.losses} against, p = {self.p_value:.3g}; {self.n} problems)"
        )

    @property
    def significant(self) -> bool:
        return self.p_value < SIGNIFICANCE


SIGNIFICANCE = 0.05
"""A gap counts as distinguishable from noise when the exact sign test's p is below this."""


def _paired_evidence(
    outcomes: Outcomes | None, ours: tuple[str, int], theirs: tuple[str, int], resamples: int = 1000
) -> PairedEvidence | None:
    """The evidence of `ours` against `theirs` ((method, budget) pairs), or None without outcomes for
    both or without a problem in common."""
    if not outcomes or ours not in outcomes or theirs not in outcomes:
        return None
    _, low, high, n = paired_gap(outcomes[ours], outcomes[theirs], resamples=resamples, seed=0)
    if n == 0:
        return None
    wins, losses, p_value = sign_test(outcomes[ours], outcomes[theirs])
    return PairedEvidence(low, high, wins, losses, p_value, n)


def method_applies(values: Mapping[str, Any] | None, dataset: str) -> bool:
    """The rule of `selfcest.evaluation.MethodSpec.applies_to`, without importing the runtime."""
    values = values or {}
    datasets = values.get("datasets")
    if datasets is None and values.get("mode") == "rag":
        datasets = ["qa"]
    return datasets is None or dataset in datasets


def expected_methods(eval_params: Mapping[str, Any], dataset: str) -> list[str]:
    """Methods a benchmark of `dataset` should have: every configured one that applies, plus the claims' roles."""
    names = [
        name
        for methods in (eval_params.get("models") or {}).values()
        for name, values in (methods or {}).items()
        if method_applies(values, dataset)
    ]
    roles = (eval_params.get("report") or {}).get("claim_methods") or {}
    for key in ("selfcest", "base", "prompted"):
        if roles.get(key):
            names.append(roles[key])
    names += list(roles.get("rivals") or [])
    return list(dict.fromkeys(names))


def expected_benchmarks(eval_params: Mapping[str, Any]) -> list[str]:
    splits = eval_params.get("splits") or {}
    return [benchmark(dataset, split) for dataset, names in splits.items() for split in names or []]


def missing_methods(sweep: Sweep, eval_params: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Per expected benchmark, each expected method without rows and why: its checkpoint directory
    was missing, its cell has not run, or no checkpoint in eval.models lists it."""
    home = {m: c for c, methods in (eval_params.get("models") or {}).items() for m in (methods or {})}
    status = {(c["dataset"], c["split"], c["checkpoint"]): c.get("status") for c in sweep.cells}
    out: dict[str, dict[str, str]] = {}
    for name in expected_benchmarks(eval_params):
        dataset, split = name.split("/", 1)
        have = {r["method"] for r in sweep.for_benchmark(name)}
        for method in expected_methods(eval_params, dataset):
            if method in have:
                continue
            checkpoint = home.get(method)
            if checkpoint is None:
                reason = "not configured in eval.models"
            elif status.get((dataset, split, checkpoint)) == "missing":
                reason = f"checkpoint `{checkpoint}` not found"
            else:
                reason = f"no cell for `{checkpoint}`"
            out.setdefault(name, {})[method] = reason
    return out


# --------------------------------------------------------------------------- frontiers
Point = tuple[float, float]


def _clean(points: Iterable[Point]) -> list[Point]:
    return sorted(
        (float(x), float(y)) for x, y in points if not (math.isnan(float(x)) or math.isnan(float(y)))
    )


def frontier(points: Iterable[Point]) -> list[Point]:
    """The monotone Pareto frontier: by increasing cost, each point more accurate than every cheaper one."""
    out: list[Point] = []
    best = -math.inf
    for x, y in sorted(_clean(points), key=lambda p: (p[0], -p[1])):
        if y > best + EPS:
            out.append((x, y))
            best = y
    return out


def frontier_value(points: Iterable[Point], x: float) -> float:
    """F(x): the best accuracy among points costing at most `x`; 0.0 when none is that cheap."""
    return max((y for px, y in _clean(points) if px <= x + EPS), default=0.0)


def frontier_auc(points: Iterable[Point], x_max: float) -> float:
    """(1 / x_max) * integral of F over [0, x_max]: the normalised area under the frontier step function."""
    if x_max <= 0:
        raise ValueError("x_max must be positive")
    area = 0.0
    steps = [(x, y) for x, y in frontier(points) if x < x_max]
    for i, (x, y) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else x_max
        area += (end - max(x, 0.0)) * y
    return area / x_max


def method_points(rows: Iterable[Mapping[str, Any]], method: str, cost: str = "gen_tokens") -> list[Point]:
    """A method's (cost, accuracy) points; a row without numbers (an empty cell's NaN) has none."""
    points = [(float(r[cost]), float(r["accuracy"])) for r in rows if r["method"] == method]
    return [(x, y) for x, y in points if not (math.isnan(x) or math.isnan(y))]


def method_area(
    rows: Iterable[Mapping[str, Any]], method: str, x_max: float, cost: str = "gen_tokens"
) -> float | None:
    """`frontier_auc` of a method's points; None when it has none (no row, or only empty cells):
    an area of 0 would read as a method that is never right, and `dvc metrics diff` as a drop."""
    points = method_points(rows, method, cost)
    return frontier_auc(points, x_max) if points else None


def combined_frontier(
    rows: Sequence[Mapping[str, Any]], cost: str = "gen_tokens", resolution: float = 0.0
) -> list[dict[str, Any]]:
    """Which method is on the all-methods frontier where, and by how much it leads the best other method.

    Returns one segment per frontier point, by increasing cost: `method`, `budget`, `accuracy`,
    `from`/`to` (the cost range it owns; `to` is None for the last), `runner_up` and `margin`
    (accuracy minus the best other method's frontier value at the segment's start; with `resolution`,
    a point up to that much dearer, short of the next segment, counts as at that cost). Rows without a
    number for the cost or the accuracy (an empty cell's NaN) are left out: a NaN sort key would
    leave the others unsorted.
    """
    rows = [r for r in rows if not any(math.isnan(float(r[key])) for key in (cost, "accuracy"))]
    ordered = sorted(rows, key=lambda r: (r[cost], -r["accuracy"], r["method"], r["budget"]))
    points: list[Mapping[str, Any]] = []
    best = -math.inf
    for r in ordered:
        if r["accuracy"] > best + EPS:
            points.append(r)
            best = r["accuracy"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    segments = []
    for i, r in enumerate(points):
        reach = r[cost] + resolution
        if i + 1 < len(points):  # a point at the next segment's start is not at this one's cost
            reach = min(reach, points[i + 1][cost] - 2 * EPS)
        others = {m: frontier_value(method_points(rows, m, cost), reach) for m in methods if m != r["method"]}
        runner_up = max(others, key=lambda m: others[m]) if others else None
        segments.append(
            {
                "method": r["method"],
                "budget": r["budget"],
                "accuracy": r["accuracy"],
                "from": r[cost],
                "to": points[i + 1][cost] if i + 1 < len(points) else None,
                "runner_up": runner_up,
                "margin": r["accuracy"] - (others[runner_up] if runner_up else 0.0),
            }
        )
    return segments


# --------------------------------------------------------------------------- claims
WITHIN_NOISE = "gap within noise"
"""Caveat of a claim that holds on an accuracy gap the exact sign test does not tell from noise
(p >= SIGNIFICANCE over the problems where the two methods differ)."""
BELOW_MARGIN = "margin within noise"
"""Caveat of (a) when the gap is significant but its paired 95% interval reaches below the margin."""
AT_FLOOR = "at the floor"
"""Caveat of (d), holding or not, when base's accuracy level is set by fewer right answers than
`min_correct`."""
TIES_ONLY = "ties only"
"""Caveat of (b) when selfcest is at, never above, the best rival at every budget."""
EQUAL_ACCURACY = "equal accuracy"
"""Caveat of (c) when it holds by tokens alone (the same accuracy as prompted, fewer tokens)."""


@dataclass
class Claim:
    key: str
    statement: str
    status: str
    detail: str
    caveat: str = ""
    """Why a claim that holds as stated is weak evidence (WITHIN_NOISE, BELOW_MARGIN, TIES_ONLY,
    EQUAL_ACCURACY, AT_FLOOR), or for AT_FLOOR why a failed (d) is,
    so that the summary's verdict says it next to HOLDS instead of leaving it to the reader."""
    evidence: PairedEvidence | None = None
    """(a), (c): the paired comparison the detail quotes, where per-problem outcomes were at hand."""
    evidence_budget: int | None = None
    """The budget `evidence` compares the two methods at."""

    @property
    def verdict(self) -> str:
        return f"{self.status} ({self.caveat})" if self.caveat else self.status

    @property
    def holds(self) -> bool | None:
        return None if self.status == NOT_CHECKED else self.status == HOLDS


def _by_budget(rows: Iterable[Mapping[str, Any]], method: str) -> dict[int, Mapping[str, Any]]:
    return {int(r["budget"]): r for r in rows if r["method"] == method}


def _rows_missing(budgets: Iterable[int], by_method: Mapping[str, Mapping[int, Any]]) -> list[str]:
    """`<method> at <budget>` for each budget of `budgets` a method has no row at."""
    return [f"{m} at {b}" for b in budgets for m, rows in by_method.items() if b not in rows]


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}%"


def _accuracy_with_tokens(row: Mapping[str, Any]) -> str:
    """A row's accuracy and mean generated tokens, as claim (c) prints them: `26.5% with 137.2`."""
    return f"{_pct(row['accuracy'])} with {row['gen_tokens']:.1f}"


def claim_beats_base(
    rows: Sequence[Mapping[str, Any]],
    selfcest: str,
    base: str,
    min_gain: float,
    outcomes: Outcomes | None = None,
    resamples: int = 1000,
    budgets: Sequence[int] = (),
) -> Claim:
    """(a) At some budget of the sweep, with the same tree-wide budget for both, selfcest's accuracy
    minus base's is at least `min_gain` (0.15 = 15 points). Compared on point estimates; every
    budget's gap is reported, and with per-problem `outcomes` the largest gap's paired evidence: a
    sign test that cannot tell the gap from 0 gives WITHIN_NOISE, a paired interval reaching below
    `min_gain` BELOW_MARGIN. The budget is the one with the largest gap, chosen after the fact; the
    detail lists every budget's gap so that the choice is visible. A gap short of the margin at every
    compared budget is DOES NOT HOLD only when both methods have a row at every budget in `budgets`
    (the sweep's); otherwise the claim is not settled (NOT CHECKED), as it asks for some budget."""
    statement = f"{selfcest} beats {base} by >= {100 * min_gain:.0f} accuracy points at a matched budget"
    ours, theirs = _by_budget(rows, selfcest), _by_budget(rows, base)
    untested = _rows_missing(budgets, {selfcest: ours, base: theirs})
    budgets = sorted(set(ours) & set(theirs))
    if not budgets:
        if ours and theirs:
            reason = f"no budget in common ({selfcest}: {sorted(ours)}, {base}: {sorted(theirs)})"
        else:
            reason = f"missing: {selfcest if not ours else base}"
        return Claim("a", statement, NOT_CHECKED, reason)
    gaps = {b: ours[b]["accuracy"] - theirs[b]["accuracy"] for b in budgets}
    best = max(budgets, key=lambda b: gaps[b])
    status = HOLDS if gaps[best] >= min_gain - EPS else FAILS
    detail = "; ".join(
        f"budget {b}: {_pct(ours[b]['accuracy'])} vs {_pct(theirs[b]['accuracy'])} ({100 * gaps[b]:+.1f} pts)"
        for b in budgets
    )
    if status == FAILS and untested:
        status, detail = NOT_CHECKED, f"{detail}; not settled without {', '.join(untested)}"
    evidence = _paired_evidence(outcomes, (selfcest, best), (base, best), resamples)
    caveat = ""
    if status == HOLDS and evidence is not None:
        if not evidence.significant:
            caveat = WITHIN_NOISE
        elif evidence.low < min_gain - EPS:
            caveat = BELOW_MARGIN
    # A matched budget caps both methods alike; what each spends under it can differ a lot (the
    # paper's +15 points came at 0.84x base's tokens), so the detail gives the two spends.
    spend = (
        f"; there {selfcest} generates {ours[best]['gen_tokens']:.1f} tokens per problem, "
        f"{base} {theirs[best]['gen_tokens']:.1f}"
    )
    if theirs[best]["gen_tokens"] > EPS:
        spend += f" ({ours[best]['gen_tokens'] / theirs[best]['gen_tokens']:.2f}x)"
    return Claim(
        "a",
        statement,
        status,
        f"largest gap {100 * gaps[best]:+.1f} pts at budget {best}{evidence.text if evidence else ''}"
        f"{spend}. {detail}",
        caveat,
        evidence,
        best,
    )


def claim_frontier(
    rows: Sequence[Mapping[str, Any]], selfcest: str, rivals: Sequence[str], budgets: Sequence[int]
) -> Claim:
    """(b) At every tested budget b, selfcest's frontier value F_selfcest(b) (best accuracy using at
    most b generated tokens) is at least every rival's F_rival(b). A present rival above selfcest
    anywhere makes it fail; otherwise a missing rival (or missing selfcest), or a method without a
    row at a tested budget, leaves it not checked: a frontier without that budget's point may be
    lower than the method's own. A budget where selfcest itself has no row is not compared."""
    statement = f"{selfcest}'s frontier is at or above those of {', '.join(rivals)} at every budget tested"
    if not rivals:
        return Claim("b", statement, NOT_CHECKED, "no rivals configured (eval.report.claim_methods.rivals)")
    ours = method_points(rows, selfcest)
    present = [m for m in rivals if method_points(rows, m)]
    absent = [m for m in rivals if m not in present]
    if not ours or not present:
        return Claim("b", statement, NOT_CHECKED, f"missing: {', '.join([selfcest] if not ours else absent)}")
    tested = {m: set(_by_budget(rows, m)) for m in [selfcest, *present]}
    holes = [f"{m} at {b}" for b in budgets for m in [selfcest, *present] if b not in tested[m]]
    failures, lines, above_somewhere = [], [], False
    for b in budgets:
        if b not in tested[selfcest]:
            continue
        mine = frontier_value(ours, b)
        theirs = {m: frontier_value(method_points(rows, m), b) for m in present}
        best = max(theirs, key=lambda m: theirs[m])
        above_somewhere |= mine > theirs[best] + EPS
        lines.append(f"budget {b}: {_pct(mine)} vs best rival {best} {_pct(theirs[best])}")
        failures += [
            f"{m} at {b} ({_pct(theirs[m])} > {_pct(mine)})" for m in present if theirs[m] > mine + EPS
        ]
    detail = ("; ".join(lines)) + (f". Below: {', '.join(failures)}" if failures else "")
    if absent:
        detail += f". Not compared (missing): {', '.join(absent)}"
    if holes:
        detail += f". No row (missing): {', '.join(holes)}"
    # A missing rival or row could still be above.
    status = FAILS if failures else (NOT_CHECKED if absent or holes else HOLDS)
    return Claim("b", statement, status, detail, TIES_ONLY if status == HOLDS and not above_somewhere else "")


def claim_beats_prompted(
    rows: Sequence[Mapping[str, Any]],
    selfcest: str,
    prompted: str,
    reference_budget: int,
    outcomes: Outcomes | None = None,
    resamples: int = 1000,
    min_token_saving: float = 1.0,
) -> Claim:
    """(c) At the reference budget, selfcest has higher accuracy than prompted (the same checkpoint
    before RL with the same tool), or equal accuracy with at least `min_token_saving` fewer mean
    generated tokens per problem (a smaller mean saving is most problems spending the same). The
    detail also lists the two at every other budget both have, without judging them. Not checked
    when neither is ever right there: fewer tokens for no correct answer is no win (measured: a
    seed whose warm-up never learned QA delegation had both at 0%, selfcest with fewer tokens)."""
    statement = f"{selfcest} beats {prompted} (higher accuracy, or equal accuracy for fewer tokens)"
    ours, theirs = _by_budget(rows, selfcest), _by_budget(rows, prompted)
    if reference_budget not in ours or reference_budget not in theirs:
        lacking = [m for m, d in ((selfcest, ours), (prompted, theirs)) if reference_budget not in d]
        return Claim(
            "c",
            statement,
            NOT_CHECKED,
            f"no row at the reference budget {reference_budget} for {', '.join(lacking)}",
        )
    a, b = ours[reference_budget], theirs[reference_budget]
    if a["accuracy"] <= EPS and b["accuracy"] <= EPS:
        return Claim(
            "c",
            statement,
            NOT_CHECKED,
            f"neither {selfcest} nor {prompted} is ever right at budget {reference_budget}",
        )
    better = a["accuracy"] > b["accuracy"] + EPS
    tie = abs(a["accuracy"] - b["accuracy"]) <= EPS
    saving = b["gen_tokens"] - a["gen_tokens"]
    tie_cheaper = tie and saving >= min_token_saving - EPS
    evidence = _paired_evidence(
        outcomes, (selfcest, reference_budget), (prompted, reference_budget), resamples
    )
    detail = (
        f"at budget {reference_budget}: {_accuracy_with_tokens(a)} generated tokens vs "
        f"{_accuracy_with_tokens(b)}{evidence.text if evidence else ''}"
    )
    if tie and 0 < saving < min_token_saving - EPS:
        detail += (
            f"; equal accuracy, {saving:.2f} fewer tokens per problem is under the {min_token_saving:g} asked"
        )
    others = sorted(set(ours) & set(theirs) - {reference_budget})
    if others:
        # The verdict is the reference budget's (chosen before the run, not after it); the other
        # budgets are listed so that a reader sees whether it is typical of the sweep or not.
        detail += ". Other budgets (not judged): " + "; ".join(
            f"budget {o}: {_accuracy_with_tokens(ours[o])} vs {_accuracy_with_tokens(theirs[o])}"
            for o in others
        )
    noisy = better and evidence is not None and not evidence.significant
    caveat = EQUAL_ACCURACY if tie_cheaper else (WITHIN_NOISE if noisy else "")
    return Claim(
        "c", statement, HOLDS if better or tie_cheaper else FAILS, detail, caveat, evidence, reference_budget
    )


def claim_critical_path(
    rows: Sequence[Mapping[str, Any]],
    selfcest: str,
    base: str,
    min_correct: int = 5,
    min_token_saving: float = 1.0,
    budgets: Sequence[int] = (),
) -> Claim:
    """(d) Take base's most accurate point q (ties: fewest critical-path tokens). The claim holds when
    some selfcest point reaches at least q's accuracy with at least `min_token_saving` fewer mean
    critical-path tokens per problem than q (as (c) asks of fewer generated tokens: a fraction of a
    token is not a shorter path). Not checked when base is never right (no accuracy level to match);
    AT_FLOOR when q is right on fewer than `min_correct` problems, where matching its accuracy says
    little about solving (a failure too: it then says little about solving either). Token counts are given to one decimal, since the margins can be that small.
    Not settled (NOT CHECKED) while base lacks a row at a budget of `budgets` (q could lie there), or
    while it fails and selfcest lacks one (the matching point could lie there)."""
    statement = f"{selfcest} needs fewer critical-path tokens than {base} at equal or better accuracy"
    ours, theirs = [r for r in rows if r["method"] == selfcest], [r for r in rows if r["method"] == base]
    if not ours or not theirs:
        return Claim("d", statement, NOT_CHECKED, f"missing: {selfcest if not ours else base}")
    claim = _claim_critical_path(ours, theirs, selfcest, base, statement, min_correct, min_token_saving)
    base_missing = _rows_missing(budgets, {base: _by_budget(theirs, base)})
    ours_missing = _rows_missing(budgets, {selfcest: _by_budget(ours, selfcest)})
    if base_missing or (claim.status == FAILS and ours_missing):
        unsettled = ", ".join(base_missing + (ours_missing if claim.status == FAILS else []))
        return dataclasses.replace(
            claim, status=NOT_CHECKED, detail=f"{claim.detail}; not settled without {unsettled}", caveat=""
        )
    return claim


def _claim_critical_path(
    ours: Sequence[Mapping[str, Any]],
    theirs: Sequence[Mapping[str, Any]],
    selfcest: str,
    base: str,
    statement: str,
    min_correct: int,
    min_token_saving: float,
) -> Claim:
    """(d) on both methods' rows; `claim_critical_path` adds the rule for missing rows."""
    q = max(theirs, key=lambda r: (r["accuracy"], -r["critical_tokens"]))
    if q["accuracy"] <= EPS:
        return Claim(
            "d", statement, NOT_CHECKED, f"{base} is never right, so there is no accuracy level to match"
        )
    matching = [r for r in ours if r["accuracy"] >= q["accuracy"] - EPS]
    reference = f"{base} at budget {q['budget']}: {_pct(q['accuracy'])} with {q['critical_tokens']:.1f} critical-path tokens"
    if not matching:
        best = max(ours, key=lambda r: r["accuracy"])
        return Claim(
            "d", statement, FAILS, f"{reference}; {selfcest} never reaches it (best {_pct(best['accuracy'])})"
        )
    p = min(matching, key=lambda r: r["critical_tokens"])
    saving = q["critical_tokens"] - p["critical_tokens"]
    # Printed to one decimal beside the two (rounded) counts, so that "52.4 ... 50.8 (-1.6)" adds up.
    printed_change = round(p["critical_tokens"], 1) - round(q["critical_tokens"], 1)
    status = HOLDS if saving >= min_token_saving - EPS else FAILS
    base_correct = round(q["accuracy"] * int(q["n"]))
    short = (
        f"; {saving:.2f} fewer critical-path tokens per problem is under the {min_token_saving:g} asked"
        if 0 < saving < min_token_saving - EPS
        else ""
    )
    return Claim(
        "d",
        statement,
        status,
        f"{reference} ({base_correct} of {int(q['n'])} problems right); {selfcest} at budget {p['budget']}: "
        f"{_pct(p['accuracy'])} with {p['critical_tokens']:.1f} ({printed_change:+.1f}){short}",
        # Either way: a verdict against an accuracy level set by a handful of right answers compares
        # how long the two take to answer, mostly wrongly, not how long they take to solve.
        AT_FLOOR if base_correct < min_correct else "",
    )


def check_claims(
    rows: Sequence[Mapping[str, Any]],
    *,
    roles: Mapping[str, Any],
    budgets: Sequence[int],
    reference_budget: int,
    min_gain: float = 0.15,
    outcomes: Outcomes | None = None,
    resamples: int = 1000,
    min_correct: int = 5,
    min_token_saving: float = 1.0,
) -> list[Claim]:
    """The four claims on one benchmark's rows; `roles` maps selfcest/base/prompted/rivals to method names.

    A row without problems or without numbers (accuracy, generated or critical-path tokens NaN, as
    `evaluation.summarize` gives for an empty cell) is left out, so that it counts as missing and
    every claim's detail names it, instead of a NaN deciding comparisons by its place in the list.

    Verdicts compare point estimates, as the claims are stated; with per-problem `outcomes` (see
    `load_outcomes`) the details of (a) and (c) add the paired bootstrap interval of the gap
    (`resamples` resamples) and the exact sign test, which say whether a gap of that size is
    distinguishable from noise at the number of problems; (d) flags a base accuracy level set by
    fewer than `min_correct` right answers."""
    selfcest, base, prompted = (
        roles.get("selfcest", "selfcest"),
        roles.get("base", "base"),
        roles.get("prompted", "prompted"),
    )
    rivals = list(roles.get("rivals") or [])
    usable = [r for r in rows if _has_numbers(r)]
    left_out = [f"{r['method']} at {int(r['budget'])}" for r in rows if not _has_numbers(r)]
    claims = [
        claim_beats_base(usable, selfcest, base, min_gain, outcomes, resamples, budgets),
        claim_frontier(usable, selfcest, rivals, budgets),
        claim_beats_prompted(
            usable, selfcest, prompted, reference_budget, outcomes, resamples, min_token_saving
        ),
        claim_critical_path(usable, selfcest, base, min_correct, min_token_saving, budgets),
    ]
    if left_out:
        note = f". Left out (no problems or no numbers): {', '.join(left_out)}"
        claims = [dataclasses.replace(c, detail=c.detail + note) for c in claims]
    return claims


def _has_numbers(row: Mapping[str, Any]) -> bool:
    values = [row.get("n"), row.get("accuracy"), row.get("gen_tokens"), row.get("critical_tokens")]
    if any(v is None or v == "" for v in values):
        return False
    numbers = [float(v) for v in values]
    return numbers[0] > 0 and not any(math.isnan(v) for v in numbers)


# --------------------------------------------------------------------------- writers
def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else round(value, 6)
    return "" if value is None else value


def write_sweep_csv(rows: Sequence[Mapping[str, Any]], path: Path | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _fmt(row.get(c)) for c in COLUMNS})


def sort_rows(
    rows: Iterable[Mapping[str, Any]], method_order: Sequence[str], benchmark_order: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Rows by benchmark (in `benchmark_order`, then by name), method (in `method_order`) and budget."""
    rank = {m: i for i, m in enumerate(method_order)}
    bench = {b: i for i, b in enumerate(benchmark_order)}
    return sorted(
        (dict(r) for r in rows),
        key=lambda r: (
            bench.get(benchmark(r["dataset"], r["split"]), len(bench)),
            r["dataset"],
            r["split"],
            rank.get(r["method"], len(rank)),
            r["method"],
            int(r["budget"]),
        ),
    )


POOLABLE_CLAIMS = ("c",)
"""Claims whose paired evidence is taken at a budget fixed before the run (metrics.json `paired`)."""


def build_metrics(
    sweep: Sweep,
    *,
    settings: Mapping[str, Settings],
    claims: Mapping[str, list[Claim]],
    floors: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Compact metrics for `dvc metrics diff`: per benchmark, its reference budget and frontier range
    (and its guessing floor where `floors` has one), and per method the accuracy at the reference
    budget and the frontier areas over generated and over critical-path tokens (`auc`,
    `auc_critical`: claim (d)'s cost); per claim benchmark, 1 or 0 per checked claim (unchecked
    claims are left out) and, for a claim that holds, `<key>_weak` 1 when its verdict carries a
    caveat (`gap within noise`, ...), so that a diff shows a claim weakening as well as failing.

    `paired` holds, per claim benchmark, claim (c)'s sign-test counts at the reference budget
    (`for`: problems only selfcest got right, `against`: only prompted), so that `selfcest spread`
    can pool them over seeds into one exact test. (a)'s counts are left out: its budget is the
    largest gap's, chosen after the run, so pooling them would add up favourable choices."""
    out: dict[str, Any] = {"benchmarks": {}}
    for name in sweep.benchmarks():
        rows = sweep.for_benchmark(name)
        setting = settings[name.split("/", 1)[0]]
        entry: dict[str, Any] = {
            "reference_budget": setting.reference_budget,
            "auc_max_tokens": setting.auc_max_tokens,
            "methods": {},
        }
        if floors and name in floors:
            entry["type_guess_floor"] = round(floors[name], 6)
        for method in dict.fromkeys(r["method"] for r in rows):
            values = {}
            for key, cost in (("auc", "gen_tokens"), ("auc_critical", "critical_tokens")):
                area = method_area(rows, method, setting.auc_max_tokens, cost)
                if area is not None:  # left out, as `accuracy` is, for a method without numbers
                    values[key] = round(area, 6)
            at_ref = _by_budget(rows, method).get(setting.reference_budget)
            if at_ref is not None and not math.isnan(at_ref["accuracy"]):  # NaN: a cell without problems
                values["accuracy"] = round(at_ref["accuracy"], 6)
            entry["methods"][method] = values
        out["benchmarks"][name] = entry
    out["claims"] = {
        name: {
            **{c.key: int(c.holds) for c in items if c.holds is not None},
            **{f"{c.key}_weak": int(bool(c.caveat)) for c in items if c.holds},
        }
        for name, items in claims.items()
    }
    out["paired"] = {
        name: {
            c.key: {"budget": c.evidence_budget, "for": c.evidence.wins, "against": c.evidence.losses}
            for c in items
            if c.key in POOLABLE_CLAIMS and c.evidence is not None
        }
        for name, items in claims.items()
    }
    return out


def plot_benchmark(
    rows: Sequence[Mapping[str, Any]], name: str, path: Path | str, method_order: Sequence[str]
) -> None:
    """Accuracy (with 95% intervals) against each cost, one line per method (points = budgets)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in method_order if any(r["method"] == m for r in rows)]
    methods += [m for m in dict.fromkeys(r["method"] for r in rows) if m not in methods]
    fig, axes = plt.subplots(1, len(COSTS), figsize=(5.2 * len(COSTS), 4.2), sharey=True)
    markers = "osD^v<>ph*X"
    for ax, (cost, label) in zip(axes, COSTS.items(), strict=True):
        for i, method in enumerate(methods):
            points = sorted((r for r in rows if r["method"] == method), key=lambda r: r["budget"])
            xs = [r[cost] for r in points]
            ys = [r["accuracy"] for r in points]
            intervals = [
                _accuracy_interval(r) for r in points
            ]  # Wilson: the bootstrap's is 0 wide at 0/n, n/n
            low = [
                max(0.0, y - lo) if not math.isnan(lo) else 0.0
                for y, (lo, _) in zip(ys, intervals, strict=True)
            ]
            high = [
                max(0.0, hi - y) if not math.isnan(hi) else 0.0
                for y, (_, hi) in zip(ys, intervals, strict=True)
            ]
            ax.errorbar(
                xs,
                ys,
                yerr=[low, high],
                marker=markers[i % len(markers)],
                capsize=3,
                label=method,
                linewidth=1.2,
            )
        steps = frontier((r[cost], r["accuracy"]) for r in rows)
        if steps:
            steps.append((max(r[cost] for r in rows), steps[-1][1]))  # the last level holds to the right
            ax.step(
                [x for x, _ in steps],
                [y for _, y in steps],
                where="post",
                color="black",
                alpha=0.25,
                linewidth=4,
                label="frontier",
            )
        ax.set_xlabel(f"mean {label} per problem")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[-1].legend(fontsize=8, loc="best")
    fig.suptitle(f"{name}: accuracy vs cost (points: budgets; bars: Wilson 95% interval)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def _md_num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def describe_machine(machine: Mapping[str, Any] | None) -> str:
    """One machine (`selfcest.determinism.machine_description`) as a phrase."""
    if not machine:
        return "not recorded"
    cpu = " ".join(f"`{machine[k]}`" for k in ("cpu_vendor", "cpu_model") if machine.get(k)) or "CPU not read"
    phrase = f"{cpu}, ATen kernels `{machine.get('cpu_kernels')}`, torch {machine.get('torch')}"
    return f"{phrase}, GPU `{machine['gpu']}`" if machine.get("gpu") else phrase


def machine_lines(training_machines: Mapping[str, Mapping[str, Any] | None], sweep: Sweep) -> list[str]:
    """The "Machines" section: where each training stage and the cells ran. The same seed trains
    other weights on an Intel CPU than on an AMD one (MKL picks its matrix kernels by vendor), so a
    reviewer comparing two commits' reports needs to see whether they come from one kind."""
    cell_machines = {
        describe_machine((cell.get("timing") or {}).get("machine"))
        for cell in sweep.cells
        if cell.get("status") == "ok"
    }
    if not training_machines and not cell_machines:
        return []
    lines = ["## Machines", ""]
    lines += [f"- {stage}: {describe_machine(machine)}" for stage, machine in training_machines.items()]
    if cell_machines:
        lines.append("- evaluation cells: " + "; ".join(sorted(cell_machines)))
    lines += [
        "",
        "On the CPU kinds measured so far, the same seed gave the same weights on two AMD kinds and",
        'other weights on Intel (README, "Environment notes"): read a difference between two commits\'',
        "reports as the code's only where their training ran on CPUs of one vendor.",
        "",
    ]
    return lines


def recorded_seconds(value: Any) -> float | None:
    """A wall time as a stage recorded it: a number, or None where it recorded none or something else."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _seconds(value: Any) -> str:
    seconds = recorded_seconds(value)
    return "not recorded" if seconds is None else f"{seconds:,.1f}"


_CELL_TIMES = ("import_seconds", "load_seconds", "run_seconds")


def time_lines(training_seconds: Mapping[str, Any], sweep: Sweep) -> list[str]:
    """The "Stage times" section: the wall time each training stage recorded (`training_seconds`,
    its `stage_seconds`) and, per evaluation cell, its seconds importing torch and transformers,
    loading the weights and running its methods (`timing` in its rows.json), with the cells' totals.
    Like `s/problem`, these are the machine's and change between runs: they are here so that a
    reviewer sees where a run's time went without reading its logs."""
    timed_cells = [cell for cell in sweep.cells if cell.get("status") == "ok"]
    if not training_seconds and not timed_cells:
        return []
    lines = [
        "## Stage times",
        "",
        "Wall seconds, as each stage recorded them; the data stages and `build_model` record none.",
        "",
        "| stage | seconds |",
        "|---|---|",
    ]
    lines += [f"| {stage} | {_seconds(value)} |" for stage, value in training_seconds.items()]
    if timed_cells:
        lines += ["", "| cell | importing | loading | running methods |", "|---|---|---|---|"]
        columns: list[list[float | None]] = [[] for _ in _CELL_TIMES]
        for cell in timed_cells:
            timing = cell.get("timing") or {}
            values = [recorded_seconds(timing.get(key)) for key in _CELL_TIMES]
            for column, value in zip(columns, values, strict=True):
                column.append(value)
            name = f"`{cell.get('dataset')}/{cell.get('split')}` `{cell.get('checkpoint')}`"
            lines.append(f"| {name} | " + " | ".join(map(_seconds, values)) + " |")
        totals = [sum(v for v in column if v is not None) for column in columns]
        lines.append(f"| all {len(timed_cells)} cells | " + " | ".join(map(_seconds, totals)) + " |")
    lines.append("")
    return lines


def summary_markdown(
    sweep: Sweep,
    *,
    eval_params: Mapping[str, Any],
    settings: Mapping[str, Settings],
    claims: Mapping[str, list[Claim]],
    method_order: Sequence[str],
    floors: Mapping[str, float] | None = None,
    training_machines: Mapping[str, Mapping[str, Any] | None] | None = None,
    training_seconds: Mapping[str, Any] | None = None,
) -> str:
    """The summary report: per benchmark a table at the reference budget, who owns the frontier
    where, and the claims; every sentence is generated from the rows. `floors`: per benchmark, the
    accuracy of guessing without reading (synthetic QA's type-guess floor), shown under its heading.
    `training_machines`: per training stage, the `machine` its metrics file recorded (None where it
    recorded none), for the "Machines" section (`machine_lines`); `training_seconds`: per training
    stage, the `stage_seconds` it recorded, for the "Stage times" section (`time_lines`)."""
    lines = [
        "# Budget-sweep evaluation",
        "",
        "Generated by `stages/report.py` from the sweep cells; do not edit by hand.",
        "",
        "- Budgets are tree-wide: every token a method generates for one problem (roots, clones, "
        "samples, hops) counts against it.",
    ]
    for dataset, s in settings.items():
        lines.append(
            f"- `{dataset}`: budgets {', '.join(map(str, s.budgets)) or '-'}; reference budget "
            f"{s.reference_budget}; frontier area over [0, {s.auc_max_tokens:g}] generated tokens."
        )
    lines += [
        "- Frontier area (AUC): normalised area under a method's monotone Pareto frontier "
        "(its best accuracy using at most x tokens, a step function) over the range above.",
        "- Accuracy: exact match (QA: SQuAD-normalised EM; F1 in its own column). The tables give its "
        "Wilson 95% interval; `sweep.csv` has that (`wilson_low`, `wilson_high`) and the cells' seeded "
        "percentile bootstrap 95% interval (`ci_low`, `ci_high`), which is zero-width at 0/n and n/n.",
        "- Time: `s/problem` (`seconds` in `sweep.csv`) is the wall time of the batch that ran a method at "
        "a budget over all the split's problems, over n: throughput, since problems run side by side. "
        "`latency_seconds` is the mean time from that batch's start to each problem's answer. Both are "
        "this machine's and change between runs; every other number is reproducible from the seed.",
        "",
    ]
    missing = missing_methods(sweep, eval_params)
    absent = [name for name in expected_benchmarks(eval_params) if not sweep.for_benchmark(name)]
    if missing or absent:
        lines += ["## Missing", ""]
        lines += [f"- `{name}`: no cells at all" for name in absent]
        lines += [
            f"- `{name}`: " + "; ".join(f"`{m}` ({reason})" for m, reason in methods.items())
            for name, methods in missing.items()
            if name not in absent
        ]
        lines.append("")
    weights = checkpoint_weights(sweep)
    if weights:
        lines += [
            "## Checkpoints",
            "",
            "| checkpoint | weights sha256 | methods |",
            "|---|---|---|",
        ]
        configured = [c for c in (eval_params.get("models") or {}) if c in weights]
        for checkpoint in configured + [c for c in weights if c not in configured]:
            entry = weights[checkpoint]
            if entry["mixed"]:
                digest = "differs between cells: " + ", ".join(f"`{h[:16]}`" for h in entry["mixed"])
            elif entry["weights_sha256"]:
                digest = f"`{entry['weights_sha256'][:16]}`"
            else:
                digest = "not recorded"
            lines.append(
                f"| `{checkpoint}` | {digest} | " + ", ".join(f"`{m}`" for m in entry["methods"]) + " |"
            )
        lines.append("")
        notes = [
            f"- `{checkpoint}`: its cells were measured on different weights (retrained between "
            "cells?); its rows mix two models."
            for checkpoint, entry in weights.items()
            if entry["mixed"]
        ]
        for group in same_weight_groups(weights):
            methods = [f"`{m}`" for checkpoint in group for m in weights[checkpoint]["methods"]]
            checkpoints = " and ".join(f"`{c}`" for c in group)
            notes.append(
                f"- {checkpoints} hold byte-identical weights, so {' and '.join(methods)} are one model "
                "measured twice: nothing that separates their rows comes from training."
            )
        lines += [*notes, ""] if notes else []
    lines += machine_lines(training_machines or {}, sweep)
    if claims:
        names = list(claims)
        lines += [
            "## Claims",
            "",
            "| claim | " + " | ".join(f"`{n}`" for n in names) + " |",
            "|---|" + "---|" * len(names),
        ]
        keys = [c.key for c in next(iter(claims.values()))]
        statements = {c.key: c.statement for items in claims.values() for c in items}
        for key in keys:
            cells = [next(c.verdict for c in claims[n] if c.key == key) for n in names]
            lines.append(f"| ({key}) {statements[key]} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "Verdicts compare point estimates, as the claims are stated. Where per-problem results are",
            "at hand, (a) and (c) also give the paired bootstrap 95% interval of the gap and an exact",
            "sign test over the problems where the two methods differ (McNemar's test for right/wrong).",
            f"A verdict in brackets holds as stated but on weak evidence: `{WITHIN_NOISE}` (sign test",
            f"p >= {SIGNIFICANCE}: the gap is not distinguishable from noise at this number of problems),",
            f"`{BELOW_MARGIN}` ((a): significant, but the interval reaches below the margin), `{TIES_ONLY}`",
            f"((b): never above the best rival, only level with it), `{EQUAL_ACCURACY}` ((c): the same",
            "accuracy as prompted, at least `eval.report.claim_min_token_saving` fewer generated tokens",
            f"per problem), `{AT_FLOOR}` ((d), holding or not: base's accuracy level rests on fewer",
            "right answers than `eval.report.claim_min_correct`, so the verdict says little about",
            "solving). (d) asks at least",
            "`eval.report.claim_min_token_saving` fewer critical-path tokens per problem. Accuracy intervals in the tables are",
            "Wilson 95% intervals (`wilson_low`/`wilson_high` in `sweep.csv`, beside the bootstrap's",
            "`ci_low`/`ci_high`, which has zero width when every problem is right or every one wrong).",
            "",
        ]
    for name in sweep.benchmarks():
        rows = sweep.for_benchmark(name)
        setting = settings[name.split("/", 1)[0]]
        reference_budget, auc_max_tokens = setting.reference_budget, setting.auc_max_tokens
        methods = [m for m in method_order if any(r["method"] == m for r in rows)]
        methods += [m for m in dict.fromkeys(r["method"] for r in rows) if m not in methods]
        has_f1 = any(r.get("f1") is not None for r in rows)
        n = max((int(r["n"]) for r in rows), default=0)
        lines += [f"## `{name}` ({n} problems)", ""]
        if floors and name in floors:
            lines += [
                f"Type-guess floor: {_pct(floors[name])}, the expected accuracy of guessing the entity of the "
                "answer's type that these problems' contexts mention most often, without following the "
                "chain (`selfcest.data.qa.type_guess_accuracy`). A method at or below it shows no reading.",
                "",
            ]
        header = ["method", f"acc @{reference_budget} [Wilson 95% CI]"] + (["F1"] if has_f1 else [])
        header += [
            "gen tok",
            "total tok",
            "crit tok",
            "s/problem",
            "clones",
            "proto err",
            "AUC gen",
            "AUC crit",
        ]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        areas = {m: method_area(rows, m, auc_max_tokens) for m in methods}
        for method in methods:
            at = _by_budget(rows, method).get(reference_budget)
            auc = areas[method]
            auc_crit = method_area(rows, method, auc_max_tokens, "critical_tokens")
            if at is None or math.isnan(at["accuracy"]):  # no row, or one without problems
                cells = [f"`{method}`", "-"] + (["-"] if has_f1 else []) + ["-"] * 6
            else:
                cells = [
                    f"`{method}`",
                    "{} [{}, {}]".format(_pct(at["accuracy"]), *map(_pct, _accuracy_interval(at))),
                ]
                if has_f1:
                    cells.append(_md_num(at.get("f1"), 3))
                cells += [
                    _md_num(at["gen_tokens"]),
                    _md_num(at["total_tokens"]),
                    _md_num(at["critical_tokens"]),
                    _md_num(at["seconds"], 3),
                    _md_num(at["clones"], 2),
                    _pct(at["protocol_error_rate"]),
                ]
            cells += ["-" if area is None else f"{area:.3f}" for area in (auc, auc_crit)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        # Ranked at the printed precision, so that "a 0.033 > b 0.033" cannot appear; a method
        # without numbers has no area and no place in the ranking.
        printed = {m: round(a, 3) for m, a in areas.items() if a is not None}
        ranking = sorted(printed, key=lambda m: -printed[m])
        if ranking:
            text = f"`{ranking[0]}` {printed[ranking[0]]:.3f}"
            for before, method in zip(ranking, ranking[1:], strict=False):
                text += (
                    " > " if printed[before] > printed[method] else " = "
                ) + f"`{method}` {printed[method]:.3f}"
            lines += [f"Frontier area ranking (generated tokens): {text}.", ""]
        for cost in ("gen_tokens", "critical_tokens"):
            # A segment narrower than one token (two methods' mean costs a fraction apart) owns no
            # cost a reader could choose, and its margin would compare against a point just beyond it.
            segments = [
                seg
                for seg in combined_frontier(rows, cost, resolution=1.0)
                if seg["accuracy"] > EPS and (seg["to"] is None or seg["to"] - seg["from"] >= 1.0)
            ]
            lines.append(
                f"On the all-methods frontier ({COSTS[cost]}; spans under one token left out, and a "
                "method within one token of a span's start counted as at that cost):"
            )
            if not segments:
                lines.append("- no method gets any problem right at any budget")
            for s in segments:
                span = f"from {s['from']:.0f}" + (
                    f" to {s['to']:.0f} tokens" if s["to"] is not None else " tokens upwards"
                )
                if not s["runner_up"]:
                    lead = ""
                elif s["margin"] <= EPS:
                    lead = f", level with `{s['runner_up']}` at that cost"
                elif s["accuracy"] - s["margin"] <= EPS:
                    # Naming a runner-up would name whichever method is listed first among those at 0%.
                    lead = f", {100 * s['margin']:+.1f} pts: no other method is right on any problem at that cost"
                else:
                    lead = f", {100 * s['margin']:+.1f} pts over the best other method (`{s['runner_up']}`) at that cost"
                lines.append(
                    f"- {span}: `{s['method']}` (budget {s['budget']}) at {_pct(s['accuracy'])}{lead}"
                )
            lines.append("")
        if name in claims:
            lines += ["Claims:", ""]
            for c in claims[name]:
                lines.append(f"- ({c.key}) {c.statement}: **{c.verdict}**. {c.detail}")
            lines.append("")
    times = time_lines(training_seconds or {}, sweep)
    lines += ([""] if times and lines[-1] else []) + times
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------- trace viewer
_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px;color:#222}
h1{font-size:1.4em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:2em}
h3{font-size:1.05em;margin-bottom:.3em}
details{margin:.3em 0 .3em 1em}summary{cursor:pointer}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:.4em;margin:.2em 0;font-size:.85em;max-height:24em;overflow:auto}
.agent{border-left:3px solid #9ab;padding-left:.6em;margin:.4em 0}.clone{border-left-color:#c96}
.ok{color:#161}.bad{color:#a11}.meta{color:#555;font-size:.9em}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;font-size:.85em}
"""
MAX_TEXT_CHARS = 3000


def _text(value: Any, limit: int = MAX_TEXT_CHARS) -> str:
    """Escaped untrusted text, cut to `limit` characters."""
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = text[:limit] + f"\n... ({len(text) - limit} more characters)"
    return html.escape(text)


def _agent_html(agents: Sequence[Mapping[str, Any]], index: int) -> str:
    agent = agents[index]
    e = html.escape
    role = "clone" if agent.get("role") == "clone" else "root"
    status = str(agent.get("status"))
    parts = [
        f'<div class="agent {role}"><b>{e(str(agent.get("agent_id")))}</b> '
        f'<span class="{"ok" if status == "ok" else "bad"}">[{e(status)}]</span> '
        f'<span class="meta">max_tokens={e(str(agent.get("max_tokens")))} generated={e(str(agent.get("generated_tokens")))} '
        f"prompt={e(str(agent.get('prompt_tokens')))} critical={e(str(agent.get('critical_path_tokens')))}</span>"
    ]
    if role == "clone":
        keys = agent.get("context_keys") or []
        parts.append(f'<div class="meta">task:</div><pre>{_text(agent.get("task"))}</pre>')
        parts.append(f'<div class="meta">context keys: {e(", ".join(map(str, keys))) or "(none)"}</div>')
    parts.append(
        f'<div class="meta">answer: {_text(agent.get("answer"), 500)}'
        + (f" &middot; failure: {_text(agent.get('failure'), 300)}" if agent.get("failure") else "")
        + "</div>"
    )
    turns = agent.get("turns") or []
    children = agent.get("children") or []
    spawned_at = {}
    for spawned in children:
        for child in spawned:
            if 0 <= child < len(agents):
                spawned_at.setdefault(agents[child].get("spawn_turn"), []).append(child)
    for number, turn in enumerate(turns, start=1):
        parts.append(
            f"<details open><summary>turn {number}: {e(str(turn.get('generated_tokens')))} tokens "
            f"(granted {e(str(turn.get('granted_tokens')))}, {e(str(turn.get('finish_reason')))})</summary>"
            f"<pre>{_text(turn.get('text'))}</pre>"
        )
        for child in spawned_at.get(number, []):
            parts.append(_agent_html(agents, child))
        parts.append("</details>")
    parts.append("</div>")
    return "".join(parts)


def _episode_html(episode: Mapping[str, Any], label: str) -> str:
    e = html.escape
    agents = episode.get("agents") or []
    head = (
        f"{e(label)}: answer {_text(episode.get('final_answer'), 200)} &middot; generated {e(str(episode.get('generated_tokens')))}, "
        f"total {e(str(episode.get('total_tokens')))}, critical {e(str(episode.get('critical_path_tokens')))}, "
        f"clones {e(str(episode.get('num_clones')))}, protocol errors {len(episode.get('protocol_errors') or [])}"
    )
    body = _agent_html(agents, 0) if agents else ""
    errors = episode.get("protocol_errors") or []
    if errors:
        body += "<pre>" + _text(json.dumps(errors, ensure_ascii=False), 1500) + "</pre>"
    return f"<details><summary>{head}</summary>{body}</details>"


def _record_html(record: Mapping[str, Any]) -> str:
    e = html.escape
    ok = float(record.get("correct") or 0.0) >= 1.0
    extra = record.get("extra") or {}
    head = (
        f"<b>{e(str(record.get('method')))}</b> (budget {e(str(record.get('budget')))}): "
        f'<span class="{"ok" if ok else "bad"}">{_text(record.get("answer"), 200)}</span> '
        f'<span class="meta">score {e(str(record.get("correct")))} &middot; gen {_md_num(record.get("generated_tokens"))} '
        f"&middot; total {_md_num(record.get('total_tokens'))} &middot; crit {_md_num(record.get('critical_path_tokens'))} "
        f"&middot; clones {_md_num(record.get('clones'))}</span>"
    )
    body = []
    if extra.get("votes") is not None:
        body.append(
            f'<div class="meta">votes: {_text(json.dumps(extra["votes"], ensure_ascii=False), 600)} (winner {e(str(extra.get("winner")))})</div>'
        )
    if extra.get("retrieved") is not None:
        body.append(
            f'<div class="meta">retrieved: {_text(", ".join(map(str, extra["retrieved"])), 600)}</div>'
        )
    episodes = record.get("episodes") or []
    for i, episode in enumerate(episodes):
        label = (
            f"hop {i + 1}"
            if extra.get("retrieved") is not None
            else (f"sample {i + 1}" if len(episodes) > 1 else "episode")
        )
        body.append(_episode_html(episode, label))
    return f"<details><summary>{head}</summary>{''.join(body)}</details>"


def episode_records(path: Path, budget: int | None = None) -> Iterable[dict[str, Any]]:
    """A cell's episode records (`episodes.jsonl.gz`) at `budget` (all budgets when None), streamed;
    nothing when the file is absent."""
    if not path.exists():
        return
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                if budget is None or int(record.get("budget", -1)) == budget:
                    yield record


def _first_problem_ids(path: Path, budget: int | None, limit: int) -> list[str]:
    ids: list[str] = []
    if limit < 1:  # `trace_problems: 0` shows none (the loop below appends before it counts)
        return ids
    for record in episode_records(path, budget):
        if record.get("problem_id") not in ids:
            ids.append(record.get("problem_id"))
            if len(ids) >= limit:
                break
    return ids


def traces_html(
    sweep: Sweep,
    *,
    problems_per_benchmark: int,
    settings: Mapping[str, Settings],
    method_order: Sequence[str],
) -> str:
    """One self-contained HTML page (inline CSS, no script): a few problems per benchmark, every
    method's episodes at the reference budget (or the largest one present) with the root/clone tree."""
    e = html.escape
    body = [
        f"<h1>Traces of the budget sweep</h1><p class=meta>{problems_per_benchmark} problems per benchmark; "
        "each method at the reference budget when it has one. All model text is escaped.</p>"
    ]
    rank = {m: i for i, m in enumerate(method_order)}
    for name in sweep.benchmarks():
        rows = sweep.for_benchmark(name)
        budgets = sorted({int(r["budget"]) for r in rows})
        reference_budget = settings[name.split("/", 1)[0]].reference_budget
        budget = reference_budget if reference_budget in budgets else (budgets[-1] if budgets else None)
        dataset, split = name.split("/", 1)
        cells = sorted((k, v) for k, v in sweep.cell_dirs.items() if k[0] == dataset and k[1] == split)
        order: list[str] = []
        for _, directory in cells:
            order = _first_problem_ids(directory / "episodes.jsonl.gz", budget, problems_per_benchmark)
            if order:
                break
        wanted = set(order)
        records = [
            r
            for _, directory in cells
            for r in episode_records(directory / "episodes.jsonl.gz", budget)
            if r.get("problem_id") in wanted
        ]
        body.append(f"<h2>{e(name)} (budget {e(str(budget))})</h2>")
        if not order:
            body.append("<p>No episode records.</p>")
        for pid in order:
            mine = sorted(
                (r for r in records if r["problem_id"] == pid),
                key=lambda r: (rank.get(r["method"], len(rank)), r["method"]),
            )
            first = mine[0]
            body.append(f"<h3>{e(str(pid))}</h3><pre>{_text(first.get('question'))}</pre>")
            body.append(
                f'<div class="meta">gold: {_text(", ".join(map(str, first.get("golds") or [])), 500)}</div>'
            )
            body += [_record_html(r) for r in mine]
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>selfcest traces</title>"
        f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )
