"""GX validation of unified QA records and the prepare_qa stage end to end."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from benchmark_paths import BENCHMARKS as BENCH

from selfcest.data import validation
from selfcest.data.qa import generate_synthetic, load_2wiki, load_musique
from selfcest.data.validation import (
    QAValidationError,
    flatten,
    run_expectations,
    schema_errors,
    validate_records,
)

ROOT = Path(__file__).resolve().parents[1]
WIKI = BENCH / "2wikimultihopqa" / "2wikimultihopqa_dev_hipporag_first10.json"
WIKI_KAG = BENCH / "2wikimultihopqa" / "kag_2wiki_qa_sub.json"
MUSIQUE = BENCH / "musique" / "kag_musique_qa_100.json"
MUSIQUE_SUB = BENCH / "musique" / "kag_musique_qa_sub.json"
LOOSE = {"max_invalid_fraction": 1.0}


@pytest.fixture(scope="module")
def real() -> list[dict]:
    return load_2wiki(str(WIKI)).records + load_musique(str(MUSIQUE)).records


def _reasons(result, record_id: str) -> list[str]:
    return [r for q in result.quarantined if q.record_id == record_id for r in q.reasons]


def test_real_and_synthetic_records_pass(real: list[dict]) -> None:
    synthetic = generate_synthetic(0, {"train": {"count": 30}, "ood": {"count": 10, "hops": 3}})
    records = real + synthetic["train"] + synthetic["ood"]
    result = validate_records(records, origin="mixed")
    assert result.quarantined == [] and len(result.kept) == len(records)
    assert result.report["invalid_fraction"] == 0.0
    assert all(e["success"] for e in result.report["expectations"].values())
    df = flatten(records)
    assert {"n_paragraphs", "n_supporting", "unresolved_hop_keys", "answer_len", "question_len"} <= set(df)


def test_schema_check_catches_missing_field_and_wrong_type(real: list[dict]) -> None:
    recs = copy.deepcopy(real[:4])
    del recs[0]["question"]
    recs[1]["num_hops"] = "2"
    recs[2]["paragraphs"][0]["supporting"] = 1
    assert schema_errors(recs[0]) == ["field 'question': missing"]
    assert schema_errors(recs[1]) == ["field 'num_hops': expected int, got str"]
    assert schema_errors(recs[2]) == ["field 'paragraphs[0].supporting': expected bool, got int"]
    result = validate_records(recs, LOOSE, origin="f.json")
    assert [q.stage for q in result.quarantined] == ["schema"] * 3
    assert [q.index for q in result.quarantined] == [0, 1, 2]
    assert result.quarantined[0].record_id == real[0]["id"] and result.quarantined[0].file == "f.json"
    assert len(result.kept) == 1


def test_expectations_map_failures_to_record_ids(real: list[dict]) -> None:
    recs = copy.deepcopy(real[:9])
    recs[1]["id"] = recs[0]["id"]  # duplicate id: both copies are ambiguous
    recs[2]["paragraphs"] = []  # empty context
    recs[2]["hops"] = []
    recs[3]["hops"][0]["paragraph_key"] = "no-such-key"  # unknown supporting key
    recs[4]["answers"] = [" "]  # empty answer
    recs[5]["paragraphs"][0]["text"] = "x" * 9000  # over max_paragraph_chars
    recs[6]["paragraphs"][1]["key"] = recs[6]["paragraphs"][0]["key"]  # repeated key
    recs[8]["id"] = "   "  # an id of spaces is no id
    result = validate_records(recs, LOOSE, origin="corrupt")
    assert _reasons(result, recs[0]["id"]) == ["expectation: id_unique"] * 2
    assert {"expectation: paragraph_count", "expectation: has_supporting"} <= set(
        _reasons(result, recs[2]["id"])
    )
    assert "expectation: hop_keys_resolvable" in _reasons(result, recs[3]["id"])
    assert _reasons(result, recs[4]["id"]) == ["expectation: answer_non_empty"]
    assert _reasons(result, recs[5]["id"]) == ["expectation: paragraph_chars"]
    assert "expectation: paragraph_keys_unique" in _reasons(result, recs[6]["id"])
    assert _reasons(result, "   ") == ["expectation: id_non_empty"]
    assert [r["id"] for r in result.kept] == [recs[7]["id"]]
    exp = result.report["expectations"]
    assert exp["id_unique"] == {"success": False, "unexpected_count": 2}
    assert exp["question_len"]["success"]


def test_an_empty_hop_question_or_paragraph_title_is_quarantined(real: list[dict]) -> None:
    """A hop's question is a clone's task and a title heads a paragraph whose key does not spell it:
    both passed every expectation when empty."""
    recs = copy.deepcopy(real[:3])
    recs[0]["hops"][0]["question"] = " "
    recs[1]["paragraphs"][0]["title"] = ""
    result = validate_records(recs, LOOSE, origin="corrupt")
    assert _reasons(result, recs[0]["id"]) == ["expectation: hop_questions_non_empty"]
    assert _reasons(result, recs[1]["id"]) == ["expectation: no_empty_titles"]
    assert [r["id"] for r in result.kept] == [recs[2]["id"]]


def test_synthetic_answer_must_be_in_context() -> None:
    rec = generate_synthetic(0, {"train": {"count": 2}})["train"]
    bad = copy.deepcopy(rec)
    bad[0]["answers"] = ["Zzzz"]
    result = validate_records(bad, LOOSE)
    assert _reasons(result, bad[0]["id"]) == ["expectation: answer_in_context"]


def test_a_yes_no_alias_does_not_exempt_a_gold_that_is_not_yes_no() -> None:
    """Only a yes/no gold is exempt from answer_in_context: a record whose gold is missing from its
    supporting paragraphs fails even when an alias is "yes" or "no" (and "no", a substring of most
    texts, does not count as found either)."""
    records = copy.deepcopy(generate_synthetic(0, {"train": {"count": 3}})["train"])
    records[0]["answers"] = ["Zzzz", "yes"]
    records[1]["answers"] = ["Zzzz", "no"]
    records[2]["answers"] = ["yes", "Zzzz"]  # a yes/no gold stays exempt
    support = " ".join(p["text"] for p in records[1]["paragraphs"] if p["supporting"]).lower()
    assert "no" in support  # so a substring search for the alias would have passed the record
    result = validate_records(records, LOOSE)
    assert _reasons(result, records[0]["id"]) == ["expectation: answer_in_context"]
    assert _reasons(result, records[1]["id"]) == ["expectation: answer_in_context"]
    assert [r["id"] for r in result.kept] == [records[2]["id"]]


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            {"min_paragraphs": 10, "max_paragraphs": 4},
            r"validation\.min_paragraphs \(10\) > validation\.max_paragraphs \(4\)",
        ),
        ({"max_num_hops": 0}, r"validation\.min_num_hops \(1\) > validation\.max_num_hops \(0\)"),
        ({"max_answer_chars": -1}, r"validation\.max_answer_chars: expected an integer >= 1, got -1"),
        # The suite's ranges for these start at 1: "between 1 and 0" crashed GX and the check was off.
        ({"max_answer_chars": 0}, r"validation\.max_answer_chars: expected an integer >= 1, got 0"),
        ({"max_key_chars": 0}, r"validation\.max_key_chars: expected an integer >= 1, got 0"),
        ({"max_paragraph_chars": 0}, r"validation\.max_paragraph_chars: expected an integer >= 1, got 0"),
        ({"max_context_chars": 0}, r"validation\.max_context_chars: expected an integer >= 1, got 0"),
        ({"max_question_chars": 0, "min_question_chars": 0}, None),  # a range of its own: 0 is sound
        (
            {"max_invalid_fraction": 5},
            r"validation\.max_invalid_fraction: expected a number in \[0, 1\], got 5",
        ),
        ({"max_invalid_fration": 0.1}, r"unknown QA validation setting validation\.max_invalid_fration"),
    ],
)
def test_a_bad_validation_setting_is_a_value_error_naming_it(limits: dict, message: str) -> None:
    """min > max used to quarantine every record and stop the stage blaming the data; a typo kept
    the default silently."""
    records = generate_synthetic(0, {"train": {"count": 2}})["train"]
    if message is None:
        validate_records(records, limits | LOOSE)
        return
    with pytest.raises(ValueError, match=message):
        validate_records(records, limits)


def test_a_crashed_expectation_stops_the_run_naming_it_and_the_exception() -> None:
    """GX 1.24 reports a metric that crashed under a `MetricConfigurationID(...)` key of
    `exception_info`, not at its top level, where the guard looked: the expectation came back as a
    failure naming no record, so nothing was quarantined and the check was silently off."""
    import great_expectations.expectations as gxe
    import pandas as pd

    df = pd.DataFrame({"_row": [0, 1], "x": [5, 7]})
    crashes = {
        "empty_range": (
            gxe.ExpectColumnValuesToBeBetween(column="x", min_value=1, max_value=0),
            r"expectation empty_range crashed: min_value cannot be greater than max_value",
        ),
        "no_such_column": (
            gxe.ExpectColumnValuesToBeBetween(column="nope", min_value=1),
            r"expectation no_such_column crashed: .*column \"nope\" in BatchData does not exist",
        ),
        # No exception, but a failure that names no row would quarantine nothing either.
        "x_is_str": (
            gxe.ExpectColumnValuesToBeOfType(column="x", type_="str"),
            r"expectation x_is_str failed without naming a failing record .*observed value 'int64'",
        ),
    }
    for name, (expectation, message) in crashes.items():
        with pytest.raises(RuntimeError, match=message):
            run_expectations(df, f"crash_{name}", lambda e=expectation, n=name: [(n, e)], "test")
    sound = run_expectations(
        df,
        "crash_sound",
        lambda: [("x_small", gxe.ExpectColumnValuesToBeBetween(column="x", min_value=1, max_value=6))],
        "test",
    )
    assert sound == {"x_small": {"success": False, "unexpected_count": 1, "rows": [1], "error": None}}


def test_validation_stops_when_the_qa_suite_crashes(
    real: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the limit check bypassed, max_answer_chars 0 makes answer_non_empty "between 1 and 0":
    the run must stop naming it, not keep the record with the empty answer."""
    monkeypatch.setattr(
        validation,
        "check_limits",
        lambda limits, prefix="validation": {**validation.DEFAULT_LIMITS, **limits},
    )
    recs = copy.deepcopy(real[:3])
    recs[1]["answers"] = [""]
    with pytest.raises(
        RuntimeError, match=r"expectation answer_non_empty crashed: min_value cannot be greater"
    ):
        validate_records(recs, {"max_answer_chars": 0, **LOOSE})


