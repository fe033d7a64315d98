"""Run folders of killed runs: what is resumed, what starts over."""

from __future__ import annotations

import importlib.metadata
import json
import logging
from pathlib import Path

import pytest

from selfcest.checkpoints import (
    FINGERPRINT_FILE,
    fingerprint,
    library_versions,
    prepare_run_dir,
    write_model_card,
)


def _checkpoint(run: Path, step: int, state: str | None) -> Path:
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    if state is not None:
        (folder / "trainer_state.json").write_text(state, encoding="utf-8")
    return folder


def test_a_run_killed_mid_write_resumes_from_its_last_whole_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert prepare_run_dir(run, "fp") is None
    assert json.loads((run / FINGERPRINT_FILE).read_text())["fingerprint"] == "fp"
    _checkpoint(run, 2, json.dumps({"global_step": 2}))
    cut = _checkpoint(run, 4, '{"global_step": 4, "log_hist')  # killed while trainer_state.json was written
    unfinished = _checkpoint(run, 6, None)  # killed before it
    assert prepare_run_dir(run, "fp") == str(run / "checkpoint-2")
    assert not cut.exists() and not unfinished.exists()  # gone, so no later save or rotation trips on them
    assert prepare_run_dir(run, "fp") == str(run / "checkpoint-2")  # and the next rerun agrees


def test_a_cut_or_foreign_fingerprint_starts_the_run_over(tmp_path: Path) -> None:
    run = tmp_path / "run"
    prepare_run_dir(run, "fp")
    _checkpoint(run, 2, json.dumps({"global_step": 2}))
    (run / FINGERPRINT_FILE).write_text('{"fingerp', encoding="utf-8")  # killed mid-write
    assert prepare_run_dir(run, "fp") is None
    assert not (run / "checkpoint-2").exists()
    assert json.loads((run / FINGERPRINT_FILE).read_text())["fingerprint"] == "fp"
    _checkpoint(run, 2, json.dumps({"global_step": 2}))
    assert prepare_run_dir(run, "other params") is None and not (run / "checkpoint-2").exists()
    assert not list(run.glob("*.tmp"))


def _installed(monkeypatch: pytest.MonkeyPatch, **versions: str | None) -> None:
    """Pretend these versions are installed (None: not installed); the other packages are as they are."""
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name not in versions:
            return real(name)
        if versions[name] is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_a_library_upgrade_between_kill_and_rerun_starts_the_run_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same params, data, checkpoint and code under another torch (or transformers, trl,
    accelerate, peft) give another fingerprint: the killed run's checkpoints, computed by the old
    version, are not resumed by the new one, and the log names the upgrade."""
    payload = {"params": {"max_steps": 4}, "data": {"train": "8539bc49"}, "code": "c0de"}
    _installed(monkeypatch, torch="2.13.0", peft=None)
    assert library_versions()["torch"] == "2.13.0" and library_versions()["peft"] is None
    before = fingerprint(payload)
    run = tmp_path / "run"
    prepare_run_dir(run, before)
    _checkpoint(run, 2, json.dumps({"global_step": 2}))
    assert fingerprint(payload) == before  # the same machine: resumed
    assert prepare_run_dir(run, fingerprint(payload)) == str(run / "checkpoint-2")

    for upgrade in ({"torch": "2.14.0"}, {"peft": "0.21.2"}):
        _installed(monkeypatch, **{"torch": "2.13.0", "peft": None, **upgrade})
        assert fingerprint(payload) != before
    _installed(monkeypatch, torch="2.14.0", peft=None)
    with caplog.at_level(logging.WARNING, logger="selfcest.checkpoints"):
        assert prepare_run_dir(run, fingerprint(payload)) is None
    assert not (run / "checkpoint-2").exists()
    assert "torch 2.13.0 -> 2.14.0" in caplog.text and "peft" not in caplog.text


def test_only_the_trainers_step_folders_are_resumed(tmp_path: Path) -> None:
    """A `checkpoint-best` folder (a user's copy) or a file named like a checkpoint crashed every rerun."""
    run = tmp_path / "run"
    prepare_run_dir(run, "fp")
    _checkpoint(run, 10, json.dumps({"global_step": 10}))
    best = run / "checkpoint-best"
    best.mkdir()
    (run / "checkpoint-12").write_text("not a folder", encoding="utf-8")
    assert prepare_run_dir(run, "fp") == str(run / "checkpoint-10")
    assert best.exists() and (run / "checkpoint-12").exists()  # left alone, not the Trainer's


def test_the_model_card_is_the_same_for_the_same_training_whatever_it_took(tmp_path: Path) -> None:
    """The card is hashed with the weights into the checkpoint folder's dvc.lock entry: a rerun that
    gives the same weights must give the same card, so wall-clock seconds stay out of it."""
    cards = []
    for name, seconds in (("fast", 4.1), ("slow", 1404.0)):
        folder = tmp_path / name
        folder.mkdir()
        write_model_card(
            folder,
            title="t",
            params={"max_steps": 30},
            data_hashes={"arithmetic_train": "8539bc49"},
            metrics={"final_loss": 2.9, "steps": 30, "stage_seconds": seconds, "train_seconds": seconds / 2},
        )
        cards.append((folder / "README.md").read_text(encoding="utf-8"))
    assert cards[0] == cards[1]
    assert "- `final_loss`: 2.9" in cards[0] and "- `steps`: 30" in cards[0]
    assert "seconds" not in cards[0]
