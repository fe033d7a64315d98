"""Reports: frontiers and areas on hand-made points, the four claims, and the report stage on synthetic cells."""

from __future__ import annotations

import csv
import gzip
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.axes
import pytest
import yaml
from expectations import REQUIRED_SWEEP_COLUMNS

from selfcest.analysis import FAILURE_KINDS, delegation_by_size, problem_size
from selfcest.data.qa import generate_synthetic, type_guess_accuracy
from selfcest.reports import (
    AT_FLOOR,
    BELOW_MARGIN,
    COSTS,
    EQUAL_ACCURACY,
    FAILS,
    HOLDS,
    NOT_CHECKED,
    TIES_ONLY,
    WITHIN_NOISE,
    Settings,
    Sweep,
    build_metrics,
    check_claims,
    checkpoint_weights,
    claim_beats_base,
    claim_beats_prompted,
    claim_critical_path,
    claim_frontier,
    combined_frontier,
    frontier,
    frontier_auc,
    frontier_value,
    load_sweep,
    method_points,
    missing_methods,
    plot_benchmark,
    same_weight_groups,
    settings_for,
    summary_markdown,
)
from selfcest.stats import paired_gap, sign_test, wilson_interval

REPO = Path(__file__).resolve().parents[1]
BUDGETS = [100, 200, 400]


def row(
    method: str, budget: int, accuracy: float, gen: float, crit: float | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "dataset": "arithmetic",
        "split": "ood",
        "benchmark": "arithmetic/ood",
        "checkpoint": f"{method}_ckpt",
        "method": method,
        "budget": budget,
        "n": 50,
        "accuracy": accuracy,
        "ci_low": max(0.0, accuracy - 0.1),
        "ci_high": min(1.0, accuracy + 0.1),
        "gen_tokens": gen,
        "total_tokens": gen + 60,
        "critical_tokens": gen if crit is None else crit,
        "seconds": 0.01,
        "latency_seconds": 0.5,
        "clones": 0.0,
        "protocol_error_rate": 0.0,
        **extra,
    }


# --------------------------------------------------------------------------- frontiers
def test_frontier_keeps_only_points_better_than_every_cheaper_one() -> None:
    points = [(10, 0.2), (20, 0.1), (30, 0.5), (30, 0.4), (40, 0.5), (50, 0.7), (5, 0.0)]
    assert frontier(points) == [(5, 0.0), (10, 0.2), (30, 0.5), (50, 0.7)]
    assert frontier([]) == []
    assert frontier([(10, float("nan")), (20, 0.3)]) == [(20, 0.3)]


def test_frontier_value_is_the_best_accuracy_within_a_cost() -> None:
    points = [(10, 0.2), (30, 0.5), (20, 0.1)]
    assert frontier_value(points, 5) == 0.0
    assert frontier_value(points, 10) == 0.2
    assert frontier_value(points, 29.9) == 0.2
    assert frontier_value(points, 30) == 0.5
    assert frontier_value(points, 1e9) == 0.5


def test_frontier_auc_on_hand_made_points() -> None:
    assert frontier_auc([(0, 1.0)], 100) == 1.0
    assert frontier_auc([(50, 0.5)], 100) == pytest.approx(0.25)
    assert frontier_auc([(25, 0.4), (50, 0.8)], 100) == pytest.approx((25 * 0.4 + 50 * 0.8) / 100)
    assert frontier_auc([(25, 0.4), (50, 0.3)], 100) == pytest.approx(
        0.75 * 0.4
    )  # a worse, dearer point adds nothing
    assert frontier_auc([(150, 1.0)], 100) == 0.0  # beyond the range
    assert frontier_auc([], 100) == 0.0
    with pytest.raises(ValueError):
        frontier_auc([(1, 1.0)], 0)


def test_combined_frontier_names_the_owner_and_its_margin() -> None:
    rows = [
        row("base", 100, 0.2, 80),
        row("base", 200, 0.3, 150),
        row("selfcest", 100, 0.5, 90),
        row("selfcest", 200, 0.6, 190),
    ]
    segments = combined_frontier(rows)
    assert [(s["method"], s["budget"]) for s in segments] == [
        ("base", 100),
        ("selfcest", 100),
        ("selfcest", 200),
    ]
    assert segments[0]["margin"] == pytest.approx(0.2) and segments[0]["to"] == 90
    assert segments[1]["runner_up"] == "base" and segments[1]["margin"] == pytest.approx(0.3)
    assert segments[2]["to"] is None and segments[2]["margin"] == pytest.approx(0.3)


def test_combined_frontier_leaves_out_rows_without_numbers() -> None:
    """A row without problems (NaN accuracy and costs, as `evaluation.summarize` gives for an empty
    cell) must not reorder the others (a NaN sort key breaks the sort) nor be named a runner-up."""
    empty = row("thinking", 400, math.nan, math.nan, n=0)
    rows = [row("base", 200, 0.9, 200), empty, row("base", 100, 0.5, 100)]
    segments = combined_frontier(rows)
    assert [(s["method"], s["budget"]) for s in segments] == [("base", 100), ("base", 200)]
    assert all(s["runner_up"] is None for s in segments)


def test_summary_and_metrics_show_a_row_without_problems_as_no_number() -> None:
    """An empty cell's row (n 0, NaN numbers) at the reference budget: the table says `-`, not
    `nan%`, and metrics.json leaves its accuracy out instead of writing a bare NaN (not JSON)."""
    from selfcest.reports import Settings, Sweep, build_metrics

    nan_numbers = dict.fromkeys(
        ["ci_low", "ci_high", "total_tokens", "seconds", "clones", "protocol_error_rate"], math.nan
    )
    rows = [
        row("base", 100, 0.5, 90),
        {**row("base", 200, math.nan, math.nan, n=0), **nan_numbers},
    ]
    sweep = Sweep(rows=rows, cells=[])
    settings = {"arithmetic": Settings([100, 200], 200, 200.0)}
    text = summary_markdown(sweep, eval_params={}, settings=settings, claims={}, method_order=["base"])
    assert "nan" not in text.lower()
    metrics = build_metrics(sweep, settings=settings, claims={})
    assert "accuracy" not in metrics["benchmarks"]["arithmetic/ood"]["methods"]["base"]
    json.dumps(metrics, allow_nan=False)


def test_summary_names_no_runner_up_when_no_other_method_is_right_at_that_cost() -> None:
    """A frontier span whose method leads every other one from 0%: the summary says so instead of
    naming, as the best other method, whichever method at 0% comes first."""
    from selfcest.reports import Settings, Sweep

    rows = [row("base", 100, 0.0, 50), row("thinking", 100, 0.0, 80), row("selfcest", 100, 0.25, 90)]
    settings = {"arithmetic": Settings([100], 100, 100.0)}
    text = summary_markdown(
        Sweep(rows=rows, cells=[]), eval_params={}, settings=settings, claims={}, method_order=[]
    )
    assert "`selfcest` (budget 100) at 25.0%, +25.0 pts: no other method is right on any problem" in text
    assert "over the best other method" not in text


