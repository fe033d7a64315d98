"""Validation of unified QA records (selfcest.data.qa.QARecord) with Great Expectations.

Two layers:
1. `schema_errors`: plain-Python structural check (fields present, right types, nested
   paragraphs/hops well formed). A record that fails it cannot be flattened, so it is quarantined
   before GX sees it.
2. A GX expectation suite over a flattened pandas view (one row per record with derived columns).
   Failed rows are mapped back to records through a `_row` column (ids may be duplicated, which is
   one of the things being checked) and quarantined with the names of the failed expectations.

`validate_records` returns kept records, quarantined items and a report dict, and raises
`QAValidationError` when the invalid fraction exceeds `max_invalid_fraction`. Records an adapter
kept out by design (`selfcest.data.qa.EXCLUDED_STAGES`, e.g. MuSiQue's unanswerable ones) are
quarantined and counted apart: the invalid fraction is invalid records over the records judged.

GX notes (1.24): the ephemeral context is used so nothing is written under the repo; Data Docs
need a CDN, so the caller renders its own JSON/Markdown report from `report`.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from selfcest.data.qa import (
    EXCLUDED_STAGES,
    HOP_FIELDS,
    PARAGRAPH_FIELDS,
    RECORD_FIELDS,
    QARecord,
    Quarantined,
)
from selfcest.param_checks import fraction_setting, int_setting

log = logging.getLogger(__name__)
# GX logs every import-time registration at INFO; stage scripts run the root logger at INFO.
logging.getLogger("great_expectations").setLevel(logging.WARNING)

#: Bounds used when params give none. Generous enough for real 2Wiki/MuSiQue records.
DEFAULT_LIMITS: dict[str, Any] = {
    "max_invalid_fraction": 0.05,
    "min_paragraphs": 2,
    "max_paragraphs": 64,
    "min_question_chars": 8,
    "max_question_chars": 512,
    "max_answer_chars": 256,
    "max_paragraph_chars": 8000,
    "max_context_chars": 100000,
    "max_key_chars": 48,
    "min_num_hops": 1,
    "max_num_hops": 8,
    # Sources whose gold answer (or one of its aliases) must appear verbatim in a supporting
    # paragraph; yes/no golds are exempt (comparison questions). True for the synthetic generator
    # by construction and for every MuSiQue record sampled here (100 of 100 dev, 3 of 3 train).
    "answer_in_context_sources": ["synthetic", "musique"],
}


#: Upper bounds of ranges whose lower end the suite fixes at 1 (`build_suite`: an empty answer, key,
#: paragraph or context is invalid): 0 would make "between 1 and 0", which GX does not fail record
#: by record but crashes on, so the check would be off for every record.
POSITIVE_LIMITS = ("max_answer_chars", "max_key_chars", "max_paragraph_chars", "max_context_chars")

#: Inclusive (min, max) pairs among the limits: min > max would quarantine every record.
LIMIT_RANGES = (
    ("min_paragraphs", "max_paragraphs"),
    ("min_question_chars", "max_question_chars"),
    ("min_num_hops", "max_num_hops"),
)


def check_limits(limits: Mapping[str, Any], prefix: str = "validation") -> dict[str, Any]:
    """`limits` over DEFAULT_LIMITS, checked: an unknown name (a typo would silently keep the
    default), a count that is not a non-negative integer (or one of POSITIVE_LIMITS below 1), a
    fraction outside [0, 1] or a range with min > max (which would quarantine every record and stop
    the stage blaming the data) raises a ValueError naming the setting `<prefix>.<name>`."""
    unknown = sorted(set(limits) - set(DEFAULT_LIMITS))
    if unknown:
        names = ", ".join(f"{prefix}.{k}" for k in unknown)
        raise ValueError(
            f"unknown QA validation setting {names} (known: {', '.join(sorted(DEFAULT_LIMITS))})"
        )
    lim = {**DEFAULT_LIMITS, **limits}
    fraction_setting(lim["max_invalid_fraction"], f"{prefix}.max_invalid_fraction")
    counts = [n for n in lim if n.startswith(("min_", "max_")) and n != "max_invalid_fraction"]
    for name in counts:
        int_setting(lim[name], f"{prefix}.{name}", minimum=1 if name in POSITIVE_LIMITS else 0)
    for lo, hi in LIMIT_RANGES:
        if lim[lo] > lim[hi]:
            raise ValueError(
                f"{prefix}.{lo} ({lim[lo]}) > {prefix}.{hi} ({lim[hi]}): the inclusive range is empty, "
                "so every record would be quarantined"
            )
    sources = lim["answer_in_context_sources"]
    if sources is not None and (
        not isinstance(sources, list) or not all(isinstance(x, str) for x in sources)
    ):
        raise ValueError(
            f"{prefix}.answer_in_context_sources: expected a list of source names, got {sources!r}"
        )
    return lim


class QAValidationError(RuntimeError):
    """Too many invalid records: names the file, the first offending record and expectation."""


@dataclass
class ValidationResult:
    kept: list[QARecord] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    #: The stop message when too many records are invalid (`too_many_invalid`), else None: with
    #: `enforce=False` the caller writes the quarantine first, then raises QAValidationError with it.
    problem: str | None = None


# ---------------------------------------------------------------------------------------- schema


def _type_ok(value: Any, typ: type | tuple[type, ...]) -> bool:
    if typ is int and isinstance(value, bool):  # bool is an int subclass
        return False
    return isinstance(value, typ)


def schema_errors(record: Any) -> list[str]:
    """Structural problems that prevent flattening; empty list when the record is well formed."""
    if not isinstance(record, dict):
        return [f"record: expected an object, got {type(record).__name__}"]
    errors = []
    for name, typ in RECORD_FIELDS.items():
        if name not in record or record[name] is None:
            errors.append(f"field {name!r}: missing")
        elif not _type_ok(record[name], typ):
            errors.append(f"field {name!r}: expected {typ.__name__}, got {type(record[name]).__name__}")  # type: ignore[union-attr]
    if errors:
        return errors
    if not all(isinstance(a, str) for a in record["answers"]):
        errors.append("field 'answers': expected list[str]")
    for list_name, fields in (("paragraphs", PARAGRAPH_FIELDS), ("hops", HOP_FIELDS)):
        for i, item in enumerate(record[list_name]):
            if not isinstance(item, dict):
                errors.append(f"field '{list_name}[{i}]': expected an object, got {type(item).__name__}")
                continue
            for name, typ in fields.items():
                if name not in item or item[name] is None:
                    errors.append(f"field '{list_name}[{i}].{name}': missing")
                elif not _type_ok(item[name], typ):
                    errors.append(
                        f"field '{list_name}[{i}].{name}': expected {typ.__name__}, got {type(item[name]).__name__}"
                    )
    return errors


# ---------------------------------------------------------------------------------------- flatten


_YES_NO = frozenset({"yes", "no"})


def _answer_in_context(answers: Sequence[str], support_text: str) -> bool:
    """The gold answer or one of its aliases appears in the (lower-cased) supporting text.

    Only the gold decides the yes/no exemption: a comparison question's "yes"/"no" is never written
    in its paragraphs, but a gold like "Paris" with a stray "yes" alias is an ordinary answer and is
    checked. Yes/no aliases of such a gold are not searched for, since "no" is a substring of most
    texts ("not", "north") and would pass any record. An empty gold passes here: `answer_non_empty`
    quarantines it with its own reason."""
    gold = answers[0].strip().lower() if answers else ""
    if not gold or gold in _YES_NO:
        return True
    candidates = [a.strip().lower() for a in answers if a.strip()]
    return any(a in support_text for a in candidates if a not in _YES_NO)


def flatten(records: Sequence[QARecord], limits: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One row per (schema-valid) record; derived columns are what the suite checks."""
    lim = {**DEFAULT_LIMITS, **(limits or {})}
    answer_sources = set(lim["answer_in_context_sources"] or [])
    rows = []
    for i, r in enumerate(records):
        paras = r["paragraphs"]
        keys = [p["key"] for p in paras]
        key_set = set(keys)
        supporting = {p["key"] for p in paras if p["supporting"]}
        hop_keys = [h["paragraph_key"] for h in r["hops"]]
        answers = r["answers"]
        gold = answers[0] if answers else ""
        support_text = " ".join(p["text"] for p in paras if p["supporting"]).lower()
        rows.append(
            {
                "_row": i,
                "id": r["id"],
                "id_chars": len(r["id"].strip()),
                "source": r["source"],
                "split": r["split"],
                "type": r["type"],
                "question": r["question"],
                "question_len": len(r["question"].strip()),
                "answer": gold,
                "answer_len": len(gold.strip()),
                "n_answers": len(answers),
                "n_empty_aliases": sum(1 for a in answers[1:] if not a.strip()),
                "n_paragraphs": len(paras),
                "n_supporting": len(supporting),
                "n_duplicate_keys": len(keys) - len(key_set),
                "n_empty_keys": sum(1 for k in keys if not k.strip()),
                "max_key_len": max((len(k) for k in keys), default=0),
                "n_empty_paragraphs": sum(1 for p in paras if not p["text"].strip()),
                # A paragraph's title heads its text for the reader where its key does not spell it
                # (`data.qa.record_documents`), and a hop's question is a clone's task (the teacher's).
                "n_empty_titles": sum(1 for p in paras if not p["title"].strip()),
                "n_empty_hop_questions": sum(1 for h in r["hops"] if not h["question"].strip()),
                "max_paragraph_chars": max((len(p["text"]) for p in paras), default=0),
                "context_chars": sum(len(p["text"]) for p in paras),
                "n_hops": len(hop_keys),
                "num_hops": r["num_hops"],
                # Hop keys must name a paragraph of this record, and a supporting one: the root
                # hands exactly these keys to clones.
                "unresolved_hop_keys": sum(1 for k in hop_keys if k not in key_set),
                "unsupported_hop_keys": sum(1 for k in hop_keys if k in key_set and k not in supporting),
                "num_hops_mismatch": bool(hop_keys) and r["num_hops"] != len(hop_keys),
                "n_empty_hop_answers": sum(1 for h in r["hops"] if not h["answer"].strip()),
                "answer_in_context": _answer_in_context(answers, support_text)
                if r["source"] in answer_sources
                else True,
            }
        )
    columns = ["_row", "id", "source", "split", "type", "question", "answer"]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)


