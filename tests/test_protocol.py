from __future__ import annotations

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from selfcest.protocol import (
    MAX_CALL_CHARS,
    MAX_REPAIR_CHARS,
    CloneOutcome,
    extract_answer,
    format_tool_response,
    parse_tool_calls,
)
from selfcest.scoring import extract_last_answer


def call(objectives: object, **extra: object) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": "spawn_clone", "arguments": {"objectives": objectives, **extra}})
        + "\n</tool_call>"
    )


def test_parses_objectives_with_task_context_and_budget() -> None:
    text = "Let me split.\n" + call([{"task": "1+2", "context": ["a"], "max_tokens": 12}, {"task": "3+4"}])
    parsed = parse_tool_calls(text, max_calls=2, max_objectives=8, known_context_keys=["a"])
    assert parsed.errors == []
    assert parsed.repairs == 0
    [tool_call] = parsed.calls
    assert [(o.task, o.context, o.max_tokens) for o in tool_call.objectives] == [
        ("1+2", ["a"], 12),
        ("3+4", [], None),
    ]


def test_repairs_malformed_json_and_counts_it() -> None:
    text = '<tool_call>\n{"name": "spawn_clone", "arguments": {"objectives": [{"task": "1+2", "max_tokens": 5}]\n</tool_call>'
    parsed = parse_tool_calls(text, max_calls=2, max_objectives=8)
    assert parsed.repairs == 1
    assert parsed.calls[0].objectives[0].task == "1+2"


def test_unclosed_call_at_end_of_turn_is_still_read() -> None:
    parsed = parse_tool_calls(
        '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["5-3"]}}',
        max_calls=1,
        max_objectives=8,
    )
    assert parsed.calls[0].objectives[0].task == "5-3"


def test_release_shared_context_and_string_objectives() -> None:
    parsed = parse_tool_calls(call(["q1", "q2"], shared_context=["k"]), max_calls=1, max_objectives=8)
    assert [o.context for o in parsed.calls[0].objectives] == [["k"], ["k"]]


def test_a_context_key_given_twice_is_handed_once() -> None:
    """`first half` twice is still one half: the runtime treats a clone holding exactly one half key
    as holding that half, which it may halve again."""
    text = call([{"task": "sum", "context": ["first half", "first half"]}], shared_context=["k", "k"])
    [tool_call] = parse_tool_calls(text, max_calls=1, max_objectives=8).calls
    assert tool_call.objectives[0].context == ["k", "first half"]


def test_an_unusable_objective_keeps_its_place_and_a_call_of_only_those_spawns_nothing() -> None:
    parsed = parse_tool_calls(call([{"task": ""}, 7, {"task": "q"}]), max_calls=1, max_objectives=8)
    [tool_call] = parsed.calls
    assert [(o.task, o.invalid) for o in tool_call.objectives] == [
        ("", "no task"),
        ("", "not an object but int"),
        ("q", None),
    ]
    assert [e.kind for e in parsed.errors] == ["invalid_objective", "invalid_objective"]
    parsed = parse_tool_calls(call([{"task": " "}]), max_calls=1, max_objectives=8)
    assert parsed.usable_calls == [] and [e.kind for e in parsed.errors] == [
        "invalid_objective",
        "no_objectives",
    ]
    assert [o.invalid for c in parsed.calls for o in c.objectives] == ["no task"]  # its place is kept


def test_a_call_of_unusable_objectives_keeps_their_places_in_the_turns_numbering() -> None:
    """The call was dropped, so a valid call after it took its places: the root read the first
    valid objective's answer as `turn1_clone0`, its unusable first objective's place."""
    text = call([{"task": ""}]) + call([{"task": "task A"}, {"task": "task B"}])
    parsed = parse_tool_calls(text, max_calls=2, max_objectives=8)
    places = [o.task or o.invalid for c in parsed.calls for o in c.objectives]
    assert places == ["no task", "task A", "task B"]
    assert [len(c.objectives) for c in parsed.usable_calls] == [2]