def test_combined_frontier_margin_counts_a_point_within_the_resolution_as_at_that_cost() -> None:
    """The committed arithmetic/test case: noclone-grpo at 97.9% with 37.27 tokens, base at 95.8%
    with 37.31. The summary leaves out spans under one token; its margin must not read base's point,
    0.04 tokens dearer, as out of reach (+97.9 pts) but lead by 2.1 pts. A point at the next
    segment's start still does not count."""
    rows = [row("noclone-grpo", 128, 47 / 48, 37.270833), row("base", 128, 46 / 48, 37.3125)]
    assert combined_frontier(rows)[0]["margin"] == pytest.approx(47 / 48)  # exact cost: unchanged
    (segment,) = combined_frontier(rows, resolution=1.0)
    assert segment["runner_up"] == "base" and segment["margin"] == pytest.approx(1 / 48)
    rows = [row("base", 100, 0.5, 100), row("sc@4", 100, 0.9, 100.5), row("selfcest", 100, 0.7, 101)]
    segments = combined_frontier(rows, resolution=1.0)
    assert [s["method"] for s in segments] == ["base", "sc@4"]
    assert segments[0]["margin"] == pytest.approx(0.5)  # sc@4 starts the next segment
    assert segments[1]["runner_up"] == "selfcest" and segments[1]["margin"] == pytest.approx(0.2)


# --------------------------------------------------------------------------- claims
def strong_sweep() -> list[dict[str, Any]]:
    """A sweep in which every claim holds."""
    return [
        row("base", 100, 0.30, 95, 95),
        row("base", 200, 0.50, 180, 180),
        row("base", 400, 0.55, 300, 300),
        row("selfcest", 100, 0.40, 90, 50),
        row("selfcest", 200, 0.70, 170, 80),
        row("selfcest", 400, 0.80, 260, 110),
        row("prompted", 100, 0.30, 95, 60),
        row("prompted", 200, 0.50, 190, 90),
        row("prompted", 400, 0.60, 350, 120),
        row("thinking", 100, 0.10, 100),
        row("thinking", 200, 0.40, 200),
        row("thinking", 400, 0.60, 390),
        row("sc@4", 100, 0.05, 100, 25),
        row("sc@4", 200, 0.35, 200, 50),
        row("sc@4", 400, 0.60, 400, 100),
        row("noclone-grpo", 100, 0.35, 90),
        row("noclone-grpo", 200, 0.55, 170),
        row("noclone-grpo", 400, 0.65, 280),
    ]


ROLES = {
    "selfcest": "selfcest",
    "base": "base",
    "prompted": "prompted",
    "rivals": ["sc@4", "thinking", "noclone-grpo"],
}


def test_every_claim_holds_on_a_strong_sweep() -> None:
    claims = check_claims(strong_sweep(), roles=ROLES, budgets=BUDGETS, reference_budget=200, min_gain=0.15)
    assert [c.key for c in claims] == ["a", "b", "c", "d"]
    assert [c.status for c in claims] == [HOLDS] * 4, [c.detail for c in claims]
    assert [c.verdict for c in claims] == [HOLDS] * 4  # clear wins: no caveat
    assert "+25.0 pts at budget 400" in claims[0].detail


def test_each_claim_fails_on_its_own_counterexample() -> None:
    rows = strong_sweep()
    # (a): the largest gap is 14 points.
    weak = [dict(r, accuracy=r["accuracy"] - 0.11) if r["method"] == "selfcest" else r for r in rows]
    assert claim_beats_base(weak, "selfcest", "base", 0.15).status == FAILS
    # (b): a rival is better at one budget (noclone-grpo at 100 tokens).
    rival = rows + [row("noclone-grpo", 100, 0.45, 85)]
    rival = [
        r
        for r in rival
        if not (r["method"] == "noclone-grpo" and r["budget"] == 100 and r["accuracy"] == 0.35)
    ]
    claim = claim_frontier(rival, "selfcest", ROLES["rivals"], BUDGETS)
    assert claim.status == FAILS and "noclone-grpo at 100" in claim.detail

    # (c): selfcest has 70% with 170 tokens at the reference budget 200.
    def prompted_at_200(accuracy: float, gen: float) -> list[dict[str, Any]]:
        return [
            dict(r, accuracy=accuracy, gen_tokens=gen)
            if r["method"] == "prompted" and r["budget"] == 200
            else r
            for r in rows
        ]

    assert (
        claim_beats_prompted(prompted_at_200(0.80, 300), "selfcest", "prompted", 200).status == FAILS
    )  # less accurate
    assert (
        claim_beats_prompted(prompted_at_200(0.70, 160), "selfcest", "prompted", 200).status == FAILS
    )  # tie, dearer
    assert (
        claim_beats_prompted(prompted_at_200(0.70, 170), "selfcest", "prompted", 200).status == FAILS
    )  # a full tie
    assert (
        claim_beats_prompted(prompted_at_200(0.70, 175), "selfcest", "prompted", 200).status == HOLDS
    )  # tie, cheaper
    never_right = [
        dict(r, accuracy=0.0) if r["method"] in ("selfcest", "prompted") and r["budget"] == 200 else r
        for r in rows
    ]
    assert claim_beats_prompted(never_right, "selfcest", "prompted", 200).status == NOT_CHECKED  # 0% vs 0%
    # Only the reference budget is judged; the others are listed beside it. Here selfcest ties
    # prompted at 200 but is far ahead at 100 and 400: still a full tie, and the detail says so.
    ahead_elsewhere = [
        dict(r, accuracy=0.95) if r["method"] == "selfcest" and r["budget"] != 200 else r
        for r in prompted_at_200(0.70, 170)
    ]
    elsewhere = claim_beats_prompted(ahead_elsewhere, "selfcest", "prompted", 200)
    assert elsewhere.status == FAILS
    assert "Other budgets (not judged): budget 100: 95.0% with" in elsewhere.detail
    listed = elsewhere.detail.split("Other budgets (not judged): ")[1]
    assert "budget 400: 95.0% with" in listed and "budget 200" not in listed
    # (d): selfcest reaches base's best accuracy only with a longer critical path.
    slow = [
        dict(r, critical_tokens=r["critical_tokens"] + 400) if r["method"] == "selfcest" else r for r in rows
    ]
    assert claim_critical_path(slow, "selfcest", "base").status == FAILS
    never = [dict(r, accuracy=0.5) if r["method"] == "selfcest" else r for r in rows]
    assert claim_critical_path(never, "selfcest", "base").status == FAILS


def test_claims_that_hold_only_by_ties_say_so() -> None:
    """(b) level with the best rival at every budget and (c) by tokens alone hold as stated, with a
    caveat in the verdict; one budget strictly above the rivals clears (b)'s caveat."""
    rows = strong_sweep()
    level = [r for r in rows if r["method"] != "thinking"] + [
        row("thinking", b, frontier_value(method_points(rows, "selfcest"), b), b - 5) for b in BUDGETS
    ]
    tie = claim_frontier(level, "selfcest", ROLES["rivals"], BUDGETS)
    assert tie.status == HOLDS and tie.verdict == f"{HOLDS} ({TIES_ONLY})"
    above_once = [
        dict(r, accuracy=r["accuracy"] - 0.01) if r["method"] == "thinking" and r["budget"] == 400 else r
        for r in level
    ]
    assert claim_frontier(above_once, "selfcest", ROLES["rivals"], BUDGETS).caveat == ""
    cheaper_tie = [
        dict(r, accuracy=0.70, gen_tokens=175) if r["method"] == "prompted" and r["budget"] == 200 else r
        for r in rows
    ]
    claim = claim_beats_prompted(cheaper_tie, "selfcest", "prompted", 200)
    assert claim.status == HOLDS and claim.caveat == EQUAL_ACCURACY


