"""The math benchmarks' data stage: real MATH-Hard and AIME records, corrupted files, S3."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from benchmark_paths import BENCHMARKS as BENCH

from selfcest.data.math import MathValidationError, adapt_math_record, load_math_split, other_boxed_answers
from selfcest.data.qa import QADataError

REPO = Path(__file__).resolve().parent.parent
MATH_HARD = BENCH / "math" / "math_hard_level5_test.jsonl"
AIME24 = BENCH / "aime" / "aime24_test.jsonl"
AIME25 = BENCH / "aime" / "aime25_test.jsonl"


def _lines(path: Path, count: int) -> str:
    return "".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:count])


def test_real_records_in_one_schema(tmp_path: Path) -> None:
    head = tmp_path / "math_hard.jsonl"
    head.write_text(_lines(MATH_HARD, 40), encoding="utf-8")
    math_hard = load_math_split(str(head), source="math_hard")
    assert len(math_hard.records) == 40 and not math_hard.quarantined
    first = json.loads(_lines(MATH_HARD, 1))
    assert math_hard.records[0] == {
        "id": str(first["idx"]),
        "problem": first["problem"],
        "answer": "i",  # the last \boxed{} of the solution
        "source": "math_hard",
    }
    aime24 = load_math_split(str(AIME24), source="aime24")
    assert len(aime24.records) == 30 and all(r["answer"].isdigit() for r in aime24.records)
    aime25 = load_math_split(str(AIME25), source="aime25")
    assert [r["id"] for r in aime25.records[:2]] == ["aime25-0", "aime25-1"]  # no ids: named by position
    assert all(result["success"] for result in aime25.report["expectations"].values())
    assert set(aime25.report["expectations"]) == {
        "id_unique", "id_non_empty", "problem_chars", "answer_chars", "answer_scorable"
    }  # fmt: skip


def _records_with_idx(path: Path, wanted: set[int]) -> str:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(line for line in lines if json.loads(line)["idx"] in wanted)


def test_a_solution_that_boxes_other_answers_is_kept_and_listed_for_a_person(tmp_path: Path) -> None:
    """Real MATH-Hard records: 333 boxes -3 before its gold 3, 2656 boxes -10879 before 10879; 28
    boxes its answer twice, 4258 once in another form. Only the first two are listed, and all are
    kept with the last box as gold; a record with an `answer` field is never listed."""
    path = tmp_path / "math_hard.jsonl"
    path.write_text(_records_with_idx(MATH_HARD, {28, 333, 2136, 2656, 4258}), encoding="utf-8")
    split = load_math_split(str(path), source="math_hard")
    assert len(split.records) == 5 and not split.quarantined
    assert [(g["id"], g["answer"], g["other_boxed"]) for g in split.ambiguous_golds] == [
        ("333", "3", ["-3"]),
        ("2656", "10879", ["-10879"]),
    ]
    assert split.report["ambiguous_golds"] == 2
    assert other_boxed_answers("\\boxed{\\frac12} so \\boxed{0.5}", "0.5") == []  # equivalent forms
    with_answer = tmp_path / "with_answer.jsonl"
    with_answer.write_text(
        json.dumps({"idx": 1, "problem": "P", "solution": "\\boxed{-3} or \\boxed{3}", "answer": "3"}) + "\n",
        encoding="utf-8",
    )
    assert load_math_split(str(with_answer), source="m").ambiguous_golds == []


def test_bad_records_are_quarantined_with_the_field_and_reason(tmp_path: Path) -> None:
    good = {"id": "g1", "problem": "What is $1+1$?", "answer": "2"}
    lines = [
        good,
        {"id": "p1", "answer": "3"},  # no problem
        {"id": "p2", "problem": 7, "answer": "3"},  # problem not a string
        {"id": "p3", "problem": "Find x.", "solution": "x is three."},  # no \boxed{}
        {"id": "p4", "problem": "Find y."},  # no answer, no solution
        ["not", "an", "object"],
        {"id": "g1", "problem": "Again?", "answer": "4"},  # duplicate id
        {"id": "p6", "problem": "Find z.", "answer": "\\frac{"},  # a gold the scorer cannot read
        {"id": "p7", "problem": "Find w.", "answer": {"value": 1}},
    ]
    path = tmp_path / "broken.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    split = load_math_split(str(path), source="broken", enforce=False)
    assert [r["id"] for r in split.records] == []  # g1 is a duplicate of the other g1: both flagged
    reasons = {q.index: q.reasons for q in split.quarantined}
    assert reasons[1] == ["field 'problem': missing"]
    assert reasons[2] == ["field 'problem': expected a string, got int"]
    assert reasons[3] == ["field 'answer': no `answer` and no \\boxed{} in `solution`"]
    assert reasons[4] == ["field 'answer': missing (and no `solution`)"]
    assert reasons[5] == ["field '<record>': expected an object, got list"]
    assert reasons[0] == reasons[6] == ["expectation: id_unique"]
    assert reasons[7] == ["expectation: answer_scorable"]
    assert reasons[8] == ["field 'answer': expected a string, got dict"]
    assert all(q.file == str(path) for q in split.quarantined) and split.quarantined[0].record == {
        **good,
        "source": "broken",
    }
    with pytest.raises(
        MathValidationError, match=r"broken.jsonl: 9/9 records invalid .* first offending record #0 id 'g1'"
    ):
        split.check()
    with pytest.raises(MathValidationError):
        load_math_split(str(path), source="broken")  # enforce: the same check
    # The length limits and an empty problem, each named: over a lowered problem limit, the default
    # answer limit (256 characters), and a problem of spaces only.
    limited = tmp_path / "limits.jsonl"
    limited.write_text(
        "".join(
            json.dumps(line) + "\n"
            for line in [
                {"id": "ok", "problem": "Q?", "answer": "1"},
                {"id": "long", "problem": "What is 12345?", "answer": "1"},
                {"id": "big", "problem": "Q?", "answer": "1" * 300},
                {"id": "blank", "problem": "   ", "answer": "1"},
            ]
        ),
        encoding="utf-8",
    )
    checked = load_math_split(str(limited), source="limits", enforce=False, limits={"max_problem_chars": 10})
    assert [r["id"] for r in checked.records] == ["ok"]
    assert {q.index: q.reasons for q in checked.quarantined} == {
        1: ["expectation: problem_chars"],
        2: ["expectation: answer_chars"],
        3: ["field 'problem': empty"],
    }
    # A limit that allows it keeps the valid rest.
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(json.dumps(line) + "\n" for line in [good, lines[1]]), encoding="utf-8")
    kept = load_math_split(str(partial), source="partial", limits={"max_invalid_fraction": 0.5})
    assert [r["id"] for r in kept.records] == ["g1"] and len(kept.quarantined) == 1


def test_broken_files_name_the_file_and_line(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text(_lines(AIME24, 2) + '{"problem": "cut', encoding="utf-8")
    with pytest.raises(QADataError, match=r"truncated.jsonl: invalid JSON on line 3"):
        load_math_split(str(truncated), source="aime24")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(QADataError, match="empty.jsonl: empty file"):
        load_math_split(str(empty), source="x")
    with pytest.raises(QADataError, match="missing.jsonl: file not found"):
        load_math_split(str(tmp_path / "missing.jsonl"), source="x")


def test_a_nan_or_infinite_answer_is_a_file_error_not_a_gold_of_nan(tmp_path: Path) -> None:
    """`{"answer": NaN}` read as float nan, and the gold became the string "nan" (Infinity: "inf")."""
    for token in ("NaN", "-Infinity", "1e400"):
        path = tmp_path / "aime.jsonl"
        path.write_text(
            _lines(AIME24, 2) + '{"id": "x", "problem": "P?", "answer": ' + token + "}\n", encoding="utf-8"
        )
        with pytest.raises(
            QADataError, match=rf"aime\.jsonl: non-standard JSON on line 3 column 40: {token} "
        ):
            load_math_split(str(path), source="aime24")


def test_a_generated_id_never_takes_another_records_id(tmp_path: Path) -> None:
    """A record without an id was named `<source>-<index>` even when another record of the file had
    that id: the two shared it, and the suite's `id_unique` quarantined both (a sound record too)."""
    path = tmp_path / "aime25.jsonl"
    records = [
        {"problem": "P0", "answer": "1"},  # no id: aime25-0 is taken by record 2, and aime25-0-2 by record 3
        {"problem": "P1", "answer": "2"},  # no id: aime25-1 is free
        {"id": "aime25-0", "problem": "P2", "answer": "3"},
        {"id": "aime25-0-2", "problem": "P3", "answer": "4"},
        {"problem": "P4", "answer": ""},  # no id, quarantined: named as the adapter would name it
        {"idx": 4, "problem": "P5", "answer": "5"},  # an own id equal to another record's index is no clash
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    split = load_math_split(str(path), source="aime25", enforce=False)
    assert [r["id"] for r in split.records] == ["aime25-0-3", "aime25-1", "aime25-0", "aime25-0-2", "4"]
    assert [(q.index, q.record_id) for q in split.quarantined] == [(4, "aime25-4")]
    assert split.report["expectations"]["id_unique"]["success"]


def test_adapter_prefers_an_answer_field_over_the_solution() -> None:
    record = adapt_math_record(
        {"problem": "p", "solution": "so \\boxed{5}", "answer": " 6 ", "unique_id": "u1"}, source="s", index=3
    )
    assert record == {"id": "u1", "problem": "p", "answer": "6", "source": "s"}


def _stage_params(tmp_path: Path, sources: dict, splits: list[str]) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["eval"]["math_sources"] = sources
    params["eval"]["splits"]["math"] = splits
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return path


def test_stage_reads_local_and_s3_sources_and_writes_the_quarantine_before_stopping(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import s3fs

    from stages import prepare_math

    monkeypatch.chdir(tmp_path)
    s3 = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=s3_endpoint)
    s3.mkdir("benchmarks")
    s3.pipe("benchmarks/aime/aime24_test.jsonl", AIME24.read_bytes())
    options = {"key": "testing", "secret": "testing", "endpoint_url": s3_endpoint}
    sources = {
        "aime24": {"path": str(AIME24), "avg_k": 8},
        "aime24_s3": {"path": "s3://benchmarks/aime/aime24_test.jsonl", "storage_options": options},
    }
    with caplog.at_level("WARNING", logger="stages"):
        prepare_math.main(["--params", str(_stage_params(tmp_path, sources, ["aime24", "aime24_s3"]))])
    # Only the URL is named as outside DVC's lineage (data/sources/README.md says what to do instead).
    untracked = [r.getMessage() for r in caplog.records if "DVC does not track" in r.getMessage()]
    assert len(untracked) == 1 and untracked[0].startswith("s3://benchmarks/aime/aime24_test.jsonl: ")
    local = [json.loads(line) for line in (tmp_path / "data/math/aime24.jsonl").read_text().splitlines()]
    remote = [json.loads(line) for line in (tmp_path / "data/math/aime24_s3.jsonl").read_text().splitlines()]
    assert len(local) == 30 and [{**r, "source": "aime24"} for r in remote] == local
    report = json.loads((tmp_path / "reports/math_validation.json").read_text())
    assert report["splits"]["aime24_s3"]["kept"] == 30 and report["quarantined"] == 0
    assert (tmp_path / "data/math/quarantine.jsonl").read_text() == ""

    broken = tmp_path / "broken.jsonl"
    broken.write_text(_lines(AIME24, 3) + json.dumps({"id": "x", "answer": "1"}) + "\n", encoding="utf-8")
    sources["broken"] = {"path": str(broken)}
    params = _stage_params(tmp_path, sources, ["aime24", "broken"])
    with pytest.raises(
        MathValidationError, match=r"broken.jsonl: 1/4 records invalid .* #3 id 'x': field 'problem': missing"
    ):
        prepare_math.main(["--params", str(params)])
    [entry] = [
        json.loads(line) for line in (tmp_path / "data/math/quarantine.jsonl").read_text().splitlines()
    ]
    assert (
        entry["file"] == str(broken) and entry["index"] == 3 and entry["record"] == {"id": "x", "answer": "1"}
    )
    assert not (tmp_path / "data/math/aime24_s3.jsonl").exists()  # a split no longer configured is gone
    assert "| `broken` |" in (tmp_path / "reports/math_validation.md").read_text()

    golds = tmp_path / "golds.jsonl"
    golds.write_text(_records_with_idx(MATH_HARD, {28, 333}), encoding="utf-8")
    with caplog.at_level("WARNING", logger="prepare_math"):
        prepare_math.main(
            ["--params", str(_stage_params(tmp_path, {"golds": {"path": str(golds)}}, ["golds"]))]
        )
    assert "golds: 1 golds read off a solution that boxes other answers too" in caplog.text
    assert (
        json.loads((tmp_path / "reports/math_validation.json").read_text())["splits"]["golds"][
            "ambiguous_golds"
        ]
        == 1
    )
    markdown = (tmp_path / "reports/math_validation.md").read_text()
    assert "## Golds to check" in markdown and "| `golds` | `333` | 1 | `3` | `-3` |" in markdown

    unknown = _stage_params(tmp_path, sources, ["aime26"])
    with pytest.raises(ValueError, match="eval.splits.math names 'aime26', which has no path"):
        prepare_math.main(["--params", str(unknown)])


def test_a_quarantined_record_is_named_as_the_adapter_names_it(tmp_path: Path) -> None:
    """The quarantine read `id` or `idx` only: a MATH-500 record (`unique_id`) or an AIME 2025 one
    (no id) was quarantined with no id at all."""
    path = tmp_path / "m.jsonl"
    records = [
        {"problem": "What is 1+1?", "solution": "It is 2.", "unique_id": "test/algebra/1.json"},
        {"problem": "P2", "answer": ""},
        {"problem": "P3", "answer": "3", "id": {"not": "text"}},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    split = load_math_split(str(path), source="aime25", enforce=False)
    assert [q.record_id for q in split.quarantined] == ["test/algebra/1.json", "aime25-1", "aime25-2"]
    assert "field 'id'" in split.quarantined[2].reasons[0]  # an id of the wrong type is the record's error


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_invalid_fracton": 1.0}, r"^eval\.math_validation: unknown key\(s\) \['max_invalid_fracton'\]"),
        ({"max_invalid_fraction": 2}, r"^eval\.math_validation\.max_invalid_fraction: expected a number"),
        ({"max_answer_chars": 0}, r"^eval\.math_validation\.max_answer_chars: expected an integer >= 1"),
    ],
)
def test_a_bad_math_limit_is_refused_by_name(limits: dict, message: str) -> None:
    """Any key was accepted: a misspelt limit kept the default of 0.0, unnoticed."""
    with pytest.raises(ValueError, match=message):
        load_math_split(str(AIME24), source="aime24", limits=limits)


def test_the_stage_refuses_a_misspelt_math_source_setting(tmp_path: Path) -> None:
    """`avgk: 8` was accepted, so the cells would have run avg@1."""
    from stages import prepare_math

    params = _stage_params(tmp_path, {"aime24": {"path": str(AIME24), "avgk": 8}}, [])
    with pytest.raises(ValueError, match=r"^eval\.math_sources\.aime24: unknown key\(s\) \['avgk'\]"):
        prepare_math.main(["--params", str(params)])


def test_the_stage_refuses_a_split_named_like_its_quarantine_or_a_path(tmp_path: Path) -> None:
    """A split named `quarantine` was written to quarantine.jsonl and then overwritten by the
    quarantine list (the report still said its records were kept); `../x` would write outside."""
    from stages import prepare_math

    for name in ("quarantine", "../aime24", ".hidden"):
        params = _stage_params(tmp_path, {name: {"path": str(AIME24)}}, [name])
        with pytest.raises(
            ValueError, match=rf"^eval.splits.math: a split may not be named '{re.escape(name)}'"
        ):
            prepare_math.main(["--params", str(params), "--out", str(tmp_path / "out")])
        assert not (tmp_path / "out").exists()
