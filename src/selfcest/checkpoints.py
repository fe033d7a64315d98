"""Versioned checkpoints: resumable training directories, step logs for DVC plots, model cards."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

FINGERPRINT_FILE = "selfcest_fingerprint.json"


def fingerprint(payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def code_sha256(*extra_files: Path | str) -> str:
    """sha256 over the source of the whole `selfcest` package and `extra_files` (a stage script).

    Part of a run's fingerprint: a run killed under one version of the code must not be resumed by
    another (a fix to the loss would otherwise continue from checkpoints trained the old way). The
    whole package, not the stage's own imports, because a stage's behaviour reaches through them."""
    package = Path(__file__).resolve().parent
    files = sorted(package.rglob("*.py")) + [Path(f).resolve() for f in extra_files]
    digest = hashlib.sha256()
    for path in files:
        name = path.relative_to(package).as_posix() if path.is_relative_to(package) else path.name
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def prepare_run_dir(run_dir: Path, run_fingerprint: str) -> str | None:
    """Make `run_dir` ready for a training run and return the checkpoint to resume from, if any.

    A run killed part-way leaves `checkpoint-*` folders; they are resumed only when the params and
    data (the fingerprint) are those of the killed run, so a changed config never resumes stale state.
    """
    marker = run_dir / FINGERPRINT_FILE
    if run_dir.exists():
        previous = json.loads(marker.read_text())["fingerprint"] if marker.exists() else None
        if previous != run_fingerprint:
            shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"fingerprint": run_fingerprint}))
    checkpoints = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    for checkpoint in reversed(checkpoints):
        if (checkpoint / "trainer_state.json").exists():
            return str(checkpoint)
    return None


class CsvLogCallback(TrainerCallback):
    """Appends every logged step to a CSV that `dvc.yaml` declares as plots.

    Plain CSV rather than DVCLive's callback: DVCLive rewrites dvc.yaml and experiment refs,
    which a stage of a committed pipeline must not do.
    """

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path = path
        self.columns = columns

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = []
        if self.path.exists() and state.global_step > 0:  # resumed: keep the rows up to the checkpoint
            with self.path.open(newline="") as handle:
                rows = [row for row in csv.DictReader(handle) if int(float(row["step"])) <= state.global_step]
        with self.path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["step", *self.columns])
            writer.writeheader()
            writer.writerows(rows)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not logs or not any(column in logs for column in self.columns):
            return
        row = {"step": state.global_step, **{c: _fmt(logs.get(c)) for c in self.columns}}
        with self.path.open("a", newline="") as handle:
            csv.DictWriter(handle, fieldnames=["step", *self.columns]).writerow(row)


def _fmt(value: Any) -> Any:
    return round(float(value), 6) if isinstance(value, int | float) else ""


def write_model_card(
    path: Path,
    *,
    title: str,
    params: Mapping[str, Any],
    data_hashes: Mapping[str, str],
    metrics: Mapping[str, Any],
) -> None:
    """A README.md beside the weights: what was trained, on what data, with what result."""
    lines = [
        f"# {title}",
        "",
        "Written by the selfcest pipeline; weights in safetensors, loadable offline with",
        "`AutoModelForCausalLM.from_pretrained(path, local_files_only=True)`.",
        "",
        "## Final training metrics",
        "",
        *[f"- `{k}`: {v}" for k, v in sorted(metrics.items())],
        "",
        "## Data",
        "",
        *[f"- `{k}`: `{v}`" for k, v in sorted(data_hashes.items())],
        "",
        "## Params",
        "",
        "```json",
        json.dumps(params, indent=2, sort_keys=True, default=str),
        "```",
        "",
    ]
    (path / "README.md").write_text("\n".join(lines), encoding="utf-8")