def test_claims_with_missing_methods_are_not_checked() -> None:
    rows = [r for r in strong_sweep() if r["method"] != "selfcest"]
    assert {c.status for c in check_claims(rows, roles=ROLES, budgets=BUDGETS, reference_budget=200)} == {
        NOT_CHECKED
    }
    some_rivals = [r for r in strong_sweep() if r["method"] not in ("sc@4", "thinking")]
    claim = claim_frontier(some_rivals, "selfcest", ROLES["rivals"], BUDGETS)
    assert claim.status == NOT_CHECKED and "missing" in claim.detail and "sc@4" in claim.detail
    beaten = [dict(r, accuracy=0.9) if r["method"] == "noclone-grpo" else r for r in some_rivals]
    assert (
        claim_frontier(beaten, "selfcest", ROLES["rivals"], BUDGETS).status == FAILS
    )  # decided despite a gap
    zero_base = [dict(r, accuracy=0.0) if r["method"] == "base" else r for r in strong_sweep()]
    assert claim_critical_path(zero_base, "selfcest", "base").status == NOT_CHECKED
    assert claim_beats_prompted(strong_sweep(), "selfcest", "prompted", 300).status == NOT_CHECKED


def test_claim_b_is_not_checked_when_a_method_lacks_a_row_at_a_tested_budget() -> None:
    """A rival without its row at one budget has a frontier lower than its own there, so (b) cannot
    hold on it; selfcest without a row at a budget is not compared there either."""
    rows = strong_sweep() + [
        row("sc@8", b, a, g) for b, a, g in [(100, 0.1, 100), (200, 0.3, 190), (400, 0.9, 390)]
    ]
    rivals = [*ROLES["rivals"], "sc@8"]
    assert claim_frontier(rows, "selfcest", rivals, BUDGETS).status == FAILS  # sc@8 at 400: 90% > 80%
    hole = [r for r in rows if not (r["method"] == "sc@8" and r["budget"] == 400)]
    claim = claim_frontier(hole, "selfcest", rivals, BUDGETS)
    assert claim.status == NOT_CHECKED and "No row (missing): sc@8 at 400" in claim.detail
    ours_hole = [r for r in strong_sweep() if not (r["method"] == "selfcest" and r["budget"] == 400)]
    claim = claim_frontier(ours_hole, "selfcest", ROLES["rivals"], BUDGETS)
    assert claim.status == NOT_CHECKED and "budget 400" not in claim.detail.split(". No row")[0]


def test_claims_leave_out_rows_without_problems_and_name_them() -> None:
    """An empty cell's row (n = 0, NaN accuracy and tokens) counts as missing wherever it stands in
    the rows, instead of a NaN winning or losing comparisons by its place."""
    empty = dict(row("selfcest", 400, math.nan, math.nan, math.nan), n=0)
    for place in (0, -1):
        rows = [r for r in strong_sweep() if not (r["method"] == "selfcest" and r["budget"] == 400)]
        rows.insert(len(rows) if place == -1 else 0, empty)
        claims = check_claims(rows, roles=ROLES, budgets=BUDGETS, reference_budget=200)
        a, b, c, d = claims
        assert a.status == HOLDS and "+20.0 pts at budget 200" in a.detail  # 400's gap is not a NaN
        assert b.status == NOT_CHECKED and c.status == HOLDS and d.status == HOLDS
        assert all("Left out (no problems or no numbers): selfcest at 400" in x.detail for x in claims)


def test_claim_a_names_budgets_that_do_not_meet() -> None:
    rows = [r for r in strong_sweep() if r["method"] in ("selfcest", "base")]
    disjoint = [r for r in rows if (r["method"], r["budget"]) in {("selfcest", 100), ("base", 200)}]
    claim = claim_beats_base(disjoint, "selfcest", "base", 0.15)
    assert (
        claim.status == NOT_CHECKED and claim.detail == "no budget in common (selfcest: [100], base: [200])"
    )


def test_claim_c_asks_a_token_saving_of_at_least_min_token_saving_at_equal_accuracy() -> None:
    rows = [
        dict(r, accuracy=0.70, gen_tokens=170.27) if r["method"] == "prompted" and r["budget"] == 200 else r
        for r in strong_sweep()
    ]
    claim = claim_beats_prompted(rows, "selfcest", "prompted", 200)
    assert claim.status == FAILS and "170.0 generated tokens vs 70.0% with 170.3" in claim.detail
    assert "0.27 fewer tokens per problem is under the 1 asked" in claim.detail
    assert claim_beats_prompted(rows, "selfcest", "prompted", 200, min_token_saving=0.25).status == HOLDS


def test_settings_per_dataset() -> None:
    params = {
        "budgets": {"arithmetic": [400, 100, 200], "qa": [64]},
        "report": {"reference_budget": {"qa": 64}},
    }
    arithmetic, qa = settings_for(params, "arithmetic"), settings_for(params, "qa")
    assert (
        arithmetic.budgets == [100, 200, 400]
        and arithmetic.reference_budget == 200
        and arithmetic.auc_max_tokens == 400
    )
    assert qa.reference_budget == 64 and qa.auc_max_tokens == 64
    flat = settings_for({"budgets": [8, 16], "report": {"reference_budget": 8, "auc_max_tokens": 32}}, "math")
    assert flat.budgets == [8, 16] and flat.reference_budget == 8 and flat.auc_max_tokens == 32
    # A reference budget no cell runs at (budgets edited, the reference left behind) is refused.
    with pytest.raises(
        ValueError,
        match=r"reference_budget for math is 2048, which is not one of eval.budgets.math \[256, 512\]",
    ):
        settings_for(
            {"budgets": {"math": [512, 256]}, "report": {"reference_budget": {"math": 2048}}}, "math"
        )


def test_settings_refuse_budgets_that_are_not_positive_whole_numbers_or_repeat() -> None:
    """A budget of 0 (or below) ran a cell whose rows could generate nothing and put them in the
    report; 8.5 became 8 and a repeated budget ran twice, unnoticed. Each stops the cell (and the
    report) naming the setting."""
    for bad in ([0, 128], [-8, 128], [8.5, 128], [True, 128], ["64", 128]):
        with pytest.raises(ValueError, match=r"eval.budgets.qa must be positive whole numbers"):
            settings_for({"budgets": {"qa": bad}, "report": {"reference_budget": {"qa": 128}}}, "qa")
    with pytest.raises(ValueError, match=r"eval.budgets.qa lists \[128\] more than once"):
        settings_for({"budgets": {"qa": [128, 64, 128]}, "report": {}}, "qa")
    assert settings_for({"budgets": 64, "report": {}}, "qa").budgets == [64]  # one budget for all
    # 0 or false as the whole setting was read as "no budgets"; it is a budget, refused by name
    for bad in (0, False, {"qa": 0}):
        with pytest.raises(ValueError, match=r"eval.budgets.qa must be positive whole numbers"):
            settings_for({"budgets": bad, "report": {}}, "qa")
    assert settings_for({"report": {}}, "qa").budgets == []  # unset: no budgets (the cell refuses that)


# --------------------------------------------------------------------------- the report stage on synthetic cells
HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>"
# Problem i of every cell: its arithmetic expression (2, 2, 3 and 3 terms) and the clones it spawned.
EXPRESSIONS = ["3+4", "9 - 2", "8-6+1", "2*(3+1)"]
CLONES = [0.0, 2.0, 4.0, 3.0]