# ---------------------------------------------------------------------------------------- suite


def build_suite(limits: Mapping[str, Any] | None = None) -> list[tuple[str, Any]]:
    """(name, expectation) pairs. Names are what reports and quarantine entries show."""
    import great_expectations.expectations as gxe

    lim = {**DEFAULT_LIMITS, **(limits or {})}

    def between(col: str, lo: Any = None, hi: Any = None) -> Any:
        return gxe.ExpectColumnValuesToBeBetween(column=col, min_value=lo, max_value=hi)

    def equal(col: str, value: Any) -> Any:
        return gxe.ExpectColumnValuesToBeInSet(column=col, value_set=[value])

    suite: list[tuple[str, Any]] = [
        ("id_unique", gxe.ExpectColumnValuesToBeUnique(column="id")),
        ("id_not_null", gxe.ExpectColumnValuesToNotBeNull(column="id")),
        ("id_non_empty", gxe.ExpectColumnValuesToBeBetween(column="id_chars", min_value=1)),  # blanks too
        ("question_not_null", gxe.ExpectColumnValuesToNotBeNull(column="question")),
        ("question_len", between("question_len", lim["min_question_chars"], lim["max_question_chars"])),
        ("answer_non_empty", between("answer_len", 1, lim["max_answer_chars"])),
        ("no_empty_aliases", equal("n_empty_aliases", 0)),
        ("paragraph_count", between("n_paragraphs", lim["min_paragraphs"], lim["max_paragraphs"])),
        ("has_supporting", between("n_supporting", 1, None)),
        ("paragraph_keys_unique", equal("n_duplicate_keys", 0)),
        ("paragraph_keys_non_empty", equal("n_empty_keys", 0)),
        ("paragraph_key_len", between("max_key_len", 1, lim["max_key_chars"])),
        ("no_empty_paragraphs", equal("n_empty_paragraphs", 0)),
        ("no_empty_titles", equal("n_empty_titles", 0)),
        ("paragraph_chars", between("max_paragraph_chars", 1, lim["max_paragraph_chars"])),
        ("context_chars", between("context_chars", 1, lim["max_context_chars"])),
        ("num_hops_range", between("num_hops", lim["min_num_hops"], lim["max_num_hops"])),
        ("hop_keys_resolvable", equal("unresolved_hop_keys", 0)),
        ("hop_keys_supporting", equal("unsupported_hop_keys", 0)),
        ("num_hops_matches_hops", equal("num_hops_mismatch", False)),
        ("hop_answers_non_empty", equal("n_empty_hop_answers", 0)),
        ("hop_questions_non_empty", equal("n_empty_hop_questions", 0)),
        ("answer_in_context", equal("answer_in_context", True)),
        ("id_is_str", gxe.ExpectColumnValuesToBeOfType(column="id", type_="str")),
        ("question_is_str", gxe.ExpectColumnValuesToBeOfType(column="question", type_="str")),
        (
            "counts_are_int",
            gxe.ExpectColumnValuesToBeInTypeList(column="n_paragraphs", type_list=["int", "int64", "int32"]),
        ),
    ]
    return suite


