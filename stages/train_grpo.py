"""Stage train_grpo: SELFCEST GRPO (and its ablations/baselines) from the warm-up checkpoint.

python -m stages.train_grpo --variant selfcest         # gated clones (the method)
python -m stages.train_grpo --variant selfcest_nogate  # clones get the root's advantage (ablation)
python -m stages.train_grpo --variant noclone          # monolithic GRPO, no tool (baseline)
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, get_args

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from selfcest.checkpoints import (  # noqa: E402
    CsvLogCallback,
    checkpoint_sha256s,
    code_sha256,
    fingerprint,
    prepare_run_dir,
    write_model_card,
)
from selfcest.determinism import machine_description  # noqa: E402
from selfcest.grpo import SelfcestConfig, TrainingConfig, build_trainer, normal_sum  # noqa: E402
from selfcest.model import load_model  # noqa: E402
from selfcest.param_checks import check_keys, int_setting  # noqa: E402
from selfcest.rewards import GateConfig, GateMode, RewardConfig  # noqa: E402
from selfcest.runtime import RuntimeConfig  # noqa: E402
from selfcest.tasks import task_from_record  # noqa: E402
from selfcest.tokenizer import load_tokenizer  # noqa: E402
from stages.common import (  # noqa: E402
    SUPPORT_FILES,
    file_sha256,
    held_out_expressions,
    load_params,
    read_jsonl,
    setup_logging,
    write_json,
)

log = logging.getLogger("train_grpo")
LOG_COLUMNS = [
    "reward",
    "selfcest/accuracy",
    "selfcest/root_tokens",
    "selfcest/clone_tokens",
    "selfcest/total_tokens",
    "selfcest/critical_tokens",
    "selfcest/clones_per_episode",
    "selfcest/delegation_rate",
    "selfcest/gate_rate",
    "selfcest/protocol_error_rate",
    "selfcest/held_out_clone_rows",
    "kl",
    "grad_norm",
    "selfcest/grad_norm_root",
    "selfcest/grad_norm_clone",
    "loss",
    "entropy",
]


# Settings with a closed set of values, which the library tells apart by one of them alone (a gate
# mode that is neither `none` nor `protocol` is the ratio gate; a weighting other than `group` is
# `token`; an advantage other than `std` is mean-centred): a misspelt value would train as another one.
CHOICES = {
    "grpo.clone_weighting": ("token", "group"),
    "grpo.training.advantage": ("std", "mean"),
    "grpo.variants.<variant>.gate": get_args(GateMode),
}
VARIANT_KEYS = ("use_tools", "gate")


def _choice(setting: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{setting} must be one of {', '.join(choices)}, got {value!r}")


def check_grpo_params(grpo: dict[str, Any], variant_name: str) -> dict[str, Any]:
    """Refuse what would train as something else unnoticed, naming the setting; return the variant.
    A variant holds `use_tools` and `gate` only: any other key (a per-variant `temperature`) is not
    read, so it is refused rather than ignored."""
    variants = grpo.get("variants") or {}
    if variant_name not in variants:
        raise ValueError(f"grpo.variants has no {variant_name!r}: it has {', '.join(variants) or 'none'}")
    variant = variants[variant_name] or {}
    unknown = sorted(set(variant) - set(VARIANT_KEYS))
    missing = [key for key in VARIANT_KEYS if key not in variant]
    if unknown or missing:
        raise ValueError(
            f"grpo.variants.{variant_name} takes {' and '.join(VARIANT_KEYS)} only"
            + (f"; unknown: {unknown}" if unknown else "")
            + (f"; missing: {missing}" if missing else "")
        )
    _choice(f"grpo.variants.{variant_name}.gate", variant["gate"], CHOICES["grpo.variants.<variant>.gate"])
    _choice("grpo.clone_weighting", grpo.get("clone_weighting"), CHOICES["grpo.clone_weighting"])
    advantage = (grpo.get("training") or {}).get("advantage", "std")
    _choice("grpo.training.advantage", advantage, CHOICES["grpo.training.advantage"])
    return variant


# grpo.tasks: how many training problems each file gives (seeded draws, in this order), and the name
# of each file's hash in the run fingerprint and the model card.
TASK_SOURCES = {"arithmetic": "arithmetic_train", "qa": "qa_train", "arithmetic_rl": "arithmetic_rl"}
TASK_FILES = {
    "arithmetic": Path("data/arithmetic/train.jsonl"),
    "qa": Path("data/qa/train.jsonl"),
    "arithmetic_rl": Path("data/arithmetic/rl.jsonl"),
}
"""Each source's file (the stage's defaults; `benchmarks/warmup_skills.py` reads the same draw)."""
HELD_OUT_FILES = (Path("data/arithmetic/test.jsonl"), Path("data/arithmetic/ood.jsonl"))
"""The splits whose sums no clone row trains on, as the warm-up's `--held-out` default."""