def test_a_block_that_is_no_call_does_not_count_towards_the_call_limit() -> None:
    text = (
        "<tool_call>junk</tool_call>" + call([{"task": "A"}]) + call([{"task": "B"}]) + call([{"task": "C"}])
    )
    parsed = parse_tool_calls(text, max_calls=2, max_objectives=8)
    assert [o.task for c in parsed.calls for o in c.objectives] == ["A", "B"]
    assert [e.kind for e in parsed.errors] == ["invalid_json", "too_many_calls"]
    assert parsed.errors[-1].detail == "1 blocks after call 2, limit 2"


def test_limits_and_bad_fields_become_protocol_errors() -> None:
    text = call([{"task": str(i)} for i in range(12)]) * 3 + call(
        [{"task": "x", "max_tokens": -4, "context": ["nope"]}]
    )
    parsed = parse_tool_calls(text, max_calls=2, max_objectives=5, known_context_keys=["k"])
    kinds = {e.kind for e in parsed.errors}
    assert {"too_many_calls", "too_many_clones"} <= kinds
    assert len(parsed.calls) == 2
    assert all(len(c.objectives) == 5 for c in parsed.calls)
    parsed = parse_tool_calls(
        call([{"task": "x", "max_tokens": -4, "context": ["nope"]}]),
        max_calls=2,
        max_objectives=5,
        known_context_keys=["k"],
    )
    assert {e.kind for e in parsed.errors} == {"invalid_max_tokens", "unknown_context_key"}
    assert parsed.calls[0].objectives[0].context == []
    assert parsed.calls[0].objectives[0].max_tokens is None


def test_other_tools_garbage_and_code_are_errors_never_executed() -> None:
    for text in [
        '<tool_call>{"name": "os.system", "arguments": {"cmd": "rm -rf /"}}</tool_call>',
        "<tool_call>__import__('os').system('echo pwned')</tool_call>",
        "<tool_call>[1, 2, 3]</tool_call>",
        '<tool_call>{"name": "spawn_clone", "arguments": 7}</tool_call>',
        '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": [{"no_task": 1}]}}</tool_call>',
    ]:
        parsed = parse_tool_calls(text, max_calls=2, max_objectives=5)
        assert parsed.usable_calls == []
        assert parsed.errors, text


def test_answer_comes_from_the_last_marker() -> None:
    assert extract_answer("Answer: 3\nwait, redo\nAnswer:  42 \nmore") == "42"
    assert extract_answer("no marker") is None
    assert extract_answer("Answer:   ") is None


def test_tool_response_format_and_token_truncation(tiny_tokenizer) -> None:
    outcomes = [CloneOutcome("19"), CloneOutcome(None, "hit its token limit"), CloneOutcome("9" * 500)]
    message = format_tool_response(1, outcomes, tiny_tokenizer, line_max_tokens=40, message_max_tokens=100)
    lines = message.split("\n")
    assert lines[0] == "turn1_clone0: 19"
    assert lines[1] == "turn1_clone1: failed (hit its token limit)"
    assert lines[2].startswith("turn1_clone2: 999")
    assert len(tiny_tokenizer.encode(lines[2], add_special_tokens=False)) <= 40
    assert len(tiny_tokenizer.encode(message, add_special_tokens=False)) <= 100


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_any_text_parses_or_records_an_error_in_bounded_time(text: str) -> None:
    start = time.perf_counter()
    for candidate in (text, "<tool_call>" + text, "<tool_call>{" + text + "</tool_call>"):
        parsed = parse_tool_calls(candidate, max_calls=3, max_objectives=4, known_context_keys=["a"])
        assert len(parsed.calls) <= 3
        assert all(1 <= len(c.objectives) <= 4 for c in parsed.calls)
        assert all(set(o.context) <= {"a"} for c in parsed.calls for o in c.objectives)
        if "<tool_call>" in candidate and not parsed.calls:
            assert parsed.errors
        extract_answer(candidate)
    assert time.perf_counter() - start < 5.0


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=30,
    )
)
def test_any_json_arguments_never_raise(arguments: object) -> None:
    text = "<tool_call>" + json.dumps({"name": "spawn_clone", "arguments": arguments}) + "</tool_call>"
    parsed = parse_tool_calls(text, max_calls=2, max_objectives=3)
    assert parsed.calls or parsed.errors


