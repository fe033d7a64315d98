"""Stage build_model: train the tokenizer on the project's task text and build the initial tiny model.

With `model.init_from` set to a local checkpoint (paper profile), that checkpoint is copied as is.
`dvc.yaml` lists the `models/` folder as this stage's dependency, so a checkpoint kept there reruns
the pipeline when its files change; one elsewhere is copied all the same, with a warning.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from selfcest.model import TinyModelConfig, build_tiny_model, count_parameters
from selfcest.tokenizer import load_tokenizer, train_tokenizer
from selfcest.tokenizer_corpus import protocol_corpus
from stages.common import iter_jsonl, load_params, setup_logging, write_json

log = logging.getLogger("build_model")

CHECKPOINTS_DIR = Path("models")
"""Local starting checkpoints, relative to the repository root: `build_model`'s DVC dependency."""


def untracked_checkpoint_reason(init_from: Path | str, tracked: Path | str = CHECKPOINTS_DIR) -> str | None:
    """Why DVC would not notice a change to the files of `init_from`, or None when it would.

    DVC hashes the `tracked` folder as a dependency but does not follow a symbolic link to a folder
    inside it (measured with DVC 3.67: a linked checkpoint's files are left out of the folder's hash),
    so a checkpoint must lie under that folder, through no linked folder."""
    folder = Path(os.path.abspath(tracked))
    path = Path(os.path.abspath(init_from))  # abspath, not resolve: a link on the way must show
    if path != folder and folder not in path.parents:
        return f"it is outside {tracked}/, the folder dvc.yaml lists as build_model's dependency"
    for part in (path, *path.parents):
        if part == folder:
            break
        if part.is_symlink():
            return f"{part} is a symbolic link, which DVC does not follow inside {tracked}/"
    return None


def read_corpus_files(paths: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """One pass over the JSONL files in `paths`: every string value of every record (task text:
    prompts, paragraphs, answers), and the (paragraph key, question) of every hop of the QA records
    (records without hops give none), which the protocol corpus builds its QA calls from."""
    strings: list[str] = []
    hops: list[tuple[str, str]] = []
    for path in paths:
        for lineno, record in iter_jsonl(path):  # a line that is not JSON: its file and line
            strings += _strings(record)
            if not isinstance(record, dict):
                continue
            for index, hop in enumerate(record.get("hops") or []):
                try:
                    hops.append((hop["paragraph_key"], hop["question"]))
                except (KeyError, TypeError) as exc:  # a missing field, or a hop that is no mapping
                    raise ValueError(
                        f"{path}, line {lineno} (record {record.get('id')!r}): hops[{index}] needs "
                        f"'paragraph_key' and 'question' fields, got {hop!r}"
                    ) from exc
    return strings, hops


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default="artifacts/init_model")
    parser.add_argument("--report", default="reports/build_model.json")
    args = parser.parse_args()
    setup_logging()
    params = load_params(Path(args.params))
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    model_params = dict(params["model"])
    init_from = model_params.pop("init_from", None)
    if init_from:
        reason = untracked_checkpoint_reason(init_from)
        if reason:
            log.warning(
                "model.init_from %s: %s, so DVC will not rerun the pipeline when its files change. "
                "Copy it there or track it with `dvc add %s/<name>` (models/README.md).",
                init_from,
                reason,
                CHECKPOINTS_DIR,
            )
        shutil.copytree(init_from, out)
        tokenizer = load_tokenizer(out)
        write_json(args.report, {"init_from": str(init_from), "vocab_size": len(tokenizer)})
        return
    corpus_files = params["tokenizer"].get("corpus_files", [])
    file_texts, qa_hops = read_corpus_files(corpus_files)
    texts = [*protocol_corpus(seed=params["seed"], qa_hops=qa_hops), *file_texts]
    corpus_hash = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    tokenizer = train_tokenizer(
        texts,
        vocab_size=params["tokenizer"]["vocab_size"],
        min_frequency=params["tokenizer"]["min_frequency"],
    )
    model = build_tiny_model(TinyModelConfig(**model_params), tokenizer, seed=params["seed"])
    out.mkdir(parents=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    write_json(
        args.report,
        {
            "parameters": count_parameters(model),
            "vocab_size": len(tokenizer),
            "corpus_texts": len(texts),
            "corpus_sha256": corpus_hash,
        },
    )


if __name__ == "__main__":
    main()