def _episode(answer: str, text: str) -> dict[str, Any]:
    clone = {
        "agent_id": "root/turn1_clone0",
        "role": "clone",
        "depth": 1,
        "parent_id": "root",
        "spawn_turn": 1,
        "task": f"Calculate {HOSTILE}",
        "context_keys": ["k<b>1</b>"],
        "requested_max_tokens": 24,
        "max_tokens": 24,
        "turns": [
            {
                "text": f"Answer: {HOSTILE}",
                "generated_tokens": 5,
                "granted_tokens": 24,
                "finish_reason": "stop",
            }
        ],
        "prompt_tokens": 30,
        "generated_tokens": 5,
        "critical_path_tokens": 5,
        "answer": HOSTILE,
        "status": "ok",
        "failure": None,
        "children": [],
    }
    root = {
        "agent_id": "root",
        "role": "root",
        "depth": 0,
        "parent_id": None,
        "spawn_turn": None,
        "task": "q",
        "context_keys": [],
        "requested_max_tokens": None,
        "max_tokens": 200,
        "turns": [
            {
                "text": "<tool_call>{}</tool_call>",
                "generated_tokens": 9,
                "granted_tokens": 160,
                "finish_reason": "stop",
            },
            {"text": text, "generated_tokens": 4, "granted_tokens": 160, "finish_reason": "stop"},
        ],
        "prompt_tokens": 50,
        "generated_tokens": 13,
        "critical_path_tokens": 18,
        "answer": answer,
        "status": "ok",
        "failure": None,
        "children": [[1]],
    }
    return {
        "task_id": "p",
        "sample_index": 0,
        "mode": "delegate",
        "budget": 200,
        "agents": [root, clone],
        "final_answer": answer,
        "final_text": text,
        "generated_tokens": 18,
        "total_tokens": 98,
        "critical_path_tokens": 18,
        "wall_seconds": 0.1,
        "num_tool_calls": 1,
        "num_clones": 1,
        "repairs": 0,
        "protocol_errors": [{"agent": "root", "kind": "bad_json", "detail": HOSTILE}],
        "budget_exhausted": False,
        "metadata": {},
    }


def write_cell(
    root: Path,
    dataset: str,
    split: str,
    checkpoint: str,
    rows: list[dict[str, Any]],
    *,
    status: str = "ok",
    weights: str | None = None,
    timing: dict[str, Any] | None = None,
) -> None:
    cell = root / dataset / split / checkpoint
    cell.mkdir(parents=True)
    payload = {
        "dataset": dataset,
        "split": split,
        "checkpoint": checkpoint,
        "weights_sha256": weights,
        "status": status,
        "methods": sorted({r["method"] for r in rows}),
        "rows": [{k: v for k, v in r.items() if k != "benchmark"} for r in rows],
    }
    if timing is not None:
        payload["timing"] = timing
    (cell / "rows.json").write_text(json.dumps(payload), encoding="utf-8")
    with gzip.open(cell / "episodes.jsonl.gz", "wt", encoding="utf-8") as handle:
        for r in rows:
            for i in range(4):
                record = {
                    "dataset": dataset,
                    "split": split,
                    "checkpoint": checkpoint,
                    "method": r["method"],
                    "budget": r["budget"],
                    "problem_id": f"{split}-{i}",
                    "question": f"Calculate the value of {EXPRESSIONS[i]}. {HOSTILE}"
                    if dataset == "arithmetic"
                    else f"Question {i} {HOSTILE}",
                    "golds": ["7"],
                    "answer": HOSTILE,
                    "correct": 0.0,
                    "f1": None,
                    "generated_tokens": 18.0,
                    "total_tokens": 98.0,
                    "critical_path_tokens": 18.0,
                    "latency_seconds": 0.1,
                    "clones": CLONES[i],
                    "protocol_error_rate": 1.0,
                    "extra": {"votes": [HOSTILE, None], "winner": 0},
                    "episodes": [_episode(HOSTILE, f"Answer: {HOSTILE}")],
                }
                handle.write(json.dumps(record) + "\n")


def _params(tmp_path: Path) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["eval"]["budgets"] = {"arithmetic": BUDGETS, "qa": BUDGETS}
    params["eval"]["report"].update(
        reference_budget=200, claim_splits=["arithmetic/ood", "qa/test"], trace_problems=2
    )
    params["eval"]["report"]["claim_methods"]["rivals"] = ["sc@4", "thinking", "noclone-grpo"]
    params["eval"]["splits"] = {"arithmetic": ["ood"], "qa": ["test"], "math": []}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return path


def test_a_misspelt_report_setting_stops_the_report_naming_it(tmp_path: Path) -> None:
    """Every `eval.report` setting is read with a default: `claim_min_gian: 0.10` judged claim (a)
    at 0.15 unnoticed."""
    from stages import report

    path = _params(tmp_path)
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert set(params["eval"]["report"]) <= set(report.REPORT_KEYS)  # params.yaml's own are all known
    params["eval"]["report"]["claim_min_gian"] = 0.10
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"eval.report: unknown key\(s\) \['claim_min_gian'\]"):
        report.main(["--params", str(path), "--cells", str(tmp_path / "cells"), "--out", str(out)])
    assert not out.exists()


