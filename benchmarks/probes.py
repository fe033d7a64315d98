"""Fresh arithmetic for the length benchmarks: the active profile's generator, and the teacher
conversations whose length limit is in question (no test split is read); and the arithmetic-only
warm-ups that some of them train. Import after `pin_cpu_kernels()`: this module imports torch."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from selfcest.data.arithmetic import ArithmeticConfig, config_from_mapping, generate_expression
from selfcest.model import load_model
from selfcest.teachers import TeacherConfig, arithmetic_conversations
from selfcest.tokenizer import load_tokenizer
from selfcest.warmup import (
    WarmupConfig,
    run_warmup,
    tokenize_conversations,
    warmup_conversations,
    warmup_settings,
)
from stages.common import held_out_expressions, read_jsonl
from stages.warmup import HELD_OUT_SPLITS

PROBED_KINDS = ("arith_mono", "arith_root_delegate")


def active_generator(params: Mapping[str, Any]) -> ArithmeticConfig:
    """The active arithmetic profile's generator settings, as stages/generate_arithmetic.py reads them."""
    arithmetic = params["arithmetic"]
    return config_from_mapping(arithmetic["profiles"][arithmetic["profile"]].get("generator") or {})


def stage_warmup_conversations(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The warm-up's conversations exactly as `stages/warmup.py` builds them from `params` (same
    training files, seed, teacher settings and held-out sums), for the benchmarks that count what the
    teacher wrote."""
    return warmup_conversations(
        warmup_settings(params["warmup"], seed=params["seed"]),
        arithmetic_records=read_jsonl(Path("data/arithmetic/train.jsonl")),
        qa_train_records=read_jsonl(Path("data/qa/train.jsonl")),
        held_out_expressions=held_out_expressions(HELD_OUT_SPLITS),
    )


def probe_teacher(teacher: TeacherConfig) -> TeacherConfig:
    """Every root delegates and no thinking row: the two kinds whose length limit is in question."""
    return dataclasses.replace(teacher, direct_root_fraction=0.0, thinking_fraction=0.0)


def probe_conversations(
    generator: ArithmeticConfig, teacher: TeacherConfig, num_operators: int, count: int, rng: random.Random
) -> list[dict[str, Any]]:
    """The monolithic and delegating-root conversations of `count` fresh `num_operators` expressions."""
    config = config_from_mapping({"num_operators": (num_operators, num_operators)}, generator)
    conversations = []
    for _ in range(count):
        expr, _ = generate_expression(config, rng)
        conversations += [
            c for c in arithmetic_conversations(expr, rng, teacher) if c["kind"] in PROBED_KINDS
        ]
    return conversations


def trained_warmup(
    out: Path,
    *,
    init: str,
    run_fingerprint: str,
    config: WarmupConfig,
    conversations: Callable[[], list[dict[str, Any]]],
    data_collator: Callable[[Any], Any] | None = None,
    label: Mapping[str, Any] | None = None,
) -> tuple[Any, Any]:
    """The tokenizer and fp32 model of a benchmark's warm-up, in `out/model`: loaded when a run with
    the same `run_fingerprint` finished there before (so a run can be measured again without
    training), else trained from `init` on `conversations()` and saved. A killed run resumes from
    its last checkpoint in `out/run`. `data_collator` builds the collator from the tokenizer. Prints
    one JSON line: `label` with the run's final metrics, or with where the finished model was."""
    final, final_marker = out / "model", out / "model" / "fingerprint.txt"
    if final_marker.exists() and final_marker.read_text() == run_fingerprint:
        print(json.dumps({**(label or {}), "trained_before": str(final)}), flush=True)
        return load_tokenizer(final), load_model(final, dtype="float32")
    tokenizer, model = load_tokenizer(init), load_model(init, dtype="float32")
    metrics = run_warmup(
        model,
        tokenizer,
        tokenize_conversations(conversations(), tokenizer, config.max_length),
        config,
        run_dir=out / "run",
        run_fingerprint=run_fingerprint,
        log_csv=out / "log.csv",
        data_collator=data_collator(tokenizer) if data_collator else None,
    )
    model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    final_marker.write_text(run_fingerprint)
    print(json.dumps({**(label or {}), **metrics}), flush=True)
    return tokenizer, model