def test_a_cut_answer_never_reads_as_a_whole_one(tiny_tokenizer) -> None:
    """The message was cut mid-line: a root of 16 clones that all answered 123456 read
    `turn1_clone10: 12` and nothing of the clones after it."""
    outcomes = [CloneOutcome("123456")] * 16
    whole = format_tool_response(1, outcomes, tiny_tokenizer, line_max_tokens=32, message_max_tokens=1000)
    assert whole.split("\n") == [f"turn1_clone{i}: 123456" for i in range(16)]
    limit = len(tiny_tokenizer.encode(whole, add_special_tokens=False)) // 2
    message = format_tool_response(1, outcomes, tiny_tokenizer, line_max_tokens=32, message_max_tokens=limit)
    *shown, note = message.split("\n")
    assert shown == [f"turn1_clone{i}: 123456" for i in range(len(shown))] and 0 < len(shown) < 16
    assert note == f"({16 - len(shown)} more clone answers left out: message limit)"
    assert len(tiny_tokenizer.encode(message, add_special_tokens=False)) <= limit
    line_limit = len(tiny_tokenizer.encode("turn1_clone0: 123456", add_special_tokens=False)) - 1
    [cut] = format_tool_response(
        1, outcomes[:1], tiny_tokenizer, line_max_tokens=line_limit, message_max_tokens=1000
    ).split("\n")
    assert cut.startswith("turn1_clone0: ") and cut.endswith("...")
    assert len(tiny_tokenizer.encode(cut, add_special_tokens=False)) <= line_limit


def test_tool_message_truncation_stays_within_its_token_limit(tiny_tokenizer) -> None:
    """Cutting multi-byte characters mid-way used to leave U+FFFD and re-encode past the limit."""
    outcomes = [CloneOutcome("🙂" * 40), CloneOutcome("é" * 50 + " done")]
    message = format_tool_response(1, outcomes, tiny_tokenizer, line_max_tokens=16, message_max_tokens=24)
    assert "\ufffd" not in message
    assert len(tiny_tokenizer.encode(message, add_special_tokens=False)) <= 24
    for line in message.split("\n"):
        assert len(tiny_tokenizer.encode(line, add_special_tokens=False)) <= 16


def test_an_unparseable_number_costs_one_call_not_the_turn() -> None:
    huge = "9" * 5000  # json.loads raises ValueError (not JSONDecodeError) past 4,300 digits
    bad = (
        '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": [{"task": "x", "max_tokens": '
        + huge
        + "}]}}</tool_call>"
    )
    good = '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": [{"task": "Add 1 and 2."}]}}</tool_call>'
    parsed = parse_tool_calls(bad + good, max_calls=2, max_objectives=4)
    assert [o.task for call in parsed.calls for o in call.objectives][-1] == "Add 1 and 2."


