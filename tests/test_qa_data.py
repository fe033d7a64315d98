"""QA adapters (real 2Wiki/MuSiQue sample files, corrupted copies, s3://) and the synthetic generator."""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path

import pytest
from benchmark_paths import BENCHMARKS as BENCH

from selfcest.data.qa import (
    NAMES,
    QADataError,
    canonical_jsonl,
    generate_synthetic,
    load_2wiki,
    load_musique,
    make_keys,
    record_documents,
    records_sha256,
    slugify,
    storage_options_for,
    type_guess_accuracy,
)

WIKI = BENCH / "2wikimultihopqa" / "2wikimultihopqa_dev_hipporag_first10.json"
WIKI_KAG = BENCH / "2wikimultihopqa" / "kag_2wiki_qa_sub.json"
MUSIQUE = BENCH / "musique" / "kag_musique_qa_100.json"
MUSIQUE_SUB = BENCH / "musique" / "kag_musique_qa_sub.json"

SMALL = {
    "train": {"count": 40},
    "test": {"count": 20},
    "ood": {"count": 20, "hops": [3, 3], "paragraphs": [18, 22]},
}


def _write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _check_keys(rec: dict) -> None:
    keys = [p["key"] for p in rec["paragraphs"]]
    assert len(keys) == len(set(keys)) and all(keys)
    assert all(h["paragraph_key"] in keys for h in rec["hops"])
    supporting = {p["key"] for p in rec["paragraphs"] if p["supporting"]}
    assert {h["paragraph_key"] for h in rec["hops"]} <= supporting


# ---------------------------------------------------------------------------------------- real files


@pytest.mark.parametrize(("path", "count"), [(WIKI, 10), (WIKI_KAG, 2)])
def test_every_real_2wiki_record_loads(path: Path, count: int) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    result = load_2wiki(str(path))
    assert result.quarantined == []
    assert len(result.records) == len(raw) == count
    for rec, src in zip(result.records, raw, strict=True):
        assert rec["id"] == src["_id"] and rec["answers"][0] == src["answer"]
        assert rec["source"] == "2wikimultihopqa" and rec["type"] == src["type"]
        assert len(rec["paragraphs"]) == len(src["context"])
        sup_titles = {t for t, _ in src["supporting_facts"]}
        assert {p["title"] for p in rec["paragraphs"] if p["supporting"]} == sup_titles
        assert len(rec["hops"]) == len(src["evidences"]) == rec["num_hops"]
        _check_keys(rec)


@pytest.mark.parametrize(("path", "count"), [(MUSIQUE, 100), (MUSIQUE_SUB, 3)])
def test_every_real_musique_record_loads(path: Path, count: int) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    result = load_musique(str(path), split="dev")
    assert result.quarantined == []
    assert len(result.records) == len(raw) == count
    for rec, src in zip(result.records, raw, strict=True):
        assert rec["answers"][0] == src["answer"]
        assert set(rec["answers"][1:]) <= set(src["answer_aliases"])
        assert rec["num_hops"] == len(src["question_decomposition"]) == len(rec["hops"])
        assert rec["type"] == src["id"].split("__")[0]
        for hop, step in zip(rec["hops"], src["question_decomposition"], strict=True):
            para = src["paragraphs"][step["paragraph_support_idx"]]
            assert (
                next(p for p in rec["paragraphs"] if p["key"] == hop["paragraph_key"])["title"]
                == para["title"]
            )
        _check_keys(rec)


def test_keys_are_short_unique_slugs() -> None:
    assert slugify("Aldri annet enn bråk") == "Aldri-annet-enn-brak"
    assert slugify("Teda") == "Teda"
    assert make_keys(["My Fair Lady", "My Fair Lady", "my fair lady!"]) == [
        "My-Fair-Lady",
        "My-Fair-Lady-2",
        "my-fair-lady-3",
    ]
    assert len(slugify("x " * 100)) <= 32


