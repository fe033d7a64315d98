"""Where a wrong arithmetic answer first went wrong (`selfcest.analysis.failure_anatomy`), on trees
shaped as the runtime records them: the root's sum in the question, each clone's half by key."""

from __future__ import annotations

from typing import Any

import pytest

from selfcest.analysis import (
    FAILURE_KINDS,
    arithmetic_audit,
    failure_anatomy,
    failure_anatomy_markdown,
    half_leaf_results,
)

# 8 terms: first half 4+5-3+2 = 8 (its halves 4+5 = 9 and -3+2 = -1), second half 6-1+7+1 = 13.
QUESTION = "Calculate the value of 4+5-3+2+6-1+7+1."
TOTAL = 21


def _agent(
    agent_id: str,
    text: str,
    answer: str | None,
    *,
    keys: tuple[str, ...] = (),
    children: list[list[int]] | None = None,
    status: str = "ok",
) -> dict[str, Any]:
    parent = agent_id.rsplit("/", 1)[0] if "/" in agent_id else None
    return {
        "agent_id": agent_id,
        "role": "clone" if parent else "root",
        "parent_id": parent,
        "context_keys": list(keys),
        "children": children or [],
        "status": status,
        "answer": answer,
        "turns": [{"text": text}],
    }


def _record(agents: list[dict[str, Any]], method: str = "selfcest", budget: int = 256) -> dict[str, Any]:
    answer = agents[0]["answer"]
    return {
        "dataset": "arithmetic",
        "split": "ood",
        "method": method,
        "budget": budget,
        "question": QUESTION,
        "golds": [str(TOTAL)],
        "answer": answer,
        "correct": float(answer == str(TOTAL)),
        "episodes": [{"agents": agents}],
    }


def _tree(
    root_text: str = "8+13=21\nAnswer: 21",
    root_answer: str = "21",
    first: tuple[str, str] = ("4+5=9\n9-3=6\n6+2=8\nAnswer: 8", "8"),
    second: tuple[str, str] = ("6-1=5\n5+7=12\n12+1=13\nAnswer: 13", "13"),
    second_status: str = "ok",
) -> list[dict[str, Any]]:
    return [
        _agent("root", root_text, root_answer, children=[[1, 2]]),
        _agent("root/turn1_clone0", first[0], first[1], keys=("first half",)),
        _agent("root/turn1_clone1", second[0], second[1], keys=("second half",), status=second_status),
    ]


def _alone(text: str, answer: str) -> list[dict[str, Any]]:
    return [_agent("root", text, answer)]


RIGHT_CHAIN = "4+5=9\n9-3=6\n6+2=8\n8+6=14\n14-1=13\n13+7=20\n20+1=21"


@pytest.mark.parametrize(
    ("agents", "failure"),
    [
        (_tree(), None),
        # the root adds its clones' right answers wrong
        (_tree(root_text="8+13=20\nAnswer: 20", root_answer="20"), "combine_addition"),
        # the root adds a number no clone gave
        (_tree(root_text="8+12=20\nAnswer: 20", root_answer="20"), "combine_readback"),
        # the root adds its clones' answers right, then goes on adding a term no clone answered
        (_tree(root_text="8+13=21\n21+5=26\nAnswer: 26", root_answer="26"), "combine_readback"),
        # every step right, the answer another number
        (_tree(root_text="8+13=21\nAnswer: 2", root_answer="2"), "answer_off_steps"),
        # the second clone skips a term (-1); the root adds its wrong answer right: the clone is first
        (
            _tree(
                root_text="8+14=22\nAnswer: 22",
                root_answer="22",
                second=("6+7=13\n13+1=14\nAnswer: 14", "14"),
            ),
            "part_terms",
        ),
        # the first clone's terms are all there, one addition is wrong
        (
            _tree(
                root_text="9+13=22\nAnswer: 22",
                root_answer="22",
                first=("4+5=9\n9-3=7\n7+2=9\nAnswer: 9", "9"),
            ),
            "part_addition",
        ),
        (
            _tree(
                root_text="Answer: 8",
                root_answer="8",
                second=("6-1=5\n5+7=", None),
                second_status="truncated",
            ),
            "cut_off",
        ),
        (
            _tree(root_text="Answer: 8", root_answer="8", second=("", None), second_status="failed"),
            "protocol",
        ),
        # a root alone: a term left out, a step past the last term, the chain stopped early
        (_alone(RIGHT_CHAIN.replace("14-1=13\n13+7=20", "14+7=21") + "\nAnswer: 22", "22"), "part_terms"),
        (_alone(RIGHT_CHAIN + "\n21+3=24\nAnswer: 24", "24"), "part_terms"),
        (_alone("4+5=9\n9-3=6\nAnswer: 6", "6"), "part_terms"),
        (_alone(RIGHT_CHAIN.replace("=21", "=22") + "\nAnswer: 22", "22"), "part_addition"),
        # a clone answers "+13", which the scorer reads as 13; the root adds 8 and 13 wrong
        (
            _tree(
                root_text="8+13=20\nAnswer: 20",
                root_answer="20",
                second=("6-1=5\n5+7=12\n12+1=13\nAnswer: +13", "+13"),
            ),
            "combine_addition",
        ),
        # the root hands the first half twice and adds the two right answers right: no combining
        # slip (it was `answer_off_steps`), the clones do not make up its sum
        (
            [
                _agent("root", "8+8=16\nAnswer: 16", "16", children=[[1, 2]]),
                _agent("root/turn1_clone0", "4+5=9\n9-3=6\n6+2=8\nAnswer: 8", "8", keys=("first half",)),
                _agent("root/turn1_clone1", "4+5=9\n9-3=6\n6+2=8\nAnswer: 8", "8", keys=("first half",)),
            ],
            "other",
        ),
        # thinking: the first pass is right and the check pass ends elsewhere
        (_alone(RIGHT_CHAIN + "\nCheck:\n4+5=9\n9+3=12\nAnswer: 12", "12"), "answer_off_steps"),
    ],
)
def test_a_wrong_answer_is_placed_where_it_first_went_wrong(
    agents: list[dict[str, Any]], failure: str | None
) -> None:
    audit = arithmetic_audit(_record(agents))
    assert audit is not None and audit["failure"] == failure
    assert audit["alone"] == (len(agents) == 1)