def test_long_malformed_calls_are_rejected_not_repaired() -> None:
    """json_repair's time grows with the square of a body's length, so only short malformed calls are
    repaired; a long one is an error, while a long well-formed call is still read."""
    head = '{"name": "spawn_clone", "arguments": {"objectives": ["'
    short = parse_tool_calls("<tool_call>" + head + "Say 1.", max_calls=2, max_objectives=4)
    assert short.repairs == 1 and [o.task for c in short.calls for o in c.objectives] == ["Say 1."]
    long_body = (head + 'a"b' * MAX_REPAIR_CHARS)[: MAX_REPAIR_CHARS + 100]
    long = parse_tool_calls("<tool_call>" + long_body, max_calls=2, max_objectives=4)
    assert not long.calls and long.repairs == 0
    assert [e.kind for e in long.errors] == ["call_too_long"]
    tasks = [f"Calculate the value of {i}+{i}." for i in range(4)]
    well_formed = call([{"task": task + " " * (MAX_REPAIR_CHARS // 4)} for task in tasks])
    assert MAX_REPAIR_CHARS < len(well_formed) < MAX_CALL_CHARS
    parsed = parse_tool_calls(well_formed, max_calls=2, max_objectives=4)
    assert [o.task for c in parsed.calls for o in c.objectives] == tasks and not parsed.errors


def test_a_turns_repairs_share_one_allowance() -> None:
    """A block that does not parse does not count towards `max_calls`, so a per-call repair limit let
    one turn repair block after block (four adversarial 4,000-character blocks: 8 s). The turn's
    malformed JSON is repaired up to MAX_REPAIR_CHARS characters in all; the blocks past that are
    errors, and a well-formed call after them is still read."""
    head = '{"name": "spawn_clone", "arguments": {"objectives": ["'
    body = head + "Say 1." + "-" * (MAX_REPAIR_CHARS // 2)  # unclosed: 2,110 characters to repair
    text = "".join(f"<tool_call>{body}</tool_call>" for _ in range(3)) + call([{"task": "Add 1 and 2."}])
    parsed = parse_tool_calls(text, max_calls=4, max_objectives=4)
    assert parsed.repairs == 1
    assert [e.kind for e in parsed.errors] == ["repair_limit", "repair_limit"]
    assert "left of the turn's 4096-character repair allowance" in parsed.errors[0].detail
    assert [o.task[:6] for c in parsed.calls for o in c.objectives] == ["Say 1.", "Add 1 "]
    # A new turn has a new allowance.
    assert parse_tool_calls(f"<tool_call>{body}</tool_call>", max_calls=4, max_objectives=4).repairs == 1


def test_a_tool_message_cut_below_its_note_still_ends_in_the_cut_marker(tiny_tokenizer) -> None:
    """When not even the `left out` note fits, the message is cut mid-line: that cut must not read
    as a whole answer (`98765432` of `9876543210`)."""
    outcomes = [CloneOutcome("12"), CloneOutcome("9876543210 is the sum of all those numbers here")]
    message = format_tool_response(1, outcomes, tiny_tokenizer, line_max_tokens=32, message_max_tokens=20)
    assert message.startswith("turn1_clone0: 12\n") and message.endswith("...")
    assert len(tiny_tokenizer.encode(message, add_special_tokens=False)) <= 20


def test_many_clones_cost_the_message_limit_not_the_whole_message_per_try(tiny_tokenizer) -> None:
    """Keeping whole lines under the message limit searched down from every line, re-encoding
    nearly the whole message per try (300 clones: 2.3 s a tool message); the tries now encode at
    most about the limit, whatever the clone count, and keep as many lines as fit."""
    encoded: list[int] = []
    encode = tiny_tokenizer.encode

    def counting_encode(text: str, **kwargs: object) -> list[int]:
        ids = encode(text, **kwargs)
        encoded.append(len(ids))
        return ids

    outcomes = [CloneOutcome(str(1000 + i)) for i in range(300)]
    tiny_tokenizer.encode = counting_encode
    try:
        message = format_tool_response(1, outcomes, tiny_tokenizer, line_max_tokens=16, message_max_tokens=64)
    finally:
        del tiny_tokenizer.encode
    *kept, note = message.split("\n")
    assert kept == [f"turn1_clone{i}: {1000 + i}" for i in range(len(kept))]
    assert note == f"({300 - len(kept)} more clone answers left out: message limit)"
    with_one_more = "\n".join(
        [*message.split("\n")[:-1], f"turn1_clone{len(kept)}: {1000 + len(kept)}", note]
    )
    assert len(encode(with_one_more, add_special_tokens=False)) > 64  # no further line fits
    # 300 one-line encodes, one of the whole message, then tries of at most the limit and a line.
    assert sorted(encoded)[-2] <= 64 + 16


def test_a_json_escaped_lone_surrogate_leaves_the_parser_as_a_replacement_character() -> None:
    """`"\\ud800"` is six ASCII characters a model can write, and json reads it as a lone surrogate,
    which no tokenizer encodes and no UTF-8 writer writes: the task that a clone's prompt is built
    from, and the details that an episode's record keeps, must hold U+FFFD instead. A pair written as
    two escapes is still the one character it spells."""
    text = (
        '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": [{"task": "add \\ud800 1 \\ud83d\\ude00",'
        ' "context": ["\\udfff", "a"], "max_tokens": "\\udc00"}]}}</tool_call>'
        '<tool_call>{"name": "\\ud801", "arguments": {}}</tool_call>'
    )
    parsed = parse_tool_calls(text, max_calls=2, max_objectives=4, known_context_keys=["a"])
    [objective] = parsed.calls[0].objectives
    assert (objective.task, objective.context) == ("add \ufffd 1 \U0001f600", ["a"])
    assert [e.kind for e in parsed.errors] == ["invalid_max_tokens", "unknown_context_key", "unknown_tool"]
    for error in parsed.errors:
        error.detail.encode("utf-8")
    repaired = parse_tool_calls(
        '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["x \\ud800 \\ud83d\\ude00"',
        max_calls=2,
        max_objectives=4,
    )
    assert repaired.repairs == 1 and repaired.calls[0].objectives[0].task == "x \ufffd \U0001f600"


def test_the_answer_line_ends_at_any_line_break_as_the_scorer_reads_it() -> None:
    """The runtime's answer (what a parent is told, and what QA scores) and the scorer's reading of
    the same text agree: a carriage return or other line break ends the answer's line too."""
    for text in [
        "Answer: Paris\rFrance",
        "Answer: Paris\u2028France",
        "Answer:\r\nParis\r\nFrance",
        "Answer: Paris",
    ]:
        assert extract_answer(text) == extract_last_answer(text) == "Paris"


def test_a_yes_no_budget_and_a_context_that_is_no_list_of_keys_are_protocol_errors() -> None:
    """`max_tokens: true` was read as 1 (int(True)), and a mapping as `context` (or items in it that
    are no key) was dropped without a word: each is the root's malformed argument, recorded as one."""
    parsed = parse_tool_calls(
        call(
            [
                {"task": "a", "max_tokens": True},
                {"task": "b", "context": {"k": "v"}},
                {"task": "c", "context": ["k", {"x": 1}]},
                {"task": "d", "context": ["k"], "max_tokens": 8},
            ]
        ),
        max_calls=2,
        max_objectives=8,
        known_context_keys=["k"],
    )
    assert [(e.kind, e.detail.split(":")[0]) for e in parsed.errors] == [
        ("invalid_max_tokens", "objective 0"),
        ("invalid_context", "objective 1"),
        ("invalid_context", "objective 2"),
    ]
    objectives = parsed.calls[0].objectives
    assert [(o.task, o.context, o.max_tokens) for o in objectives] == [
        ("a", [], None),
        ("b", [], None),
        ("c", ["k"], None),
        ("d", ["k"], 8),
    ]


def test_a_shared_context_that_is_no_list_of_keys_is_a_protocol_error() -> None:
    """The release's `shared_context` as a mapping (or with items that are no key) was dropped without
    a word, while the same in an objective's `context` is an error; the keys it does offer still apply."""
    for shared, keys in (({"k": "v"}, []), (["k", {"x": 1}], ["k"]), (["k"], ["k"])):
        parsed = parse_tool_calls(
            call([{"task": "a"}], shared_context=shared),
            max_calls=2,
            max_objectives=8,
            known_context_keys=["k"],
        )
        errors = [(e.kind, e.detail.split(":")[0]) for e in parsed.errors]
        assert errors == ([] if shared == ["k"] else [("invalid_context", "shared_context")]), shared
        assert parsed.calls[0].objectives[0].context == keys
