"""Versioned outputs through an S3 DVC remote: the project's own `generate_arithmetic` stage, in a
clone of this repository, pushed to a real S3-compatible server on loopback (moto's) and pulled
into a second clone, at two commits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from digests import tree_digest

REPO_ROOT = Path(__file__).resolve().parent.parent
BUCKET = "selfcest-dvc"


def _run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    completed = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, env=env)
    assert completed.returncode == 0, (
        f"{' '.join(args)} failed in {cwd}:\n{completed.stdout}\n{completed.stderr}"
    )
    return completed.stdout + completed.stderr


def _dvc(cwd: Path, *args: str) -> str:
    # A clone's stages import the clone's own library, not the editable install's working tree,
    # so uncommitted edits there cannot make the clone's data differ from its dvc.lock.
    return _run(cwd, sys.executable, "-m", "dvc", *args, env={**os.environ, "PYTHONPATH": str(cwd / "src")})


def _git(cwd: Path, *args: str) -> str:
    return _run(cwd, "git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args)


def _credentials(clone: Path) -> None:
    # Credentials go to the clone's untracked .dvc/config.local, as a user's would.
    _dvc(clone, "remote", "modify", "--local", "storage", "access_key_id", "testing")
    _dvc(clone, "remote", "modify", "--local", "storage", "secret_access_key", "testing")


@pytest.mark.slow
def test_stage_outputs_push_to_an_s3_remote_and_pull_into_a_fresh_clone(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    if not (REPO_ROOT / ".git").exists():
        pytest.skip("needs the project's git repository to clone")
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(tmp_path / "site-cache"))
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    s3 = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=s3_endpoint)
    s3.mkdir(BUCKET)
    origin = tmp_path / "origin"
    _git(tmp_path, "clone", "-q", str(REPO_ROOT), str(origin))
    committed_lock = (origin / "dvc.lock").read_text()
    # The stage regenerates its data from the seed in params: the same bytes as dvc.lock records.
    _dvc(origin, "repro", "--single-item", "generate_arithmetic")
    assert (origin / "dvc.lock").read_text() == committed_lock
    first = tree_digest(origin / "data" / "arithmetic")

    _dvc(origin, "remote", "add", "--default", "storage", f"s3://{BUCKET}/cache")
    _dvc(origin, "remote", "modify", "storage", "endpointurl", s3_endpoint)
    _credentials(origin)
    _git(origin, "add", ".dvc/config")
    _git(origin, "commit", "-q", "-m", "an S3 remote")
    _dvc(origin, "push", "generate_arithmetic")
    assert s3.find(f"{BUCKET}/cache/files/md5"), "nothing was pushed"

    # A second version of the stage's outputs, committed and pushed.
    params = (origin / "params.yaml").read_text()
    assert "\nseed: 42\n" in params
    (origin / "params.yaml").write_text(params.replace("\nseed: 42\n", "\nseed: 7\n", 1))
    _dvc(origin, "repro", "--single-item", "generate_arithmetic")
    second = tree_digest(origin / "data" / "arithmetic")
    assert second != first
    _git(origin, "add", "params.yaml", "dvc.lock", "reports/arithmetic_card.json")
    _git(origin, "commit", "-q", "-m", "seed 7")
    _dvc(origin, "push", "generate_arithmetic")

    # A fresh clone gets each version from the remote, with nothing recomputed.
    fresh = tmp_path / "fresh"
    _git(tmp_path, "clone", "-q", str(origin), str(fresh))
    _credentials(fresh)
    _dvc(fresh, "pull", "generate_arithmetic")
    assert tree_digest(fresh / "data" / "arithmetic") == second
    assert "didn't change" in _dvc(fresh, "repro", "--single-item", "generate_arithmetic")
    _git(fresh, "checkout", "-q", "HEAD~1")
    _dvc(fresh, "pull", "generate_arithmetic")
    assert tree_digest(fresh / "data" / "arithmetic") == first
    assert "up to date" in _dvc(fresh, "status", "generate_arithmetic")
