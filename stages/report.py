"""Stage report: the sweep's reports, computed from every eval cell under artifacts/eval.

Outputs (in `reports/` unless `--out` says otherwise):

  sweep.csv            one row per (benchmark, method, budget); DVC plots of accuracy vs each cost
  metrics.json         per benchmark and method: accuracy at the reference budget and frontier area;
                       per claim benchmark: 1/0 per checked claim (for `dvc metrics diff`)
  pareto/<dataset>_<split>.png   static Pareto plots (matplotlib, Agg)
  summary.md           tables, frontier ownership and the four claims, all computed
  traces.html          a self-contained trace viewer (no scripts, no external files)

Cells that are absent (a checkpoint not in eval.models, a `missing` checkpoint) are reported as
missing; they never fail the stage.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python stages/report.py` works too

from selfcest.param_checks import int_setting  # noqa: E402
from stages.common import PARAMS_FILE, load_params, read_jsonl, setup_logging, write_json  # noqa: E402

log = logging.getLogger("report")

# The settings under `eval.report`; each is read with a default, so a misspelt one (`claim_min_gian`)
# would judge the claims at the default unnoticed: any other key stops the stage.
REPORT_KEYS = (
    "reference_budget",
    "auc_max_tokens",
    "trace_problems",
    "claim_splits",
    "claim_min_gain",
    "claim_min_correct",
    "claim_min_token_saving",
    "claim_methods",
    "delegation_methods",
)


def sweep_episode_records(sweep: Any) -> list[dict[str, Any]]:
    """Every cell's per-problem records (`episodes.jsonl.gz`), read once for the analyses below."""
    from selfcest.reports import episode_records

    records: list[dict[str, Any]] = []
    for directory in sweep.cell_dirs.values():
        records.extend(episode_records(directory / "episodes.jsonl.gz"))
    return records


def write_csv(rows: list[dict[str, Any]], fields: list[str], path: Path) -> None:
    import csv

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def write_delegation_by_size(records: list[dict[str, Any]], report: dict, path: Path) -> None:
    """Delegation rate and clones per problem by problem size, before (prompted) and after RL."""
    from selfcest.analysis import delegation_by_size

    methods = report.get("delegation_methods") or ["prompted", "selfcest", "selfcest-nogate"]
    fields = [
        "dataset",
        "split",
        "method",
        "budget",
        "size",
        "n",
        "delegation_rate",
        "clones",
        "accuracy",
        "gen_tokens",
    ]
    write_csv(delegation_by_size(records, methods), fields, path)


