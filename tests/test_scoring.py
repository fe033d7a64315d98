"""Scorers: answer extraction, arithmetic exact match, SQuAD EM/F1, math-verify equivalence.

The math and QA checks run on the real benchmark records (`benchmark_paths.py` finds them).
"""

from __future__ import annotations

import json
import re
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from benchmark_paths import BENCHMARKS
from hypothesis import given, settings
from hypothesis import strategies as st

from selfcest.scoring import (
    all_boxed,
    extract_last_answer,
    last_boxed,
    math_equivalent,
    math_final_answer,
    normalize_answer,
    parse_last_integer,
    qa_exact_match,
    qa_f1,
    score_arithmetic,
)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --------------------------------------------------------------------------- extract_last_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, None),
        (42, None),
        ("", None),
        ("no marker here", None),
        ("Answer: 5", "5"),
        ("Answer: 1\nthinking...\nAnswer: 2\n", "2"),  # last marker wins
        ("Answer:   7  \nmore text", "7"),  # first line only, stripped
        ("Answer:\n\n  9\n", "9"),  # leading blank lines after the marker are skipped
        ("Answer:   ", None),
        ("Answer: Answer: 3", "3"),
        ("answer: 5", None),  # the marker is case-sensitive, as the protocol spells it
    ],
)
def test_extract_last_answer(text: object, expected: str | None) -> None:
    assert extract_last_answer(text) == expected


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_extract_last_answer_never_raises(text: str) -> None:
    result = extract_last_answer(text)
    assert result is None or (result == result.strip() and "\n" not in result and result)


# --------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("text", "gold", "score"),
    [
        ("Answer: 42", 42, 1.0),
        ("Answer: -1,234", -1234, 1.0),
        ("Answer: 1,234,567", 1234567, 1.0),
        ("Answer: +5", 5, 1.0),
        ("Answer: \u22127", -7, 1.0),  # Unicode minus sign
        ("Answer: x = -8.", -8, 1.0),
        ("Answer: 42.0", 42, 1.0),
        ("Answer: 42.5", 42, 0.0),  # not an integer: no credit, and not read as "5"
        ("Answer: 10-3", 7, 0.0),  # the answer is not evaluated; the last integer is 3
        ("Answer: 10-3", 3, 1.0),  # "-" after a digit is an operator, not a sign
        ("Answer: 41", 42, 0.0),  # no partial credit for near misses
        ("Answer: 3\nAnswer: 4", 4, 1.0),
        ("Answer: 3\nAnswer: 4", 3, 0.0),
        ("42", 42, 0.0),  # no marker
        ("Answer: none", 0, 0.0),
        ("Answer: " + "9" * 5000, 0, 0.0),  # beyond int/str limits: wrong, not an exception
        (None, 0, 0.0),
        ("**Answer:** 12", 12, 1.0),
        ("Answer: $1{,}234{,}567$", 1234567, 1.0),  # LaTeX thousands separators (read as 567)
        ("Answer: 1\\,234\\,567", 1234567, 1.0),
        ("Answer: \u20131234567", 1234567, 0.0),  # an en dash as the minus sign (was full credit)
        ("Answer: \u20131234567", -1234567, 1.0),
        ("Answer: 3\u20135", 5, 1.0),  # an en dash after a digit is no sign
    ],
)
def test_score_arithmetic(text: str | None, gold: int, score: float) -> None:
    assert score_arithmetic(text, gold) == score


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-(10**20), max_value=10**20), st.booleans())
def test_score_arithmetic_roundtrip(value: int, commas: bool) -> None:
    rendered = f"{value:,}" if commas else str(value)
    assert score_arithmetic(f"work...\nAnswer: {rendered}", value) == 1.0
    assert score_arithmetic(f"Answer: {rendered}", value + 1) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parse_last_integer_never_raises(text: str) -> None:
    assert parse_last_integer(text) is None or isinstance(parse_last_integer(text), int)


# --------------------------------------------------------------------------- QA


def test_normalize_answer() -> None:
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("An apple, a day.") == "apple day"
    assert normalize_answer("theory") == "theory"  # articles only as whole words


