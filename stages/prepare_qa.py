"""Stage prepare_qa: synthetic multi-hop QA splits plus adapted real 2Wiki/MuSiQue samples, validated.

Outputs (paths relative to the working directory):
  data/qa/                   `DatasetDict.save_to_disk`: synthetic train/validation/test/ood plus one
                             split per real source name (e.g. 2wiki_dev, musique_dev)
  data/qa/<split>.jsonl      canonical JSON lines of the kept records (byte-stable)
  data/qa/quarantine.jsonl   every record kept out, with file, index, id and reasons: invalid ones
                             (stage adapter, schema or expectations) and sound ones kept out by
                             design (stage `unanswerable`: MuSiQue's contrast questions; stage
                             `overlaps_train`: evaluation records a training split also holds), which
                             are counted apart and not towards `validation.max_invalid_fraction`
  reports/qa_validation.json counts per source and split, invalid fractions, expectations (DVC metrics)
  reports/qa_validation.md   the same for humans (GX Data Docs need a CDN, so we write our own)

When a source group or split has more invalid records than `validation.max_invalid_fraction`, or a
split keeps no record at all (every one kept out by design or invalid within the limit), the
quarantine and the reports are written (no split is, and the old ones are removed), then the stage
stops with QAValidationError naming the file, the count and the first offending record (for an empty
split: the split and how many of its records went where), so that every reason is kept.

Relative source paths are resolved against the working directory (the repo root under DVC), so
the default `../shared/data/benchmarks/...` points at the read-only sample files. `s3://` URLs go
through fsspec/s3fs with the source's `storage_options`.

`--params`, `--out` and `--reports` let tests run the stage on a small params file in a tmp dir.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
import unicodedata
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# `python stages/prepare_qa.py` puts stages/ (not the repo root) on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from selfcest.data.qa import (  # noqa: E402
    OVERLAPS_TRAIN,
    UNANSWERABLE,
    QADataError,
    QARecord,
    Quarantined,
    canonical_jsonl,
    context_text,
    generate_synthetic,
    load_source,
    records_sha256,
    split_config,
    type_guess_accuracy,
)
from selfcest.data.validation import QAValidationError, check_limits, validate_records  # noqa: E402
from selfcest.param_checks import check_keys  # noqa: E402
from stages.common import (  # noqa: E402
    PARAMS_FILE,
    check_split_names,
    load_params,
    resolve_source,
    setup_logging,
    write_json,
)

log = logging.getLogger("prepare_qa")

REAL_SOURCE_KEYS = ("name", "format", "source", "split", "path", "storage_options")
"""The settings of one `qa.real.sources` entry."""


def _features() -> Any:
    import datasets

    paragraph = {
        "key": datasets.Value("string"),
        "title": datasets.Value("string"),
        "text": datasets.Value("string"),
        "supporting": datasets.Value("bool"),
    }
    hop = {
        "question": datasets.Value("string"),
        "answer": datasets.Value("string"),
        "paragraph_key": datasets.Value("string"),
    }
    # Explicit nested schema: inference would fail on a split whose records all have no hops.
    return datasets.Features(
        {
            "id": datasets.Value("string"),
            "question": datasets.Value("string"),
            "answers": datasets.Sequence(datasets.Value("string")),
            "paragraphs": [paragraph],
            "hops": [hop],
            "source": datasets.Value("string"),
            "split": datasets.Value("string"),
            "num_hops": datasets.Value("int32"),
            "type": datasets.Value("string"),
        }
    )


def is_train_split(name: str) -> bool:
    """Training splits are the synthetic `train` and real ones named `<something>_train` (e.g.
    `musique_train`); every other split (validation, test, ood, 2wiki_dev, musique_dev, ...) is
    evaluated on, so it must not share records with them."""
    return name == "train" or name.endswith(("_train", "-train"))


def normalised(text: str) -> str:
    """Case, Unicode form, punctuation and spacing folded away: "St. Louis?" and "st  louis" match."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    spaced = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in folded)
    return " ".join(spaced.split())


