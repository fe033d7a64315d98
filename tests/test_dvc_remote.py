"""Versioned outputs through an S3 DVC remote: the project's own `generate_arithmetic` stage, in a
clone of this repository, pushed to a real S3-compatible server on loopback (moto's) and pulled
into a second clone, at two commits."""

from __future__ import annotations

from pathlib import Path

import pytest
from digests import tree_digest
from dvc_clone import REPO_ROOT, dvc, git, isolated_dvc

BUCKET = "selfcest-dvc"


def _credentials(clone: Path) -> None:
    # Credentials go to the clone's untracked .dvc/config.local, as a user's would.
    dvc(clone, "remote", "modify", "--local", "storage", "access_key_id", "testing")
    dvc(clone, "remote", "modify", "--local", "storage", "secret_access_key", "testing")


@pytest.mark.slow
def test_stage_outputs_push_to_an_s3_remote_and_pull_into_a_fresh_clone(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    isolated_dvc(tmp_path, monkeypatch)
    s3 = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=s3_endpoint)
    s3.mkdir(BUCKET)
    origin = tmp_path / "origin"
    git(tmp_path, "clone", "-q", str(REPO_ROOT), str(origin))
    committed_lock = (origin / "dvc.lock").read_text()
    # The stage regenerates its data from the seed in params: the same bytes as dvc.lock records.
    dvc(origin, "repro", "--single-item", "generate_arithmetic")
    assert (origin / "dvc.lock").read_text() == committed_lock
    first = tree_digest(origin / "data" / "arithmetic")

    dvc(origin, "remote", "add", "--default", "storage", f"s3://{BUCKET}/cache")
    dvc(origin, "remote", "modify", "storage", "endpointurl", s3_endpoint)
    _credentials(origin)
    git(origin, "add", ".dvc/config")
    git(origin, "commit", "-q", "-m", "an S3 remote")
    dvc(origin, "push", "generate_arithmetic")
    assert s3.find(f"{BUCKET}/cache/files/md5"), "nothing was pushed"

    # A second version of the stage's outputs, committed and pushed.
    params = (origin / "params.yaml").read_text()
    assert "\nseed: 42\n" in params
    (origin / "params.yaml").write_text(params.replace("\nseed: 42\n", "\nseed: 7\n", 1))
    dvc(origin, "repro", "--single-item", "generate_arithmetic")
    second = tree_digest(origin / "data" / "arithmetic")
    assert second != first
    git(origin, "add", "params.yaml", "dvc.lock", "reports/arithmetic_card.json")
    git(origin, "commit", "-q", "-m", "seed 7")
    dvc(origin, "push", "generate_arithmetic")

    # A fresh clone gets each version from the remote, with nothing recomputed.
    fresh = tmp_path / "fresh"
    git(tmp_path, "clone", "-q", str(origin), str(fresh))
    _credentials(fresh)
    dvc(fresh, "pull", "generate_arithmetic")
    assert tree_digest(fresh / "data" / "arithmetic") == second
    assert "didn't change" in dvc(fresh, "repro", "--single-item", "generate_arithmetic")
    git(fresh, "checkout", "-q", "HEAD~1")
    dvc(fresh, "pull", "generate_arithmetic")
    assert tree_digest(fresh / "data" / "arithmetic") == first
    assert "up to date" in dvc(fresh, "status", "generate_arithmetic")