def test_keys_keep_letters_that_do_not_decompose() -> None:
    """The ASCII fold dropped every letter NFKD does not split into ASCII and an accent: "Øresund"
    became `resund`, "Straße" `Strae`, and an all-CJK context `p`, `p-2`, `p-3` (keys naming nothing)."""
    assert slugify("Øresund Bridge") == "Oresund-Bridge"
    assert slugify("Heinz-Josef Große") == "Heinz-Josef-Grosse"  # a real 2Wiki title (was `Groe`)
    assert slugify("Châu Đức District") == "Chau-Duc-District"  # a real 2Wiki title (was `Chau-uc`)
    assert [slugify(t) for t in ("Æthelred", "ÆSIR", "Łódź", "Þórr", "2010 Elazığ earthquake")] == [
        "Aethelred", "AESIR", "Lodz", "Thorr", "2010-Elazig-earthquake"
    ]  # fmt: skip
    # Other scripts keep their letters (and marks: the Devanagari vowel signs are part of the word).
    assert make_keys(["東京", "大阪", "東京", "Москва", "हिन्दी"]) == [
        "東京",
        "大阪",
        "東京-2",
        "Москва",
        "हिन्दी",
    ]
    assert make_keys(["ΑΒΓ", "αβγ"]) == ["ΑΒΓ", "αβγ-2"]  # unique regardless of case, as ASCII keys
    # Decomposable titles keep their old keys; punctuation outside ASCII is still dropped.
    assert (
        slugify("Frédéric Chopin") == "Frederic-Chopin"
        and slugify("1979–80 European Cup") == "197980-European-Cup"
    )
    assert slugify("Hawaiʻi") == "Hawaii" and slugify("🎉") == "p"


# ---------------------------------------------------------------------------------------- corruption


def test_missing_field_is_quarantined_with_file_record_and_field(tmp_path: Path) -> None:
    data = json.loads(WIKI.read_text(encoding="utf-8"))
    del data[3]["answer"]
    path = _write(tmp_path / "wiki.json", data)
    result = load_2wiki(str(path))
    assert len(result.records) == 9 and len(result.quarantined) == 1
    q = result.quarantined[0]
    assert (q.index, q.record_id, q.file) == (3, data[3]["_id"], str(path))
    assert "'answer'" in q.reasons[0] and "missing" in q.reasons[0]


def test_wrong_type_is_quarantined(tmp_path: Path) -> None:
    data = json.loads(MUSIQUE_SUB.read_text(encoding="utf-8"))
    data[1]["paragraphs"] = "not a list"
    data[2]["paragraphs"][4]["is_supporting"] = "yes"
    result = load_musique(str(_write(tmp_path / "m.json", data)))
    assert [q.index for q in result.quarantined] == [1, 2]
    assert "field 'paragraphs': expected list, got str" in result.quarantined[0].reasons[0]
    assert "paragraphs[4].is_supporting" in result.quarantined[1].reasons[0]


def test_unknown_supporting_title_and_idx_are_quarantined(tmp_path: Path) -> None:
    wiki = json.loads(WIKI.read_text(encoding="utf-8"))
    wiki[0]["supporting_facts"][0][0] = "No Such Title"
    wiki[1]["context"] = []  # empty context: its supporting facts cannot resolve either
    res = load_2wiki(str(_write(tmp_path / "w.json", wiki)))
    assert [q.index for q in res.quarantined] == [0, 1]
    assert "unknown supporting title 'No Such Title'" in res.quarantined[0].reasons[0]
    assert "supporting_facts[0]" in res.quarantined[1].reasons[0]

    mus = json.loads(MUSIQUE_SUB.read_text(encoding="utf-8"))
    mus[0]["question_decomposition"][1]["paragraph_support_idx"] = 99
    res = load_musique(str(_write(tmp_path / "m.json", mus)))
    assert len(res.quarantined) == 1
    assert "unknown supporting paragraph idx 99" in res.quarantined[0].reasons[0]
    assert "question_decomposition[1].paragraph_support_idx" in res.quarantined[0].reasons[0]


def test_a_supporting_title_differing_only_in_case_maps_to_its_context_title(tmp_path: Path) -> None:
    """A 2Wiki supporting fact whose title matches a context title only up to case was quarantined as
    "unknown supporting title". With one such context title it resolves to that paragraph and the
    record adapts exactly as with the context's own spelling; with two titles that differ only in
    case (and neither exact) it stays quarantined, as ambiguous. (No record of the shared samples
    has such a fact: each of their 30 facts names its title exactly.)"""
    wiki = json.loads(WIKI.read_text(encoding="utf-8"))
    original = load_2wiki(str(_write(tmp_path / "orig.json", wiki[4:5]))).records[0]
    cased = copy.deepcopy(wiki[4])
    title = cased["supporting_facts"][0][0]  # "God's Gift to Women"
    cased["supporting_facts"][0][0] = title.upper()
    ambiguous = copy.deepcopy(wiki[4])
    ambiguous["context"].append([title.upper(), ["A distractor titled like the supporting paragraph."]])
    ambiguous["supporting_facts"][0][0] = title.lower()
    res = load_2wiki(str(_write(tmp_path / "w.json", [cased, ambiguous])))

    assert res.records == [original]
    assert {p["title"] for p in res.records[0]["paragraphs"] if p["supporting"]} >= {title}
    assert [q.index for q in res.quarantined] == [1]
    assert res.quarantined[0].reasons == [
        f"field 'supporting_facts[0]': supporting title {title.lower()!r} matches several context "
        f"titles up to case ({title!r}, {title.upper()!r}) and none exactly: ambiguous"
    ]