_RUNS = itertools.count()


@functools.cache
def _gx_context() -> Any:
    """One ephemeral context per process: each new one makes a temp docs dir and logs at INFO."""
    # Analytics off: the machines have no internet and GX would try to phone home.
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


_DEFINITIONS: dict[str, tuple[Any, dict[str, str]]] = {}


def _definition(
    suite_name: str, build: Callable[[], list[tuple[str, Any]]], cache_key: str
) -> tuple[Any, dict[str, str]]:
    """Validation definition for one suite, built once per process and `cache_key` (the suite's
    limits): adding expectations to a GX suite costs ~20 ms each (serialisation), and the
    dataframe is a run-time parameter anyway."""
    import great_expectations as gx

    key = f"{suite_name}:{cache_key}"
    if key not in _DEFINITIONS:
        context = _gx_context()
        run = f"{suite_name}_{next(_RUNS)}"  # the context is shared, so every suite needs fresh names
        batch = (
            context.data_sources.add_pandas(run)
            .add_dataframe_asset("records")
            .add_batch_definition_whole_dataframe("all")
        )
        suite = context.suites.add(gx.ExpectationSuite(name=run))
        by_id: dict[str, str] = {}
        for name, exp in build():
            by_id[suite.add_expectation(exp).id] = name
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=run, data=batch, suite=suite)
        )
        _DEFINITIONS[key] = (definition, by_id)
    return _DEFINITIONS[key]