@pytest.mark.parametrize(
    ("pred", "golds", "em", "f1"),
    [
        ("the Eiffel Tower.", "Eiffel Tower", 1.0, 1.0),
        ("Eiffel Tower in Paris", "the Eiffel Tower", 0.0, 2 * 0.5 * 1.0 / 1.5),
        ("NYC", ["New York City", "NYC"], 1.0, 1.0),  # best over aliases
        ("New York", ["New York City", "NYC"], 0.0, 2 * 1.0 * (2 / 3) / (1 + 2 / 3)),
        ("Yes.", "yes", 1.0, 1.0),
        ("yes", "no", 0.0, 0.0),
        ("yes it is", "yes", 0.0, 0.0),  # yes/no rule: no token-overlap credit
        ("no", "no way", 0.0, 0.0),
        ("Paris", "London", 0.0, 0.0),
        (None, "Paris", 0.0, 0.0),
        ("The", "A", 1.0, 1.0),  # both articles only: F1 agrees with EM (SQuAD 2.0), was 0.0
        ("The", "Paris", 0.0, 0.0),
    ],
)
def test_qa_metrics(pred: str | None, golds: str | list[str], em: float, f1: float) -> None:
    assert qa_exact_match(pred, golds) == em
    assert qa_f1(pred, golds) == pytest.approx(f1)


def test_qa_requires_a_gold() -> None:
    with pytest.raises(ValueError, match="gold"):
        qa_f1("x", [])


def test_qa_real_records_match_themselves() -> None:
    musique = json.loads((BENCHMARKS / "musique" / "kag_musique_qa_100.json").read_text())
    for record in musique:
        golds = [record["answer"], *record.get("answer_aliases", [])]
        for gold in golds:
            assert qa_exact_match(gold, golds) == 1.0
            assert qa_f1(extract_last_answer(f"Reasoning...\nAnswer: {gold}\n"), golds) == 1.0
    two_wiki = json.loads(
        (BENCHMARKS / "2wikimultihopqa" / "2wikimultihopqa_dev_hipporag_first10.json").read_text()
    )
    for record in two_wiki:
        assert (
            qa_exact_match(extract_last_answer(f"...\nAnswer: {record['answer']}"), record["answer"]) == 1.0
        )
        assert qa_f1("completely unrelated words", record["answer"]) == 0.0