def quarantine_train_overlaps(
    splits: dict[str, list[QARecord]], where: Mapping[int, tuple[str, int]]
) -> list[Quarantined]:
    """Take out of every evaluation split the records whose id, or whose normalised question and
    gold answer, a training split also holds (contamination: a model trained on that split has seen
    them), and return them quarantined as `overlaps_train`, naming the training split and its
    record. `where` maps id(record) to its (file, index) for the quarantine entry. Training splits
    are not checked against each other, nor evaluation splits against each other."""
    by_id: dict[str, str] = {}
    by_pair: dict[tuple[str, str], tuple[str, str]] = {}
    for name, records in splits.items():
        if is_train_split(name):
            for r in records:
                by_id.setdefault(r["id"], name)  # the first training split in order is named
                by_pair.setdefault((normalised(r["question"]), normalised(r["answers"][0])), (name, r["id"]))
    out: list[Quarantined] = []
    for name, records in splits.items():
        if is_train_split(name):
            continue
        kept: list[QARecord] = []
        for r in records:
            reasons = []
            if r["id"] in by_id:
                reasons.append(
                    f"{OVERLAPS_TRAIN}: id {r['id']!r} is also in training split {by_id[r['id']]!r}"
                )
            pair = by_pair.get((normalised(r["question"]), normalised(r["answers"][0])))
            if pair:
                reasons.append(
                    f"{OVERLAPS_TRAIN}: question and answer (normalised) are also in training split "
                    f"{pair[0]!r} (record {pair[1]!r})"
                )
            if not reasons:
                kept.append(r)
                continue
            file, index = where[id(r)]
            out.append(
                Quarantined(
                    r["source"], file, index, r["id"], reasons, stage=OVERLAPS_TRAIN, split=name, record=r
                )
            )
        splits[name] = kept
    return out


SYNTHETIC_SOURCE = "synthetic"
"""The `source` of every generated record (`validate_records(..., source=...)` below)."""


@dataclass
class Prepared:
    """What the stage writes, and the stop messages: groups over the invalid limit, empty splits."""

    splits: dict[str, list[QARecord]] = field(default_factory=dict)
    quarantined: list[Quarantined] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def check(self, quarantine: Path | None = None) -> None:
        """Raise QAValidationError when a source group or split had too many invalid records, or a
        split kept none: the first one's message (file, count, first offending record; or the empty
        split and why), the others after it, and where the quarantine with every record's reasons
        was written."""
        if not self.problems:
            return
        message = "\n".join(self.problems)
        if quarantine is not None:
            message += f"\nevery quarantined record, with its reasons, is in {quarantine}"
        raise QAValidationError(message)


def check_answer_in_context_sources(params: Mapping[str, Any]) -> None:
    """A name listed in `validation.answer_in_context_sources` must be `synthetic` or the source
    name of a configured `qa.real` source (its `source`, else its `format`, as the loader is given):
    a name that matches none (`2wiki` for `2wikimultihopqa`) turned the check off for that source
    silently. Only a list the params give is checked: the default names sources a profile may not
    configure. Sources of a disabled `qa.real` count, so that switching them off needs no other edit."""
    listed = (params.get("validation") or {}).get("answer_in_context_sources")
    if not listed:
        return
    real = params["qa"].get("real") or {}
    known = {SYNTHETIC_SOURCE} | {
        str(src.get("source", src.get("format")))
        for src in real.get("sources") or []
        if isinstance(src, Mapping) and src.get("source", src.get("format")) is not None
    }
    unknown = [name for name in listed if name not in known]
    if unknown:
        raise ValueError(
            f"validation.answer_in_context_sources: unknown source name(s) {', '.join(map(repr, unknown))}: "
            "no configured qa.real source has them, so the check would be off for them (known source "
            f"names: {', '.join(sorted(known))})"
        )


def build(params: dict[str, Any]) -> tuple[dict[str, list[QARecord]], list[Quarantined], dict[str, Any]]:
    """Everything but the writing: (kept splits, quarantined, metrics). Raises QAValidationError when
    too many records are invalid or a split keeps none (`prepare` then `Prepared.check`; `main`
    writes in between)."""
    prepared = prepare(params)
    prepared.check()
    return prepared.splits, prepared.quarantined, prepared.metrics


