"""The Prefect flow runs real DVC stages in order in a real git + DVC repo, and DVC decides reruns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.pipeline import pipeline, stage_order

DVC_YAML = """\
stages:
  second:
    cmd: python -c "import pathlib; pathlib.Path('b.txt').write_text(pathlib.Path('a.txt').read_text() + 'b')"
    deps: [a.txt]
    outs: [b.txt]
  first:
    cmd: python -c "import pathlib, yaml; pathlib.Path('a.txt').write_text(str(yaml.safe_load(open('params.yaml'))['n']))"
    params: [n]
    outs: [a.txt]
"""


@pytest.fixture
def dvc_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(tmp_path / "site-cache"))
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "config", "core.analytics", "false"], cwd=repo, check=True)
    (repo / "dvc.yaml").write_text(DVC_YAML)
    (repo / "params.yaml").write_text("n: 1\n")
    return repo


def test_stage_order_follows_dependencies(dvc_repo: Path) -> None:
    assert stage_order(dvc_repo) == ["first", "second"]
    assert stage_order(dvc_repo, ["first"]) == ["first"]


@pytest.mark.slow
def test_flow_runs_stages_and_dvc_skips_unchanged(dvc_repo: Path) -> None:
    outputs = pipeline(repo_dir=str(dvc_repo))
    assert (dvc_repo / "b.txt").read_text() == "1b"
    assert "Running stage 'first'" in outputs["first"]
    outputs = pipeline(repo_dir=str(dvc_repo))
    assert "didn't change" in outputs["first"] and "didn't change" in outputs["second"]
    (dvc_repo / "params.yaml").write_text("n: 2\n")
    pipeline(repo_dir=str(dvc_repo))
    assert (dvc_repo / "b.txt").read_text() == "2b"