def test_unanswerable_musique_is_quarantined_as_unanswerable_not_invalid(tmp_path: Path) -> None:
    """MuSiQue-Full's contrast questions are sound records kept out by design: quarantined with
    their own stage and reason, which does not count as invalid. A broken record that is also
    marked unanswerable is still reported (and counted) as broken."""
    mus = json.loads(MUSIQUE_SUB.read_text(encoding="utf-8"))
    mus[0]["answerable"] = False
    mus[1]["answerable"] = False
    del mus[1]["question"]
    res = load_musique(str(_write(tmp_path / "m.json", mus)))
    assert len(res.records) == 1
    unanswerable, broken = res.quarantined
    assert (unanswerable.index, unanswerable.stage, unanswerable.invalid) == (0, "unanswerable", False)
    assert unanswerable.reasons == [
        "unanswerable: field 'answerable' is false (a MuSiQue-Full contrast question: its answer is "
        "not supported by its paragraphs)"
    ]
    assert (broken.index, broken.stage, broken.invalid) == (1, "adapter", True)
    assert "field 'question': missing" in broken.reasons[0]


def test_truncated_json_raises_naming_file(tmp_path: Path) -> None:
    path = tmp_path / "trunc.json"
    path.write_bytes(WIKI.read_bytes()[:5000])
    with pytest.raises(QADataError, match=r"trunc\.json: invalid JSON \(truncated\?\) at line"):
        load_2wiki(str(path))
    lines = tmp_path / "trunc.jsonl"  # the official MuSiQue format is JSON lines
    recs = json.loads(MUSIQUE_SUB.read_text(encoding="utf-8"))
    text = "".join(json.dumps(r) + "\n" for r in recs)
    lines.write_text(text[: len(text) - 100], encoding="utf-8")
    with pytest.raises(QADataError, match=r"trunc\.jsonl: invalid JSON on line 3"):
        load_musique(str(lines))
    wrapped = tmp_path / "wrapped.json"  # a valid JSON object, pretty-printed: not a cut file
    wrapped.write_text(json.dumps({"data": recs}, indent=2), encoding="utf-8")
    with pytest.raises(
        QADataError, match=r"wrapped\.json: a JSON object: expected a JSON list or JSON lines"
    ):
        load_musique(str(wrapped))


def test_musique_jsonl_loads(tmp_path: Path) -> None:
    recs = json.loads(MUSIQUE_SUB.read_text(encoding="utf-8"))
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    assert len(load_musique(str(path)).records) == 3


def test_non_utf8_raises_naming_file_and_byte(tmp_path: Path) -> None:
    raw = WIKI.read_bytes()
    path = tmp_path / "latin1.json"
    path.write_bytes(raw[:300] + b"\xff\xfe" + raw[300:])
    with pytest.raises(QADataError, match=r"latin1\.json: not valid UTF-8 at byte 300"):
        load_2wiki(str(path))


def test_missing_file_and_wrong_top_level(tmp_path: Path) -> None:
    with pytest.raises(QADataError, match="nope.json: file not found"):
        load_2wiki(str(tmp_path / "nope.json"))
    path = _write(tmp_path / "obj.json", [1, {"_id": "x"}])
    res = load_2wiki(str(path))
    assert len(res.quarantined) == 2 and "expected an object, got int" in res.quarantined[0].reasons[0]