def test_a_clone_under_an_unknown_key_is_other_and_non_arithmetic_or_voting_records_are_skipped() -> None:
    agents = _tree(root_text="8+13=20\nAnswer: 20", root_answer="20")
    agents[1]["context_keys"] = ["Paragraph 1"]  # not a half: its sum is unknown, so is the root's failure
    assert arithmetic_audit(_record(agents))["failure"] == "other"  # type: ignore[index]
    assert arithmetic_audit(dict(_record(_tree()), dataset="qa")) is None
    voting = _record(_tree())
    voting["episodes"] = voting["episodes"] * 4  # sc@k: several samples, no one tree
    assert arithmetic_audit(voting) is None


def test_numbers_too_long_for_int_are_text_not_a_crash() -> None:
    huge = "9" * 5000  # int() refuses strings of over 4,300 digits
    agents = _tree(root_text=f"8+13={huge}\nAnswer: {huge}", root_answer=huge)
    audit = arithmetic_audit(_record(agents))
    assert audit is not None and audit["failure"] == "combine_readback"  # no step line: none read back
    assert audit["combine_steps"] == [0, 0]


def test_step_lines_are_counted_by_who_wrote_them() -> None:
    # the root's 38+15 (both operands of two digits) is wrong, its clones' steps right
    agents = [
        _agent("root", "38+15=52\nAnswer: 52", "52", children=[[1, 2]]),
        _agent("root/turn1_clone0", "4+5=9\nAnswer: 9", "9", keys=("first half",)),
        _agent("root/turn1_clone1", "6-1=5\nAnswer: 5", "5", keys=("second half",)),
    ]
    audit = arithmetic_audit(_record(agents))
    assert audit is not None
    assert (
        audit["part_steps"] == [2, 2]
        and audit["combine_steps"] == [0, 1]
        and audit["wide_combine_steps"] == [0, 1]
    )


def test_anatomy_rows_count_every_wrong_answer_once_and_the_summary_names_the_commonest() -> None:
    records = [
        _record(_tree()),
        _record(_tree(root_text="8+13=20\nAnswer: 20", root_answer="20")),
        _record(_tree(root_text="8+13=22\nAnswer: 22", root_answer="22")),
        _record(_alone("4+5=9\nAnswer: 9", "9")),
        _record(_alone(RIGHT_CHAIN + "\nAnswer: 21", "21"), method="base"),
        _record(_tree(), budget=128),
    ]
    rows = failure_anatomy(records)
    by_key = {(r["method"], r["budget"]): r for r in rows}
    selfcest = by_key[("selfcest", 256)]
    assert (selfcest["n"], selfcest["wrong"], selfcest["wrong_alone"]) == (4, 3, 1)
    assert (selfcest["combine_addition"], selfcest["part_terms"]) == (2, 1)
    assert sum(selfcest[kind] for kind in FAILURE_KINDS) == selfcest["wrong"]
    assert by_key[("base", 256)]["wrong"] == 0 and by_key[("base", 256)]["part_steps_right"] == 1.0
    assert by_key[("selfcest", 128)]["n"] == 1

    text = failure_anatomy_markdown(rows, 256)
    for order in (["base", "selfcest"], ["selfcest", "base"]):  # the tables follow the sweep's method order
        table = failure_anatomy_markdown(rows, 256, order)
        assert table.index(f"| `{order[0]}` |") < table.index(f"| `{order[1]}` |")
    assert "### `arithmetic/ood`" in text
    assert "`selfcest` combining: addition (2 of 3)" in text
    assert "`base` " not in text.split("Most common first failure:")[1]  # no wrong answers to place
    assert failure_anatomy_markdown(rows, 512) == ""


def test_half_leaf_results_count_clones_alone_by_key_and_the_sign_their_half_starts_with() -> None:
    """The second half's halves: `6-1` starts with a positive term, and in a sum with `-6` there its
    `first half` starts with a subtracted one, the kind the warm-up's teacher never shows a clone."""
    question = "Calculate the value of 4+5-3+2-6-1+7+1."  # second half -6-1+7+1 = 1: halves -6-1, 7+1
    agents = [
        _agent("root", "8+1=9\nAnswer: 9", "9", children=[[1, 2]]),
        _agent("root/turn1_clone0", "4+5=9\n9-3=6\n6+2=8\nAnswer: 8", "8", keys=("first half",)),
        _agent("root/turn1_clone1", "-7+8=1\nAnswer: 1", "1", keys=("second half",), children=[[1, 2]]),
        _agent("root/turn1_clone1/turn1_clone0", "1-1=0\nAnswer: 0", "0", keys=("first half",)),
        _agent("root/turn1_clone1/turn1_clone1", "7+1=8\nAnswer: 8", "8", keys=("second half",)),
    ]
    record = {**_record(agents), "question": question}
    rows = {
        (r["key"], r["lead"]): (r["n"], r["right"])
        for r in half_leaf_results([record, _record(_alone("x", "1"))])
    }
    # the clone with children is no leaf; the root is no clone; -6-1 answered 0 is wrong
    assert rows == {("first half", "+"): (1, 1), ("first half", "-"): (1, 0), ("second half", "+"): (1, 1)}