def test_the_stage_names_a_bad_split_range_before_generating(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from stages.prepare_qa import build

    synthetic = {
        "paragraphs": [10, 12],
        "splits": {"train": {"count": 5}, "ood": {"count": 5, "hops": [3, 2]}},
    }
    with pytest.raises(ValueError, match=r"^qa\.synthetic\.splits\.ood\.hops: the range \[3, 2\] is empty"):
        build(_real_only(tmp_path, [], synthetic))


def test_threshold_stops_with_file_record_and_expectation(real: list[dict]) -> None:
    recs = copy.deepcopy(real[:10])
    recs[3]["answers"] = [""]
    with pytest.raises(QAValidationError) as err:
        validate_records(recs, {"max_invalid_fraction": 0.05}, origin="wiki.json")
    msg = str(err.value)
    assert "wiki.json" in msg and recs[3]["id"] in msg and "answer_non_empty" in msg and "1/10" in msg
    assert len(validate_records(recs, {"max_invalid_fraction": 0.1}).kept) == 9


# ---------------------------------------------------------------------------------------- stage


def _stage_params(tmp_path: Path, sources: list[dict]) -> Path:
    params = {
        "seed": 3,
        "qa": {
            "seed": 3,
            "synthetic": {
                "paragraphs": [10, 12],
                "splits": {
                    "train": {"count": 20},
                    "validation": {"count": 5},
                    "test": {"count": 5},
                    "ood": {"count": 5, "hops": [3, 3], "paragraphs": [16, 18]},
                },
            },
            "real": {"enabled": True, "sources": sources},
        },
        "validation": {"max_invalid_fraction": 0.2},
    }
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params), encoding="utf-8")
    return path


