"""Long-context multi-hop QA: one unified record schema, adapters for the official 2WikiMultiHopQA
and MuSiQue formats, and a seeded synthetic multi-hop generator for the tiny CPU profile.

The root agent only ever sees the question and the paragraph *keys*; clones get sub-questions
plus the keys of the paragraphs they should read (the runtime expands keys to text). So every
record carries short keys that are unique within the record, and, where the source gives them,
the hops (sub-question, answer, key of the paragraph that answers it).

Error policy: a file that cannot be read or parsed (missing, not UTF-8, truncated JSON, or numbers
standard JSON does not have: NaN, Infinity) raises `QADataError` naming the file (and the
byte/line/column); a record that cannot be adapted is returned as a `Quarantined` item with the
file, record index, id, field and reason -- it is never dropped silently.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

import fsspec

from selfcest.param_checks import int_setting, is_int_setting

# ---------------------------------------------------------------------------------------- schema


class Paragraph(TypedDict):
    key: str  # short, unique within the record: slug of the title (+ "-2", "-3" if titles repeat)
    title: str
    text: str
    supporting: bool  # True when the paragraph is needed to answer the question


class Hop(TypedDict):
    question: str  # MuSiQue keeps its "#1"-style back-references verbatim
    answer: str
    paragraph_key: str  # key of the paragraph that answers this hop


class QARecord(TypedDict):
    """Unified long-context multi-hop QA record (all sources, all splits)."""

    id: str
    question: str
    answers: list[str]  # gold first, then aliases (deduplicated, order kept)
    paragraphs: list[Paragraph]
    hops: list[Hop]  # empty when the source gives no decomposition
    source: str  # "synthetic", "2wikimultihopqa", "musique", ...
    split: str
    num_hops: int
    type: str  # question type when known (2Wiki "compositional", MuSiQue "3hop1", ...), else ""


#: Field name -> expected Python type(s); the validation schema check uses the same table.
RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "question": str,
    "answers": list,
    "paragraphs": list,
    "hops": list,
    "source": str,
    "split": str,
    "num_hops": int,
    "type": str,
}
PARAGRAPH_FIELDS: dict[str, type] = {"key": str, "title": str, "text": str, "supporting": bool}
HOP_FIELDS: dict[str, type] = {"question": str, "answer": str, "paragraph_key": str}


class QADataError(ValueError):
    """A file-level problem (unreadable, not UTF-8, not JSON, wrong top-level shape)."""

    def __init__(self, file: str, message: str, *, index: int | None = None, record_id: str | None = None):
        where = file
        if index is not None:
            where += f", record #{index}"
        if record_id:
            where += f" (id {record_id!r})"
        super().__init__(f"{where}: {message}")
        self.file = file
        self.index = index
        self.record_id = record_id


#: Quarantine stages of records kept out by design, not because they are broken: MuSiQue's
#: unanswerable contrast questions and evaluation records that repeat a training record. They are
#: quarantined with their reason and counted in the report, but neither count towards
#: `validation.max_invalid_fraction` nor enter its denominator: a file of sound records stays valid.
UNANSWERABLE = "unanswerable"
OVERLAPS_TRAIN = "overlaps_train"
EXCLUDED_STAGES: frozenset[str] = frozenset({UNANSWERABLE, OVERLAPS_TRAIN})


@dataclass
class Quarantined:
    """A record kept out of the data set, with why. `stage` is adapter, schema or expectations
    (the record is invalid), or one of EXCLUDED_STAGES (it is sound but kept out by design)."""

    source: str
    file: str
    index: int | None
    record_id: str | None
    reasons: list[str]
    stage: str = "adapter"
    split: str = ""
    record: Any = None  # the raw (adapter) or unified (validation) record, for inspection

    @property
    def invalid(self) -> bool:
        """True when the record is broken (counts towards max_invalid_fraction)."""
        return self.stage not in EXCLUDED_STAGES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadResult:
    records: list[QARecord] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    file: str = ""
    positions: list[int] = field(default_factory=list)
    """Each kept record's index in its file (quarantined ones leave gaps), for error messages."""


