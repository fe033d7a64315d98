"""The whole pipeline end to end: `scripts/smoke.py` runs the real dvc.yaml with the smoke profile
(`profiles/smoke.yaml`) as `dvc exp run -S` overrides in a throwaway copy of this checkout.

The stage tests each run one stage on hand-made inputs; this is the one test in which every stage
reads what the stages before it wrote (data -> tokenizer and model -> warm-up -> GRPO -> 16 sweep
cells -> reports), as `dvc repro` runs them, and then runs them all again through the Prefect
flow, to check that one seed gives the same outputs."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from scripts.smoke import SmokeError, copy_working_tree, prepare_copy, smoke
from selfcest.hashing import file_sha256
from tests.benchmark_paths import BENCHMARKS
from tests.dvc_clone import dvc, git, isolated_dvc

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# sweep.csv's columns that are this machine's wall time; every other one is reproducible from the seed.
WALL_CLOCK_COLUMNS = {"seconds", "latency_seconds"}


def _locked_outputs(lock: Path) -> dict[str, str]:
    """Every output's path -> its hash, as dvc.lock records them."""
    stages = OmegaConf.to_container(OmegaConf.load(lock))["stages"]
    return {out["path"]: out["md5"] for stage in stages.values() for out in stage.get("outs", [])}