def test_stage_end_to_end(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    import datasets

    from stages import prepare_qa

    wiki = json.loads(WIKI.read_text(encoding="utf-8"))
    wiki[5]["question"] = 5  # wrong type -> quarantined by the adapter, stage continues
    bad_wiki = tmp_path / "wiki.json"
    bad_wiki.write_text(json.dumps(wiki), encoding="utf-8")
    sources = [
        {
            "name": "2wiki_dev",
            "format": "2wiki",
            "source": "2wikimultihopqa",
            "split": "dev",
            "path": str(bad_wiki),
        },
        {
            "name": "2wiki_dev",
            "format": "2wiki",
            "source": "2wikimultihopqa",
            "split": "dev",
            "path": str(WIKI_KAG),
        },
        {
            "name": "musique_dev",
            "format": "musique",
            "source": "musique",
            "split": "dev",
            "path": str(MUSIQUE),
        },
    ]
    params = _stage_params(tmp_path, sources)
    out, reports = tmp_path / "data" / "qa", tmp_path / "reports"
    prepare_qa.main(["--params", str(params), "--out", str(out), "--reports", str(reports)])

    dd = datasets.load_from_disk(str(out))
    assert set(dd) == {"train", "validation", "test", "ood", "2wiki_dev", "musique_dev"}
    assert dd["train"].num_rows == 20 and dd["musique_dev"].num_rows == 100
    # 10 - 1 quarantined; the 2 KAG copies are identical to HippoRAG records and merged.
    assert dd["2wiki_dev"].num_rows == 9
    first = json.loads((out / "train.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first == dd["train"][0]

    quarantine = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert len(quarantine) == 1 and quarantine[0]["record_id"] == wiki[5]["_id"]
    assert "field 'question': expected str, got int" in quarantine[0]["reasons"][0]

    metrics = json.loads((reports / "qa_validation.json").read_text(encoding="utf-8"))
    assert metrics["quarantined"] == 1 and metrics["kept"] == 20 + 5 + 5 + 5 + 9 + 100
    assert metrics["sources"]["2wiki_dev/wiki.json"] == {
        "kept": 9,
        "quarantined": 1,
        "unanswerable": 0,
        "overlaps_train": 0,
        "duplicates_merged": 0,
        "invalid_fraction": 0.1,
    }
    assert metrics["sources"]["2wiki_dev/kag_2wiki_qa_sub.json"]["duplicates_merged"] == 2
    assert metrics["splits"]["ood"]["num_hops_min"] == 3
    assert 0.0 <= metrics["splits"]["test"]["type_guess_accuracy"] <= 1.0
    assert metrics["splits"]["musique_dev"]["type_guess_accuracy"] is None
    md = (reports / "qa_validation.md").read_text(encoding="utf-8")
    assert "# QA data validation" in md and wiki[5]["_id"] in md

    # Same params -> same bytes.
    before = (out / "ood.jsonl").read_bytes()
    prepare_qa.main(["--params", str(params), "--out", str(out), "--reports", str(reports)])
    assert (out / "ood.jsonl").read_bytes() == before

    # Over the threshold the stage stops and names the file, record and reason.
    wiki[1]["answer"] = None
    wiki[2]["context"] = "oops"
    bad_wiki.write_text(json.dumps(wiki), encoding="utf-8")
    with pytest.raises(
        QAValidationError,
        match=r"3/11 records invalid.*first offending record #1 id .a80d84e7096d11ebbdb0ac1f6bf848b6. in \S*wiki\.json: field .answer.: missing",
    ):
        prepare_qa.main(["--params", str(params), "--out", str(out), "--reports", str(reports)])


def _wiki_with_two_bad_records(tmp_path: Path) -> tuple[list[dict], Path]:
    """Four 2Wiki records: #0 without a question (the adapter rejects it), #3 with an empty answer
    (it adapts, then fails an expectation)."""
    records = json.loads(WIKI.read_text())[:4]
    records[0] = {k: v for k, v in records[0].items() if k != "question"}
    records[3]["answer"] = ""
    path = tmp_path / "wiki.json"
    path.write_text(json.dumps(records))
    return records, path


def test_a_stopped_stage_writes_the_quarantine_and_reports_first(tmp_path: Path) -> None:
    """Over max_invalid_fraction the stage raised inside the validation, before the quarantine and
    the reports were written: every reason but the first in the message was lost. Now both bad
    records are in data/qa/quarantine.jsonl and the reports, no split is written (nor an old one
    left), and the error still names the file, the count and the first offending record."""
    sys.path.insert(0, str(ROOT))
    from stages import prepare_qa

    records, path = _wiki_with_two_bad_records(tmp_path)
    params = _real_only(tmp_path, [{"name": "x_dev", "format": "2wiki", "path": str(path)}])
    params["validation"] = {"max_invalid_fraction": 0.2}
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params), encoding="utf-8")
    out, reports = tmp_path / "data" / "qa", tmp_path / "reports"
    out.mkdir(parents=True)
    (out / "old_split.jsonl").write_text("{}\n")
    with pytest.raises(QAValidationError) as err:
        prepare_qa.main(["--params", str(params_file), "--out", str(out), "--reports", str(reports)])
    message = str(err.value)
    assert f"{path}: 2/4 records invalid" in message
    assert f"first offending record #0 id {records[0]['_id']!r}: field 'question': missing" in message

    quarantine = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [(q["index"], q["record_id"], q["stage"]) for q in quarantine] == [
        (0, records[0]["_id"], "adapter"),
        (3, records[3]["_id"], "expectations"),
    ]
    assert quarantine[1]["reasons"] == ["expectation: answer_non_empty"]
    assert sorted(p.name for p in out.iterdir()) == ["quarantine.jsonl"]
    metrics = json.loads((reports / "qa_validation.json").read_text(encoding="utf-8"))
    assert (metrics["kept"], metrics["invalid"], metrics["invalid_fraction"]) == (2, 2, 0.5)
    assert records[3]["_id"] in (reports / "qa_validation.md").read_text(encoding="utf-8")
    assert f"every quarantined record, with its reasons, is in {out / 'quarantine.jsonl'}" in message


def test_a_split_left_empty_stops_after_writing_the_quarantine_and_reports(tmp_path: Path) -> None:
    """A split whose records are all kept out by design (here three real MuSiQue records marked
    `answerable: false`), with no invalid limit exceeded, stopped the stage with a bare ValueError
    before anything was written: the old splits stayed looking current and no quarantine or report
    said why. Now it stops as a split over the invalid limit does: the quarantine and the reports
    are written, no split is (the old ones are gone), and the error names the split and why."""
    sys.path.insert(0, str(ROOT))
    from stages import prepare_qa

    mus = json.loads(MUSIQUE.read_text(encoding="utf-8"))[:3]
    for record in mus:
        record["answerable"] = False
    mus_path = tmp_path / "mus.json"
    mus_path.write_text(json.dumps(mus), encoding="utf-8")
    sources = [
        {"name": "wiki_dev", "format": "2wiki", "path": str(WIKI_KAG)},  # a sound split beside it
        {"name": "mus_dev", "format": "musique", "path": str(mus_path)},
    ]
    params = _real_only(tmp_path, sources)
    params["validation"] = {"max_invalid_fraction": 0.0}
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params), encoding="utf-8")
    out, reports = tmp_path / "data" / "qa", tmp_path / "reports"
    out.mkdir(parents=True)
    (out / "mus_dev.jsonl").write_text("{}\n")  # a previous run's split
    with pytest.raises(QAValidationError) as err:
        prepare_qa.main(["--params", str(params_file), "--out", str(out), "--reports", str(reports)])
    assert str(err.value) == (
        f"{mus_path}: QA split 'mus_dev' has no records left: all 3 of its records were kept out "
        "(3 unanswerable, 0 overlapping a training split, 0 invalid within "
        "validation.max_invalid_fraction), and a split with no records cannot be written\n"
        f"every quarantined record, with its reasons, is in {out / 'quarantine.jsonl'}"
    )

    assert sorted(p.name for p in out.iterdir()) == ["quarantine.jsonl"]
    quarantine = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [(q["index"], q["record_id"], q["stage"], q["split"]) for q in quarantine] == [
        (i, mus[i]["id"], "unanswerable", "mus_dev") for i in range(3)
    ]
    metrics = json.loads((reports / "qa_validation.json").read_text(encoding="utf-8"))
    assert metrics["splits"]["mus_dev"]["kept"] == 0 and metrics["splits"]["mus_dev"]["unanswerable"] == 3
    assert metrics["splits"]["wiki_dev"]["kept"] == 2
    assert mus[0]["id"] in (reports / "qa_validation.md").read_text(encoding="utf-8")