def _mean_of_logged(values: list[Any]) -> float | None:
    """The mean of a metric over the last logged steps, rounded; None where no step logged it.

    TRL logs None for a metric that was NaN on every step of a logging window (`gate_rate` where no
    clone ran: the no-clone variant), which `or 0.0` had turned into a measured 0."""
    logged = [float(v) for v in values if v is not None]
    return round(sum(logged) / len(logged), 4) if logged else None


def held_out_sums(paths: list[Path]) -> frozenset[str]:
    """The held-out splits' sums (`stages.common.held_out_expressions`) that are flat `+`/`-` sums.

    Clone rows are matched by their flat sums (`grpo.normal_sum`): the runtime cuts only flat sums
    into halves, so a sum with `*` or brackets (the paper profile's arithmetic) can never be a clone's
    sum and has nothing to hold out. Such sums are counted in the log, not refused (they stopped the
    paper profile's GRPO before its first step)."""
    exprs = held_out_expressions(paths)
    flat = [expr for expr in exprs if normal_sum(expr) is not None]
    if len(flat) < len(exprs):
        log.info(
            "held-out splits: %d sums are not flat +/- sums, so no clone can hold one", len(exprs) - len(flat)
        )
    return frozenset(flat)


def grpo_records(tasks: dict[str, Any], seed: int, paths: dict[str, Path]) -> list[dict[str, Any]]:
    """The seeded draw of GRPO's training records: `tasks[name]` records of the file `paths[name]`
    for each `TASK_SOURCES` name (0 or absent: that file is not read), shuffled together. The draws
    run in `TASK_SOURCES` order, so a source added at the end leaves the earlier draws as they were
    (`benchmarks/warmup_skills.py` measures on the records a draw leaves out)."""
    check_keys("grpo.tasks", tasks, tuple(TASK_SOURCES))
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    for name in TASK_SOURCES:
        count = int_setting(tasks.get(name, 0), f"grpo.tasks.{name}", minimum=0)
        if count == 0:
            continue
        available = read_jsonl(paths[name])
        if not available:
            raise ValueError(f"grpo.tasks.{name} asks {count} problems but {paths[name]} holds none")
        records += rng.sample(available, min(count, len(available)))
    rng.shuffle(records)
    return records