def _sweep_without_wall_clock(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [
            {k: v for k, v in row.items() if k not in WALL_CLOCK_COLUMNS} for row in csv.DictReader(handle)
        ]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_smoke_profile_runs_every_stage_through_dvc_and_again_through_the_flow_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolated_dvc(tmp_path, monkeypatch)
    untouched = {name: file_sha256(REPO / name) for name in ("dvc.lock", "params.yaml", "reports/sweep.csv")}
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "smoke.py"),
            str(tmp_path / "work"),
            "--shared",
            str(BENCHMARKS.parent.parent),
        ],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    assert "smoke: the pipeline ran in" in completed.stdout
    copy = tmp_path / "work" / "selfcest"

    # The checkout itself is left alone.
    assert {name: file_sha256(REPO / name) for name in untouched} == untouched

    # DVC applied the profile: `dvc params diff` in the copy shows its values against the commit.
    diff = subprocess.run(
        [sys.executable, "-m", "dvc", "params", "diff", "--json"],
        cwd=copy,
        capture_output=True,
        text=True,
        check=True,
    )
    changed = json.loads(diff.stdout)["params.yaml"]
    assert (changed["warmup.max_steps"]["old"], changed["warmup.max_steps"]["new"]) == (12000, 30)
    assert (changed["grpo.training.max_steps"]["old"], changed["grpo.training.max_steps"]["new"]) == (24, 2)

    # Every method of every checkpoint on every split at every budget of the profile: one row each.
    params = OmegaConf.load(copy / "params.yaml")
    methods = {name: spec for models in params.eval.models.values() for name, spec in models.items()}
    expected = {
        (dataset, split, method, budget)
        for dataset in ("arithmetic", "qa")
        for split in params.eval.splits[dataset]
        for method, spec in methods.items()
        if dataset == "qa" or spec.mode != "rag"
        for budget in params.eval.budgets[dataset]
    }
    with (copy / "reports" / "sweep.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    cells = [(row["dataset"], row["split"], row["method"], int(row["budget"])) for row in rows]
    assert len(cells) == len(set(cells))
    assert set(cells) == expected
    assert {int(row["n"]) for row in rows} == {4}

    metrics = json.loads((copy / "reports" / "metrics.json").read_text(encoding="utf-8"))
    benchmarks = {f"{dataset}/{split}" for dataset, split, _, _ in expected}
    assert set(metrics["benchmarks"]) == benchmarks
    for bench in benchmarks:
        assert set(metrics["benchmarks"][bench]["methods"]) == {
            m for d, s, m, _ in expected if f"{d}/{s}" == bench
        }
    pngs = sorted((copy / "reports" / "pareto").glob("*.png"))
    assert pngs and all(p.read_bytes().startswith(PNG_MAGIC) for p in pngs)
    summary = (copy / "reports" / "summary.md").read_text(encoding="utf-8")
    assert all(f"## `{bench}` (4 problems)" in summary for bench in benchmarks)
    assert "<html" in (copy / "reports" / "traces.html").read_text(encoding="utf-8").lower()

    assert "up to date" in dvc(copy, "status")

    # The same params run again, in a second copy, by the Prefect flow (every stage a task): one seed
    # gives the same data, tokenizer and checkpoints to the byte (dvc.lock's hashes, model cards
    # included) and the same sweep rows but for their wall-clock columns.
    again, env = prepare_copy(tmp_path / "again", BENCHMARKS.parent.parent)
    (again / "params.yaml").write_bytes((copy / "params.yaml").read_bytes())
    flow = subprocess.run(
        [sys.executable, str(again / "flows" / "pipeline.py"), "--repo", str(again)],
        cwd=again,
        env={**env, "PREFECT_HOME": str(tmp_path / "prefect-home")},
        capture_output=True,
        text=True,
    )
    assert flow.returncode == 0, flow.stdout[-4000:] + flow.stderr[-4000:]
    first, second = _locked_outputs(copy / "dvc.lock"), _locked_outputs(again / "dvc.lock")
    assert set(first) == set(second)
    # The sweep cells' folders hold their rows' wall-clock seconds too, so they are compared as rows.
    reproducible = ["data/arithmetic", "data/qa", "data/math"] + [
        f"artifacts/{name}_model" for name in ("init", "warmup", "selfcest", "selfcest_nogate", "noclone")
    ]
    assert {p: first[p] for p in reproducible} == {p: second[p] for p in reproducible}
    assert _sweep_without_wall_clock(copy / "reports" / "sweep.csv") == _sweep_without_wall_clock(
        again / "reports" / "sweep.csv"
    )


def test_the_smoke_script_names_what_it_cannot_run_with(tmp_path: Path) -> None:
    """Before anything runs: a missing benchmarks folder, a WORKDIR already used, a source folder
    that is not a git checkout, each refused by name."""
    with pytest.raises(SmokeError, match=r"data/benchmarks is missing"):
        smoke(tmp_path / "work", shared=tmp_path / "no-shared")
    shared = BENCHMARKS.parent.parent
    (tmp_path / "used" / "selfcest").mkdir(parents=True)
    with pytest.raises(SmokeError, match=r"already exists"):
        smoke(tmp_path / "used", shared=shared)
    (tmp_path / "linked" / "shared").mkdir(parents=True)
    with pytest.raises(SmokeError, match=r"shared exists and is not"):
        smoke(tmp_path / "linked", shared=shared)
    assert not (tmp_path / "linked" / "selfcest").exists()
    with pytest.raises(SmokeError, match=r"is not a git checkout"):
        copy_working_tree(tmp_path / "used", tmp_path / "copy")


def test_a_step_past_its_time_is_stopped_with_what_it_started(tmp_path: Path) -> None:
    """`make smoke` had no limit: a hung stage held it for ever. A step (and its children) is
    stopped after its time, and the run fails naming it."""
    import os
    import time

    from scripts.smoke import _run

    pid_file = tmp_path / "pid"
    child = f"import os, pathlib, time; pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); time.sleep(600)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    started = time.monotonic()
    with pytest.raises(SmokeError, match=r"was still running in .* after 5 s"):
        _run([sys.executable, "-c", parent], tmp_path, dict(os.environ), timeout_s=5)
    assert time.monotonic() - started < 30
    stat = Path("/proc") / pid_file.read_text() / "stat"
    deadline = time.monotonic() + 20
    while stat.exists():  # the grandchild, not only the step, is gone (or a zombie to be reaped)
        try:
            if stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                break
        except FileNotFoundError:
            break
        assert time.monotonic() < deadline, "the step's child outlived it"
        time.sleep(0.2)
    assert _run([sys.executable, "-c", "print('ok')"], tmp_path, dict(os.environ), capture=True) == "ok\n"


def test_the_copy_holds_tracked_and_untracked_files_but_not_ignored_or_deleted_ones(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    git(source, "init", "-q")
    (source / ".gitignore").write_text("/artifacts/\n", encoding="utf-8")
    for name in ("kept.py", "deleted.py", "sub/committed.txt"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(name, encoding="utf-8")
    git(source, "add", "-A")
    git(source, "commit", "-q", "-m", "x")
    (source / "deleted.py").unlink()
    (source / "kept.py").write_text("edited", encoding="utf-8")
    (source / "new.py").write_text("new", encoding="utf-8")
    (source / "artifacts").mkdir()
    (source / "artifacts" / "model.bin").write_text("weights", encoding="utf-8")
    target = tmp_path / "target"
    assert copy_working_tree(source, target) == 4
    copied = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert copied == [".gitignore", "kept.py", "new.py", "sub/committed.txt"]
    assert (target / "kept.py").read_text(encoding="utf-8") == "edited"