def test_quarantine_names_each_records_position_in_its_file(tmp_path: Path) -> None:
    """A record the adapter quarantines must not shift the file positions that later quarantine
    entries report (record #3 failing an expectation was reported as #2)."""
    sys.path.insert(0, str(ROOT))
    from stages.prepare_qa import build

    records, path = _wiki_with_two_bad_records(tmp_path)
    _, quarantined, _ = build(_real_only(tmp_path, [{"name": "x", "format": "2wiki", "path": str(path)}]))
    where = {q.record_id: q.index for q in quarantined}
    assert where == {records[0]["_id"]: 0, records[3]["_id"]: 3}


def _real_only(tmp_path: Path, sources: list[dict], synthetic: dict | None = None) -> dict:
    return {
        "qa": {
            "seed": 1,
            "synthetic": synthetic or {"enabled": False},
            "real": {"enabled": True, "sources": sources},
        },
        "validation": LOOSE,
    }


def test_real_quarantines_count_under_their_output_split(tmp_path: Path) -> None:
    """Records the expectations quarantine carry the output split's name, as the adapter's do, so
    a real split's metrics count both and a synthetic split of the source's own split name none."""
    sys.path.insert(0, str(ROOT))
    from stages.prepare_qa import build

    _, path = _wiki_with_two_bad_records(tmp_path)
    source = {"name": "wiki_train", "format": "2wiki", "split": "train", "path": str(path)}
    synthetic = {"paragraphs": [10, 12], "splits": {"train": {"count": 5}}}
    _, quarantined, metrics = build(_real_only(tmp_path, [source], synthetic))
    assert [q.split for q in quarantined] == ["wiki_train", "wiki_train"]
    assert metrics["splits"]["wiki_train"]["quarantined"] == 2
    assert metrics["splits"]["train"]["quarantined"] == 0