class _RecordError(Exception):
    """Raised inside an adapter for one record; turned into a Quarantined item."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"field {field_name!r}: {message}")
        self.field = field_name


class _RecordExcluded(Exception):
    """Raised inside an adapter for a sound record that is kept out by design (`stage` is one of
    EXCLUDED_STAGES); turned into a Quarantined item that does not count as invalid."""

    def __init__(self, stage: str, message: str):
        super().__init__(f"{stage}: {message}")
        self.stage = stage


# ---------------------------------------------------------------------------------------- keys

_SLUG_MAX = 32

# Latin letters that NFKD does not split into an ASCII letter and an accent, so the ASCII fold
# dropped them ("Øresund" became `resund`). Each is spelt as its usual ASCII transliteration; an
# uppercase letter that becomes two is written title-case before a lowercase letter ("Æthelred" ->
# `Aethelred`) and all caps otherwise ("ÆSIR" -> `AESIR`).
_TRANSLITERATE: dict[str, str] = {
    "Æ": "AE", "æ": "ae", "Œ": "OE", "œ": "oe", "Ø": "O", "ø": "o", "ß": "ss", "ẞ": "SS",
    "Ł": "L", "ł": "l", "Đ": "D", "đ": "d", "Ð": "D", "ð": "d", "Þ": "TH", "þ": "th",
    "ı": "i", "Ħ": "H", "ħ": "h", "Ŧ": "T", "ŧ": "t", "Ŋ": "NG", "ŋ": "ng", "ƒ": "f",
    "Ɓ": "B", "ɓ": "b", "Ɗ": "D", "ɗ": "d", "Ƙ": "K", "ƙ": "k", "Ƴ": "Y", "ƴ": "y",
}  # fmt: skip


def _fold(title: str) -> str:
    """`title` with Latin letters folded to ASCII and every other letter or digit kept.

    After NFKD an accented Latin letter is its ASCII base and a combining accent: the accent is
    dropped, as the ASCII fold always did, so keys of such titles are unchanged. A letter or digit of
    another script (CJK, Cyrillic, Greek, Arabic, ...) is kept with its marks (a Devanagari vowel
    sign is part of the word); it used to be dropped, which turned an all-CJK context into `p`,
    `p-2`, ... and left the root nothing to tell its paragraphs apart by. Keys need not be ASCII:
    the root copies them from the prompt into a JSON tool call, the protocol matches them exactly,
    and the tokenizer is byte-level. Other non-ASCII characters (dashes, curly quotes, symbols)
    are dropped, as before."""
    out: list[str] = []
    kept_base = False  # whether the last base character was a kept non-ASCII letter or digit
    chars = unicodedata.normalize("NFKD", title)
    for i, ch in enumerate(chars):
        if ch.isascii():
            out.append(ch)
            kept_base = False
        elif unicodedata.category(ch).startswith("M"):
            if kept_base:  # a mark of a kept letter; an ASCII letter's accent is folded away
                out.append(ch)
        elif ch in _TRANSLITERATE:
            latin = _TRANSLITERATE[ch]
            if len(latin) > 1 and latin.isupper() and chars[i + 1 : i + 2].islower():
                latin = latin.capitalize()
            out.append(latin)
            kept_base = False
        elif ch.isalnum() and not "\u02b0" <= ch <= "\u02ff":
            # U+02B0-U+02FF are modifier letters that Latin text uses as apostrophes and length
            # marks ("Hawaiʻi"): isalnum() accepts them, but they were never part of a key.
            out.append(ch)
            kept_base = True
        else:
            kept_base = False
    # NFC so that a kept letter and its marks are one character again where Unicode has one.
    return unicodedata.normalize("NFC", "".join(out))


def slugify(title: str, max_len: int = _SLUG_MAX) -> str:
    """Slug of a title, case kept; Latin accents folded so keys stay cheap for small tokenizers,
    letters of other scripts kept (`_fold`).

    Case is kept so that a one-word title is its own key (the paper's root sees paragraph titles):
    the root then copies a name from the question into `context` as it is written.
    """
    # Every character left by `_fold` that is not an ASCII letter or digit is a kept letter, digit
    # or mark of another script, so only runs of ASCII non-alphanumerics become separators.
    slug = re.sub(r"[\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+", "-", _fold(title)).strip("-")
    if len(slug) > max_len:
        # Cut at a word boundary when one is close, so keys stay readable.
        cut = slug[:max_len]
        slug = cut.rsplit("-", 1)[0] if "-" in cut[max_len // 2 :] else cut
    return slug.strip("-") or "p"


def make_keys(titles: Sequence[str]) -> list[str]:
    """Stable keys, unique within one record: repeated slugs get -2, -3, ... in order."""
    used: set[str] = set()
    keys = []
    for title in titles:
        base = slugify(title)
        key, n = base, 1
        # Keys differing only in case would confuse readers (casefold() is lower() on ASCII keys).
        while key.casefold() in used:
            n += 1
            key = f"{base}-{n}"
        used.add(key.casefold())
        keys.append(key)
    return keys


def paragraph_document(paragraph: Mapping[str, Any]) -> str:
    """What a reader handed this paragraph's key sees: its text, headed by its title when the key does
    not spell the title. Slug keys drop punctuation and accents ("Theodred II (Bishop of Elmham)" is
    `Theodred-II-Bishop-of-Elmham`), and 2Wiki's hops name titles, so a clone should read the title
    itself. Synthetic titles are their keys, so synthetic documents are the bare text."""
    title = str(paragraph.get("title") or "").strip()
    text = str(paragraph["text"])
    return f"{title}\n{text}" if title and title != paragraph["key"] else text


def record_documents(record: Mapping[str, Any]) -> dict[str, str]:
    """{key: document} of a unified QA record, in context order: the runtime's `Task.documents`."""
    return {p["key"]: paragraph_document(p) for p in record["paragraphs"]}


# ---------------------------------------------------------------------------------------- reading


def storage_options_for(path: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """fsspec options for `path`: explicit ones win; for s3:// an endpoint may come from the env
    (SELFCEST_S3_ENDPOINT_URL) so that a MinIO/moto endpoint needs no code change."""
    opts = dict(options or {})
    given = "endpoint_url" in opts or "endpoint_url" in (opts.get("client_kwargs") or {})
    if path.startswith("s3://") and not given:
        endpoint = os.environ.get("SELFCEST_S3_ENDPOINT_URL")
        if endpoint:
            opts["endpoint_url"] = endpoint
    return opts


def read_bytes(path: str, storage_options: Mapping[str, Any] | None = None) -> bytes:
    path = str(path)
    try:
        with fsspec.open(path, "rb", **storage_options_for(path, storage_options)) as fh:
            return fh.read()
    except FileNotFoundError as exc:
        raise QADataError(path, "file not found") from exc
    except OSError as exc:
        raise QADataError(path, f"cannot read: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 (s3fs/botocore: no credentials, endpoint down, ...)
        raise QADataError(path, f"cannot read: {type(exc).__name__}: {exc}") from exc


class NonStandardJSONError(ValueError):
    """A number that standard JSON (RFC 8259) does not have: `NaN`, `Infinity`, `-Infinity`, or a
    numeral too large for a float. Python's `json` reads them as float nan/inf, and `str()` of that
    became a gold answer "nan" or "inf" (a math record's numeric `answer`). Like invalid JSON, the
    file is broken, not one record: `read_json_records` raises QADataError naming file and line."""

    def __init__(self, token: str, reason: str):
        super().__init__(f"{token} {reason}")
        self.token = token

    def position(self, text: str) -> tuple[int, int] | None:
        """(line, column) of the token in `text`, 1-based as JSONDecodeError's, or None. The parser
        does not tell where it stopped; it is the first place outside a JSON string where the token
        stands as a whole value (everything before it parsed, so no earlier one is there)."""
        pattern = re.compile(rf'"(?:[^"\\]|\\.)*"|(?<![\w.+-]){re.escape(self.token)}(?![\w.])')
        for match in pattern.finditer(text):
            if not match.group().startswith('"'):
                start = match.start()
                return text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)
        return None


def _reject_constant(name: str) -> Any:
    raise NonStandardJSONError(name, "is not a JSON value (NaN and Infinity are not standard JSON)")


def _finite_float(numeral: str) -> float:
    value = float(numeral)
    if not math.isfinite(value):
        raise NonStandardJSONError(numeral, "is too large for a float (it would read as inf)")
    return value


def strict_json_loads(text: str) -> Any:
    """`json.loads` of standard JSON only: NaN, Infinity and numerals that overflow a float raise
    NonStandardJSONError instead of reading as float nan/inf."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)


def read_json_records(path: str, storage_options: Mapping[str, Any] | None = None) -> list[Any]:
    """A JSON list (2Wiki, KAG files) or JSON lines (official MuSiQue). Raises QADataError."""
    raw = read_bytes(path, storage_options)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise QADataError(
            str(path), f"not valid UTF-8 at byte {exc.start} ({raw[exc.start : exc.start + 4]!r})"
        ) from exc
    text = text.lstrip("\ufeff")
    stripped = text.lstrip()
    if not stripped:
        raise QADataError(str(path), "empty file")
    if stripped[0] == "[":
        try:
            data = strict_json_loads(text)
        except json.JSONDecodeError as exc:
            raise QADataError(
                str(path), f"invalid JSON (truncated?) at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from exc
        except NonStandardJSONError as exc:
            pos = exc.position(text)
            at = f" at line {pos[0]} column {pos[1]}" if pos else ""
            raise QADataError(str(path), f"non-standard JSON{at}: {exc}") from exc
        except (ValueError, RecursionError) as exc:  # an integer over Python's digit limit, deep nesting
            raise QADataError(str(path), f"unreadable JSON: {type(exc).__name__}: {exc}") from exc
        return data
    # JSON lines: a broken line is a file error too, because a truncated line usually means a
    # truncated download and silently keeping the rest would hide it.
    records = []
    # Lines end at "\n" only: str.splitlines() also splits at U+2028, U+0085 and other characters
    # that JSON strings may hold raw (and that `canonical_jsonl` writes raw), halving a valid record.
    for lineno, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            records.append(strict_json_loads(line))
        except NonStandardJSONError as exc:
            pos = exc.position(line)
            at = f" column {pos[1]}" if pos else ""
            raise QADataError(str(path), f"non-standard JSON on line {lineno}{at}: {exc}") from exc
        except json.JSONDecodeError as exc:
            if not records and _is_json_object(text):
                # A pretty-printed object (`{"data": [...]}`) failed on its first line as if cut.
                raise QADataError(str(path), "a JSON object: expected a JSON list or JSON lines") from exc
            raise QADataError(
                str(path), f"invalid JSON on line {lineno} column {exc.colno} (truncated?): {exc.msg}"
            ) from exc
        except (ValueError, RecursionError) as exc:  # an integer over Python's digit limit, deep nesting
            raise QADataError(
                str(path), f"unreadable JSON on line {lineno}: {type(exc).__name__}: {exc}"
            ) from exc
    return records


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def lone_surrogate_field(value: Any, where: str = "<record>", depth: int = 0) -> str | None:
    """The first field of a parsed JSON value holding a lone UTF-16 surrogate, or None.

    A valid UTF-8 file can spell one as an escape (`"\\ud800"`) and `json.loads` accepts it, but such
    a string cannot be written as UTF-8 again: the record has to be quarantined where it is read,
    before it reaches a writer or pyarrow. Bounded by the JSON's own nesting (the parser's limit)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if depth > 1000:
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and lone_surrogate_field(key, where, depth + 1):
            return where
        found = lone_surrogate_field(item, key if where == "<record>" else f"{where}.{key}", depth + 1)
        if found:
            return found
    return None


def writable(value: Any) -> Any:
    """`value` with every lone surrogate written as its escape text (`\\ud800`), so a quarantined
    record keeps what it held and can still be written as UTF-8."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {writable(k): writable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [writable(v) for v in value]
    return value


def _get(rec: Mapping[str, Any], name: str, typ: type | tuple[type, ...], *, optional: bool = False) -> Any:
    if name not in rec or rec[name] is None:
        if optional:
            return None
        raise _RecordError(name, "missing")
    value = rec[name]
    # bool is an int subclass; an int field must not accept True/False.
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        names = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise _RecordError(name, f"expected {names}, got {type(value).__name__}")
    return value


def _answers(gold: str, aliases: Iterable[str]) -> list[str]:
    out: list[str] = []
    for a in [gold, *aliases]:
        if a not in out and (a.strip() or not out):  # keep the gold even if empty: validation flags it
            out.append(a)
    return out


def _adapt_file(
    path: str,
    adapt: Callable[[Any], QARecord],
    source: str,
    storage_options: Mapping[str, Any] | None,
) -> LoadResult:
    path = str(path)
    data = read_json_records(path, storage_options)
    if not isinstance(data, list):
        raise QADataError(path, f"expected a JSON list of records, got {type(data).__name__}")
    result = LoadResult(file=path)
    for index, raw in enumerate(data):
        rid = None
        if isinstance(raw, dict):
            rid_raw = raw.get("_id", raw.get("id"))
            rid = str(rid_raw) if rid_raw is not None else None
        try:
            if not isinstance(raw, dict):
                raise _RecordError("<record>", f"expected an object, got {type(raw).__name__}")
            bad = lone_surrogate_field(raw)
            if bad:
                raise _RecordError(bad, "holds an escaped lone surrogate (not valid Unicode)")
            result.records.append(adapt(raw))
            result.positions.append(index)
        except _RecordError as exc:
            rid = writable(rid)
            result.quarantined.append(Quarantined(source, path, index, rid, [str(exc)], record=writable(raw)))
        except _RecordExcluded as exc:
            result.quarantined.append(
                Quarantined(
                    source, path, index, writable(rid), [str(exc)], stage=exc.stage, record=writable(raw)
                )
            )
    return result


# ---------------------------------------------------------------------------------------- 2Wiki


def adapt_2wiki(rec: Mapping[str, Any], *, split: str = "dev", source: str = "2wikimultihopqa") -> QARecord:
    """One official 2WikiMultiHopQA record -> QARecord (raises _RecordError)."""
    rid = _get(rec, "_id", str) if "_id" in rec else _get(rec, "id", str)
    question = _get(rec, "question", str)
    answer = _get(rec, "answer", str)
    context = _get(rec, "context", list)
    titles, texts, sentence_counts = [], [], []
    for i, item in enumerate(context):
        if (
            not isinstance(item, list | tuple)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not isinstance(item[1], list)
            or not all(isinstance(s, str) for s in item[1])
        ):
            raise _RecordError(f"context[{i}]", "expected [title, [sentences...]]")
        titles.append(item[0])
        sentence_counts.append(len(item[1]))
        # Official sentences carry no separators (HotpotQA's do); strip + single space suits both.
        texts.append(" ".join(s.strip() for s in item[1] if s.strip()))
    keys = make_keys(titles)
    # A title can stand on two paragraphs (a distractor with the same title): a hop resolves to the
    # copy that states its answer, and a fact to a copy holding its sentence that a hop chose, else
    # the first such copy (the first copy for both could mark a distractor supporting and quarantine
    # a sound record: its hop's paragraph would not be supporting).
    fact_copies: list[list[int]] = []  # per supporting fact, the paragraphs that hold its sentence
    for i, fact in enumerate(_get(rec, "supporting_facts", list)):
        if (
            not isinstance(fact, list | tuple)
            or len(fact) != 2
            or not isinstance(fact[0], str)
            or not isinstance(fact[1], int)
            or isinstance(fact[1], bool)
        ):
            raise _RecordError(f"supporting_facts[{i}]", "expected [title, sentence_index]")
        title, sentence = fact
        title = supporting_title(title, titles, f"supporting_facts[{i}]")  # the context's own spelling
        holding = [p for p, t in enumerate(titles) if t == title and 0 <= sentence < sentence_counts[p]]
        if not holding:
            raise _RecordError(
                f"supporting_facts[{i}]",
                f"sentence {sentence} is out of range for every paragraph titled {title!r}",
            )
        fact_copies.append(holding)
    may_support = {keys[p] for holding in fact_copies for p in holding}

    # Evidences are (subject, relation, object) triples, one per hop; the subject's paragraph
    # answers the hop. 2Wiki sometimes changes the case of titles, hence the lower-case fallback.
    hops: list[Hop] = []
    for i, ev in enumerate(_get(rec, "evidences", list, optional=True) or []):
        if not isinstance(ev, list | tuple) or len(ev) != 3 or not all(isinstance(x, str) for x in ev):
            raise _RecordError(f"evidences[{i}]", "expected [subject, relation, object]")
        subj, rel, obj = ev
        candidates = titles_matching(subj, titles)
        if not candidates:
            raise _RecordError(f"evidences[{i}]", f"subject {subj!r} is not a context title")
        # Prefer the copy that states the answer, then one a supporting fact may point at, then the first.
        position = min(
            candidates,
            key=lambda p: (obj.lower() not in texts[p].lower(), keys[p] not in may_support, p),
        )
        hops.append(
            {"question": f"What is the {rel} of {subj}?", "answer": obj, "paragraph_key": keys[position]}
        )

    hop_keys = {hop["paragraph_key"] for hop in hops}
    supporting = {
        next((keys[p] for p in holding if keys[p] in hop_keys), keys[holding[0]]) for holding in fact_copies
    }
    paragraphs: list[Paragraph] = [
        {"key": k, "title": t, "text": x, "supporting": k in supporting}
        for k, t, x in zip(keys, titles, texts, strict=True)
    ]
    qtype = _get(rec, "type", str, optional=True) or ""
    return {
        "id": rid,
        "question": question,
        "answers": _answers(answer, []),
        "paragraphs": paragraphs,
        "hops": hops,
        "source": source,
        "split": split,
        "num_hops": len(hops) if hops else len(supporting),
        "type": qtype,
    }


def supporting_title(title: str, titles: Sequence[str], field_name: str) -> str:
    """The context title that a supporting fact's `title` names (raises _RecordError).

    An exact match is taken as it is. Otherwise the one context title equal to it up to case, as
    written in the context: 2Wiki changes the case of titles (see `titles_matching` for evidences),
    and quarantining such a record as "unknown title" would drop a sound one. Two context titles
    that differ only in case (`Foo`, `FOO`) make a case-insensitive match ambiguous: that record is
    quarantined rather than pinned to a guessed paragraph."""
    if title in titles:
        return title
    folded = list(dict.fromkeys(t for t in titles if t.lower() == title.lower()))  # distinct, in order
    if len(folded) == 1:
        return folded[0]
    if folded:
        raise _RecordError(
            field_name,
            f"supporting title {title!r} matches several context titles up to case "
            f"({', '.join(map(repr, folded))}) and none exactly: ambiguous",
        )
    raise _RecordError(field_name, f"unknown supporting title {title!r} (not in context)")


def titles_matching(subject: str, titles: list[str]) -> list[int]:
    """Positions of the paragraphs titled `subject`; case-insensitively when none matches exactly."""
    exact = [p for p, title in enumerate(titles) if title == subject]
    return exact or [p for p, title in enumerate(titles) if title.lower() == subject.lower()]


def load_2wiki(
    path_or_url: str,
    *,
    split: str = "dev",
    source: str = "2wikimultihopqa",
    storage_options: Mapping[str, Any] | None = None,
) -> LoadResult:
    """Load an official 2WikiMultiHopQA file (JSON list; local path or s3:// URL)."""
    return _adapt_file(
        str(path_or_url), lambda r: adapt_2wiki(r, split=split, source=source), source, storage_options
    )


# ---------------------------------------------------------------------------------------- MuSiQue


def adapt_musique(rec: Mapping[str, Any], *, split: str = "dev", source: str = "musique") -> QARecord:
    """One official MuSiQue record -> QARecord (raises _RecordError)."""
    rid = _get(rec, "id", str)
    question = _get(rec, "question", str)
    answer = _get(rec, "answer", str)
    aliases = _get(rec, "answer_aliases", list, optional=True) or []
    if not all(isinstance(a, str) for a in aliases):
        raise _RecordError("answer_aliases", "expected a list of strings")
    # Read (and type-checked) here, acted on once the whole record has adapted: see the end.
    answerable = _get(rec, "answerable", bool, optional=True)
    paras = _get(rec, "paragraphs", list)
    titles, texts, idxs, flags = [], [], [], []
    for i, p in enumerate(paras):
        if not isinstance(p, dict):
            raise _RecordError(f"paragraphs[{i}]", f"expected an object, got {type(p).__name__}")
        for name, typ in (("title", str), ("paragraph_text", str), ("is_supporting", bool)):
            try:
                _get(p, name, typ)
            except _RecordError as exc:
                raise _RecordError(f"paragraphs[{i}].{exc.field}", str(exc).split(": ", 1)[1]) from None
        idx = p.get("idx", i)
        if not isinstance(idx, int) or isinstance(idx, bool):
            raise _RecordError(f"paragraphs[{i}].idx", f"expected int, got {type(idx).__name__}")
        titles.append(p["title"])
        texts.append(p["paragraph_text"].strip())
        idxs.append(idx)
        flags.append(p["is_supporting"])
    if len(set(idxs)) != len(idxs):
        raise _RecordError("paragraphs", "duplicate paragraph idx")
    keys = make_keys(titles)
    key_of_idx = dict(zip(idxs, keys, strict=True))

    hops: list[Hop] = []
    for i, step in enumerate(_get(rec, "question_decomposition", list)):
        if not isinstance(step, dict):
            raise _RecordError(f"question_decomposition[{i}]", "expected an object")
        try:
            q = _get(step, "question", str)
            a = _get(step, "answer", str)
            support = _get(step, "paragraph_support_idx", int)
        except _RecordError as exc:
            raise _RecordError(
                f"question_decomposition[{i}].{exc.field}", str(exc).split(": ", 1)[1]
            ) from None
        if support not in key_of_idx:
            raise _RecordError(
                f"question_decomposition[{i}].paragraph_support_idx",
                f"unknown supporting paragraph idx {support}",
            )
        hops.append({"question": q, "answer": a, "paragraph_key": key_of_idx[support]})

    # MuSiQue-Full mixes in unanswerable contrast questions by design; their `answer` is not
    # supported by the context, so training or scoring on them would reward hallucination. They are
    # kept out as `unanswerable`, not as invalid, and only once the rest of the record adapted, so
    # that a broken record marked unanswerable is still reported (and counted) as broken.
    if answerable is False:
        raise _RecordExcluded(
            UNANSWERABLE,
            "field 'answerable' is false (a MuSiQue-Full contrast question: its answer is not "
            "supported by its paragraphs)",
        )
    m = re.match(r"^(\dhop\d*)__", rid)
    paragraphs: list[Paragraph] = [
        {"key": k, "title": t, "text": x, "supporting": f}
        for k, t, x, f in zip(keys, titles, texts, flags, strict=True)
    ]
    return {
        "id": rid,
        "question": question,
        "answers": _answers(answer, aliases),
        "paragraphs": paragraphs,
        "hops": hops,
        "source": source,
        "split": split,
        "num_hops": len(hops) if hops else sum(flags),
        "type": m.group(1) if m else "",
    }


def load_musique(
    path_or_url: str,
    *,
    split: str = "dev",
    source: str = "musique",
    storage_options: Mapping[str, Any] | None = None,
) -> LoadResult:
    """Load a MuSiQue file (official JSONL or the KAG JSON list; local path or s3:// URL)."""
    return _adapt_file(
        str(path_or_url), lambda r: adapt_musique(r, split=split, source=source), source, storage_options
    )


LOADERS: dict[str, Callable[..., LoadResult]] = {"2wiki": load_2wiki, "musique": load_musique}


def load_source(
    fmt: str, path_or_url: str, *, split: str, source: str, storage_options: Mapping[str, Any] | None = None
) -> LoadResult:
    if fmt not in LOADERS:
        raise ValueError(f"{path_or_url}: unknown QA format {fmt!r} (known: {sorted(LOADERS)})")
    return LOADERS[fmt](path_or_url, split=split, source=source, storage_options=storage_options)


# ---------------------------------------------------------------------------------------- synthetic

# Closed name vocabulary: every name is two of these syllables, so there are 256 names in all and
# each one is frequent enough in the training text for the tokenizer to make it a single token.
# Why single tokens: copying a one-token name (into a clone's task, a context key or the final
# answer) is a look-up of one position, which the tiny model learns as it learns to copy digits;
# a name of several pieces needs an induction circuit (copy the piece that followed the previous
# piece), which the ~1M-parameter model did not form in the CPU warm-up (measured: teacher-forced,
# it wrote "founded by Rite." then "Answer: Mite").
SYLLABLES = ("ka", "lo", "mi", "ra", "to", "ne", "su", "vi", "da", "pe", "zo", "ba", "ri", "mu", "te", "no")
NAMES: tuple[str, ...] = tuple((a + b).capitalize() for a in SYLLABLES for b in SYLLABLES)


@dataclass(frozen=True)
class Relation:
    src: str
    dst: str
    phrase: str  # noun phrase for a nested hop: "the founder of {x}"
    ask: str  # direct question: "Who founded {x}?"
    fact: str  # sentence in the subject's paragraph: "{s} was founded by {o}."


RELATIONS: dict[str, Relation] = {
    "born_in": Relation(
        "person", "city", "the birthplace of {x}", "In which city was {x} born?", "{s} was born in {o}."
    ),
    "lives_in": Relation(
        "person", "city", "the home city of {x}", "In which city does {x} live?", "{s} lives in {o}."
    ),
    "works_for": Relation(
        "person", "company", "the employer of {x}", "Which company does {x} work for?", "{s} works for {o}."
    ),
    "founded_by": Relation(
        "company", "person", "the founder of {x}", "Who founded {x}?", "{s} was founded by {o}."
    ),
    "led_by": Relation("company", "person", "the head of {x}", "Who leads {x}?", "{s} is led by {o}."),
    "based_in": Relation(
        "company", "city", "the base of {x}", "In which city is {x} based?", "{s} is based in {o}."
    ),
    "located_in": Relation(
        "city", "country", "the country of {x}", "In which country is {x}?", "{s} is a city in {o}."
    ),
    "capital": Relation(
        "country", "city", "the capital of {x}", "What is the capital of {x}?", "The capital of {s} is {o}."
    ),
}
_OUT: dict[str, list[str]] = {}
for _name, _rel in RELATIONS.items():
    _OUT.setdefault(_rel.src, []).append(_name)

# Facts that never answer a question: they only make paragraphs (and so the context) longer.
# Each template has its own word list so every filler reads as a plain English sentence.
_FILLERS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "person": (
        ("{s} is a {w}.", ("teacher", "farmer", "singer", "doctor", "pilot", "baker", "painter")),
        ("{s} likes {w}.", ("music", "books", "tea", "maps", "boats", "long walks", "old films")),
        ("{s} has {w}.", ("two cats", "a red car", "a small garden", "three sons", "a blue boat")),
    ),
    "city": (
        ("{s} has an old {w}.", ("port", "bridge", "market", "park", "tower", "museum", "church")),
        ("{s} is known for its {w}.", ("river", "food", "music", "cold winters", "long beach")),
        ("{s} lies near {w}.", ("the sea", "a lake", "the hills", "a big forest", "the border")),
    ),
    "company": (
        ("{s} makes {w}.", ("shoes", "bread", "cars", "lamps", "boats", "tools", "paper", "games")),
        ("{s} sells {w}.", ("books", "tea", "maps", "bikes", "chairs", "phones")),
        ("{s} has {w} workers.", ("ten", "fifty", "many", "few", "two hundred")),
    ),
    "country": (
        ("{s} is known for its {w}.", ("hills", "lakes", "forests", "farms", "coasts", "songs")),
        ("{s} has {w}.", ("a long coast", "many rivers", "high mountains", "a dry south")),
    ),
}
# Entity mix of one record's world, as fractions of its paragraph count (cities and countries
# are shared by many people/companies, which is what makes chains of different lengths possible).
_TYPE_SHARE = {"person": 0.4, "company": 0.25, "city": 0.25, "country": 0.1}


@dataclass
class SyntheticSplitConfig:
    count: int
    hops: tuple[int, int] = (2, 2)  # inclusive range of hops per question
    paragraphs: tuple[int, int] = (10, 16)  # inclusive range of paragraphs per record
    filler_sentences: tuple[int, int] = (1, 2)  # inclusive range per paragraph
    # Entities in a record's world beyond its paragraph count. Only `paragraphs` of them get a
    # paragraph; the rest are only named in facts. More entities, more candidate answers of each type
    # in the context, so guessing by type pays less (`type_guess_accuracy`).
    extra_entities: int = 4


class _World:
    """A small random world: typed entities with every outgoing relation defined (functional)."""

    def __init__(self, rng: random.Random, size: int):
        self.rng = rng
        self.names: set[str] = set()
        self._unused = rng.sample(NAMES, len(NAMES))
        counts = {t: max(2, round(size * share)) for t, share in _TYPE_SHARE.items()}
        self.by_type: dict[str, list[str]] = {t: [self._name() for _ in range(n)] for t, n in counts.items()}
        self.type_of = {e: t for t, es in self.by_type.items() for e in es}
        self.facts: dict[str, dict[str, str]] = {e: {} for e in self.type_of}
        countries, cities = self.by_type["country"], self.by_type["city"]
        if len(cities) < len(countries):
            cities.extend(self._name() for _ in range(len(countries) - len(cities)))
            self.type_of.update({c: "city" for c in cities})
            self.facts.update({c: {} for c in cities if c not in self.facts})
        # The first cities go one per country, so every country has a capital inside it.
        for i, city in enumerate(cities):
            self.facts[city]["located_in"] = countries[i] if i < len(countries) else rng.choice(countries)
        for country in countries:
            self.facts[country]["capital"] = rng.choice(
                [c for c in cities if self.facts[c]["located_in"] == country]
            )
        for person in self.by_type["person"]:
            self.facts[person]["born_in"] = rng.choice(self.by_type["city"])
            self.facts[person]["lives_in"] = rng.choice(self.by_type["city"])
            self.facts[person]["works_for"] = rng.choice(self.by_type["company"])
        for company in self.by_type["company"]:
            self.facts[company]["founded_by"] = rng.choice(self.by_type["person"])
            self.facts[company]["led_by"] = rng.choice(self.by_type["person"])
            self.facts[company]["based_in"] = rng.choice(self.by_type["city"])

    def _name(self) -> str:
        """The next unused name of this world (names are drawn without replacement from NAMES)."""
        if not self._unused:
            raise ValueError(f"a synthetic world cannot have more than {len(NAMES)} entities")
        name = self._unused.pop()
        self.names.add(name)
        return name

    def paragraph(self, entity: str, fillers: tuple[int, int]) -> str:
        etype = self.type_of[entity]
        sents = [RELATIONS[r].fact.format(s=entity, o=o) for r, o in self.facts[entity].items()]
        if etype == "country":
            sents.insert(0, f"{entity} is a country.")
        for tmpl, words in self.rng.sample(
            _FILLERS[etype], min(len(_FILLERS[etype]), self.rng.randint(*fillers))
        ):
            sents.append(tmpl.format(s=entity, w=self.rng.choice(words)))
        return " ".join(sents)

    def chain(self, rels: Sequence[str]) -> tuple[str, list[str]] | None:
        """Follow `rels` from a random anchor; None if the path revisits an entity (a revisit
        makes the answer trivially equal to an entity named earlier in the question)."""
        ents = [self.rng.choice(self.by_type[RELATIONS[rels[0]].src])]
        for rel in rels:
            nxt = self.facts[ents[-1]][rel]
            if nxt in ents:
                return None
            ents.append(nxt)
        return ents[0], ents


@functools.lru_cache(maxsize=16)
def relation_paths(n_hops: int) -> list[tuple[str, ...]]:
    """Every type-compatible relation path of n_hops, minus capital->located_in (always returns
    to the start). Sampling a path uniformly keeps question types balanced, which sampling an
    anchor first would not (city anchors would almost always give located_in>capital)."""
    paths: list[tuple[str, ...]] = [(r,) for r in RELATIONS]
    for _ in range(n_hops - 1):
        paths = [
            (*p, r)
            for p in paths
            for r in _OUT[RELATIONS[p[-1]].dst]
            if (p[-1], r) != ("capital", "located_in")
        ]
    return sorted(paths)


def _compose_question(anchor: str, rels: Sequence[str]) -> str:
    np = anchor
    for rel in rels[:-1]:
        np = RELATIONS[rel].phrase.format(x=np)
    question = RELATIONS[rels[-1]].ask.format(x=np)
    return question[0].upper() + question[1:]


WORLD_DRAWS = 1000
"""Worlds drawn for one synthetic record before its setting is declared impossible."""


def synthetic_record(rng: random.Random, cfg: SyntheticSplitConfig, *, split: str, index: int) -> QARecord:
    n_par = rng.randint(*cfg.paragraphs)
    n_hops = rng.randint(*cfg.hops)
    if n_par < n_hops:
        raise ValueError(f"synthetic split {split!r}: {n_par} paragraphs cannot hold {n_hops} hops")
    rels = list(rng.choice(relation_paths(n_hops)))
    # A fresh world per record, so answers must be read, never memorised. Bounded: a setting no world
    # can meet (more paragraphs than entities, a chain needing more entities of a type than a world
    # has) must stop with an error, not loop; settings that can be met succeed within a few draws.
    for _ in range(WORLD_DRAWS):
        world = _World(rng, n_par + cfg.extra_entities)
        found = next((f for f in (world.chain(rels) for _ in range(50)) if f), None)
        if found and len(world.type_of) >= n_par:
            break
    else:
        raise ValueError(
            f"synthetic split {split!r}, record {index}: no world of {n_par} + {cfg.extra_entities} "
            f"entities held {n_par} paragraphs and the {n_hops}-hop chain {' -> '.join(rels)} in "
            f"{WORLD_DRAWS} draws; raise extra_entities or lower paragraphs/hops"
        )
    anchor, ents = found
    support = ents[:-1]  # the paragraph of each hop's subject states the hop's fact
    others = [e for e in sorted(world.type_of) if e not in support]
    # Prefer distractors that share the chain's types (hard negatives), then fill at random.
    chain_types = {world.type_of[e] for e in support}
    hard = [e for e in others if world.type_of[e] in chain_types]
    soft = [e for e in others if world.type_of[e] not in chain_types]
    rng.shuffle(hard)
    rng.shuffle(soft)
    chosen = support + (hard + soft)[: n_par - len(support)]
    rng.shuffle(chosen)
    keys = make_keys(chosen)
    key_of = dict(zip(chosen, keys, strict=True))
    paragraphs: list[Paragraph] = [
        {
            "key": key_of[e],
            "title": e,
            "text": world.paragraph(e, cfg.filler_sentences),
            "supporting": e in support,
        }
        for e in chosen
    ]
    hops: list[Hop] = [
        {
            "question": RELATIONS[rel].ask.format(x=subj),
            "answer": obj,
            "paragraph_key": key_of[subj],
        }
        for subj, rel, obj in zip(ents[:-1], rels, ents[1:], strict=True)
    ]
    return {
        "id": f"synth-{split}-{index:05d}",
        "question": _compose_question(anchor, rels),
        "answers": [ents[-1]],
        "paragraphs": paragraphs,
        "hops": hops,
        "source": "synthetic",
        "split": split,
        "num_hops": n_hops,
        "type": "chain:" + ">".join(rels),
    }


def _setting_range(value: Any, where: str, *, minimum: int) -> tuple[int, int]:
    """An inclusive range setting, `[min, max]` or one integer for both, with minimum <= min <= max.
    Checked here because a bad one would otherwise surface as random's "empty range for
    randrange()" or an unpacking error, naming no setting."""
    pair = (value, value) if is_int_setting(value) else value
    if not isinstance(pair, list | tuple) or len(pair) != 2 or not all(is_int_setting(v) for v in pair):
        raise ValueError(
            f"{where}: expected an integer or an inclusive range [min, max] of integers, got {value!r}"
        )
    lo, hi = pair
    if lo > hi:
        raise ValueError(f"{where}: the range [{lo}, {hi}] is empty (min {lo} > max {hi})")
    if lo < minimum:
        raise ValueError(f"{where}: the range [{lo}, {hi}] must not go below {minimum}")
    return (int(lo), int(hi))


_SPLIT_DEFAULTS = SyntheticSplitConfig(count=1)


def split_config(
    spec: Mapping[str, Any],
    defaults: Mapping[str, Any] | None = None,
    *,
    name: str = "<split>",
    prefix: str = "qa.synthetic",
) -> SyntheticSplitConfig:
    """One synthetic split's settings (`spec`, over the section's `defaults`), checked: a bad value
    raises ValueError naming its setting path, `<prefix>.splits.<name>.<field>` for the split's own
    value or `<prefix>.<field>` for a default it inherits."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"{prefix}.splits.{name}: expected a mapping of settings, got {spec!r}")
    fields = set(asdict(_SPLIT_DEFAULTS))
    merged = {**(defaults or {}), **spec}
    unknown = sorted(set(merged) - fields)
    if unknown:
        where = [f"{prefix}.splits.{name}.{k}" if k in spec else f"{prefix}.{k}" for k in unknown]
        raise ValueError(
            f"unknown synthetic QA setting {', '.join(where)} (known: {', '.join(sorted(fields))})"
        )

    def where(field_name: str) -> str:
        if field_name in spec:
            return f"{prefix}.splits.{name}.{field_name}"
        return f"{prefix}.{field_name} (the default split {name!r} inherits)"

    def value(field_name: str) -> Any:
        return merged.get(field_name, getattr(_SPLIT_DEFAULTS, field_name))

    if "count" not in merged:
        raise ValueError(f"{prefix}.splits.{name}.count: missing")
    cfg = SyntheticSplitConfig(
        count=int_setting(merged["count"], where("count"), minimum=1),
        hops=_setting_range(value("hops"), where("hops"), minimum=1),
        paragraphs=_setting_range(value("paragraphs"), where("paragraphs"), minimum=1),
        filler_sentences=_setting_range(value("filler_sentences"), where("filler_sentences"), minimum=0),
        extra_entities=int_setting(value("extra_entities"), where("extra_entities"), minimum=0),
    )
    # A paragraph draws its filler sentences from its entity type's templates without repeats, so a
    # larger max was silently capped at the fewest templates a type has.
    most = min(len(templates) for templates in _FILLERS.values())
    if cfg.filler_sentences[1] > most:
        raise ValueError(
            f"{where('filler_sentences')}: max {cfg.filler_sentences[1]} is above the {most} filler "
            "templates that every entity type has (a paragraph repeats none)"
        )
    # Every hop's subject needs its own paragraph; checked here so that a setting that fails only
    # when a draw pairs few paragraphs with many hops fails at once, naming both settings.
    if cfg.paragraphs[0] < cfg.hops[1]:
        raise ValueError(
            f"{where('paragraphs')}: min {cfg.paragraphs[0]} is below the {cfg.hops[1]} paragraphs that "
            f"the {cfg.hops[1]} hops {where('hops')} allows need (one per hop); raise the paragraphs' "
            "min or lower the hops' max"
        )
    return cfg


def generate_synthetic(
    seed: int, splits: Mapping[str, SyntheticSplitConfig | Mapping[str, Any]]
) -> dict[str, list[QARecord]]:
    """Synthetic multi-hop QA splits. Each split has its own RNG stream (seeded by seed and split
    name). (question, answer) pairs are unique across splits (first split in order wins), so
    changing one split's count leaves the splits before it unchanged, but can change the ones after
    it: a record whose pair an earlier split now holds (or no longer holds) is skipped (or kept).
    Question texts do repeat (the 2-hop space is ~13 relation paths x 256 names), but every record
    has its own world and an eval record's answer is never a train answer to the same question, so
    memorising train answers does not help: the answer has to be read from the context."""
    seen: set[str] = set()
    out: dict[str, list[QARecord]] = {}
    for name, spec in splits.items():
        # A config built in code is checked as settings are, so a bad range fails naming its split.
        cfg = split_config(asdict(spec) if isinstance(spec, SyntheticSplitConfig) else spec, name=name)
        rng = random.Random(f"selfcest-qa:{seed}:{name}")
        records: list[QARecord] = []
        attempts = 0
        while len(records) < cfg.count:
            attempts += 1
            if attempts > 20 * cfg.count + 100:
                raise RuntimeError(f"synthetic split {name!r}: cannot make {cfg.count} unique questions")
            rec = synthetic_record(rng, cfg, split=name, index=len(records))
            sig = rec["question"] + "\x00" + rec["answers"][0]
            if sig in seen:
                continue
            seen.add(sig)
            records.append(rec)
        out[name] = records
    return out


def sentences(text: str) -> list[str]:
    """A paragraph's sentences (the synthetic generator ends every sentence with a full stop)."""
    return [sentence.strip() for sentence in re.split(r"(?<=\.)\s+", text.strip())]


def fact_pattern(template: str) -> re.Pattern[str]:
    """`"{s} was born in {o}."` -> a regex that reads subject and object back out of such a sentence."""
    pattern = re.escape(template).replace(r"\{s\}", r"(?P<s>[A-Z]\w*)").replace(r"\{o\}", r"(?P<o>[A-Z]\w*)")
    return re.compile(pattern + r"\Z")


FACT_PATTERNS: list[tuple[Relation, re.Pattern[str]]] = [
    (relation, fact_pattern(relation.fact)) for relation in RELATIONS.values()
]


def fact_sentences(text: str) -> list[tuple[Relation, str, str, str]]:
    """(relation, subject, object, sentence) for every relation sentence of a synthetic paragraph.

    The generator writes each fact from its relation's template (`RELATIONS`); filler sentences and
    text from other sources match no template and give nothing. The teachers quote these sentences
    and `type_guess_accuracy` reads the entities' types from them."""
    facts = []
    for sentence in sentences(text):
        for relation, pattern in FACT_PATTERNS:
            match = pattern.match(sentence)
            if match:
                facts.append((relation, match["s"], match["o"], sentence))
                break
    return facts


_NAME_SET = frozenset(NAMES)


def type_guess_accuracy(records: Iterable[Mapping[str, Any]]) -> float | None:
    """Expected accuracy of a reader that never follows the chain: it guesses the entity of the
    answer's type that the context mentions most often (leaving out names in the question), breaking
    ties uniformly (a tie of k that holds the answer scores 1/k). A floor for the synthetic splits:
    a method at or below it shows no reading. Types come from the fact sentences, as a reader that
    knows the templates would get them. None when no record is a synthetic chain."""
    scores: list[float] = []
    for record in records:
        chain = str(record.get("type", ""))
        if record.get("source") != "synthetic" or not chain.startswith("chain:"):
            continue
        wanted = RELATIONS[chain.split(":", 1)[1].split(">")[-1]].dst
        mentions: dict[str, int] = {}
        type_of: dict[str, str] = {}
        for paragraph in record["paragraphs"]:
            text = paragraph["text"]
            for word in re.findall(r"[A-Z][a-z]+", text):
                if word in _NAME_SET:
                    mentions[word] = mentions.get(word, 0) + 1
            for relation, subject, obj, _ in fact_sentences(text):
                type_of[subject], type_of[obj] = relation.src, relation.dst
        asked = set(re.findall(r"[A-Z][a-z]+", str(record["question"])))
        counts = {e: c for e, c in mentions.items() if type_of.get(e) == wanted and e not in asked}
        top = max(counts.values(), default=0)
        tied = [e for e, c in counts.items() if c == top]
        answers = set(record["answers"])
        scores.append(sum(e in answers for e in tied) / len(tied) if tied else 0.0)
    return sum(scores) / len(scores) if scores else None


# ---------------------------------------------------------------------------------------- output


def canonical_jsonl(records: Iterable[Mapping[str, Any]]) -> str:
    """Byte-stable JSON lines (sorted keys, no ASCII escaping): equal records -> equal bytes."""
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)


def records_sha256(records: Iterable[Mapping[str, Any]]) -> str:
    return hashlib.sha256(canonical_jsonl(records).encode("utf-8")).hexdigest()


def context_text(record: Mapping[str, Any]) -> str:
    """The monolithic reader's view: every paragraph as "title: text", one per line."""
    return "\n".join(f"{p['title']}: {p['text']}" for p in record["paragraphs"])
