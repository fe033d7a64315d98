"""Versioned checkpoints: resumable training directories, step logs for DVC plots, model cards."""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from selfcest.determinism import installed_version
from selfcest.hashing import file_sha256

log = logging.getLogger(__name__)

FINGERPRINT_FILE = "selfcest_fingerprint.json"
# The libraries whose code computes a run (its tokenization, forward and backward passes, sampling,
# optimiser and GRPO loss; vLLM's rollouts and evaluation cells): a run killed under one version and
# resumed under another would mix two computations in one set of weights or one cell's journal.
# peft and vllm are optional (None where they are not installed).
LIBRARIES = ("torch", "transformers", "tokenizers", "trl", "accelerate", "peft", "vllm")
CHECKPOINT_NAME = re.compile(r"checkpoint-\d+")
# Files beside the weights that change what a checkpoint does with the same weights: the tokenizer's,
# and the model's configuration (`rope_theta`, say) and generation defaults (its end-of-turn ids).
# `special_tokens_map.json` can swap the end and padding tokens; a template under
# `additional_chat_templates/` is the one a call with tools renders. A Qwen checkpoint also ships its
# byte-level BPE as `vocab.json` + `merges.txt` (what a slow tokenizer, or a checkpoint without
# `tokenizer.json`, is built from), and a SentencePiece model `tokenizer.model`; the default
# profile's tokenizer writes none of them, and a missing file is left out of the hashes.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
TOKENIZER_DIRS = ("additional_chat_templates",)
CONFIG_FILES = ("config.json", "generation_config.json")