def test_unanswerable_musique_records_are_quarantined_and_counted_but_not_invalid(tmp_path: Path) -> None:
    """Two of three MuSiQue records marked `answerable: false` are kept out as `unanswerable`; with
    max_invalid_fraction 0 the stage still goes on (they are not broken), reports their number per
    file, per split and in all, and leaves them out of the invalid fraction's denominator."""
    sys.path.insert(0, str(ROOT))
    from stages.prepare_qa import build, render_markdown

    records = json.loads(MUSIQUE.read_text(encoding="utf-8"))[:3]
    records[0]["answerable"] = records[2]["answerable"] = False
    path = tmp_path / "mus.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    params = _real_only(tmp_path, [{"name": "mus_dev", "format": "musique", "path": str(path)}])
    params["validation"] = {"max_invalid_fraction": 0.0}
    splits, quarantined, metrics = build(params)
    assert [r["id"] for r in splits["mus_dev"]] == [records[1]["id"]]
    assert [(q.index, q.stage, q.split) for q in quarantined] == [
        (0, "unanswerable", "mus_dev"),
        (2, "unanswerable", "mus_dev"),
    ]
    source = metrics["sources"]["mus_dev/mus.json"]
    assert (source["quarantined"], source["unanswerable"], source["invalid_fraction"]) == (2, 2, 0.0)
    assert (metrics["splits"]["mus_dev"]["quarantined"], metrics["splits"]["mus_dev"]["unanswerable"]) == (
        2,
        2,
    )
    assert (metrics["quarantined"], metrics["invalid"], metrics["unanswerable"]) == (2, 0, 2)
    assert metrics["invalid_fraction"] == 0.0
    assert "0 invalid" in render_markdown(metrics, quarantined)

    # A broken record beside them is judged against the sound ones only: 1 of 2, not 1 of 4.
    records.append({k: v for k, v in records[1].items() if k != "question"})
    path.write_text(json.dumps(records), encoding="utf-8")
    params["validation"] = {"max_invalid_fraction": 0.4}
    with pytest.raises(QAValidationError, match=r"1/2 records invalid .*#3 .*field 'question': missing"):
        build(params)


