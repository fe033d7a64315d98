"""Math benchmarks (MATH-Hard, AIME) in one schema, read from a local file or an `s3://` URL.

A record is `{"id", "problem", "answer", "source"}`, all strings. Inputs are JSON lines or a JSON
list in either of the two layouts the benchmarks ship in:
- MATH: `{problem, solution, level, type, idx}`; the gold answer is the last `\\boxed{}` of the
  solution unless the record has an `answer` field;
- AIME: `{problem, answer[, id]}`; a record without an id is named by its position
  (`<source>-<index>`), as AIME 2025's are, unless another record of the file has that id
  (`generated_ids`).

Two layers, as for QA (`selfcest.data.validation`):
1. `adapt_math_record`: fields present and of the right type, else the record is quarantined with
   the field and the reason;
2. a Great Expectations suite over the split: ids unique and non-empty, problem and answer
   lengths within bounds, and every gold equivalent to itself under the project's math scorer
   (`scoring.math_equivalent`), since a gold that the scorer cannot parse can never be scored right.

A gold read off a solution's last box is kept, but when the solution boxes other answers that are
not equivalent to it (a solution that boxes a case's answer, then the final one; or the final one,
then a check), the record is listed in `MathSplit.ambiguous_golds` for a person to look at: the last
box is usually right, and quarantining those would drop sound problems from a curated benchmark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The QA adapters' record error: one record's field and reason, turned into a Quarantined item.
from selfcest.data.qa import QADataError, Quarantined, lone_surrogate_field, read_json_records, writable
from selfcest.data.qa import _RecordError as RecordError
from selfcest.param_checks import check_keys, fraction_setting, int_setting
from selfcest.scoring import all_boxed, last_boxed, math_equivalent

#: Bounds used when params give none.
DEFAULT_MATH_LIMITS: dict[str, Any] = {
    # A benchmark is small and curated: one bad record means a broken file, so the stage stops
    # (after writing the quarantine file). Raise it to evaluate the rest anyway.
    "max_invalid_fraction": 0.0,
    "max_problem_chars": 20000,
    "max_answer_chars": 256,
}


class MathValidationError(RuntimeError):
    """Too many invalid records: names the file, the first offending record and its reason."""


@dataclass
class MathSplit:
    """One benchmark split after validation."""

    records: list[dict[str, str]] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    #: Kept records whose gold came from the solution's last box while other boxes of that solution
    #: hold non-equivalent answers: `{"id", "index", "answer", "other_boxed"}`, to check by hand.
    ambiguous_golds: list[dict[str, Any]] = field(default_factory=list)

    def check(self) -> None:
        """Raise MathValidationError when more than `max_invalid_fraction` of the file is invalid."""
        from selfcest.data.validation import too_many_invalid

        report = self.report
        if report:
            problem = too_many_invalid(
                report["file"], self.quarantined, report["total"], report["max_invalid_fraction"]
            )
            if problem:
                raise MathValidationError(problem)


def _text(record: Mapping[str, Any], name: str) -> str | None:
    value = record.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RecordError(name, f"expected a string, got {type(value).__name__}")
    return str(value).strip()


def adapt_math_record(
    raw: Any, *, source: str, index: int, generated_id: str | None = None
) -> dict[str, str]:
    """A MATH or AIME line in the project's schema; raises RecordError naming the field.
    `generated_id`: the id of a record without one (`generated_ids`), else `<source>-<index>`."""
    if not isinstance(raw, dict):
        raise RecordError("<record>", f"expected an object, got {type(raw).__name__}")
    problem = raw.get("problem")
    if problem is None:
        raise RecordError("problem", "missing")
    if not isinstance(problem, str):
        raise RecordError("problem", f"expected a string, got {type(problem).__name__}")
    if not problem.strip():
        raise RecordError("problem", "empty")
    answer = _text(raw, "answer")
    if not answer:
        solution = raw.get("solution")
        if solution is not None and not isinstance(solution, str):
            raise RecordError("solution", f"expected a string, got {type(solution).__name__}")
        answer = (last_boxed(solution) or "").strip() if solution else ""
        if not answer:
            where = (
                "no `answer` and no \\boxed{} in `solution`" if solution else "missing (and no `solution`)"
            )
            raise RecordError("answer", where)
    return {
        "id": math_record_id(raw, source, index, strict=True, generated_id=generated_id),
        "problem": problem,
        "answer": answer,
        "source": source,
    }


def other_boxed_answers(solution: object, gold: str) -> list[str]:
    """The distinct boxed answers of `solution` that are not equivalent to `gold` (in order)."""
    others: list[str] = []
    for content in all_boxed(solution):
        answer = content.strip()
        if (
            answer
            and answer != gold
            and answer not in others
            and not math_equivalent(f"\\boxed{{{answer}}}", gold)
        ):
            others.append(answer)
    return others


def math_record_id(
    raw: Any, source: str, index: int, *, strict: bool = False, generated_id: str | None = None
) -> str:
    """A record's id: its first non-empty `id`, `unique_id` (MATH-500) or `idx`, else
    `generated_id` (`generated_ids`: `<source>-<index>` unless a record of the file has that id;
    AIME 2025 files have none), so that adapted and quarantined records are named alike. `strict`:
    an id that is no text or number raises the record's error (the adapter); otherwise it is passed
    over (the quarantine, which must name the record whatever it holds)."""
    found = _own_id(raw, strict=strict)
    return found or generated_id or f"{source}-{index}"


def _own_id(raw: Any, *, strict: bool = False) -> str | None:
    """The id a record names itself by, or None (no id, an empty one, or, unless `strict`, one of
    the wrong type)."""
    if not isinstance(raw, Mapping):
        return None
    try:
        return _text(raw, "id") or _text(raw, "unique_id") or _text(raw, "idx") or None
    except RecordError:
        if strict:
            raise
        return None


def generated_ids(data: Sequence[Any], source: str) -> dict[int, str]:
    """{index: id} for the records of one file that name themselves by no id: `<source>-<index>`, or,
    when a record of the same file already has that id, the first free `<source>-<index>-2`, -3, ...
    A generated id taken from a record's own id made two records share it: the suite's `id_unique`
    then quarantined both, a sound record with the one that lacked an id. Deterministic: it depends
    on the file alone. Own ids that repeat each other are left to `id_unique`."""
    own = [_own_id(raw) for raw in data]
    taken = {rid for rid in own if rid is not None}
    out: dict[int, str] = {}
    for index, rid in enumerate(own):
        if rid is not None:
            continue
        base = candidate = f"{source}-{index}"
        n = 1
        while candidate in taken:
            n += 1
            candidate = f"{base}-{n}"
        taken.add(candidate)
        out[index] = candidate
    return out


def check_math_limits(
    limits: Mapping[str, Any] | None, section: str = "eval.math_validation"
) -> dict[str, Any]:
    """`limits` over DEFAULT_MATH_LIMITS, checked: an unknown key (a typo would keep the default) or
    a bad value raises a ValueError naming `<section>.<key>`."""
    check_keys(section, limits, DEFAULT_MATH_LIMITS)
    lim = {**DEFAULT_MATH_LIMITS, **(limits or {})}
    fraction_setting(lim["max_invalid_fraction"], f"{section}.max_invalid_fraction")
    for name in ("max_problem_chars", "max_answer_chars"):
        int_setting(lim[name], f"{section}.{name}", minimum=1)
    return lim


def build_math_suite(limits: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(name, expectation) pairs over `math_frame`'s columns."""
    import great_expectations.expectations as gxe

    return [
        ("id_unique", gxe.ExpectColumnValuesToBeUnique(column="id")),
        ("id_non_empty", gxe.ExpectColumnValuesToBeBetween(column="id_chars", min_value=1)),
        (
            "problem_chars",
            gxe.ExpectColumnValuesToBeBetween(
                column="problem_chars", min_value=1, max_value=limits["max_problem_chars"]
            ),
        ),
        (
            "answer_chars",
            gxe.ExpectColumnValuesToBeBetween(
                column="answer_chars", min_value=1, max_value=limits["max_answer_chars"]
            ),
        ),
        ("answer_scorable", gxe.ExpectColumnValuesToBeInSet(column="answer_scorable", value_set=[True])),
    ]