def test_report_stage_on_synthetic_cells(tmp_path: Path) -> None:
    from stages import report

    cells = tmp_path / "cells"
    rows = strong_sweep()
    by_checkpoint: dict[str, list[dict[str, Any]]] = {}
    for r in rows:  # noclone-grpo's checkpoint is absent: its cells are missing
        if r["method"] != "noclone-grpo":
            by_checkpoint.setdefault(
                "selfcest_model" if r["method"] == "selfcest" else "warmup_model", []
            ).append(r)
    for checkpoint, cell_rows in by_checkpoint.items():
        write_cell(cells, "arithmetic", "ood", checkpoint, cell_rows)
    write_cell(cells, "arithmetic", "ood", "noclone_model", [], status="missing")
    qa_rows = [
        dict(r, dataset="qa", split="test", benchmark="qa/test", f1=r["accuracy"])
        for r in rows
        if r["method"] == "base"
    ]
    write_cell(cells, "qa", "test", "warmup_model", qa_rows)
    write_cell(
        cells, "qa", "test", "retired_model", [dict(r, method="retired") for r in qa_rows]
    )  # left the matrix
    # Synthetic QA records under the cells' problem ids: the report's type-guess floor covers the
    # evaluated problems only (test-0 guessed right, test-1..3 wrong; test-9 right, not evaluated).
    pool = generate_synthetic(5, {"test": {"count": 60, "extra_entities": 4}})["test"]
    right = [r for r in pool if type_guess_accuracy([r]) == 1.0]
    wrong = [r for r in pool if type_guess_accuracy([r]) == 0.0]
    chosen = [right[0], *wrong[:3], right[1]]
    qa_data = tmp_path / "qa_data"
    qa_data.mkdir()
    (qa_data / "test.jsonl").write_text(
        "".join(
            json.dumps(dict(r, id=pid)) + "\n"
            for r, pid in zip(chosen, ["test-0", "test-1", "test-2", "test-3", "test-9"], strict=True)
        ),
        encoding="utf-8",
    )
    out = tmp_path / "reports"
    report.main(
        [
            "--params",
            str(_params(tmp_path)),
            "--cells",
            str(cells),
            "--out",
            str(out),
            "--qa-data",
            str(qa_data),
        ]
    )

    with (out / "sweep.csv").open(newline="") as handle:
        table = list(csv.DictReader(handle))
    assert set(table[0]) >= REQUIRED_SWEEP_COLUMNS
    assert len(table) == len(rows) - 3 + len(qa_rows)  # no noclone-grpo, no stale `retired` cell
    assert (
        table[0]["dataset"] == "arithmetic" and table[0]["method"] == "base" and table[0]["budget"] == "100"
    )

    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"benchmarks", "claims", "paired"}
    arith = metrics["benchmarks"]["arithmetic/ood"]
    assert arith["reference_budget"] == 200 and arith["methods"]["selfcest"]["accuracy"] == 0.7
    assert 0.0 < arith["methods"]["base"]["auc"] < arith["methods"]["selfcest"]["auc"] < 1.0
    assert 0.0 < arith["methods"]["base"]["auc_critical"] < arith["methods"]["selfcest"]["auc_critical"] < 1.0
    # (b): noclone-grpo is missing; (a) and (c) hold with a caveat in their verdicts, (d) without
    assert metrics["claims"]["arithmetic/ood"] == {
        "a": 1,
        "c": 1,
        "d": 1,
        "a_weak": 1,
        "c_weak": 1,
        "d_weak": 0,
    }
    assert metrics["claims"]["qa/test"] == {}  # nothing to check without selfcest
    # (c)'s sign-test counts at the reference budget, for `selfcest spread` to pool; not (a)'s
    assert metrics["paired"] == {
        "arithmetic/ood": {"c": {"budget": 200, "for": 0, "against": 0}},
        "qa/test": {},
    }
    assert metrics["benchmarks"]["qa/test"]["type_guess_floor"] == 0.25
    assert "type_guess_floor" not in arith

    for name in ("arithmetic_ood", "qa_test"):
        png = out / "pareto" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Delegation by problem size, for the delegating methods only (prompted, selfcest): sizes 2 and 3
    # hold two problems each, with clones (0, 2) and (4, 3).
    with (out / "delegation_by_size.csv").open(newline="") as handle:
        delegation = [
            (r["dataset"], r["split"], r["method"], int(r["budget"]), int(r["size"]), int(r["n"]))
            + tuple(float(r[k]) for k in ("delegation_rate", "clones", "accuracy", "gen_tokens"))
            for r in csv.DictReader(handle)
        ]
    assert delegation == [
        ("arithmetic", "ood", method, budget, size, 2, rate, clones, 0.0, 18.0)
        for method in ("prompted", "selfcest")
        for budget in BUDGETS
        for size, rate, clones in ((2, 0.5, 1.0), (3, 1.0, 3.5))
    ]

    # Where the arithmetic answers went wrong: every cell's records placed, each wrong answer once.
    with (out / "arithmetic_failures.csv").open(newline="") as handle:
        anatomy = list(csv.DictReader(handle))
    assert anatomy and {r["split"] for r in anatomy} == {"ood"}
    for row in anatomy:
        assert int(row["wrong"]) == sum(int(row[kind]) for kind in FAILURE_KINDS)

    summary = (out / "summary.md").read_text()
    assert summary.count("## Where arithmetic answers go wrong") == 1 and summary.endswith("\n")
    missing_line = next(line for line in summary.splitlines() if line.startswith("- `arithmetic/ood`:"))
    assert "`noclone-grpo` (checkpoint `noclone_model` not found)" in missing_line  # missing, not a crash
    assert "`selfcest`" not in missing_line
    # The cells' episode records score every problem wrong, so the paired interval of (a)'s gap
    # (read from them, not from the rows' means) is [0, 0]: the verdict holds, within noise.
    assert (
        "(a) selfcest beats base by >= 15 accuracy points at a matched budget | HOLDS (gap within noise) "
        "| NOT CHECKED |" in summary
    )
    assert "at every budget tested | NOT CHECKED | NOT CHECKED |" in summary
    assert "`selfcest` (budget 400) at 80.0%" in summary
    assert summary.count("Type-guess floor: 25.0%") == 1  # under `qa/test` only

    page = (out / "traces.html").read_text()
    assert "<script" not in page.lower() and "<img" not in page.lower()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "root/turn1_clone0" in page and "k&lt;b&gt;1&lt;/b&gt;" in page and "max_tokens=24" in page
    assert page.count("<h3>") == 2 * 2  # two problems for each of the two benchmarks
    # Every method's record at the reference budget only, once per problem.
    assert set(re.findall(r"\(budget (\d+)\)", page)) == {"200"}
    headers = re.findall(r"<summary><b>([^<]+)</b> \(budget (\d+)\)", page)
    arithmetic_methods = ["base", "selfcest", "prompted", "thinking", "sc@4"]  # noclone-grpo is missing
    assert sorted(headers) == sorted([(m, "200") for m in arithmetic_methods] * 2 + [("base", "200")] * 2)
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing fetched


def test_problem_size_and_delegation_by_size() -> None:
    def arithmetic(expression: str) -> dict[str, Any]:
        return {"dataset": "arithmetic", "question": f"Calculate the value of {expression}."}

    assert problem_size(arithmetic("3+4-(2*5)")) == 4
    assert problem_size(arithmetic("12 - 3 + 4")) == 3
    assert problem_size(arithmetic("-3+4")) == 2  # a leading minus is a sign, not a term
    assert problem_size(arithmetic("7")) == 1
    assert problem_size({"dataset": "arithmetic", "question": "What is 3+4?"}) is None
    assert problem_size({"dataset": "qa", "question": "Who?", "num_hops": 3}) == 3
    assert problem_size({"dataset": "qa", "question": "Who?"}) is None

    def record(method: str, expression: str, clones: float, correct: float, **extra: Any) -> dict[str, Any]:
        return {
            **arithmetic(expression),
            "split": "ood",
            "method": method,
            "budget": 200,
            "clones": clones,
            "correct": correct,
            "generated_tokens": 10.0 * (clones + 1),
            **extra,
        }

    records = [
        record("prompted", "3+4", 0.0, 1.0),
        record("prompted", "5-1", 2.0, 0.0),
        record("prompted", "5-1+2", 3.0, 1.0, budget=100),
        record("prompted", "no question", 1.0, 1.0, question="What is 3+4?"),  # no size: left out
        record("base", "3+4", 1.0, 1.0),  # not a delegation method
    ]
    assert delegation_by_size(records, ["prompted", "selfcest"]) == [
        {
            "dataset": "arithmetic",
            "split": "ood",
            "method": "prompted",
            "budget": 100,
            "size": 3,
            "n": 1,
            "delegation_rate": 1.0,
            "clones": 3.0,
            "accuracy": 1.0,
            "gen_tokens": 40.0,
        },
        {
            "dataset": "arithmetic",
            "split": "ood",
            "method": "prompted",
            "budget": 200,
            "size": 2,
            "n": 2,
            "delegation_rate": 0.5,
            "clones": 1.0,
            "accuracy": 0.5,
            "gen_tokens": 20.0,
        },
    ]


def test_pareto_plot_draws_each_method_and_the_frontier_per_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: dict[str, list[tuple[matplotlib.axes.Axes, tuple[Any, ...], dict[str, Any]]]] = {
        "errorbar": [],
        "step": [],
    }

    def recording(name: str) -> Callable[..., Any]:
        original = getattr(matplotlib.axes.Axes, name)

        def wrapper(self: matplotlib.axes.Axes, *args: Any, **kwargs: Any) -> Any:
            calls[name].append((self, args, kwargs))
            return original(self, *args, **kwargs)

        return wrapper

    for name in calls:
        monkeypatch.setattr(matplotlib.axes.Axes, name, recording(name))
    rows = strong_sweep()
    order = ["selfcest", "base", "prompted", "thinking", "sc@4", "noclone-grpo"]
    path = tmp_path / "pareto" / "arithmetic_ood.png"
    plot_benchmark(list(reversed(rows)), "arithmetic/ood", path, method_order=order)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    panels = list(dict.fromkeys(ax for ax, _, _ in calls["errorbar"]))
    assert len(panels) == len(COSTS)
    for ax, cost in zip(panels, COSTS, strict=True):
        lines = [(kwargs["label"], args) for a, args, kwargs in calls["errorbar"] if a is ax]
        assert [label for label, _ in lines] == order  # one line per method, in the given order
        for method, (xs, ys) in lines:
            mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["budget"])
            assert list(xs) == [r[cost] for r in mine] and list(ys) == [r["accuracy"] for r in mine]
        steps = [args for a, args, _ in calls["step"] if a is ax]
        assert len(steps) == 1  # the frontier, drawn once per cost panel
        xs, ys = (list(v) for v in steps[0])
        assert xs[-1] == max(r[cost] for r in rows) and ys[-1] == 0.80  # held to the dearest point
        assert ys == sorted(ys) and len(xs) >= 2
    # Generated tokens by hand: selfcest's 40% at 90, 70% at 170 and 80% at 260 beat every cheaper point.
    xs, ys = next(args for ax, args, _ in calls["step"] if ax is panels[0])
    assert (list(xs), list(ys)) == ([90, 170, 260, 400], [0.40, 0.70, 0.80, 0.80])