def test_json_python_cannot_hold_raises_naming_file_and_line(tmp_path: Path) -> None:
    """An integer past Python's digit limit or nesting past its recursion limit is a file error that
    names the file (and the line of a JSON-lines file), not a bare ValueError or RecursionError."""
    huge = "1" * 5000
    (tmp_path / "huge.json").write_text(f'[{{"_id": {huge}}}]', encoding="utf-8")
    with pytest.raises(QADataError, match=r"huge\.json: unreadable JSON: ValueError"):
        load_2wiki(str(tmp_path / "huge.json"))
    (tmp_path / "huge.jsonl").write_text(f'{{"id": "a"}}\n{{"id": {huge}}}\n', encoding="utf-8")
    with pytest.raises(QADataError, match=r"huge\.jsonl: unreadable JSON on line 2: ValueError"):
        load_musique(str(tmp_path / "huge.jsonl"))
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(QADataError, match=r"deep\.json: unreadable JSON: RecursionError"):
        load_2wiki(str(tmp_path / "deep.json"))


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_and_infinity_are_a_file_error_naming_file_and_line(tmp_path: Path, token: str) -> None:
    """Python's json reads NaN, Infinity and a numeral past a float's range as float nan/inf, which
    standard JSON does not have; a gold answer became the string "nan" or "inf". Like invalid JSON,
    the file is broken: QADataError names it, the line and the column, and loads nothing."""
    wiki = tmp_path / "nan.json"
    wiki.write_text(
        '[\n  {"_id": "a", "question": "q", "answer": "NaN",\n   "score": ' + token + "}\n]", encoding="utf-8"
    )
    with pytest.raises(
        QADataError, match=rf"nan\.json: non-standard JSON at line 3 column 13: {re.escape(token)} "
    ):
        load_2wiki(str(wiki))
    lines = tmp_path / "nan.jsonl"
    lines.write_text(
        '{"id": "a", "answer": "Infinity"}\n{"id": "b", "answer": ' + token + "}\n", encoding="utf-8"
    )
    with pytest.raises(
        QADataError, match=rf"nan\.jsonl: non-standard JSON on line 2 column 23: {re.escape(token)} "
    ):
        load_musique(str(lines))


def test_an_escaped_lone_surrogate_is_quarantined_and_stays_writable(tmp_path: Path) -> None:
    """`"\\ud800"` is valid JSON in a valid UTF-8 file but no string UTF-8 can write: the record is
    quarantined naming its field, and its quarantine entry keeps the escape as text."""
    text = WIKI.read_text(encoding="utf-8")
    data = json.loads(text)
    question = data[2]["question"]
    raw = text.replace(json.dumps(question)[1:-1], json.dumps(question)[1:-1] + "\\ud800", 1)
    path = tmp_path / "wiki.json"
    path.write_text(raw, encoding="utf-8")
    result = load_2wiki(str(path))
    assert len(result.records) == 9 and [q.index for q in result.quarantined] == [2]
    assert (
        "field 'question'" in result.quarantined[0].reasons[0]
        and "surrogate" in result.quarantined[0].reasons[0]
    )
    written = canonical_jsonl([result.quarantined[0].to_dict()]).encode("utf-8")
    assert b"\\ud800" in written


def test_an_impossible_synthetic_setting_raises_instead_of_looping() -> None:
    """18 paragraphs need 18 entities; a world of 18 (no extra ones) never has them all of usable
    types, and the generator must say so instead of drawing worlds for ever."""
    impossible = {"train": {"count": 1, "paragraphs": [18, 18], "extra_entities": 0}}
    with pytest.raises(ValueError, match=r"synthetic split 'train', record 0: no world of 18 \+ 0 entities"):
        generate_synthetic(3, impossible)
    with pytest.raises(
        ValueError, match=r"qa\.synthetic\.splits\.train\.extra_entities: expected an integer >= 0"
    ):
        generate_synthetic(3, {"train": {"count": 1, "extra_entities": -1}})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"count": 5, "hops": [3, 2]}, r"qa\.synthetic\.splits\.ood\.hops: the range \[3, 2\] is empty"),
        (
            {"count": 5, "paragraphs": [9, 4]},
            r"qa\.synthetic\.splits\.ood\.paragraphs: the range \[9, 4\] is empty",
        ),
        ({"count": 5, "filler_sentences": [-1, 0]}, r"splits\.ood\.filler_sentences: .* must not go below 0"),
        (
            {"count": 5, "filler_sentences": [1, 5]},
            r"splits\.ood\.filler_sentences: max 5 is above the 2 filler templates",
        ),
        ({"count": 5, "hops": [0, 0]}, r"splits\.ood\.hops: .* must not go below 1"),
        ({"count": 5, "hops": [1, 2, 3]}, r"splits\.ood\.hops: expected an integer or an inclusive range"),
        ({"count": -3}, r"qa\.synthetic\.splits\.ood\.count: expected an integer >= 1, got -3"),
        ({"hops": 2}, r"qa\.synthetic\.splits\.ood\.count: missing"),
        ({"count": 5, "hop": [3, 3]}, r"unknown synthetic QA setting qa\.synthetic\.splits\.ood\.hop "),
        (
            {"count": 5, "paragraphs": [2, 9], "hops": [2, 3]},
            r"splits\.ood\.paragraphs: min 2 is below the 3 paragraphs that the 3 hops "
            r"qa\.synthetic\.splits\.ood\.hops allows need",
        ),
    ],
)
def test_a_bad_synthetic_setting_is_a_value_error_naming_its_path(spec: dict, message: str) -> None:
    """Settings that used to fail inside `random` ("empty range for randrange()") or an unpacking,
    naming nothing, or only on an unlucky draw, now fail at once naming the setting."""
    with pytest.raises(ValueError, match=message):
        generate_synthetic(3, {"ood": spec})


