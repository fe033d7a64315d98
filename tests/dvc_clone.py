"""Helpers of the tests that run DVC in a git clone of this repository (an S3 remote, S3 imports)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    completed = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, env=env)
    assert completed.returncode == 0, (
        f"{' '.join(args)} failed in {cwd}:\n{completed.stdout}\n{completed.stderr}"
    )
    return completed.stdout + completed.stderr


def dvc(cwd: Path, *args: str) -> str:
    # A clone's stages import the clone's own library, not the editable install's working tree,
    # so uncommitted edits there cannot make the clone's data differ from its dvc.lock.
    return run(cwd, sys.executable, "-m", "dvc", *args, env={**os.environ, "PYTHONPATH": str(cwd / "src")})


def git(cwd: Path, *args: str) -> str:
    return run(cwd, "git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args)


def isolated_dvc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip without the project's git repository to clone; otherwise DVC's site cache in `tmp_path`,
    no analytics, and this interpreter's tools (`dvc`, `python`) first on PATH for the stages."""
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("needs the project's git repository to clone")
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(tmp_path / "site-cache"))
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