def test_missing_methods_from_params() -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))["eval"]
    sweep = load_sweep(Path("/nonexistent"))
    assert sweep.rows == [] and sweep.cells == []
    missing = missing_methods(sweep, params)
    assert "agentic-rag" in missing["qa/test"] and "agentic-rag" not in missing["arithmetic/ood"]
    assert {"base", "selfcest", "selfcest-nogate", "noclone-grpo", "prompted"} <= set(
        missing["arithmetic/ood"]
    )


def test_claims_a_and_c_give_the_paired_interval_of_their_gap() -> None:
    """With per-problem outcomes, (a) and (c) report the paired bootstrap interval of the gap and the
    sign test; the verdicts stay on point estimates. A consistent 10-problem gain is significant but
    its interval reaches below (a)'s 15-point margin; a one-problem gap is noise."""
    problems = [f"p{i}" for i in range(40)]
    outcomes = {
        ("base", 400): {p: float(i < 22) for i, p in enumerate(problems)},  # 55%
        ("selfcest", 400): {p: float(i < 32) for i, p in enumerate(problems)},  # 80%: +10 on the same 22
        ("selfcest", 200): {p: float(i < 28) for i, p in enumerate(problems)},  # 70%
        ("prompted", 200): {p: float(i < 27) for i, p in enumerate(problems)},  # 67.5%: one problem less
    }
    claims = check_claims(
        strong_sweep(), roles=ROLES, budgets=BUDGETS, reference_budget=200, outcomes=outcomes
    )
    a, c = claims[0], claims[2]
    assert [x.status for x in claims] == [HOLDS] * 4  # the same verdicts as without outcomes
    assert a.caveat == BELOW_MARGIN and c.caveat == WITHIN_NOISE and c.verdict == f"{HOLDS} ({WITHIN_NOISE})"
    pattern = r"gap \[([-+\d.]+), ([-+\d.]+)\] pts; sign test over the (\d+) problems where they differ: (\d+) for, (\d+) against, p = ([\d.e-]+); 40 problems"
    low, high, differ, wins, losses, p_value = (float(v) for v in re.search(pattern, a.detail).groups())
    assert 0 < low < 15.0 and high >= 25.0  # every flip is a gain: above 0, not clearly above 15
    assert (differ, wins, losses) == (10, 10, 0) and p_value == pytest.approx(2 / 2**10, rel=1e-2)
    low, high, differ, wins, losses, p_value = (float(v) for v in re.search(pattern, c.detail).groups())
    assert low <= 0 < high and (differ, wins, losses, p_value) == (1, 1, 0, 1.0)  # one problem: noise
    without = check_claims(strong_sweep(), roles=ROLES, budgets=BUDGETS, reference_budget=200)
    assert "bootstrap" not in without[0].detail + without[2].detail
    # metrics.json keeps (c)'s counts at the reference budget for `selfcest spread` to pool, and
    # leaves out (a)'s, taken at the budget of the largest gap (chosen after the run)
    rows = [dict(r, dataset="arithmetic", split="ood", benchmark="arithmetic/ood") for r in strong_sweep()]
    sweep = Sweep(rows, cells=[])
    settings = {"arithmetic": Settings(budgets=list(BUDGETS), reference_budget=200, auc_max_tokens=400.0)}
    paired = build_metrics(sweep, settings=settings, claims={"arithmetic/ood": claims})["paired"]
    assert paired == {"arithmetic/ood": {"c": {"budget": 200, "for": 1, "against": 0}}}
    assert build_metrics(sweep, settings=settings, claims={"arithmetic/ood": without})["paired"] == {
        "arithmetic/ood": {}
    }


def test_paired_gap_pairs_problems_by_id() -> None:
    ours = {"a": 1.0, "b": 1.0, "c": 0.0, "only-ours": 1.0}
    theirs = {"a": 1.0, "b": 0.0, "c": 0.0, "only-theirs": 0.0}
    gap, low, high, n = paired_gap(ours, theirs, resamples=500, seed=1)
    assert n == 3 and gap == pytest.approx(1 / 3) and 0.0 <= low <= gap <= high <= 1.0
    assert paired_gap({"a": 1.0}, {"a": 1.0}) == (0.0, 0.0, 0.0, 1)
    gap, low, high, n = paired_gap({"a": 1.0}, {"b": 1.0})
    assert n == 0 and math.isnan(gap) and math.isnan(low) and math.isnan(high)


def test_summary_names_checkpoints_with_the_same_or_mixed_weights(tmp_path: Path) -> None:
    """A GRPO ablation whose gate never fired trains exactly as its reference run: the summary must
    say the two methods are one model, and must flag a checkpoint whose cells saw different weights."""
    rows = strong_sweep()
    cells = tmp_path / "cells"
    same, other = "ab" * 32, "cd" * 32
    for checkpoint, method, weights in (
        ("selfcest_model", "selfcest", same),
        ("selfcest_nogate_model", "base", same),  # stands in for selfcest-nogate
        ("warmup_model", "prompted", other),
    ):
        write_cell(
            cells,
            "arithmetic",
            "ood",
            checkpoint,
            [r for r in rows if r["method"] == method],
            weights=weights,
        )
    write_cell(cells, "arithmetic", "test", "warmup_model", [r for r in rows if r["method"] == "prompted"])
    sweep = load_sweep(cells)
    weights = checkpoint_weights(sweep)
    assert weights["warmup_model"]["weights_sha256"] == other  # a cell that recorded none changes nothing
    assert same_weight_groups(weights) == [["selfcest_model", "selfcest_nogate_model"]]
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))["eval"]
    settings = {dataset: settings_for(params, dataset) for dataset in ("arithmetic", "qa")}
    summary = summary_markdown(sweep, eval_params=params, settings=settings, claims={}, method_order=[])
    assert f"| `selfcest_model` | `{same[:16]}` | `selfcest` |" in summary
    assert (
        "- `selfcest_model` and `selfcest_nogate_model` hold byte-identical weights, so `selfcest` and "
        "`base` are one model measured twice" in summary
    )
    assert "measured on different weights" not in summary

    write_cell(
        cells,
        "qa",
        "test",
        "warmup_model",
        [dict(r, dataset="qa", split="test") for r in rows[:1]],
        weights=same,
    )
    weights = checkpoint_weights(load_sweep(cells))
    assert (
        weights["warmup_model"]["mixed"] == [other, same]
        and weights["warmup_model"]["weights_sha256"] is None
    )
    assert same_weight_groups(weights) == [["selfcest_model", "selfcest_nogate_model"]]
    summary = summary_markdown(
        load_sweep(cells), eval_params=params, settings=settings, claims={}, method_order=[]
    )
    assert "- `warmup_model`: its cells were measured on different weights" in summary