def test_a_bad_inherited_synthetic_default_names_the_default_and_the_split() -> None:
    from selfcest.data.qa import split_config

    with pytest.raises(
        ValueError, match=r"^qa\.synthetic\.hops \(the default split 'train' inherits\): the range"
    ):
        split_config({"count": 5}, {"hops": [3, 2]}, name="train")


def test_an_s3_endpoint_from_the_environment_is_kept_beside_other_client_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SELFCEST_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    region = {"client_kwargs": {"region_name": "eu-west-1"}}
    assert storage_options_for("s3://b/k.json", region)["endpoint_url"] == "http://127.0.0.1:9000"
    own = {"client_kwargs": {"endpoint_url": "http://other:9000"}}
    assert "endpoint_url" not in storage_options_for("s3://b/k.json", own)


def test_an_unreachable_s3_endpoint_is_a_file_error(port: int) -> None:
    opts = {"key": "k", "secret": "s", "endpoint_url": f"http://127.0.0.1:{port}"}
    opts["config_kwargs"] = {"retries": {"max_attempts": 1}, "connect_timeout": 2}
    with pytest.raises(QADataError, match=r"s3://qa-bucket/dev\.json: cannot read: \w+"):
        load_2wiki("s3://qa-bucket/dev.json", storage_options=opts)


# ---------------------------------------------------------------------------------------- s3


def test_load_from_s3_through_moto_server(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=s3_endpoint)
    fs.mkdir("qa-bucket")
    fs.pipe("qa-bucket/2wiki/dev.json", WIKI.read_bytes())
    fs.pipe("qa-bucket/musique/dev.json", MUSIQUE_SUB.read_bytes())
    opts = {"key": "testing", "secret": "testing", "endpoint_url": s3_endpoint}
    wiki = load_2wiki("s3://qa-bucket/2wiki/dev.json", storage_options=opts)
    assert len(wiki.records) == 10 and not wiki.quarantined
    # The endpoint may also come from the environment.
    monkeypatch.setenv("SELFCEST_S3_ENDPOINT_URL", s3_endpoint)
    mus = load_musique(
        "s3://qa-bucket/musique/dev.json", storage_options={"key": "testing", "secret": "testing"}
    )
    assert len(mus.records) == 3
    with pytest.raises(QADataError, match="s3://qa-bucket/missing.json: file not found"):
        load_2wiki("s3://qa-bucket/missing.json", storage_options=opts)


# ---------------------------------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic() -> None:
    a = generate_synthetic(7, SMALL)
    b = generate_synthetic(7, SMALL)
    c = generate_synthetic(8, SMALL)
    for split in SMALL:
        assert records_sha256(a[split]) == records_sha256(b[split])
        assert records_sha256(a[split]) != records_sha256(c[split])
    # One split's count does not change another split's bytes.
    d = generate_synthetic(7, {**SMALL, "ood": {**SMALL["ood"], "count": 5}})
    assert records_sha256(d["train"]) == records_sha256(a["train"])


