"""Stage eval_<dataset>@<checkpoint>-<split>: one cell of the budget sweep.

A cell is one (checkpoint, split): it loads the checkpoint once and runs every method configured
under `eval.models.<checkpoint>` at every budget of `eval.budgets.<dataset>` on the split. Outputs, in
`artifacts/eval/<dataset>/<split>/<checkpoint>/`:

  rows.json          one sweep row per (method, budget): accuracy with a bootstrap 95% interval
                     (EM and F1 for QA), mean tokens (generated, with prompts, critical path),
                     seconds per problem, clones per problem, protocol-error rate, n
  episodes.jsonl.gz  one JSON line per (method, budget, problem) with every episode record
                     (texts and counts, no per-token arrays), for the trace viewer

A missing checkpoint directory does not fail the stage: rows.json then says `status: missing`.

A killed cell resumes: every finished (method, budget) unit is journaled in
`artifacts/runs/eval/<dataset>/<split>/<checkpoint>/` (`--run-dir`), under a fingerprint of the
cell's params, split file, weights and code; a rerun with the same fingerprint reads those units
back instead of running them, and any other fingerprint starts the journal afresh. The journal is
removed once rows.json is written.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_STARTED = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python stages/evaluate.py` works too

from selfcest.determinism import machine_description  # noqa: E402
from selfcest.param_checks import check_keys, is_int_setting  # noqa: E402
from selfcest.sweep_config import check_method_names, check_sweep_keys, per_dataset, settings_for  # noqa: E402
from stages.common import PARAMS_FILE, SUPPORT_FILES, file_sha256, load_params, setup_logging, write_json  # noqa: E402

log = logging.getLogger("evaluate")


def split_path(dataset: str, split: str) -> Path:
    """Where a split's records are: the data stages' JSONL files (prepare_math's for the math
    benchmarks)."""
    if dataset in ("arithmetic", "qa", "math"):
        return Path("data") / dataset / f"{split}.jsonl"
    raise ValueError(f"unknown dataset {dataset!r}")


def max_problems_for(
    value: Any,
    dataset: str,
    split: str,
    *,
    splits: Mapping[str, Any] | None = None,
    setting: str = "eval.sweep.max_problems",
) -> int | None:
    """`eval.sweep.max_problems` for one split: a number (null: every problem) for all splits, a
    mapping per dataset, or, under a dataset, a mapping per split whose `default` covers the splits
    it does not name (for example `{qa: {default: 48, musique_dev: 10}}` caps only the long one).
    `splits` (`eval.splits`): the split names such a mapping may use besides `default`, so that a
    misspelt `oood: 200` is refused rather than leaving ood at the default."""
    value = per_dataset(value, dataset, setting=setting)
    if isinstance(value, Mapping):
        if splits is not None:
            check_keys(f"{setting}.{dataset}", value, (*(splits.get(dataset) or []), "default"))
        value = value.get(split, value.get("default"))
    if value is not None and (not is_int_setting(value) or value < 1):
        raise ValueError(
            f"{setting} for {dataset}/{split} must be a positive whole number or null, got {value!r}"
        )
    return value


def gzip_writer(path: Path) -> io.TextIOWrapper:
    """A text writer to a gzip file with a fixed header (no name, mtime 0): same records, same bytes."""
    raw = open(path, "wb")  # noqa: SIM115 - closed through the wrapper
    return io.TextIOWrapper(gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0), encoding="utf-8")


def build_engine(sweep: dict[str, Any], checkpoint: Path) -> tuple[Any, str]:
    """The cell's generation engine and where it runs, from `eval.sweep`: `engine: transformers`
    (batched `generate`, on `device`) or `engine: vllm` (paper profile, GPU; `eval.sweep.vllm` is
    passed to `vllm.LLM`)."""

    from selfcest.engine import TransformersEngine, VLLMEngine, resolve_device
    from selfcest.model import load_model
    from selfcest.tokenizer import load_tokenizer

    name = sweep.get("engine") or "transformers"
    if name not in ("transformers", "vllm"):  # refused before any file is read
        raise ValueError(f"eval.sweep.engine must be 'transformers' or 'vllm', got {name!r}")
    tokenizer = load_tokenizer(checkpoint)
    if name == "vllm":
        return VLLMEngine(str(checkpoint), tokenizer, **dict(sweep.get("vllm") or {})), "cuda"
    device = resolve_device(sweep.get("device") or "auto")
    model = load_model(checkpoint, device=device)
    return TransformersEngine(model, tokenizer, max_batch_size=int(sweep.get("batch_size", 64))), device


def main(argv: list[str] | None = None, *, own_process: bool = False) -> None:
    """Run one cell. `own_process`: this process was started for the stage (`python -m
    stages.evaluate`), so it has run no torch work before; only then may `eval.sweep.workers` fork it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, choices=["arithmetic", "qa", "math"])
    parser.add_argument("--split", required=True)
    parser.add_argument(
        "--model", required=True, help="a key of eval.models (a directory in eval.checkpoint_dir)"
    )
    parser.add_argument("--params", type=Path, default=PARAMS_FILE)
    parser.add_argument("--out", type=Path, help="default: artifacts/eval/<dataset>/<split>/<model>")
    parser.add_argument("--max-problems", type=int, help="override eval.sweep.max_problems (smoke tests)")
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="the journal of finished units; default: artifacts/runs/eval/<dataset>/<split>/<model>",
    )
    args = parser.parse_args(argv)
    setup_logging()
    params = load_params(args.params)
    eval_params = params["eval"]
    # The report stage refuses a reference budget that is not one of the dataset's budgets; check it
    # here too, so that a misconfigured sweep stops before its cells spend minutes (hours with the
    # paper's models) rather than after. A check only: `eval.report` is not among this stage's
    # params, since nothing a cell writes depends on it (the rule, sweep_config.py, is a dep).
    budgets = settings_for(eval_params, args.dataset).budgets
    if not budgets:  # the cell would write `ok` with no rows, and the report say only that none ran
        raise ValueError(f"eval.budgets gives {args.dataset} no budget: list at least one")
    check_method_names(eval_params.get("models"))  # also a check only: the report needs unique names

    sweep = eval_params.get("sweep") or {}  # `sweep: null` is every default
    models = eval_params.get("models") or {}
    if args.model not in models:
        raise ValueError(
            f"--model {args.model!r} is not a key of eval.models ({', '.join(models) or 'none'})"
        )
    check_sweep_keys(sweep)
    # Checked before the checkpoint loads, the flag like the setting (0 would give empty cells).
    max_problems = (
        max_problems_for(
            sweep.get("max_problems"), args.dataset, args.split, splits=eval_params.get("splits")
        )
        if args.max_problems is None
        else max_problems_for(args.max_problems, args.dataset, args.split, setting="--max-problems")
    )
    out = args.out or Path("artifacts/eval") / args.dataset / args.split / args.model
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(eval_params.get("checkpoint_dir", "artifacts")) / args.model
    meta = {"dataset": args.dataset, "split": args.split, "checkpoint": args.model}
    method_params = models[args.model] or {}

    from selfcest.evaluation import Evaluator, MethodSpec, evaluate_cell, load_problems

    methods = [
        MethodSpec.from_params(name, values, section=f"eval.models.{args.model}.{name}")
        for name, values in method_params.items()
    ]
    methods = [m for m in methods if m.applies_to(args.dataset)]
    if not checkpoint.is_dir():
        log.warning("checkpoint %s is missing: writing a `missing` cell", checkpoint)
        write_json(
            out / "rows.json", {**meta, "status": "missing", "methods": [m.name for m in methods], "rows": []}
        )
        with gzip_writer(out / "episodes.jsonl.gz"):
            pass
        return

    threads = int(sweep.get("threads") or 0)
    if threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    if threads:
        torch.set_num_threads(threads)
    from selfcest.engine import accelerator_name
    from selfcest.evaluation import runtime_config_from_params

    imported = time.perf_counter()
    engine, device = build_engine(sweep, checkpoint)
    loaded = time.perf_counter()

    seed = int(sweep.get("seed", params.get("seed", 0)))
    source = eval_params.get("math_sources", {}).get(args.split, {}) if args.dataset == "math" else {}
    split_file = split_path(args.dataset, args.split)
    problems = load_problems(
        args.dataset,
        split_file,
        max_problems=max_problems,
        seed=seed,
    )
    # The journal resumes only this very cell: what its rows depend on, hashed, as the training
    # stages key their run folders (eval.sweep.workers/threads/batch_size change no row, sampled
    # ones included, since every request draws from its own keyed seed, but are kept in: a resume is
    # for a killed run of the same command, not for reuse across settings).
    from selfcest.checkpoints import checkpoint_sha256s, code_sha256, fingerprint, prepare_run_dir

    hashing = time.perf_counter()
    checkpoint_hashes = checkpoint_sha256s(checkpoint)
    weights = checkpoint_hashes["weights"]
    cell_fingerprint = fingerprint(
        {
            **meta,
            "seed": params.get("seed"),
            "runtime": params.get("runtime"),
            "sweep": sweep,
            "budgets": budgets,
            "methods": method_params,
            "source": source,
            "max_problems": args.max_problems,
            "data": file_sha256(split_file),
            "checkpoint": checkpoint_hashes,  # weights and tokenizer files (a fixed chat template)
            "device": device,
            "code": code_sha256(__file__, *SUPPORT_FILES),
        }
    )
    journal_root = Path("artifacts/runs/eval")
    run_dir = args.run_dir or journal_root / args.dataset / args.split / args.model
    prepare_run_dir(run_dir, cell_fingerprint)
    hashed = time.perf_counter()
    evaluator = Evaluator(
        engine,
        runtime_config_from_params(params.get("runtime")),
        seed=seed,
        avg_k=int(source.get("avg_k", 1)),
        avg_temperature=float(sweep.get("avg_temperature", 0.6)),
        avg_top_p=float(sweep.get("avg_top_p", 0.95)),
    )
    # Forking is safe only from a process whose torch has never run work on more than one thread
    # (libgomp's thread pool does not survive a fork: a worker forked from a test process that had
    # run two-thread work hung at its first operation) and never started CUDA or vLLM.
    workers = max(1, int(sweep.get("workers") or 1))
    if workers > 1 and not (own_process and device == "cpu" and torch.get_num_threads() == 1):
        log.info(
            "eval.sweep.workers=%d needs a CPU engine on one thread in the stage's own process: one process",
            workers,
        )
        workers = 1
    with gzip_writer(out / "episodes.jsonl.gz") as records:
        rows = evaluate_cell(
            evaluator,
            methods,
            problems,
            budgets,
            meta=meta,
            resamples=int(sweep.get("bootstrap_resamples", 1000)),
            bootstrap_seed=seed,
            records_out=records,
            workers=workers,
            journal=run_dir,
        )
    finished = time.perf_counter()
    timing = {
        "import_seconds": round(imported - _STARTED, 2),
        "load_seconds": round(loaded - imported, 2),
        "hash_seconds": round(hashed - hashing, 2),
        "run_seconds": round(finished - loaded - (hashed - hashing), 2),
        "threads": torch.get_num_threads(),
        "workers": workers,
        "device": device,
        "engine_calls": engine.stats.calls,
        # Where the cell ran (its timings are this machine's; `selfcest.reports.machine_lines`).
        "machine": {**machine_description(), "gpu": accelerator_name(device)},
    }
    write_json(
        out / "rows.json",
        {
            **meta,
            # Which weights produced these rows: the report names checkpoints that hold the same
            # weights (a GRPO ablation that trained exactly as its reference run).
            "weights_sha256": weights,
            "status": "ok",
            "methods": [m.name for m in methods],
            "rows": rows,
            "timing": timing,
        },
    )
    shutil.rmtree(run_dir)  # the rows are written: nothing left to resume
    if args.run_dir is None:  # and the default journal's <dataset>/<split> folders, once empty
        for folder in run_dir.parents:
            if folder == journal_root or any(folder.iterdir()):
                break
            folder.rmdir()
    log.info("cell %s: %d rows, %s", json.dumps(meta), len(rows), timing)


if __name__ == "__main__":
    main(own_process=True)