def test_claim_a_without_caveat_when_the_margin_is_clear() -> None:
    """A gap whose sign test is significant and whose paired interval stays above the margin is
    plain HOLDS; the same point gap from a few problems that differ is WITHIN_NOISE."""
    rows = [row("selfcest", 100, 0.9, 80), row("base", 100, 0.3, 90)]
    problems = [f"p{i}" for i in range(40)]
    clear = {
        ("selfcest", 100): {p: float(i < 36) for i, p in enumerate(problems)},
        ("base", 100): {
            p: float(i < 12) for i, p in enumerate(problems)
        },  # right on a subset: 24 for, 0 against
    }
    assert claim_beats_base(rows, "selfcest", "base", 0.15, clear).verdict == HOLDS
    few = {
        ("selfcest", 100): {"p0": 1.0, "p1": 1.0, "p2": 0.0},
        ("base", 100): {"p0": 0.0, "p1": 0.0, "p2": 0.0},
    }
    claim = claim_beats_base(rows, "selfcest", "base", 0.15, few)
    assert claim.status == HOLDS and claim.caveat == WITHIN_NOISE  # 2 for, 0 against: p = 0.5


def test_claim_d_at_the_floor_says_so() -> None:
    """(d) on a base level set by fewer right answers than `min_correct` holds with AT_FLOOR; the
    detail gives the count."""
    rows = [row("base", 100, 1 / 50, 90, 90), row("selfcest", 100, 2 / 50, 70, 60)]
    claim = claim_critical_path(rows, "selfcest", "base")
    assert claim.status == HOLDS and claim.caveat == AT_FLOOR and "(1 of 50 problems right)" in claim.detail
    assert claim_critical_path(rows, "selfcest", "base", min_correct=1).caveat == ""
    rows = [row("base", 100, 0.4, 90, 90), row("selfcest", 100, 0.5, 70, 60)]
    assert claim_critical_path(rows, "selfcest", "base").verdict == HOLDS
    # A failure against such a level says as little: selfcest right far more often, on a longer path
    # than a base that answers (mostly wrongly) at once.
    rows = [row("base", 100, 1 / 50, 14, 14), row("selfcest", 100, 0.9, 48, 48)]
    claim = claim_critical_path(rows, "selfcest", "base")
    assert claim.verdict == f"{FAILS} ({AT_FLOOR})"
    assert claim_critical_path(rows, "selfcest", "base", min_correct=1).verdict == FAILS


def test_claim_a_gives_what_each_method_spends_at_the_budget_of_its_gap() -> None:
    """A matched budget caps both alike; the detail says how many tokens each generated under it."""
    rows = [row("base", 256, 0.05, 53.7), row("selfcest", 256, 0.26, 137.85)]
    detail = claim_beats_base(rows, "selfcest", "base", 0.15).detail
    assert "there selfcest generates 137.8 tokens per problem, base 53.7 (2.57x)" in detail
    rows[0]["gen_tokens"] = 0.0
    assert "base 0.0." in claim_beats_base(rows, "selfcest", "base", 0.15).detail


def test_claim_d_asks_a_whole_token_of_saving() -> None:
    """(d) at base's accuracy with a fraction of a critical-path token fewer is not a shorter path: it
    fails and says why, with the tokens to one decimal; from `min_token_saving` fewer it holds."""
    rows = [row("base", 128, 9 / 200, 52.4, 52.4, n=200), row("selfcest", 128, 9 / 200, 110.0, 51.9, n=200)]
    claim = claim_critical_path(rows, "selfcest", "base")
    assert claim.status == FAILS
    assert "52.4 critical-path tokens" in claim.detail and "51.9 (-0.5)" in claim.detail
    assert "0.50 fewer critical-path tokens per problem is under the 1 asked" in claim.detail
    assert claim_critical_path(rows, "selfcest", "base", min_token_saving=0.5).status == HOLDS
    rows[1]["critical_tokens"] = 50.8
    assert claim_critical_path(rows, "selfcest", "base").status == HOLDS


def test_wilson_interval_and_sign_test() -> None:
    low, high = wilson_interval(0, 48)
    assert low == 0.0 and high == pytest.approx(0.0741, abs=1e-4)  # the bootstrap's would be [0, 0]
    low, high = wilson_interval(48, 48)
    assert high == pytest.approx(1.0) and low == pytest.approx(0.9259, abs=1e-4)
    low, high = wilson_interval(24, 48)
    assert low == pytest.approx(1 - high) and low == pytest.approx(0.3636, abs=1e-3)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    ours = {f"p{i}": 1.0 for i in range(6)} | {"q": 0.0, "tie": 1.0}
    theirs = {f"p{i}": 0.0 for i in range(6)} | {"q": 1.0, "tie": 1.0, "only-theirs": 1.0}
    wins, losses, p_value = sign_test(ours, theirs)
    assert (wins, losses) == (6, 1) and p_value == pytest.approx(2 * 8 / 128)  # exact binomial, two-sided
    assert sign_test({"a": 1.0}, {"a": 1.0}) == (0, 0, 1.0)


def test_report_stage_on_a_sweep_that_leaves_a_claim_splits_dataset_out(tmp_path: Path) -> None:
    """`eval.splits.arithmetic: []` (a QA-only sweep) with `arithmetic/ood` still a claim split: the
    claims there are not checked, and the stage writes its reports instead of stopping on a KeyError."""
    from stages import report

    params_path = _params(tmp_path)
    params = yaml.safe_load(params_path.read_text(encoding="utf-8"))
    params["eval"]["splits"]["arithmetic"] = []
    params_path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    cells = tmp_path / "cells"
    qa_rows = [
        dict(r, dataset="qa", split="test", benchmark="qa/test", f1=r["accuracy"])
        for r in strong_sweep()
        if r["method"] == "base"
    ]
    write_cell(cells, "qa", "test", "warmup_model", qa_rows)
    out = tmp_path / "reports"
    report.main(["--params", str(params_path), "--cells", str(cells), "--out", str(out)])
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["benchmarks"]) == {"qa/test"}
    assert metrics["claims"]["arithmetic/ood"] == {}
    assert "arithmetic/ood" in (out / "summary.md").read_text()


def test_a_method_without_numbers_has_no_frontier_area() -> None:
    """A method whose only cell is empty has no area: metrics.json leaves `auc` out (as it leaves
    `accuracy` out) instead of writing 0.0, which `dvc metrics diff` would show as a drop, and the
    summary's table says `-` and its ranking leaves it out."""
    from selfcest.reports import Settings, Sweep, build_metrics

    nan_numbers = dict.fromkeys(
        ["ci_low", "ci_high", "total_tokens", "seconds", "clones", "protocol_error_rate"], math.nan
    )
    rows = [row("base", 100, 0.5, 90)] + [
        {**row("selfcest", b, math.nan, math.nan, n=0), **nan_numbers} for b in (100, 200)
    ]
    sweep = Sweep(rows=rows, cells=[])
    settings = {"arithmetic": Settings([100, 200], 200, 200.0)}
    methods = build_metrics(sweep, settings=settings, claims={})["benchmarks"]["arithmetic/ood"]["methods"]
    assert methods["selfcest"] == {} and methods["base"]["auc"] == 0.275
    text = summary_markdown(
        sweep, eval_params={}, settings=settings, claims={}, method_order=["base", "selfcest"]
    )
    assert "| `selfcest` | - | - | - | - | - | - | - | - | - |" in text
    assert "Frontier area ranking (generated tokens): `base` 0.275." in text


def test_summary_ranks_frontier_areas_at_the_printed_precision() -> None:
    """Two areas that print alike are `=`, not `0.033 > 0.033`."""
    from selfcest.reports import Settings, Sweep

    rows = [row("a", 100, 0.0333, 0.1), row("b", 100, 0.0332, 0.1)]
    settings = {"arithmetic": Settings([100], 100, 100.0)}
    text = summary_markdown(
        Sweep(rows=rows, cells=[]), eval_params={}, settings=settings, claims={}, method_order=["a", "b"]
    )
    assert "`a` 0.033 = `b` 0.033" in text