def math_frame(records: Sequence[Mapping[str, str]]) -> Any:
    """One row per record with the columns the suite checks; `_row` maps failures back."""
    import pandas as pd

    return pd.DataFrame(
        {
            "_row": list(range(len(records))),
            "id": [r["id"] for r in records],
            "id_chars": [len(r["id"]) for r in records],
            "problem_chars": [len(r["problem"]) for r in records],
            "answer_chars": [len(r["answer"]) for r in records],
            # The gold, boxed as a model would write it, must score right against itself.
            "answer_scorable": [math_equivalent(f"\\boxed{{{r['answer']}}}", r["answer"]) for r in records],
        }
    )


def load_math_split(
    path: str,
    *,
    source: str,
    limits: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    enforce: bool = True,
) -> MathSplit:
    """Read, adapt and validate one benchmark file. File-level problems (unreadable, not UTF-8,
    not JSON) raise QADataError naming the file (and line); bad records are quarantined; more than
    `max_invalid_fraction` of them raises MathValidationError (`enforce=False`: the caller writes
    the quarantine first, then calls `MathSplit.check`)."""
    from selfcest.data.validation import expectation_summary, run_expectations

    lim = check_math_limits(limits)
    data = read_json_records(path, storage_options)  # a list: JSON lines, or a top-level JSON list
    if not data:
        raise QADataError(path, "no records")
    out = MathSplit()
    adapted: list[tuple[int, dict[str, str]]] = []
    fallback = generated_ids(data, source)
    for index, raw in enumerate(data):
        try:
            bad = lone_surrogate_field(raw)
            if bad:
                raise RecordError(bad, "holds an escaped lone surrogate (not valid Unicode)")
            record = adapt_math_record(raw, source=source, index=index, generated_id=fallback.get(index))
            adapted.append((index, record))
        except RecordError as exc:
            out.quarantined.append(
                Quarantined(
                    source,
                    path,
                    index,
                    writable(math_record_id(raw, source, index, generated_id=fallback.get(index))),
                    [str(exc)],
                    split=source,
                    record=writable(raw),
                )
            )
    results: dict[str, dict[str, Any]] = {}
    if adapted:
        frame = math_frame([record for _, record in adapted])
        results = run_expectations(
            frame, "math", lambda: build_math_suite(lim), json.dumps(lim, sort_keys=True, default=str)
        )
    failed: dict[int, list[str]] = {}
    for name, result in results.items():
        for row in result["rows"]:
            failed.setdefault(row, []).append(f"expectation: {name}")
    for row, (index, record) in enumerate(adapted):
        if row in failed:
            out.quarantined.append(
                Quarantined(
                    source,
                    path,
                    index,
                    record["id"],
                    failed[row],
                    stage="expectations",
                    split=source,
                    record=record,
                )
            )
        else:
            out.records.append(record)
            raw = data[index]
            if not _text(raw, "answer"):  # the gold is the solution's last box (`adapt_math_record`)
                others = other_boxed_answers(raw.get("solution"), record["answer"])
                if others:
                    out.ambiguous_golds.append(
                        {
                            "id": record["id"],
                            "index": index,
                            "answer": record["answer"],
                            "other_boxed": others,
                        }
                    )
    out.quarantined.sort(key=lambda q: q.index if q.index is not None else -1)
    total = len(data)
    invalid_fraction = len(out.quarantined) / total if total else 0.0
    out.report = {
        "file": path,
        "total": total,
        "kept": len(out.records),
        "quarantined": len(out.quarantined),
        "invalid_fraction": invalid_fraction,
        "max_invalid_fraction": lim["max_invalid_fraction"],
        "ambiguous_golds": len(out.ambiguous_golds),
        "expectations": expectation_summary(results),
    }
    if enforce:
        out.check()
    return out