def test_eval_records_a_training_split_holds_are_quarantined_naming_it(tmp_path: Path) -> None:
    """musique_dev gets one record with a musique_train id and one with a train record's question
    and answer up to case, punctuation and spacing: both are kept out of musique_dev as
    `overlaps_train`, naming musique_train, counted (per file, split and in all) but not as invalid;
    the training split keeps all its records."""
    sys.path.insert(0, str(ROOT))
    from stages.prepare_qa import build

    train = json.loads(MUSIQUE_SUB.read_text(encoding="utf-8"))
    dev = json.loads(MUSIQUE.read_text(encoding="utf-8"))[:4]
    dev[1]["id"] = train[2]["id"]
    dev.append({**copy.deepcopy(train[0]), "id": "copy-of-a-train-record"})
    dev[4]["question"] = "  " + dev[4]["question"].upper().rstrip("?") + " ?"
    (tmp_path / "train.json").write_text(json.dumps(train), encoding="utf-8")
    (tmp_path / "dev.json").write_text(json.dumps(dev), encoding="utf-8")
    sources = [
        {"name": "mus_dev", "format": "musique", "path": str(tmp_path / "dev.json")},
        {"name": "mus_train", "format": "musique", "split": "train", "path": str(tmp_path / "train.json")},
    ]
    synthetic = {"paragraphs": [10, 12], "splits": {"train": {"count": 5}, "test": {"count": 3}}}
    params = _real_only(tmp_path, sources, synthetic)
    params["validation"] = {"max_invalid_fraction": 0.0}
    splits, quarantined, metrics = build(params)

    assert [r["id"] for r in splits["mus_dev"]] == [dev[i]["id"] for i in (0, 2, 3)]
    assert len(splits["mus_train"]) == 3 and len(splits["test"]) == 3
    assert [(q.index, q.record_id, q.stage, q.split) for q in quarantined] == [
        (1, train[2]["id"], "overlaps_train", "mus_dev"),
        (4, "copy-of-a-train-record", "overlaps_train", "mus_dev"),
    ]
    assert quarantined[0].reasons == [
        f"overlaps_train: id {train[2]['id']!r} is also in training split 'mus_train'"
    ]
    assert quarantined[1].reasons == [
        "overlaps_train: question and answer (normalised) are also in training split 'mus_train' "
        f"(record {train[0]['id']!r})"
    ]
    assert quarantined[1].file == str(tmp_path / "dev.json")
    assert metrics["sources"]["mus_dev/dev.json"] == {
        "kept": 3,
        "quarantined": 2,
        "unanswerable": 0,
        "overlaps_train": 2,
        "duplicates_merged": 0,
        "invalid_fraction": 0.0,
    }
    assert metrics["splits"]["mus_dev"]["overlaps_train"] == 2 and metrics["splits"]["mus_dev"]["kept"] == 3
    assert metrics["splits"]["test"]["overlaps_train"] == 0
    assert (metrics["overlaps_train"], metrics["invalid"], metrics["invalid_fraction"]) == (2, 0, 0.0)


