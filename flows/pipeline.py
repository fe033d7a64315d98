"""Prefect flow that runs the DVC pipeline stage by stage, with retries.

Each DVC stage (matrix cells included) becomes one Prefect task that runs
`dvc repro --single-item <stage>`, in the dependency order of `dvc.yaml`. DVC still decides what
actually reruns: a stage whose deps, params and outs are unchanged is skipped by DVC, so a second
flow run does no work. The flow only orchestrates; it imports nothing from the library.

    python flows/pipeline.py                      # run once (ephemeral Prefect API)
    python flows/pipeline.py --stages build_model # run a subset (and what it needs, in order)
    # a scheduled deployment: schedules fire only on a real server (`prefect server start` in
    # another shell), so --serve refuses to run without PREFECT_API_URL
    PREFECT_API_URL=http://127.0.0.1:4200/api python flows/pipeline.py --serve --cron "0 3 * * *"
    PREFECT_API_URL=http://127.0.0.1:4200/api python flows/pipeline.py --serve --interval 3600

A served deployment runs one flow run at a time: a run that comes due while the last one is still
running waits for it (two `dvc repro` in one repo would fail on DVC's lock). `--stage-timeout
SECONDS` stops (and fails) a stage that runs longer, with the processes it started.

Each stage's output (DVC's and the stage's own log) reaches the Prefect log line by line as it is
written, so a long warm-up shows its progress while it runs.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from datetime import UTC, datetime, timedelta
from pathlib import Path

import networkx as nx
from dvc.exceptions import NotDvcRepoError
from dvc.repo import Repo
from dvc.stage import PipelineStage
from prefect import flow, get_run_logger, task
from prefect.schedules import Cron, Interval

REPO_ROOT = Path(__file__).resolve().parent.parent


def stage_order(repo_dir: Path, targets: list[str] | None = None) -> list[str]:
    """DVC stage names in dependency order (every stage after the stages it depends on). `targets`:
    only these stages, or stage groups (`train_grpo` for every `train_grpo@...`), and what they need;
    a name that is neither is refused, so a typo never runs nothing and reports success."""
    with Repo(str(repo_dir)) as repo:
        # Repo() searches upward, but `dvc repro` runs in repo_dir itself: from a subfolder every
        # stage would fail (and be retried), so a folder that is not the root is refused here.
        if Path(repo.root_dir).resolve() != Path(repo_dir).resolve():
            raise ValueError(
                f"{repo_dir} is inside the DVC repository {repo.root_dir}, not its root: "
                f"pass --repo {repo.root_dir}"
            )
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        # The stages of dvc.yaml only: the graph also holds the stage of every `.dvc` file (`dvc add`,
        # `dvc import-url` into data/sources/), which has no name and which `dvc repro` leaves alone.
        graph = graph.subgraph([stage for stage in graph.nodes if isinstance(stage, PipelineStage)])
        if targets is not None:
            names = {stage.name for stage in graph.nodes}
            groups = {name.split("@")[0] for name in names}
            unknown = [t for t in targets if t not in names and t not in groups]
            if unknown or not targets:
                raise ValueError(
                    f"{repo_dir}/dvc.yaml has no stage or stage group {unknown or targets}; "
                    f"its stage groups: {', '.join(sorted(groups))}"
                )
            wanted: set = set()
            for stage in graph.nodes:
                if stage.name in targets or stage.name.split("@")[0] in targets:
                    wanted |= {stage, *nx.descendants(graph, stage)}
            graph = graph.subgraph(wanted)
        # Names (not `addressing`, which is relative to the caller's cwd): this project keeps one dvc.yaml.
        return [stage.name for stage in nx.lexicographical_topological_sort(graph.reverse(), key=str)]


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """End a stage's process group (dvc and the stage it runs) if it is still running: SIGTERM, then
    SIGKILL after 10 s."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


@task(retries=2, retry_delay_seconds=10, task_run_name="dvc-repro-{stage}")
def repro_stage(stage: str, repo_dir: str, timeout_s: float | None = None) -> str:
    """Run one DVC stage; DVC skips it when nothing it depends on changed. Returns its output.

    `timeout_s`: a stage still running after this many seconds is stopped (its whole process group)
    and fails, so that a hung stage does not hold DVC's lock, and every scheduled run behind it, for
    ever. The stage also stops when this task ends any other way (an error, Ctrl-C)."""
    logger = get_run_logger()
    command = [sys.executable, "-m", "dvc", "repro", "--single-item", stage]
    logger.info("running %s in %s", " ".join(command), repo_dir)
    # The stages' commands are `python -m stages...`: this interpreter's environment must come first
    # on PATH, or a flow started as `.venv/bin/python flows/pipeline.py` runs them on another Python.
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    lines: deque[str] = deque(maxlen=2000)
    timed_out = threading.Event()
    # A session of its own: the stage and what it starts are one process group, stopped together.
    with subprocess.Popen(
        command,
        cwd=repo_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    ) as process:
        watchdog = None
        if timeout_s is not None:
            watchdog = threading.Timer(timeout_s, lambda: (timed_out.set(), _stop_group(process)))
            watchdog.daemon = True
            watchdog.start()
        try:
            assert process.stdout is not None
            # Lines end at "\n" only: text mode's universal newlines would also end one at every "\r"
            # a progress bar writes, and log each refresh of the warm-up's bar as a line of its own.
            output = io.TextIOWrapper(process.stdout, encoding="utf-8", errors="replace", newline="\n")
            for raw in output:
                # A progress bar's last state; a trailing "\r" (a CRLF line, a bar's final refresh)
                # first, or the text before it would be lost.
                line = raw.rstrip("\n").rstrip("\r").rsplit("\r", 1)[-1]
                lines.append(line)
                logger.info(line)
            process.wait()
        finally:
            if watchdog is not None:
                watchdog.cancel()
            _stop_group(process)
    if timed_out.is_set():
        raise TimeoutError(
            f"dvc repro {stage} was still running after {timeout_s:g} s and was stopped; its last lines:\n"
            + "\n".join(list(lines)[-20:])
        )
    if process.returncode != 0:
        raise RuntimeError(
            f"dvc repro {stage} failed with exit code {process.returncode}; its last lines:\n"
            + "\n".join(list(lines)[-20:])
        )
    return "\n".join(lines)