def run_expectations(
    df: pd.DataFrame, suite_name: str, build: Callable[[], list[tuple[str, Any]]], cache_key: str = ""
) -> dict[str, dict[str, Any]]:
    """Run the suite that `build` makes ((name, expectation) pairs) over `df`, whose `_row` column
    numbers its rows; return name -> {success, unexpected_count, rows (list of _row), error}.
    Raises RuntimeError naming the expectation when one crashed or failed without naming a row:
    either way its records would otherwise pass unchecked."""
    definition, by_id = _definition(suite_name, build, cache_key)
    result = definition.run(
        batch_parameters={"dataframe": df},
        result_format={"result_format": "COMPLETE", "unexpected_index_column_names": ["_row"]},
    )
    out: dict[str, dict[str, Any]] = {}
    for res in result.results:
        name = by_id.get(res.expectation_config.id, res.expectation_config.type)
        errors = _raised_exceptions(res.exception_info)
        rows = sorted({int(item["_row"]) for item in res.result.get("unexpected_index_list") or []})
        out[name] = {
            "success": bool(res.success),
            "unexpected_count": int(res.result.get("unexpected_count") or 0),
            "rows": rows,
            "error": "; ".join(errors) if errors else None,
        }
        if errors:
            # A crashed expectation is a bug in the suite, not in the data: fail loudly.
            raise RuntimeError(f"expectation {name} crashed: {'; '.join(errors)}")
        if not res.success and not rows:
            # A failure that names no record quarantines none, so the records would pass unchecked
            # (GX 1.24 reports some crashes only this way, and an aggregate check fails like this).
            raise RuntimeError(
                f"expectation {name} failed without naming a failing record "
                f"(unexpected_count {out[name]['unexpected_count']}, observed value "
                f"{res.result.get('observed_value')!r}): the suite cannot check the records"
            )
    return out


def _raised_exceptions(info: Any) -> list[str]:
    """The messages of the exceptions an expectation's `exception_info` reports. GX 1.24 gives
    either one top-level {raised_exception, exception_message, ...} or, when a metric crashed, one
    such dict per `MetricConfigurationID(...)` key: reading only the top level missed those."""
    if not isinstance(info, dict):
        return []
    found = [info, *(v for v in info.values() if isinstance(v, dict))]
    return [str(d.get("exception_message") or "no message") for d in found if d.get("raised_exception")]