def test_synthetic_records_are_answerable_from_hop_paragraphs() -> None:
    splits = generate_synthetic(3, SMALL)
    ids: set[str] = set()
    for split, records in splits.items():
        for rec in records:
            assert rec["id"] not in ids and rec["split"] == split and rec["source"] == "synthetic"
            ids.add(rec["id"])
            _check_keys(rec)
            by_key = {p["key"]: p for p in rec["paragraphs"]}
            assert {p["key"] for p in rec["paragraphs"] if p["supporting"]} == {
                h["paragraph_key"] for h in rec["hops"]
            }
            assert len(rec["hops"]) == rec["num_hops"]
            prev = None
            for hop in rec["hops"]:
                para = by_key[hop["paragraph_key"]]
                # The hop's paragraph is about the hop's subject and states the answer in a sentence
                # naming that subject; the chain passes each answer on to the next hop.
                assert para["title"] in hop["question"]
                sentences = [s for s in para["text"].split(". ") if para["title"] in s]
                assert any(re.search(rf"\b{re.escape(hop['answer'])}\b", s) for s in sentences)
                if prev is not None:
                    assert para["title"] == prev
                prev = hop["answer"]
            assert prev == rec["answers"][0]
            assert not re.search(rf"\b{rec['answers'][0]}\b", rec["question"])
            # Names come from the closed two-syllable set (one token each for the tiny tokenizer).
            assert all(
                p["title"] in NAMES and re.fullmatch(r"[A-Z][a-z]{3}", p["title"]) for p in rec["paragraphs"]
            )


def test_ood_has_more_hops_and_paragraphs() -> None:
    splits = generate_synthetic(5, SMALL)
    train, ood = splits["train"], splits["ood"]
    assert min(r["num_hops"] for r in ood) > max(r["num_hops"] for r in train)
    assert min(len(r["paragraphs"]) for r in ood) > max(len(r["paragraphs"]) for r in train)
    assert all(10 <= len(r["paragraphs"]) <= 16 for r in train)
    # Full context is long (a tiny model's 512-token window), one paragraph is short.
    ctx = [sum(len(p["text"]) for p in r["paragraphs"]) for r in train]
    assert min(ctx) > 600 and max(len(p["text"]) for r in train for p in r["paragraphs"]) < 300
    pairs = {(r["question"], r["answers"][0]) for r in train}
    assert not pairs & {(r["question"], r["answers"][0]) for r in splits["test"]}


def _chain_record(texts: list[str]) -> dict:
    return {
        "source": "synthetic",
        "type": "chain:led_by>works_for",
        "question": "Which company does the head of Vite work for?",
        "answers": ["Riri"],
        "paragraphs": [{"key": t.split()[0], "title": t.split()[0], "text": t} for t in texts],
    }


def test_type_guess_accuracy_guesses_the_most_mentioned_entity_of_the_answer_type() -> None:
    texts = [
        "Vite was founded by Teda. Vite is led by Mika. Vite is based in Kara.",
        "Mika works for Riri. Mika lives in Kara.",
        "Teda works for Lolo.",
    ]
    # Companies named: Vite (in the question, left out), Riri and Lolo once each: a tie of two.
    assert type_guess_accuracy([_chain_record(texts)]) == 0.5
    # Lolo's own paragraph names it twice more: the guess is Lolo, wrong. Cities (Kara, named twice)
    # are not the answer's type and never the guess.
    wrong = _chain_record([*texts, "Lolo makes bread. Lolo has ten workers."])
    assert type_guess_accuracy([wrong]) == 0.0
    assert type_guess_accuracy([_chain_record(texts), wrong]) == 0.25
    # Real records have no chain type: no floor to report.
    assert type_guess_accuracy([{**wrong, "source": "musique", "type": "2hop"}]) is None


def test_bigger_worlds_lower_the_type_guess_floor() -> None:
    spec = {"count": 80, "paragraphs": [8, 10], "hops": [2, 2]}
    small = generate_synthetic(11, {"test": {**spec, "extra_entities": 4}})["test"]
    big = generate_synthetic(11, {"test": {**spec, "extra_entities": 40}})["test"]
    assert all(8 <= len(r["paragraphs"]) <= 10 for r in small + big)
    guess_small, guess_big = type_guess_accuracy(small), type_guess_accuracy(big)
    assert guess_small is not None and guess_big is not None
    assert guess_big < guess_small - 0.1  # measured on seed 42's 300 test records: 51.8% -> 24.8%

    def named(record: dict) -> int:
        return len({w for p in record["paragraphs"] for w in re.findall(r"[A-Z][a-z]+", p["text"])})

    assert sum(map(named, big)) > sum(map(named, small))