def selfcest_config(params: dict[str, Any], variant_name: str) -> SelfcestConfig:
    """The rollout, reward and gate settings of one `grpo.variants` entry."""
    grpo = params["grpo"]
    variant = check_grpo_params(grpo, variant_name)
    return SelfcestConfig(
        runtime=RuntimeConfig(use_tools=variant["use_tools"], **grpo["runtime"]),
        reward=RewardConfig(**grpo["reward"]),
        # `gate_options: null` (a user's "none") means no options, as `{}` does
        gate=GateConfig(mode=variant["gate"], **(grpo.get("gate_options") or {})),
        clone_weighting=grpo["clone_weighting"],
        temperature=grpo["temperature"],
        seed=params["seed"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", required=True)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--init", default="artifacts/warmup_model")
    parser.add_argument("--arithmetic", type=Path, default=TASK_FILES["arithmetic"])
    parser.add_argument("--qa", type=Path, default=TASK_FILES["qa"])
    parser.add_argument(
        "--arithmetic-rl", type=Path, default=TASK_FILES["arithmetic_rl"], help="GRPO-only problems"
    )
    parser.add_argument(
        "--held-out",
        type=Path,
        nargs="*",
        default=list(HELD_OUT_FILES),
        help="arithmetic splits whose sums no clone row may train on (decontamination, as in the warm-up)",
    )
    parser.add_argument("--out", default=None, help="default artifacts/<variant>_model")
    parser.add_argument("--run-dir", default=None, help="default artifacts/runs/<variant>")
    parser.add_argument("--reports", default="reports")
    args = parser.parse_args()
    setup_logging()
    params = load_params(Path(args.params))
    grpo = params["grpo"]
    selfcest = selfcest_config(params, args.variant)  # checks the settings before the data are read
    selfcest = dataclasses.replace(selfcest, held_out_sums=held_out_sums(args.held_out))
    variant = grpo["variants"][args.variant]
    out = Path(args.out or f"artifacts/{args.variant}_model")
    run_dir = Path(args.run_dir or f"artifacts/runs/{args.variant}")
    reports = Path(args.reports)
    started = time.perf_counter()

    paths = {"arithmetic": args.arithmetic, "qa": args.qa, "arithmetic_rl": args.arithmetic_rl}
    records = grpo_records(grpo["tasks"], params["seed"], paths)
    view = "delegate" if variant["use_tools"] else "monolithic"
    tasks = [task_from_record(record, view) for record in records]

    training = TrainingConfig(**grpo["training"])
    data_hashes = {
        label: file_sha256(paths[name]) for name, label in TASK_SOURCES.items() if grpo["tasks"].get(name)
    }
    data_hashes |= {f"held_out:{path}": file_sha256(path) for path in args.held_out}
    run_fingerprint = fingerprint(
        {
            "grpo": grpo,
            "variant": variant,
            "seed": params["seed"],
            "data": data_hashes,
            "init": checkpoint_sha256s(args.init),  # weights (sharded too) and tokenizer files
            "code": code_sha256(__file__, *SUPPORT_FILES),
        }
    )
    resume = prepare_run_dir(run_dir, run_fingerprint)
    tokenizer = load_tokenizer(args.init)
    model = load_model(args.init, dtype="float32")
    log_csv = reports / f"grpo_{args.variant}_log.csv"
    trainer = build_trainer(
        model,
        tokenizer,
        tasks,
        selfcest,
        training,
        output_dir=str(run_dir),
        callbacks=[CsvLogCallback(log_csv, LOG_COLUMNS)],
    )
    if resume:
        log.info("resuming %s from %s", args.variant, resume)
    trainer.train(resume_from_checkpoint=resume)

    history = [h for h in trainer.state.log_history if "reward" in h]
    last = history[-3:] or [{}]
    metrics = {
        name.replace("selfcest/", ""): _mean_of_logged([h.get(name) for h in last])
        for name in (
            "reward",
            "selfcest/accuracy",
            "selfcest/delegation_rate",
            "selfcest/clones_per_episode",
            "selfcest/total_tokens",
            "selfcest/gate_rate",
        )
    }
    metrics.update(steps=trainer.state.global_step, stage_seconds=round(time.perf_counter() - started, 1))
    if out.exists():
        shutil.rmtree(out)
    trainer.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_model_card(
        out,
        title=f"selfcest GRPO checkpoint: {args.variant}",
        params={"seed": params["seed"], "grpo": grpo, "variant": variant},
        data_hashes=data_hashes,
        metrics=metrics,
    )
    # The machine goes to the metrics file only, not the model card (`machine_description`).
    write_json(reports / f"grpo_{args.variant}.json", {**metrics, "machine": machine_description()})
    shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