def write_failure_anatomy(records: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """Where each method's wrong arithmetic answers first went wrong, per split and budget."""
    from selfcest.analysis import FAILURE_KINDS, failure_anatomy

    rows = failure_anatomy(records)
    fields = ["split", "method", "budget", "n", "wrong", "wrong_alone", *FAILURE_KINDS]
    for kind in ("part_steps", "combine_steps", "wide_combine_steps"):
        fields += [kind, f"{kind}_right"]
    write_csv(rows, fields, path)
    return rows


def type_guess_floors(sweep: Any, qa_data: Path) -> dict[str, float]:
    """Per synthetic QA benchmark, the type-guess floor over the problems its cells evaluated (a
    seeded subset of the split file, so the whole split's figure in qa_validation.json can differ)."""
    from selfcest.data.qa import type_guess_accuracy
    from selfcest.reports import load_outcomes

    floors: dict[str, float] = {}
    for name in sweep.benchmarks():
        dataset, split = name.split("/", 1)
        path = qa_data / f"{split}.jsonl"
        if dataset != "qa" or not path.exists():
            continue
        evaluated = {pid for per_problem in load_outcomes(sweep, name).values() for pid in per_problem}
        floor = type_guess_accuracy(r for r in read_jsonl(path) if r["id"] in evaluated)
        if floor is not None:
            floors[name] = floor
    return floors


def training_reports(folder: Path, params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{stage: its metrics file as a mapping} for the warm-up and each GRPO variant; a file that is
    missing, unreadable or not a mapping gives {}. Files of variants no longer in params are not
    read: they are stale."""
    files = {"warmup": folder / "warmup.json"} | {
        f"train_grpo@{variant}": folder / f"grpo_{variant}.json"
        for variant in (params.get("grpo") or {}).get("variants") or {}
    }
    found: dict[str, dict[str, Any]] = {}
    for stage, path in files.items():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = None
        found[stage] = record if isinstance(record, dict) else {}
    return found


def training_machines(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """{stage: the machine its metrics file recorded}, None where it recorded none (a warm-up
    skipped for `model.init_from`, an older file)."""
    return {
        stage: r.get("machine") if isinstance(r.get("machine"), dict) else None
        for stage, r in records.items()
    }


def training_seconds(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{stage: the wall time its metrics file recorded (`stage_seconds`)}, as recorded: the report
    shows anything but a number as "not recorded" (`selfcest.reports.recorded_seconds`)."""
    return {stage: r.get("stage_seconds") for stage, r in records.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=PARAMS_FILE)
    parser.add_argument("--cells", type=Path, default=Path("artifacts/eval"))
    parser.add_argument("--out", type=Path, default=Path("reports"))
    parser.add_argument(
        "--qa-data", type=Path, default=Path("data/qa"), help="QA split files, for the type-guess floor"
    )
    parser.add_argument(
        "--training-reports",
        type=Path,
        default=None,
        help="folder of the training stages' metrics files (warmup.json, grpo_<variant>.json), "
        "for the machines they ran on; default: --out, where the pipeline writes both",
    )
    args = parser.parse_args(argv)
    setup_logging()

    from selfcest import reports
    from selfcest.analysis import failure_anatomy_markdown
    from selfcest.param_checks import check_keys

    params = load_params(args.params)
    eval_params = params["eval"]
    report = eval_params.get("report") or {}
    check_keys("eval.report", report, REPORT_KEYS)
    method_order = list(
        dict.fromkeys(m for methods in (eval_params.get("models") or {}).values() for m in (methods or {}))
    )

    sweep = reports.load_sweep(args.cells, reports.configured_cells(eval_params))
    sweep.rows = reports.sort_rows(sweep.rows, method_order, reports.expected_benchmarks(eval_params))
    splits = eval_params.get("splits") or {}
    # A claim split whose dataset the sweep leaves out (`eval.splits.arithmetic: []`) has no rows:
    # its claims are reported as not checked, with that dataset's settings, not a KeyError.
    claim_datasets = (name.split("/", 1)[0] for name in report.get("claim_splits") or [])
    datasets = dict.fromkeys(
        [*(d for d, names in splits.items() if names), *(r["dataset"] for r in sweep.rows), *claim_datasets]
    )
    settings = {dataset: reports.settings_for(eval_params, dataset) for dataset in datasets}
    claims = {
        name: reports.check_claims(
            sweep.for_benchmark(name),
            roles=report.get("claim_methods") or {},
            budgets=settings[name.split("/", 1)[0]].budgets,
            reference_budget=settings[name.split("/", 1)[0]].reference_budget,
            min_gain=float(report.get("claim_min_gain", 0.15)),
            outcomes=reports.load_outcomes(sweep, name),
            resamples=int((eval_params.get("sweep") or {}).get("bootstrap_resamples", 1000)),
            min_correct=int(report.get("claim_min_correct", 5)),
            min_token_saving=float(report.get("claim_min_token_saving", 1.0)),
        )
        for name in report.get("claim_splits") or []
    }

    floors = type_guess_floors(sweep, args.qa_data)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    reports.write_sweep_csv(sweep.rows, out / "sweep.csv")
    write_json(
        out / "metrics.json",
        reports.build_metrics(sweep, settings=settings, claims=claims, floors=floors),
    )
    plots = out / "pareto"
    if plots.exists():
        shutil.rmtree(plots)  # no stale plots of splits that left the sweep
    plots.mkdir(parents=True)
    for name in sweep.benchmarks():
        reports.plot_benchmark(
            sweep.for_benchmark(name), name, plots / f"{name.replace('/', '_')}.png", method_order
        )
    records = sweep_episode_records(sweep)
    anatomy = write_failure_anatomy(records, out / "arithmetic_failures.csv")
    trained = training_reports(args.training_reports or out, params)
    summary = reports.summary_markdown(
        sweep,
        eval_params=eval_params,
        settings=settings,
        claims=claims,
        method_order=method_order,
        floors=floors,
        training_machines=training_machines(trained),
        training_seconds=training_seconds(trained),
    )
    arithmetic = settings.get("arithmetic")
    anatomy_section = failure_anatomy_markdown(
        anatomy, arithmetic.reference_budget if arithmetic else None, method_order
    )
    (out / "summary.md").write_text(
        summary.rstrip("\n") + ("\n\n" + anatomy_section if anatomy_section else "") + "\n", encoding="utf-8"
    )
    (out / "traces.html").write_text(
        reports.traces_html(
            sweep,
            problems_per_benchmark=int_setting(
                report.get("trace_problems", 3), "eval.report.trace_problems", minimum=0
            ),
            settings=settings,
            method_order=method_order,
        ),
        encoding="utf-8",
    )
    write_delegation_by_size(records, report, out / "delegation_by_size.csv")
    for name, items in claims.items():
        for claim in items:
            log.info("%s (%s): %s", name, claim.key, claim.verdict)
    log.info("report: %d rows from %d cells -> %s", len(sweep.rows), len(sweep.cells), out)


if __name__ == "__main__":
    main()