@flow(name="selfcest-pipeline", log_prints=True)
def pipeline(
    repo_dir: str = str(REPO_ROOT), stages: list[str] | None = None, stage_timeout_s: float | None = None
) -> dict[str, str]:
    """Every DVC stage in order; a stage starts only after the stages before it succeeded.
    `stage_timeout_s`: each stage's limit (none by default; `repro_stage`)."""
    outputs: dict[str, str] = {}
    for stage in stage_order(Path(repo_dir), stages):
        outputs[stage] = repro_stage(stage, repo_dir, stage_timeout_s)
    return outputs


def _check_stages(parser: argparse.ArgumentParser, repo_dir: Path, stages: list[str] | None) -> None:
    """Exit with a usage error (status 2) when `repo_dir` is not a DVC repository's root or `stages`
    names no stage or stage group of its dvc.yaml."""
    try:
        stage_order(repo_dir, stages)
    except ValueError as exc:  # names the repo and the stage groups itself
        parser.error(str(exc))
    except NotDvcRepoError as exc:  # DVC's message does not say which folder it searched from
        parser.error(f"--repo {repo_dir}: {exc}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", default=str(REPO_ROOT))
    parser.add_argument(
        "--stages", nargs="+", help="only these stages or stage groups, and what they depend on"
    )
    parser.add_argument(
        "--serve", action="store_true", help="serve a scheduled deployment (needs a Prefect server)"
    )
    schedule = parser.add_mutually_exclusive_group()
    schedule.add_argument(
        "--cron", help="schedule for --serve, in UTC (default: 0 3 * * *, nightly at 03:00 UTC)"
    )
    schedule.add_argument(
        "--interval", type=float, help="schedule for --serve: every this many seconds, on round times"
    )
    parser.add_argument("--name", help="the deployment's name for --serve (default: selfcest-nightly)")
    parser.add_argument(
        "--stage-timeout",
        type=float,
        help="stop a stage (and fail it) after this many seconds (default: no limit; the default "
        "profile's longest stage, the warm-up, takes about 20 minutes on two cores)",
    )
    args = parser.parse_args()
    if args.stage_timeout is not None and not 0 < args.stage_timeout < float("inf"):
        parser.error(f"--stage-timeout must be a positive number of seconds, got {args.stage_timeout}")
    if not args.serve:
        given = [f"--{flag}" for flag in ("cron", "interval", "name") if getattr(args, flag) is not None]
        if given:  # else the whole pipeline would start now instead of on a schedule
            parser.error(f"{', '.join(given)}: for --serve only (without it the pipeline runs once, now)")
        # A mistyped stage or repo is a usage error, checked before the flow starts: inside it, it
        # started Prefect's temporary server, recorded a failed flow run and printed two tracebacks.
        _check_stages(parser, Path(args.repo), args.stages)
        pipeline(repo_dir=args.repo, stages=args.stages, stage_timeout_s=args.stage_timeout)
        return
    if args.interval is not None and args.interval <= 0:
        parser.error(f"--interval must be positive, got {args.interval}")
    try:  # a bad --cron is a usage error, reported before the DVC repo is loaded
        when = (
            # Anchored on a round time, so `--interval 3600` runs on the hour, not an hour after serving.
            Interval(timedelta(seconds=args.interval), anchor_date=datetime(2020, 1, 1, tzinfo=UTC))
            if args.interval is not None
            else Cron(args.cron or "0 3 * * *")
        )
    except (ValueError, OverflowError) as exc:  # a bad cron string; an --interval of nan or inf
        given = f"--interval {args.interval}" if args.interval is not None else f"--cron {args.cron!r}"
        parser.error(f"{given}: {exc}")
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        # Without it Prefect serves on a private ephemeral API whose scheduler never runs: the
        # process would wait for ever and no scheduled run would start.
        parser.error(
            "--serve needs a Prefect server: start one (`prefect server start`) and set "
            "PREFECT_API_URL, e.g. http://127.0.0.1:4200/api (see README)"
        )
    repo_dir = Path(args.repo).resolve()  # stored in the deployment: relative to nothing at run time
    _check_stages(parser, repo_dir, args.stages)  # a wrong repo or stage stops here, not at the first run
    pipeline.serve(
        name=args.name or "selfcest-nightly",
        parameters={"repo_dir": str(repo_dir), "stages": args.stages, "stage_timeout_s": args.stage_timeout},
        schedules=[when],
        limit=1,  # one run at a time: a run due while another runs waits for it
    )


if __name__ == "__main__":
    main()
