"""Stage warmup: supervised warm-up of the tiny model on the programmatic teachers' conversations.

Default profile only: with `model.init_from` set (paper profile), the starting checkpoint is copied.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from pathlib import Path

from selfcest.checkpoints import checkpoint_sha256s, code_sha256, fingerprint, write_model_card
from selfcest.determinism import machine_description
from selfcest.model import load_model
from selfcest.tokenizer import load_tokenizer
from selfcest.warmup import run_warmup, tokenize_conversations, warmup_conversations, warmup_settings
from stages.common import (
    SUPPORT_FILES,
    file_sha256,
    held_out_expressions,
    load_params,
    read_jsonl,
    setup_logging,
    write_json,
)

log = logging.getLogger("warmup")

# The arithmetic splits held out of the clones' conversations by default (dvc.yaml passes none).
HELD_OUT_SPLITS = ("data/arithmetic/test.jsonl", "data/arithmetic/ood.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--init", default="artifacts/init_model")
    parser.add_argument("--arithmetic", default="data/arithmetic/train.jsonl")
    parser.add_argument("--qa", default="data/qa/train.jsonl")
    parser.add_argument(
        "--held-out",
        nargs="*",
        default=list(HELD_OUT_SPLITS),
        help="arithmetic splits whose expressions no clone conversation may ask (decontamination)",
    )
    parser.add_argument("--out", default="artifacts/warmup_model")
    parser.add_argument("--run-dir", default="artifacts/runs/warmup", help="checkpoints of a run in progress")
    parser.add_argument("--log-csv", default="reports/warmup_log.csv")
    parser.add_argument("--metrics", default="reports/warmup.json")
    args = parser.parse_args()
    setup_logging()
    params = load_params(Path(args.params))
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    if params["model"].get("init_from"):
        shutil.copytree(args.init, out)
        write_json(args.metrics, {"skipped": True})
        Path(args.log_csv).write_text("step,loss\n")
        return
    started = time.perf_counter()
    settings = warmup_settings(params["warmup"], seed=params["seed"])
    # The teacher's clones must see the prompts the runtime gives them: halves offered by key (with
    # the tool) exactly when the runtime cuts sums into halves.
    halves = bool((params.get("runtime") or {}).get("expression_halves", False))
    if (settings.teacher.arithmetic_delegation == "halves") != halves:
        raise ValueError(
            f"warmup.teacher.arithmetic_delegation is {settings.teacher.arithmetic_delegation!r} but "
            f"runtime.expression_halves is {halves}: set halves with true, chunks with false"
        )
    config = settings.training
    tokenizer = load_tokenizer(args.init)
    model = load_model(args.init, dtype="float32")
    conversations = warmup_conversations(
        settings,
        arithmetic_records=read_jsonl(args.arithmetic),
        qa_train_records=read_jsonl(args.qa),
        held_out_expressions=held_out_expressions(args.held_out),
    )
    dataset = tokenize_conversations(conversations, tokenizer, config.max_length)
    kinds: dict[str, int] = {}
    for kind in dataset["kind"]:
        kinds[kind] = kinds.get(kind, 0) + 1
    log.info("warm-up on %d conversations: %s", len(dataset), json.dumps(kinds))
    lengths = {
        "longest_conversation_tokens": max(
            k + c for k, c in zip(dataset["length"], dataset["cut_tokens"], strict=True)
        ),
        "cut_conversations": sum(1 for c in dataset["cut_tokens"] if c),  # cut to max_length (warned above)
    }
    data_hashes = {"arithmetic_train": file_sha256(args.arithmetic), "qa_train": file_sha256(args.qa)}
    data_hashes |= {f"held_out:{path}": file_sha256(path) for path in args.held_out}
    # The initial weights do not change with the tokenizer's merges (same vocabulary size), so the
    # tokenizer files count too: a retrained tokenizer must not resume checkpoints of the old one.
    init_hashes = checkpoint_sha256s(args.init)
    run_fingerprint = fingerprint(
        {
            "params": params["warmup"],
            "seed": params["seed"],
            "data": data_hashes,
            "init": init_hashes,
            "code": code_sha256(__file__, *SUPPORT_FILES),
        }
    )
    metrics = run_warmup(
        model,
        tokenizer,
        dataset,
        config,
        run_dir=Path(args.run_dir),
        run_fingerprint=run_fingerprint,
        log_csv=Path(args.log_csv),
    )
    metrics["conversations"] = len(dataset)
    metrics |= lengths
    metrics["stage_seconds"] = round(time.perf_counter() - started, 1)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_model_card(
        out,
        title="selfcest warm-up checkpoint (tiny Qwen3)",
        params={"seed": params["seed"], "warmup": params["warmup"]},
        data_hashes=data_hashes | {f"init:{name}": sha for name, sha in init_hashes.items()},
        metrics=metrics,
    )
    # The machine goes to the metrics file only, not the model card (`machine_description`).
    write_json(args.metrics, {**metrics, "kinds": kinds, "machine": machine_description()})
    shutil.rmtree(args.run_dir, ignore_errors=True)  # finished: nothing left to resume


if __name__ == "__main__":
    main()