def test_synthetic_is_json_round_trippable() -> None:
    rec = generate_synthetic(1, {"train": {"count": 1}})["train"][0]
    assert json.loads(json.dumps(rec)) == copy.deepcopy(rec)


def test_2wiki_duplicate_titles_resolve_to_the_copy_with_the_fact() -> None:
    """A distractor that shares a supporting paragraph's title must not be marked supporting or be
    a hop's paragraph; a sentence index out of range (or not an int) quarantines the record."""
    import copy

    from selfcest.data.qa import _RecordError, adapt_2wiki

    wiki = BENCH / "2wikimultihopqa" / "2wikimultihopqa_dev_hipporag_first10.json"
    record = json.loads(wiki.read_text())[0]  # supporting: ['Lothair II', 1], hop 1 about Lothair II
    with_twin = copy.deepcopy(record)
    with_twin["context"].insert(0, ["Lothair II", ["A one-sentence distractor."]])
    adapted = adapt_2wiki(with_twin)
    twins = [p for p in adapted["paragraphs"] if p["title"] == "Lothair II"]
    assert [p["supporting"] for p in twins] == [False, True]
    assert adapted["hops"][0]["paragraph_key"] == twins[1]["key"]
    for bad in (99, "1", True):
        broken = copy.deepcopy(record)
        broken["supporting_facts"][0][1] = bad
        with pytest.raises(_RecordError, match=r"supporting_facts\[0\]"):
            adapt_2wiki(broken)
    # A distractor twin long enough to hold the supporting sentence index too: the fact goes to the
    # copy the hop chose (the one stating its answer), not to the first copy, which would leave the
    # hop's paragraph unsupported and get a sound record quarantined.
    long_twin = copy.deepcopy(record)
    sentence = record["supporting_facts"][0][1]
    long_twin["context"].insert(0, ["Lothair II", ["A distractor sentence."] * (sentence + 1)])
    adapted = adapt_2wiki(long_twin)
    twins = [p for p in adapted["paragraphs"] if p["title"] == "Lothair II"]
    assert [p["supporting"] for p in twins] == [False, True]
    assert adapted["hops"][0]["paragraph_key"] == twins[1]["key"]
    supporting = {p["key"] for p in adapted["paragraphs"] if p["supporting"]}
    assert {hop["paragraph_key"] for hop in adapted["hops"]} <= supporting


def test_json_lines_with_raw_line_separators_in_strings_read_whole(tmp_path: Path) -> None:
    """U+2028, U+0085 and form feeds may stand raw in a JSON string (and `canonical_jsonl` writes
    them raw); str.splitlines() would split the record there and fail a valid file."""
    from selfcest.data.qa import read_json_records

    records = [{"id": "a", "text": "one\u2028two\x85three\x0cfour"}, {"id": "b", "text": "plain"}]
    path = tmp_path / "records.jsonl"
    path.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n", encoding="utf-8")
    assert read_json_records(path) == records


def test_readers_of_real_records_see_titles_their_keys_do_not_spell() -> None:
    from selfcest.evaluation import problem_from_record
    from selfcest.tasks import task_from_record
    from selfcest.teachers import TeacherConfig, qa_conversations

    record = next(
        r
        for r in load_2wiki(str(WIKI)).records
        if r["hops"]
        and (hop := {p["key"]: p for p in r["paragraphs"]}[r["hops"][0]["paragraph_key"]])["title"]
        != hop["key"]
    )
    paragraph = {p["key"]: p for p in record["paragraphs"]}[record["hops"][0]["paragraph_key"]]
    expected = f"{paragraph['title']}\n{paragraph['text']}"
    assert record_documents(record)[paragraph["key"]] == expected
    # Every path to a reader: the runtime's task, the evaluator's problem, the warm-up's clone turns.
    assert task_from_record(record, "delegate").documents[paragraph["key"]] == expected
    assert problem_from_record("qa", record).documents[paragraph["key"]] == expected
    config = TeacherConfig(qa_failed_clone_fraction=0.0)
    conversations = qa_conversations(record, random.Random(0), config)
    texts = [m["content"] for c in conversations for m in c["messages"] if isinstance(m.get("content"), str)]
    assert any(expected in text for text in texts)
    # Synthetic titles are their keys: their documents stay the bare text.
    synthetic = generate_synthetic(3, SMALL)["test"][0]
    assert record_documents(synthetic) == {p["key"]: p["text"] for p in synthetic["paragraphs"]}
