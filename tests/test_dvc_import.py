"""Benchmark files on S3 under DVC's lineage: `dvc import-url` into `data/sources/` (a dependency of
`prepare_qa` and `prepare_math`), then a new version of the object on the server, `dvc update`, and
the stage is stale and reruns on the new records. A real MuSiQue sample on moto's S3 server on
loopback, in a clone of this repository, with the commands that data/sources/README.md gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_paths import BENCHMARKS
from dvc_clone import REPO_ROOT, dvc, git, isolated_dvc

BUCKET = "selfcest-sources"
SAMPLE = BENCHMARKS / "musique" / "kag_musique_qa_100.json"
COMMITTED_PATH = "path: ../shared/data/benchmarks/musique/kag_musique_qa_100.json"
IMPORTED = "data/sources/musique_dev.json"


def _musique_dev_ids(clone: Path) -> list[str]:
    lines = (clone / "data" / "qa" / "musique_dev.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["id"] for line in lines]


@pytest.mark.slow
def test_an_imported_s3_benchmark_reruns_prepare_qa_when_the_object_changes(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    isolated_dvc(tmp_path, monkeypatch)
    records = json.loads(SAMPLE.read_text(encoding="utf-8"))
    s3 = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=s3_endpoint)
    s3.mkdir(BUCKET)
    s3.pipe(f"{BUCKET}/musique/dev.json", json.dumps(records).encode())

    # The clone's other sources stay at ../shared/data/benchmarks, as params.yaml has them.
    work = tmp_path / "work"
    work.mkdir()
    (work / "shared").symlink_to(BENCHMARKS.parents[1], target_is_directory=True)
    clone = work / "clone"
    git(work, "clone", "-q", str(REPO_ROOT), str(clone))
    dvc(clone, "remote", "add", "sources", f"s3://{BUCKET}")
    dvc(clone, "remote", "modify", "sources", "endpointurl", s3_endpoint)
    dvc(clone, "remote", "modify", "--local", "sources", "access_key_id", "testing")
    dvc(clone, "remote", "modify", "--local", "sources", "secret_access_key", "testing")
    dvc(clone, "import-url", "remote://sources/musique/dev.json", IMPORTED)
    params = (clone / "params.yaml").read_text(encoding="utf-8")
    assert params.count(COMMITTED_PATH) == 1
    (clone / "params.yaml").write_text(params.replace(COMMITTED_PATH, f"path: {IMPORTED}"), encoding="utf-8")

    dvc(clone, "repro", "--single-item", "prepare_qa")
    assert _musique_dev_ids(clone) == [r["id"] for r in records]
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "MuSiQue dev from S3")
    import_file = clone / f"{IMPORTED}.dvc"
    first_etag = import_file.read_text(encoding="utf-8")

    # A new version of the object on the server: the import is frozen, so nothing moves until
    # `dvc update`; after it the folder's hash changed and DVC names the stale stage.
    kept = records[:60]
    s3.pipe(f"{BUCKET}/musique/dev.json", json.dumps(kept).encode())
    assert "up to date" in dvc(clone, "status", "prepare_qa")
    dvc(clone, "update", f"{IMPORTED}.dvc")
    assert import_file.read_text(encoding="utf-8") != first_etag
    status = dvc(clone, "status", "prepare_qa")
    assert "data/sources" in status and "modified" in status, status
    dvc(clone, "repro", "--single-item", "prepare_qa")
    assert _musique_dev_ids(clone) == [r["id"] for r in kept]
    assert "up to date" in dvc(clone, "status", "prepare_qa")