def prepare(params: dict[str, Any]) -> Prepared:
    """Everything but the writing and the stop on too many invalid records or an empty split
    (`Prepared.problems`)."""
    qa = params["qa"]
    # Checked before any generating or reading: a bad setting fails at once, naming itself. `limits`
    # is then the checked settings over their defaults, the same that `validate_records` applies.
    limits = check_limits(params.get("validation") or {})
    splits: dict[str, list[QARecord]] = {}
    problems: list[str] = []  # the stop messages: raised after the quarantine is written
    stopped: set[str] = set()  # splits over the invalid limit: their message says why one is empty
    origins: dict[str, str] = {}  # split -> the file(s) or synthetic name it came from, for messages
    quarantined: list[Quarantined] = []
    metrics: dict[str, Any] = {"sources": {}, "splits": {}, "expectations": {}}
    where: dict[int, tuple[str, int]] = {}  # id(kept record) -> (file, index): for the overlap check
    source_key: dict[tuple[str, str], str] = {}  # (split, file) -> its key in metrics["sources"]

    def merge_expectations(name: str, report: dict[str, Any]) -> None:
        for exp, res in report["expectations"].items():
            slot = metrics["expectations"].setdefault(exp, {"success": True, "unexpected_count": 0})
            slot["success"] = slot["success"] and res["success"]
            slot["unexpected_count"] += res["unexpected_count"]

    # ---- synthetic
    check_keys("qa", qa, ("seed", "synthetic", "real"))
    check_keys("qa.real", qa.get("real"), ("enabled", "sources"))
    check_answer_in_context_sources(params)
    syn = qa.get("synthetic") or {}
    if syn.get("enabled", True):
        # Every key but the switch and the splits is a default for the splits, so that `split_config`
        # refuses a misspelt one by name (a filter to the known keys dropped it, unnoticed).
        defaults = {k: v for k, v in syn.items() if k not in ("enabled", "splits")}
        configs = {
            name: split_config(spec, defaults, name=name) for name, spec in (syn.get("splits") or {}).items()
        }
        generated = generate_synthetic(int(qa["seed"]), configs)
        for name, records in generated.items():
            # enforce=False: an error here would lose the quarantine (`Prepared.check` raises later).
            result = validate_records(
                records, limits, origin=f"synthetic/{name}", source=SYNTHETIC_SOURCE, enforce=False
            )
            problems += [result.problem] if result.problem else []
            stopped |= {name} if result.problem else set()
            splits[name] = result.kept
            origins[name] = f"synthetic/{name}"
            where.update({id(r): (f"synthetic/{name}", index) for index, r in enumerate(records)})
            source_key[(name, f"synthetic/{name}")] = f"synthetic/{name}"
            quarantined += result.quarantined
            merge_expectations(name, result.report)
            metrics["sources"][f"synthetic/{name}"] = {
                "kept": len(result.kept),
                "quarantined": len(result.quarantined),
                UNANSWERABLE: result.report["excluded"][UNANSWERABLE],
                OVERLAPS_TRAIN: 0,  # counted once every split is in
                "invalid_fraction": result.report["invalid_fraction"],
            }

    # ---- real sources, grouped by output split name (several files may feed one split)
    real = qa.get("real") or {}
    if real.get("enabled", True):
        groups: dict[str, list[dict[str, Any]]] = {}
        for position, src in enumerate(real.get("sources") or []):
            entry = f"qa.real.sources[{position}]"
            if not isinstance(src, Mapping):
                raise ValueError(f"{entry}: expected a mapping with name, format and path, got {src!r}")
            check_keys(entry, src, REAL_SOURCE_KEYS)  # a misspelt `storage_options` lost an S3 endpoint
            missing = [key for key in ("name", "format", "path") if key not in src]
            if missing:
                raise ValueError(f"{entry}: missing {', '.join(missing)}")
            groups.setdefault(src["name"], []).append(src)
        for split_name, sources in groups.items():
            if split_name in splits:
                raise ValueError(
                    f"qa.real.sources: name {split_name!r} is also a synthetic split; the real records "
                    "would replace the synthetic ones. Give the source another name."
                )
            records: list[QARecord] = []
            files: list[str] = []
            indices: list[int] = []
            prior: list[Quarantined] = []
            seen: dict[str, str] = {}  # id -> canonical JSON of the first copy
            per_file: dict[str, dict[str, int]] = {}
            for src in sources:
                path = resolve_source(src["path"], "qa.real.sources")
                loaded = load_source(
                    src["format"],
                    path,
                    split=src.get("split", "dev"),
                    source=src.get("source", src["format"]),
                    storage_options=src.get("storage_options"),
                )
                stats = per_file.setdefault(path, {"records": 0, "duplicates_merged": 0})
                stats["records"] += len(loaded.records) + len(loaded.quarantined)
                for q in loaded.quarantined:
                    q.split = split_name
                prior += loaded.quarantined
                for index, rec in zip(loaded.positions, loaded.records, strict=True):  # file positions
                    # The KAG 2Wiki file repeats records of the HippoRAG one: identical copies are
                    # merged (and counted); same id with other content stays in, so the unique-id
                    # expectation quarantines it.
                    blob = json.dumps(rec, sort_keys=True)
                    if seen.get(rec["id"]) == blob:
                        stats["duplicates_merged"] += 1
                        continue
                    seen.setdefault(rec["id"], blob)
                    records.append(rec)
                    files.append(path)
                    indices.append(index)
            if not records and not prior:
                raise QADataError(", ".join(per_file), f"no records for QA split {split_name!r}")
            result = validate_records(
                records,
                limits,
                origin=", ".join(per_file),
                prior=prior,
                files=files,
                indices=indices,
                enforce=False,  # as for the synthetic splits: `Prepared.check` raises after writing
            )
            problems += [result.problem] if result.problem else []
            stopped |= {split_name} if result.problem else set()
            splits[split_name] = result.kept
            origins[split_name] = ", ".join(per_file)
            where.update({id(r): (f, i) for r, f, i in zip(records, files, indices, strict=True)})
            for q in result.quarantined:  # the expectations' quarantines carry the record's own split
                q.split = split_name
            quarantined += result.quarantined
            merge_expectations(split_name, result.report)
            q_by_file = Counter(q.file for q in result.quarantined)
            invalid_by_file = Counter(q.file for q in result.quarantined if q.invalid)
            unanswerable_by_file = Counter(q.file for q in result.quarantined if q.stage == UNANSWERABLE)
            kept_ids = {id(r) for r in result.kept}  # identity: kept holds the same objects
            kept_by_file = Counter(f for f, r in zip(files, records, strict=True) if id(r) in kept_ids)
            names = Counter(Path(path).name for path in per_file)
            for path, stats in per_file.items():
                # The file's name, or its whole path where two of the split's files share a name.
                name = Path(path).name if names[Path(path).name] == 1 else path
                source_key[(split_name, path)] = f"{split_name}/{name}"
                # Records kept out by design (unanswerable) are not judged, as in validate_records.
                judged = stats["records"] - (q_by_file[path] - invalid_by_file[path])
                metrics["sources"][f"{split_name}/{name}"] = {
                    "kept": kept_by_file[path],
                    "quarantined": q_by_file[path],
                    UNANSWERABLE: unanswerable_by_file[path],
                    OVERLAPS_TRAIN: 0,  # counted once every split is in
                    "duplicates_merged": stats["duplicates_merged"],
                    "invalid_fraction": invalid_by_file[path] / judged if judged else 0.0,
                }

    # ---- contamination: evaluation records that a training split also holds are kept out
    overlaps = quarantine_train_overlaps(splits, where)
    for q in overlaps:
        entry = metrics["sources"][source_key[(q.split, q.file)]]
        entry["kept"] -= 1
        entry["quarantined"] += 1
        entry[OVERLAPS_TRAIN] += 1
    quarantined += overlaps

    # ---- per-split summary
    train_questions = {r["question"] for name, rs in splits.items() if is_train_split(name) for r in rs}
    for name, records in splits.items():
        n_par = [len(r["paragraphs"]) for r in records] or [0]
        hops = [r["num_hops"] for r in records] or [0]
        chars = [len(context_text(r)) for r in records] or [0]
        metrics["splits"][name] = {
            "kept": len(records),
            "quarantined": sum(1 for q in quarantined if q.split == name),
            UNANSWERABLE: sum(1 for q in quarantined if q.split == name and q.stage == UNANSWERABLE),
            OVERLAPS_TRAIN: sum(1 for q in overlaps if q.split == name),
            "paragraphs_min": min(n_par),
            "paragraphs_max": max(n_par),
            "num_hops_min": min(hops),
            "num_hops_max": max(hops),
            "context_chars_mean": round(sum(chars) / len(chars), 1),
            "context_chars_max": max(chars),
            "sha256": records_sha256(records),
            # Question texts of a training split, with another answer (a record with the same answer
            # overlaps and is kept out; each synthetic record has its own world): memorising train
            # answers does not help, reading the context does.
            "question_in_train": 0
            if is_train_split(name)
            else sum(1 for r in records if r["question"] in train_questions),
            # A reader that guesses the most-mentioned entity of the answer's type (synthetic only):
            # the accuracy a method must beat to show it follows the chain.
            "type_guess_accuracy": type_guess_accuracy(records),
        }
    # A split left with no records (all kept out by design, or invalid within the limit) cannot be
    # written (datasets does not load an empty split back). It stopped the stage before anything was
    # written, leaving the old splits looking current and no quarantine saying why: now it stops as a
    # split over the invalid limit does, after the quarantine and reports, with the old splits gone.
    problems += [
        empty_split_problem(name, origins[name], [q for q in quarantined if q.split == name])
        for name, records in splits.items()
        if not records and name not in stopped
    ]
    total_kept = sum(len(v) for v in splits.values())
    invalid = sum(1 for q in quarantined if q.invalid)
    judged = total_kept + invalid  # records kept out by design are not judged
    metrics.update(
        kept=total_kept,
        quarantined=len(quarantined),
        invalid=invalid,
        unanswerable=sum(1 for q in quarantined if q.stage == UNANSWERABLE),
        overlaps_train=len(overlaps),
        invalid_fraction=invalid / judged if judged else 0.0,
        max_invalid_fraction=float(limits["max_invalid_fraction"]),
    )
    return Prepared(splits, quarantined, metrics, problems)