def test_claims_a_and_d_are_not_settled_while_a_budget_lacks_its_row() -> None:
    """(a) asks for some budget and (d) for base's best point: while rows are missing, a gap short of
    the margin everywhere compared (or no matching selfcest point) is NOT CHECKED, naming the rows."""
    rows = [row("base", b, 0.05, 50.0) for b in BUDGETS] + [row("selfcest", 100, 0.06, 50.0)]
    a = claim_beats_base(rows, "selfcest", "base", 0.15, budgets=BUDGETS)
    assert a.status == NOT_CHECKED and "not settled without selfcest at 200, selfcest at 400" in a.detail
    assert claim_beats_base(rows, "selfcest", "base", 0.15).status == FAILS  # no budgets: the old rule
    settled = rows + [row("selfcest", b, 0.06, 50.0) for b in (200, 400)]
    assert claim_beats_base(settled, "selfcest", "base", 0.15, budgets=BUDGETS).status == FAILS
    d_rows = [row("base", b, 0.5, 40.0) for b in BUDGETS] + [row("selfcest", 100, 0.4, 30.0)]
    d = claim_critical_path(d_rows, "selfcest", "base", budgets=BUDGETS)
    assert d.status == NOT_CHECKED and "not settled without selfcest at 200, selfcest at 400" in d.detail
    base_hole = [r for r in settled if not (r["method"] == "base" and r["budget"] == 400)]
    base_hole = [
        dict(r, accuracy=0.5, critical_tokens=30.0) if r["method"] == "selfcest" else r for r in base_hole
    ]
    assert claim_critical_path(base_hole, "selfcest", "base").status == HOLDS
    d = claim_critical_path(base_hole, "selfcest", "base", budgets=BUDGETS)
    assert d.status == NOT_CHECKED and "not settled without base at 400" in d.detail


def test_claim_d_prints_a_change_that_adds_up_with_the_printed_counts() -> None:
    rows = [
        row("base", 128, 9 / 200, 52.42, 52.42, n=200),
        row("selfcest", 128, 9 / 200, 110.0, 50.75, n=200),
    ]
    claim = claim_critical_path(rows, "selfcest", "base")
    assert (
        claim.status == HOLDS
        and "52.4 critical-path tokens" in claim.detail
        and "50.8 (-1.6)" in claim.detail
    )


def test_claim_b_without_rivals_says_so() -> None:
    claim = claim_frontier(strong_sweep(), "selfcest", [], BUDGETS)
    assert (
        claim.status == NOT_CHECKED
        and claim.detail == "no rivals configured (eval.report.claim_methods.rivals)"
    )


def test_a_method_under_two_checkpoints_and_a_fractional_reference_budget_are_refused() -> None:
    from selfcest.reports import configured_cells

    models = {
        "warmup_model": {"base": {"mode": "monolithic"}},
        "noclone_model": {"base": {"mode": "monolithic"}},
    }
    with pytest.raises(ValueError, match=r"eval.models: .* base under warmup_model, noclone_model"):
        configured_cells({"models": models, "splits": {"arithmetic": ["ood"]}})
    for reference in (128.9, "128"):
        eval_params = {"budgets": {"qa": [64, 128]}, "report": {"reference_budget": {"qa": reference}}}
        with pytest.raises(ValueError, match="reference_budget for qa must be a whole number"):
            settings_for(eval_params, "qa")


def _summary_section(tmp_path: Path, cells: Path, out: Path, heading: str) -> str:
    """Run the report stage on `cells` into `out` and return one section of its summary."""
    from stages import report

    report.main(["--params", str(_params(tmp_path)), "--cells", str(cells), "--out", str(out)])
    summary = (out / "summary.md").read_text(encoding="utf-8")
    return summary.split(heading, 1)[1].split("\n## ", 1)[0]


def test_the_summary_gives_each_stages_recorded_wall_time(tmp_path: Path) -> None:
    """Where a run's time went, from what each stage recorded: the training stages' `stage_seconds`
    and each cell's import, load and run seconds, with the cells' totals. A stage or cell that
    recorded none says so rather than counting as zero seconds; a stale variant's file is not read."""
    cells = tmp_path / "cells"
    rows = [r for r in strong_sweep() if r["method"] == "base"]
    write_cell(
        cells, "arithmetic", "ood", "warmup_model", rows,
        timing={"import_seconds": 8.25, "load_seconds": 0.5, "run_seconds": 241.0},
    )  # fmt: skip
    write_cell(
        cells,
        "arithmetic",
        "ood",
        "selfcest_model",
        rows,
        timing={"import_seconds": 7.75, "run_seconds": 1234},
    )
    out = tmp_path / "reports"
    out.mkdir()
    (out / "warmup.json").write_text(json.dumps({"stage_seconds": 1607.94}), encoding="utf-8")
    (out / "grpo_noclone.json").write_text(
        json.dumps({"stage_seconds": "38"}), encoding="utf-8"
    )  # not a number
    (out / "grpo_retired.json").write_text(
        json.dumps({"stage_seconds": 5.0}), encoding="utf-8"
    )  # not a variant
    section = _summary_section(tmp_path, cells, out, "## Stage times")
    assert "| warmup | 1,607.9 |" in section
    assert "| train_grpo@noclone | not recorded |" in section
    assert "| train_grpo@selfcest | not recorded |" in section  # no file at all
    assert "retired" not in section
    assert "| `arithmetic/ood` `warmup_model` | 8.2 | 0.5 | 241.0 |" in section
    assert "| `arithmetic/ood` `selfcest_model` | 7.8 | not recorded | 1,234.0 |" in section
    assert "| all 2 cells | 16.0 | 0.5 | 1,475.0 |" in section


def test_the_summary_names_the_machines_the_training_and_the_cells_ran_on(tmp_path: Path) -> None:
    """The same seed trains other weights on an Intel CPU than on an AMD one, so the summary says
    where each training stage ran (its metrics file's `machine`) and where the cells ran; a stage
    that recorded none is `not recorded`, and a stale variant's file is not read."""
    intel = {"cpu_vendor": "GenuineIntel", "cpu_model": "Xeon", "cpu_kernels": "avx2", "torch": "2.13.0"}
    amd = dict(intel, cpu_vendor="AuthenticAMD", cpu_model="EPYC")
    cells = tmp_path / "cells"
    rows = [r for r in strong_sweep() if r["method"] == "base"]
    write_cell(cells, "arithmetic", "ood", "warmup_model", rows, timing={"machine": amd})
    h200 = dict(amd, gpu="NVIDIA H200")  # a cell on a GPU names its card: its wall times are that card's
    write_cell(cells, "arithmetic", "ood", "selfcest_model", rows, timing={"machine": h200})
    out = tmp_path / "reports"
    out.mkdir()
    (out / "warmup.json").write_text(json.dumps({"steps": 3, "machine": intel}), encoding="utf-8")
    (out / "grpo_noclone.json").write_text(json.dumps({"steps": 3}), encoding="utf-8")  # an older file
    (out / "grpo_retired.json").write_text(json.dumps({"machine": amd}), encoding="utf-8")  # not a variant
    section = _summary_section(tmp_path, cells, out, "## Machines")
    assert "- warmup: `GenuineIntel` `Xeon`, ATen kernels `avx2`, torch 2.13.0" in section
    assert "- train_grpo@noclone: not recorded" in section
    assert "- train_grpo@selfcest: not recorded" in section  # no file at all
    assert "retired" not in section
    assert (
        "- evaluation cells: `AuthenticAMD` `EPYC`, ATen kernels `avx2`, torch 2.13.0; "
        "`AuthenticAMD` `EPYC`, ATen kernels `avx2`, torch 2.13.0, GPU `NVIDIA H200`"
    ) in section