def test_synthetic_eval_records_are_checked_against_the_synthetic_train_split() -> None:
    sys.path.insert(0, str(ROOT))
    from stages.prepare_qa import is_train_split, quarantine_train_overlaps

    assert [is_train_split(n) for n in ("train", "musique_train", "2wiki-train")] == [True] * 3
    assert [is_train_split(n) for n in ("validation", "test", "ood", "musique_dev", "retrain")] == [False] * 5
    generated = generate_synthetic(0, {"train": {"count": 5}, "test": {"count": 3}})
    leak = {**copy.deepcopy(generated["train"][2]), "id": "synth-test-99999"}
    leak["question"] = leak["question"].lower()
    splits = {"train": list(generated["train"]), "test": [*generated["test"], leak]}
    where = {id(r): (f"synthetic/{name}", i) for name, rs in splits.items() for i, r in enumerate(rs)}
    out = quarantine_train_overlaps(splits, where)
    assert [(q.file, q.index, q.record_id, q.split) for q in out] == [
        ("synthetic/test", 3, leak["id"], "test")
    ]
    assert f"training split 'train' (record {generated['train'][2]['id']!r})" in out[0].reasons[0]
    assert splits == {"train": generated["train"], "test": generated["test"]}


def test_a_real_source_may_not_take_a_synthetic_splits_name(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from stages.prepare_qa import build

    source = {"name": "test", "format": "2wiki", "path": str(WIKI)}
    synthetic = {"paragraphs": [10, 12], "splits": {"test": {"count": 5}}}
    with pytest.raises(ValueError, match="name 'test' is also a synthetic split"):
        build(_real_only(tmp_path, [source], synthetic))


def test_an_empty_real_source_stops_the_stage_naming_it_and_keeps_the_old_outputs(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from selfcest.data.qa import QADataError

    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    source = {"name": "x", "format": "2wiki", "path": str(empty)}
    _stops_keeping_the_old_outputs(tmp_path, source, QADataError, r"empty\.json: no records for QA split 'x'")


def _stops_keeping_the_old_outputs(tmp_path: Path, source: dict, error: type[Exception], match: str) -> None:
    """`prepare_qa` with the one real `source` stops with `error` (matching `match`) and leaves the
    output folder's old files where they were."""
    sys.path.insert(0, str(ROOT))
    from stages import prepare_qa

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(_real_only(tmp_path, [source])))
    out = tmp_path / "qa"
    out.mkdir()
    (out / "old.jsonl").write_text("{}\n")
    with pytest.raises(error, match=match):
        prepare_qa.main(["--params", str(params), "--out", str(out), "--reports", str(tmp_path / "reports")])
    assert (out / "old.jsonl").exists()


def test_files_of_one_split_sharing_a_name_keep_their_own_metrics(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from stages.prepare_qa import build

    records = json.loads(WIKI.read_text())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "dev.json").write_text(json.dumps(records[:4]))
    (tmp_path / "b" / "dev.json").write_text(json.dumps(records[4:]))
    sources = [{"name": "x", "format": "2wiki", "path": str(tmp_path / d / "dev.json")} for d in "ab"]
    _, _, metrics = build(_real_only(tmp_path, sources))
    kept = {name: row["kept"] for name, row in metrics["sources"].items()}
    assert kept == {f"x/{tmp_path / 'a' / 'dev.json'}": 4, f"x/{tmp_path / 'b' / 'dev.json'}": 6}


def test_the_stage_reports_the_invalid_fraction_limit_it_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metrics' `max_invalid_fraction` is the checked setting over `DEFAULT_LIMITS`, the one
    `validate_records` enforces: the stage used to read it again with a default of its own."""
    sys.path.insert(0, str(ROOT))
    from selfcest.data import validation
    from stages.prepare_qa import build

    monkeypatch.setitem(validation.DEFAULT_LIMITS, "max_invalid_fraction", 0.25)
    synthetic = {"paragraphs": [10, 12], "splits": {"train": {"count": 5}}}
    params = _real_only(tmp_path, [], synthetic) | {"validation": {}}
    assert build(params)[2]["max_invalid_fraction"] == 0.25
    params["validation"] = {"max_invalid_fraction": 0.5}
    assert build(params)[2]["max_invalid_fraction"] == 0.5


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda qa: qa["synthetic"].update(extra_entites=40), r"qa\.synthetic\.extra_entites"),
        (lambda qa: qa["synthetic"].update(enable=False), r"qa\.synthetic\.enable"),
        (lambda qa: qa["real"].update(source=[]), r"^qa\.real: unknown key\(s\) \['source'\]"),
        (lambda qa: qa.update(synthetc={}), r"^qa: unknown key\(s\) \['synthetc'\]"),
        (
            lambda qa: qa["real"]["sources"].append(
                {"name": "x_train", "format": "2wiki", "path": "p", "splt": "train"}
            ),
            r"^qa\.real\.sources\[0\]: unknown key\(s\) \['splt'\]",
        ),
        (
            lambda qa: qa["real"]["sources"].append({"name": "x_dev", "format": "2wiki"}),
            r"^qa\.real\.sources\[0\]: missing path",
        ),
    ],
)
def test_the_stage_refuses_a_misspelt_qa_setting_by_name(tmp_path: Path, edit: Any, message: str) -> None:
    """The synthetic defaults were filtered to the known keys before they were checked, and real
    sources were not checked at all: `extra_entites: 40` ran with 4, `splt: train` as a dev split."""
    sys.path.insert(0, str(ROOT))
    from stages.prepare_qa import build

    params = _real_only(tmp_path, [], {"paragraphs": [10, 12], "splits": {"train": {"count": 5}}})
    edit(params["qa"])
    with pytest.raises(ValueError, match=message):
        build(params)


def test_an_answer_in_context_source_that_no_source_has_is_refused_naming_it(tmp_path: Path) -> None:
    """`2wiki` listed for the loader's `2wikimultihopqa` matched no record, so the check was off
    for 2Wiki, silently. Refused before any reading (the path does not exist), naming the setting,
    the unknown name and the known ones; the committed params pass."""
    sys.path.insert(0, str(ROOT))
    from stages import prepare_qa

    sources = [
        {"name": "w_dev", "format": "2wiki", "source": "2wikimultihopqa", "path": str(tmp_path / "none")},
        {"name": "m_dev", "format": "musique", "path": str(tmp_path / "none")},  # source: the format
    ]
    params = _real_only(tmp_path, sources)
    params["validation"] = {"answer_in_context_sources": ["synthetic", "2wiki", "musique", "hotpot"]}
    with pytest.raises(
        ValueError,
        match=r"^validation\.answer_in_context_sources: unknown source name\(s\) '2wiki', 'hotpot': no "
        r"configured qa\.real source has them.*\(known source names: 2wikimultihopqa, musique, synthetic\)$",
    ):
        prepare_qa.build(params)

    params["validation"] = {"answer_in_context_sources": ["synthetic", "2wikimultihopqa", "musique"]}
    params["qa"]["real"]["enabled"] = False  # switched off, the sources still name the sources
    prepare_qa.check_answer_in_context_sources(params)
    committed = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    prepare_qa.check_answer_in_context_sources(committed)

    # With the name right, the check is on for 2Wiki: a gold nowhere in its context is quarantined.
    wiki = json.loads(WIKI.read_text(encoding="utf-8"))[:3]
    wiki[0]["answer"] = "Zanzibar Quux"
    (tmp_path / "wiki.json").write_text(json.dumps(wiki), encoding="utf-8")
    params = _real_only(tmp_path, [{**sources[0], "path": str(tmp_path / "wiki.json")}])
    params["validation"] = {"answer_in_context_sources": ["2wikimultihopqa"], **LOOSE}
    _, quarantined, _ = prepare_qa.build(params)
    assert [(q.record_id, q.reasons) for q in quarantined] == [
        (wiki[0]["_id"], ["expectation: answer_in_context"])
    ]


def test_a_real_source_named_like_the_quarantine_stops_before_the_old_outputs_go(tmp_path: Path) -> None:
    """A split named `quarantine` was written to quarantine.jsonl and then overwritten by the
    quarantine list; it is refused, and the folder's old files stay."""
    source = {"name": "quarantine", "format": "2wiki", "path": str(WIKI)}
    _stops_keeping_the_old_outputs(tmp_path, source, ValueError, r"a split may not be named 'quarantine'")
