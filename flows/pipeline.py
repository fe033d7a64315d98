"""Prefect flow that runs the DVC pipeline stage by stage, with retries.

Each DVC stage (matrix cells included) becomes one Prefect task that runs
`dvc repro --single-item <stage>`, in the dependency order of `dvc.yaml`. DVC still decides what
actually reruns: a stage whose deps, params and outs are unchanged is skipped by DVC, so a second
flow run does no work. The flow only orchestrates; it imports nothing from the library.

    python flows/pipeline.py                      # run once (ephemeral Prefect API)
    python flows/pipeline.py --stages build_model # run a subset (and what it needs, in order)
    python flows/pipeline.py --serve --cron "0 3 * * *"   # a scheduled deployment; needs `prefect server start`
    python flows/pipeline.py --serve --interval 3600      # or every hour
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx
from dvc.repo import Repo
from prefect import flow, get_run_logger, task

REPO_ROOT = Path(__file__).resolve().parent.parent


def stage_order(repo_dir: Path, targets: list[str] | None = None) -> list[str]:
    """DVC stage names in dependency order (every stage after the stages it depends on)."""
    with Repo(str(repo_dir)) as repo:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        if targets:
            wanted: set = set()
            for stage in graph.nodes:
                if stage.name in targets:
                    wanted |= {stage, *nx.descendants(graph, stage)}
            graph = graph.subgraph(wanted)
        # Names (not `addressing`, which is relative to the caller's cwd): this project keeps one dvc.yaml.
        return [stage.name for stage in nx.lexicographical_topological_sort(graph.reverse(), key=str)]


@task(retries=2, retry_delay_seconds=10, task_run_name="dvc-repro-{stage}")
def repro_stage(stage: str, repo_dir: str) -> str:
    """Run one DVC stage; DVC skips it when nothing it depends on changed."""
    logger = get_run_logger()
    command = [sys.executable, "-m", "dvc", "repro", "--single-item", stage]
    logger.info("running %s in %s", " ".join(command), repo_dir)
    completed = subprocess.run(command, cwd=repo_dir, capture_output=True, text=True, env=os.environ.copy())
    for line in completed.stdout.splitlines()[-20:]:
        logger.info(line)
    if completed.returncode != 0:
        logger.error(completed.stderr[-4000:])
        raise RuntimeError(f"dvc repro {stage} failed with exit code {completed.returncode}")
    return completed.stdout


@flow(name="selfcest-pipeline", log_prints=True)
def pipeline(repo_dir: str = str(REPO_ROOT), stages: list[str] | None = None) -> dict[str, str]:
    """Every DVC stage in order; a stage starts only after the stages before it succeeded."""
    outputs: dict[str, str] = {}
    for stage in stage_order(Path(repo_dir), stages):
        outputs[stage] = repro_stage(stage, repo_dir)
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", default=str(REPO_ROOT))
    parser.add_argument("--stages", nargs="*", help="only these stages and what they depend on")
    parser.add_argument(
        "--serve", action="store_true", help="serve a scheduled deployment (needs a Prefect server)"
    )
    schedule = parser.add_mutually_exclusive_group()
    schedule.add_argument("--cron", help="schedule for --serve (default: 0 3 * * *, nightly at 03:00)")
    schedule.add_argument("--interval", type=float, help="schedule for --serve: every this many seconds")
    parser.add_argument("--name", default="selfcest-nightly", help="the deployment's name for --serve")
    args = parser.parse_args()
    if args.serve:
        when = {"interval": args.interval} if args.interval else {"cron": args.cron or "0 3 * * *"}
        pipeline.serve(name=args.name, parameters={"repo_dir": args.repo, "stages": args.stages}, **when)
    else:
        pipeline(repo_dir=args.repo, stages=args.stages)


if __name__ == "__main__":
    main()