# --------------------------------------------------------------------------- last_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces do not close the box
        ("\\boxed {x^{2}}", "x^{2}"),
        ("$\\boxed 5$", "5"),
        ("\\fbox{3}", "3"),
        ("\\boxed{1} and \\boxed{2", None),  # the last box is truncated: no answer
        ("no box", None),
        (None, None),
        ("\\boxed", None),
        ("so \\boxed 5.", "5"),  # a sentence's full stop is no part of a brace-less box
        ("\\boxed\n{5}", "5"),  # any whitespace before the brace
    ],
)
def test_last_boxed(text: object, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_last_boxed_is_bounded() -> None:
    assert last_boxed("\\boxed{" + "{" * 100_000) is None
    assert last_boxed("\\boxed{" + "x" * 50 + "}", max_chars=10) is None


def test_all_boxed_reads_every_box_in_order_and_skips_broken_ones() -> None:
    text = "a \\boxed{1}, b \\fbox{x^{2}}, c $\\boxed 5$, d \\boxed{" + "y" * 50 + "} e \\boxed{3"
    assert all_boxed(text, max_chars=20) == ["1", "x^{2}", "5"]  # too long and unbalanced: skipped
    assert all_boxed("no box") == [] and all_boxed(None) == []


def test_an_answer_line_after_a_box_is_the_answer() -> None:
    """The prompts ask for `Answer:`, not a box: a model that boxes a step and then corrects it was
    scored on the box (the episode's final answer said 5, its row scored 3). The later one counts;
    a box in the `Answer:` line, or after it, is still read."""
    corrected = "We get $x=\\boxed{3}$. Checking again: step 2 was wrong, so x = 5.\nAnswer: 5"
    assert math_final_answer(corrected) == "5"
    assert math_equivalent(corrected, "5") and not math_equivalent(corrected, "3")
    assert math_final_answer("Answer: \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert math_final_answer("Answer: 4\nWait, that was wrong: \\boxed{6}") == "6"
    assert math_final_answer("\\boxed{3}\nAnswer:") == "3"  # an empty answer line gives the box


def test_an_empty_box_after_the_answer_does_not_hide_it() -> None:
    """A model that echoes the instruction "put the answer in \\boxed{}" after answering was scored
    wrong: only the last box was read, and an empty one fell through to the `Answer:` line."""
    text = "So the result is \\boxed{5}. (Remember to put the final answer in \\boxed{}.)"
    assert last_boxed(text) == ""  # the last box, as the gold reader of MATH solutions wants it
    assert math_final_answer(text) == "5" and math_equivalent(text, "5")
    assert math_final_answer("\\boxed{5} and \\boxed{ } \\boxed{6") is None  # a cut box last: unknown
    assert math_final_answer("\\boxed{} \\boxed{}\nAnswer: 7.") == "7"


# --------------------------------------------------------------------------- math


def test_aime_answers_verify_and_perturbations_do_not() -> None:
    records = _jsonl(BENCHMARKS / "aime" / "aime24_test.jsonl") + _jsonl(
        BENCHMARKS / "aime" / "aime25_test.jsonl"
    )
    assert len(records) == 60
    for record in records:
        gold = str(record["answer"])
        assert math_equivalent(f"... so the total is \\boxed{{{gold}}}.", gold), gold
        assert math_equivalent(f"Answer: {int(gold)}", gold), gold  # "033" == 33, via Answer:
        assert not math_equivalent(f"\\boxed{{{int(gold) + 1}}}", gold), gold
        assert not math_equivalent(f"\\boxed{{{gold}}} is wrong; \\boxed{{{int(gold) + 1}}}", gold), gold


def _perturb_first_digit(answer: str) -> str | None:
    match = re.search(r"\d", answer)
    if match is None:
        return None
    return answer[: match.start()] + str((int(match.group()) + 1) % 10) + answer[match.end() :]


# math-verify compares numerically at 15 digits, so 1/2004! and 2/2004! (both ~1e-5700) are equal.
_KNOWN_NUMERIC_TIES = {"\\frac{1}{2004!}"}


def test_math_hard_answers_verify_and_perturbations_do_not() -> None:
    records = _jsonl(BENCHMARKS / "math" / "math_hard_level5_test.jsonl")
    assert len(records) == 1324
    golds = [last_boxed(r["solution"]) for r in records]
    assert all(golds)  # every MATH-Hard solution has a balanced last \boxed{}
    # Every 4th record keeps this under ~5 s; all 1324 pass too (about 18 s).
    perturbed = 0
    for gold in golds[::4]:
        assert gold is not None
        assert math_equivalent(f"Thus the answer is $\\boxed{{{gold}}}$.", gold), gold
        wrong = _perturb_first_digit(gold)
        if wrong is not None and gold not in _KNOWN_NUMERIC_TIES:
            perturbed += 1
            assert not math_equivalent(f"\\boxed{{{wrong}}}", gold), (gold, wrong)
    assert perturbed > 300


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("\\boxed{\\dfrac{1}{2}}", "\\frac12", True),
        ("Answer: 0.5", "\\frac{1}{2}", True),  # no box: falls back to the last Answer:
        ("Answer: $\\frac{1}{2}$", "\\frac{1}{2}", True),
        ("\\boxed{(-\\infty, 3]}", "(-\\infty,3]", True),
        ("\\boxed{C}", "\\text{(C)}", True),
        # math-verify alone reads `\frac \pi4 + 2 - \sqrt2` as 2; braced first, it is not.
        ("\\boxed{2}", "\\frac \\pi4 + 2 - \\sqrt2", False),
        ("\\boxed{\\frac{\\pi}{4}+2-\\sqrt{2}}", "\\frac \\pi4 + 2 - \\sqrt2", True),
        ("the answer is 5", "5", False),  # neither a box nor an Answer: marker
        (None, "5", False),
        ("\\boxed{}", "5", False),
        ("\\boxed{} Answer: 5", "5", True),  # an empty box is no answer: the Answer: line is read
        ("Answer: 204.", "204", True),  # the sentence's full stop is not part of the answer
        ("Answer: 3.5.", "3.5", True),
        ("Answer: **204**.", "204", True),
        ("Answer: \\sqrt{2}.", "\\sqrt{2}", True),
        ("Answer: 3!", "3", False),  # a factorial keeps its "!"
        ("\\boxed{" + "1+" * 600 + "1}", "601", False),  # over MAX_MATH_ANSWER_CHARS: not parsed
    ],
)
def test_math_equivalent_cases(pred: str | None, gold: str, expected: bool) -> None:
    assert math_equivalent(pred, gold) is expected