def empty_split_problem(name: str, origin: str, quarantined: list[Quarantined]) -> str:
    """The stop message of a split that kept no record though no invalid limit was exceeded: its
    files, and how many of its records went where (by design or invalid)."""
    stages = Counter(q.stage for q in quarantined)
    invalid = sum(1 for q in quarantined if q.invalid)
    return (
        f"{origin}: QA split {name!r} has no records left: all {len(quarantined)} of its records were "
        f"kept out ({stages[UNANSWERABLE]} unanswerable, {stages[OVERLAPS_TRAIN]} overlapping a training "
        f"split, {invalid} invalid within validation.max_invalid_fraction), and a split with no records "
        "cannot be written"
    )


def _guess(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def render_markdown(metrics: dict[str, Any], quarantined: list[Quarantined]) -> str:
    lines = [
        "# QA data validation",
        "",
        "Generated by `stages/prepare_qa.py` (Great Expectations suite in "
        "`src/selfcest/data/validation.py`); do not edit by hand.",
        "",
        f"Kept {metrics['kept']} records, quarantined {metrics['quarantined']}: "
        f"{metrics['invalid']} invalid (invalid fraction {metrics['invalid_fraction']:.2%}, stop above "
        f"{metrics['max_invalid_fraction']:.2%}), {metrics['unanswerable']} unanswerable (MuSiQue's "
        f"contrast questions) and {metrics['overlaps_train']} evaluation records that a training split "
        "also holds (same id, or same normalised question and answer); the last two are kept out by "
        "design and not counted as invalid.",
        "",
        "## Sources",
        "",
        "| source | kept | quarantined | unanswerable | overlaps train | duplicates merged | invalid fraction |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in metrics["sources"].items():
        lines.append(
            f"| {name} | {s['kept']} | {s['quarantined']} | {s[UNANSWERABLE]} | {s[OVERLAPS_TRAIN]} | "
            f"{s.get('duplicates_merged', 0)} | {s['invalid_fraction']:.2%} |"
        )
    lines += [
        "",
        "## Splits",
        "",
        "| split | kept | quarantined | unanswerable | overlaps train (kept out) | paragraphs | hops "
        "| context chars (mean / max) | question text in train | type-guess accuracy | sha256 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in metrics["splits"].items():
        lines.append(
            f"| {name} | {s['kept']} | {s['quarantined']} | {s[UNANSWERABLE]} | {s[OVERLAPS_TRAIN]} | "
            f"{s['paragraphs_min']}-{s['paragraphs_max']} | "
            f"{s['num_hops_min']}-{s['num_hops_max']} | {s['context_chars_mean']} / {s['context_chars_max']} | "
            f"{s['question_in_train']} | {_guess(s.get('type_guess_accuracy'))} | "
            f"`{s['sha256'][:16]}` |"
        )
    lines += [
        "",
        "Type-guess accuracy (synthetic splits): the expected accuracy of guessing the entity of the "
        "answer's type that the context mentions most often (ties split evenly), without following "
        "the chain; a method at or below it shows no reading.",
    ]
    lines += ["", "## Expectations", "", "| expectation | success | unexpected |", "|---|---|---|"]
    for name, e in sorted(metrics["expectations"].items()):
        lines.append(f"| {name} | {'yes' if e['success'] else '**no**'} | {e['unexpected_count']} |")
    lines += ["", "## Quarantined records", ""]
    if not quarantined:
        lines.append("None.")
    for q in quarantined[:200]:
        lines.append(f"- `{q.file}` #{q.index} id `{q.record_id}` ({q.stage}): {'; '.join(q.reasons)}")
    if len(quarantined) > 200:
        lines.append(f"- ... {len(quarantined) - 200} more in data/qa/quarantine.jsonl")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=PARAMS_FILE)
    parser.add_argument("--out", type=Path, default=Path("data/qa"))
    parser.add_argument("--reports", type=Path, default=Path("reports"))
    args = parser.parse_args(argv)
    setup_logging()

    import datasets  # deferred: importing datasets takes a few seconds and `--help` should not

    datasets.disable_progress_bars()
    started = time.perf_counter()
    prepared = prepare(load_params(args.params))
    splits, quarantined, metrics = prepared.splits, prepared.quarantined, prepared.metrics
    check_split_names(splits, "qa.synthetic.splits / qa.real.sources")  # before the old files go
    # Start from an empty directory so a split dropped from the params leaves no stale files (and a
    # stopped run leaves no old split beside its new quarantine).
    if args.out.exists():
        shutil.rmtree(args.out)
    if not prepared.problems:  # a stopped run writes no split: only what says what to fix
        features = _features()
        dataset = datasets.DatasetDict(
            {name: datasets.Dataset.from_list(records, features=features) for name, records in splits.items()}
        )
        dataset.save_to_disk(str(args.out))
        for name, records in splits.items():
            (args.out / f"{name}.jsonl").write_text(canonical_jsonl(records), encoding="utf-8")
    args.out.mkdir(parents=True, exist_ok=True)
    quarantine = args.out / "quarantine.jsonl"
    quarantine.write_text(canonical_jsonl(q.to_dict() for q in quarantined), encoding="utf-8")
    write_json(args.reports / "qa_validation.json", metrics)
    (args.reports / "qa_validation.md").write_text(render_markdown(metrics, quarantined), encoding="utf-8")
    prepared.check(quarantine)  # after writing: the quarantine keeps every reason, not just the first
    log.info(
        "wrote %s (%s; %d quarantined) in %.1fs",
        args.out,
        ", ".join(f"{k}={len(v)}" for k, v in splits.items()),
        len(quarantined),
        time.perf_counter() - started,
    )


if __name__ == "__main__":
    main()