def weights_sha256(checkpoint: Path | str) -> str | None:
    """Which weights a checkpoint directory holds: the sha256 of its one `*.safetensors` file (what
    `sha256sum model.safetensors` prints), or, for a sharded or `*.bin` checkpoint (a Hugging Face
    model of billions of parameters ships in shards), the sha256 of its sorted `name sha256` lines.
    None when the directory holds no weights file."""
    checkpoint = Path(checkpoint)
    files = sorted(checkpoint.glob("*.safetensors")) or sorted(checkpoint.glob("*.bin"))
    if not files:
        return None
    if len(files) == 1 and files[0].suffix == ".safetensors":
        return file_sha256(files[0])
    lines = "".join(f"{f.name} {file_sha256(f)}\n" for f in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def checkpoint_sha256s(checkpoint: Path | str) -> dict[str, str | None]:
    """What a run started from a checkpoint depends on: its weights, its tokenizer files (a fixed
    chat template or retrained merges change every episode with the same weights) and its model and
    generation configuration (another `rope_theta` or end-of-sequence id changes what the same weights
    generate). For run fingerprints: a killed run resumes only from checkpoints made with the same
    starting point."""
    checkpoint = Path(checkpoint)
    hashes: dict[str, str | None] = {"weights": weights_sha256(checkpoint)}
    hashes |= {
        name: file_sha256(checkpoint / name)
        for name in TOKENIZER_FILES + CONFIG_FILES
        if (checkpoint / name).exists()
    }
    hashes |= {
        path.relative_to(checkpoint).as_posix(): file_sha256(path)
        for folder in TOKENIZER_DIRS
        for path in sorted((checkpoint / folder).rglob("*"))
        if path.is_file()
    }
    return hashes


def library_versions() -> dict[str, str | None]:
    """The installed version of each of `LIBRARIES` (`importlib.metadata`, so nothing is imported),
    None for one that is not installed."""
    return {name: installed_version(name) for name in LIBRARIES}


def fingerprint(payload: Mapping[str, Any]) -> str:
    """sha256 of `payload` (what a run depends on: params, data, starting checkpoint, code) and of
    `library_versions()`: every run fingerprint covers the libraries, so that an upgrade between a
    kill and the rerun starts the run over instead of resuming it. The same on one machine, and
    written only into run folders (`prepare_run_dir`), never into a stage's DVC outputs."""
    keyed = {"payload": payload, "libraries": library_versions()}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()


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


def _read_json(path: Path) -> Any:
    """The JSON in `path`, or None where it is missing or unreadable (a kill mid-write leaves it cut)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def prepare_run_dir(run_dir: Path, run_fingerprint: str) -> str | None:
    """Make `run_dir` ready for a training run and return the checkpoint to resume from, if any.

    A run killed part-way leaves `checkpoint-*` folders; they are resumed only when the params,
    data, code and library versions (the fingerprint) are those of the killed run, so a changed
    config or an upgraded library never resumes stale state. A fingerprint file that cannot be read
    counts as another run's (the folder starts over), and a checkpoint whose `trainer_state.json` does
    not parse (killed while it was written) is removed, so the run resumes from the one before it
    instead of failing on every rerun.
    """
    marker = run_dir / FINGERPRINT_FILE
    libraries = library_versions()
    if run_dir.exists():
        previous = _read_json(marker) if marker.exists() else None
        if not isinstance(previous, dict) or previous.get("fingerprint") != run_fingerprint:
            log.warning("%s: starting afresh, %s", run_dir, _what_changed(previous, libraries))
            shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # Written whole or not at all: a kill mid-write leaves the temporary file, never a cut marker.
    # The versions are kept beside the hash (which covers them) only to name an upgrade on a rerun.
    partial = marker.with_suffix(".tmp")
    partial.write_text(json.dumps({"fingerprint": run_fingerprint, "libraries": libraries}), encoding="utf-8")
    partial.replace(marker)
    # The Trainer's own folders only (`checkpoint-<step>`, as HF's `sort_checkpoints` reads them): a
    # `checkpoint-best` a user left there, or a file of that name, crashed every rerun.
    checkpoints = sorted(
        (p for p in run_dir.glob("checkpoint-*") if p.is_dir() and CHECKPOINT_NAME.fullmatch(p.name)),
        key=lambda p: int(p.name.split("-")[-1]),
    )
    for checkpoint in reversed(checkpoints):
        if _read_json(checkpoint / "trainer_state.json") is not None:
            return str(checkpoint)
        shutil.rmtree(checkpoint)
    return None


def _what_changed(previous: Any, libraries: Mapping[str, str | None]) -> str:
    """Why a run folder is not resumed, for the log: the libraries whose versions changed where the
    folder's marker names them, else what else the fingerprint covers."""
    if not isinstance(previous, dict):
        return "its fingerprint file is missing or unreadable"
    before = previous.get("libraries")
    if isinstance(before, dict):
        changed = [
            f"{name} {before.get(name)} -> {version}"
            for name, version in libraries.items()
            if before.get(name) != version
        ]
        if changed:
            return "library versions changed since the killed run: " + ", ".join(changed)
    return "the params, data, starting checkpoint or code changed since the killed run"


class CsvLogCallback(TrainerCallback):
    """Appends every logged step to a CSV that `dvc.yaml` declares as plots.

    Plain CSV rather than DVCLive's callback: DVCLive rewrites dvc.yaml and experiment refs,
    which a stage of a committed pipeline must not do.
    """

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path = path
        self.columns = columns

    def _row(self, step: int, logs: Mapping[str, Any]) -> dict[str, Any] | None:
        if not any(column in logs for column in self.columns):
            return None
        return {"step": step, **{c: _fmt(logs.get(c)) for c in self.columns}}

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A resumed run rewrites the rows up to its checkpoint from the log history that the
        # checkpoint's trainer_state.json restored, not from the CSV: `dvc repro` deletes a stage's
        # plots outputs before it reruns the stage, so the file of the killed run is gone by now.
        rows = [
            row
            for entry in state.log_history
            if int(entry.get("step", 0)) <= state.global_step
            and (row := self._row(int(entry.get("step", 0)), entry)) is not None
        ]
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
        row = self._row(state.global_step, logs or {})
        if row is None or not state.is_world_process_zero:
            return
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
    """A README.md beside the weights: what was trained, on what data, with what result.

    Wall-clock metrics (`*_seconds`) are left out: they differ between runs that give the same
    weights, and the card is part of the checkpoint folder's hash in dvc.lock, so a timing in it made
    every rerun a new checkpoint for DVC (and every stage after it stale). The stage's metrics file
    under reports/ keeps them."""
    reproducible = {k: v for k, v in metrics.items() if not k.endswith("_seconds")}
    lines = [
        f"# {title}",
        "",
        "Written by the selfcest pipeline; weights in safetensors, loadable offline with",
        "`AutoModelForCausalLM.from_pretrained(path, local_files_only=True)`.",
        "",
        "## Final training metrics",
        "",
        *[f"- `{k}`: {v}" for k, v in sorted(reproducible.items())],
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