def test_math_equivalent_in_a_worker_thread() -> None:
    # math-verify's SIGALRM timeout raises ValueError off the main thread; we disable it there.
    results: list[bool] = []
    worker = threading.Thread(
        target=lambda: results.append(math_equivalent("\\boxed{\\frac{2}{4}}", "\\frac12"))
    )
    worker.start()
    worker.join(timeout=30)
    assert results == [True]


def test_math_equivalent_is_bounded_off_the_main_thread() -> None:
    """Off the main thread math-verify's timeouts were off, and nine characters (`9^{9^{9}}`: sympy
    works out the power in one C call) never returned. The comparison now runs in a child process
    that is killed at the deadline; the next call starts a new one."""
    import selfcest.scoring as scoring

    results: list[tuple[bool, bool]] = []
    previous = scoring.MATH_VERIFY_DEADLINE_S
    scoring.MATH_VERIFY_DEADLINE_S = 3
    try:
        worker = threading.Thread(
            target=lambda: results.append(
                (math_equivalent("Answer: 9^{9^{9}}", "1"), math_equivalent("Answer: 0.5", "\\frac{1}{2}"))
            )
        )
        worker.start()
        worker.join(timeout=120)
    finally:
        scoring.MATH_VERIFY_DEADLINE_S = previous
    assert results == [(False, True)]


def test_a_callers_watchdog_is_not_swallowed() -> None:
    """`except BaseException` caught math-verify's timeout and a caller's own watchdog alike: the
    caller's exception (pytest-timeout's, say) vanished into a False."""

    class Watchdog(Exception):
        pass

    def fire(*_: object) -> None:
        raise Watchdog

    previous = signal.getitimer(signal.ITIMER_REAL)
    handler = signal.signal(signal.SIGALRM, fire)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(Watchdog):
            math_equivalent("Answer: 9^{9^{9}}", "1")
    finally:
        signal.setitimer(signal.ITIMER_REAL, *previous)
        signal.signal(signal.SIGALRM, handler)
    assert math_equivalent("\\boxed{7}", "7")  # the interrupted request left no stale reply


def test_an_answer_in_display_math_on_its_own_lines_is_read() -> None:
    assert math_final_answer("Answer:\n\\[\n\\frac{1}{2}\n\\]") == "\\frac{1}{2}"
    assert math_final_answer("Answer:\n$$\n3\n$$") == "3"
    assert math_final_answer("Answer:\n\\[\n3") == "\\["  # never closed: left as it was
    assert math_equivalent("Answer:\n\\[\n\\frac{1}{2}\n\\]", "\\frac{1}{2}")


def test_math_equivalent_keeps_an_outer_alarm() -> None:
    # math-verify's `signal.alarm(0)` would cancel a caller's ITIMER_REAL watchdog (pytest-timeout
    # uses one); with an outer timer armed we skip math-verify's own timeout instead.
    previous = signal.getitimer(signal.ITIMER_REAL)
    handler = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1000.0)
        assert math_equivalent("\\boxed{7}", "7")
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, *previous)
        signal.signal(signal.SIGALRM, handler)