def expectation_summary(results: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """`run_expectations`' results as a report shows them: success and unexpected count per name."""
    return {
        n: {"success": r["success"], "unexpected_count": r["unexpected_count"]} for n, r in results.items()
    }


def run_suite(df: pd.DataFrame, limits: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Run the QA suite; return name -> {success, unexpected_count, rows (list of _row), error}."""
    lim = {**DEFAULT_LIMITS, **(limits or {})}
    return run_expectations(df, "qa", lambda: build_suite(lim), json.dumps(lim, sort_keys=True, default=str))


# ---------------------------------------------------------------------------------------- driver


def validate_records(
    records: Sequence[Any],
    limits: Mapping[str, Any] | None = None,
    *,
    origin: str = "<records>",
    source: str | None = None,
    enforce: bool = True,
    prior: Sequence[Quarantined] = (),
    files: Sequence[str] | None = None,
    indices: Sequence[int] | None = None,
) -> ValidationResult:
    """Schema check, then the GX suite. `origin` (a file or split name) goes into messages;
    `files` and `indices` (one per record) give each record's input file and index in that file
    when records come from several files; by default origin and the position in `records`.
    `prior`: items an adapter already quarantined from the same input; they count towards the
    invalid fraction (but those of EXCLUDED_STAGES, sound records kept out by design, neither count
    nor enter its denominator) and are returned first.

    Raises QAValidationError when enforce and invalid / (total - excluded) > max_invalid_fraction
    (otherwise its message is `ValidationResult.problem`), ValueError naming the setting when
    `limits` are not sound (`check_limits`), and RuntimeError naming the expectation when one
    crashes or fails without naming a record (`run_expectations`)."""
    lim = check_limits(limits or {})
    out = ValidationResult()

    def file_of(index: int) -> str:
        return files[index] if files is not None else origin

    def index_of(index: int) -> int:
        return indices[index] if indices is not None else index

    well_formed: list[QARecord] = []
    positions: list[int] = []  # index of each well-formed record in `records`
    for index, rec in enumerate(records):
        errors = schema_errors(rec)
        if errors:
            rid = rec.get("id") if isinstance(rec, dict) else None
            out.quarantined.append(
                Quarantined(
                    source=source or (rec.get("source", "") if isinstance(rec, dict) else "") or "",
                    file=file_of(index),
                    index=index_of(index),
                    record_id=str(rid) if rid is not None else None,
                    reasons=[f"schema: {e}" for e in errors],
                    stage="schema",
                    split=str(rec.get("split", "")) if isinstance(rec, dict) else "",
                    record=rec,
                )
            )
        else:
            well_formed.append(rec)
            positions.append(index)

    expectations: dict[str, dict[str, Any]] = {}
    failed_by_row: dict[int, list[str]] = {}
    if well_formed:
        df = flatten(well_formed, lim)
        expectations = run_suite(df, lim)
        for name, res in expectations.items():
            for row in res["rows"]:
                failed_by_row.setdefault(row, []).append(name)
    for row, rec in enumerate(well_formed):
        if row in failed_by_row:
            out.quarantined.append(
                Quarantined(
                    source=source or rec["source"],
                    file=file_of(positions[row]),
                    index=index_of(positions[row]),
                    record_id=rec["id"],
                    reasons=[f"expectation: {n}" for n in failed_by_row[row]],
                    stage="expectations",
                    split=rec["split"],
                    record=rec,
                )
            )
        else:
            out.kept.append(rec)
    out.quarantined.sort(key=lambda q: (q.file, q.index if q.index is not None else -1))
    out.quarantined = [*prior, *out.quarantined]

    total = len(records) + len(prior)
    invalid = [q for q in out.quarantined if q.invalid]
    judged = total - (len(out.quarantined) - len(invalid))  # excluded records are not judged
    invalid_fraction = len(invalid) / judged if judged else 0.0
    out.report = {
        "origin": origin,
        "total": total,
        "kept": len(out.kept),
        "quarantined": len(out.quarantined),
        "invalid": len(invalid),
        # Sound records kept out by design, per reason (stage): neither invalid nor judged.
        "excluded": {
            stage: sum(1 for q in out.quarantined if q.stage == stage) for stage in sorted(EXCLUDED_STAGES)
        },
        "adapter_failures": sum(1 for q in out.quarantined if q.stage == "adapter"),
        "schema_failures": sum(1 for q in out.quarantined if q.stage == "schema"),
        "expectation_failures": sum(1 for q in out.quarantined if q.stage == "expectations"),
        "invalid_fraction": invalid_fraction,
        "max_invalid_fraction": lim["max_invalid_fraction"],
        "expectations": expectation_summary(expectations),
    }
    out.problem = too_many_invalid(origin, invalid, judged, lim["max_invalid_fraction"])
    if enforce and out.problem:
        raise QAValidationError(out.problem)
    return out


def too_many_invalid(
    origin: str, quarantined: Sequence[Quarantined], total: int, max_invalid_fraction: float
) -> str | None:
    """The stop message when more than `max_invalid_fraction` of `total` records were quarantined
    (None otherwise): the counts, and the first offending record with its file (when that is not
    `origin` itself) and reasons."""
    fraction = len(quarantined) / total if total else 0.0
    if fraction <= max_invalid_fraction:
        return None
    first = quarantined[0]
    where = "" if first.file == origin else f" in {first.file}"
    return (
        f"{origin}: {len(quarantined)}/{total} records invalid ({fraction:.1%} > "
        f"max_invalid_fraction {max_invalid_fraction:.1%}); first offending record "
        f"#{first.index} id {first.record_id!r}{where}: {'; '.join(first.reasons)}"
    )
