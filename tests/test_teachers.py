"""Warm-up teachers: every conversation they write is correct, parseable and varied."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest
from scripted_policies import halving_policy, last_user

from selfcest.data.arithmetic import evaluate_expression
from selfcest.data.qa import RELATIONS, SyntheticSplitConfig, synthetic_record
from selfcest.prompts import THINKING_SYSTEM_PROMPT, arithmetic_question
from selfcest.protocol import extract_answer, parse_tool_calls
from selfcest.teachers import (
    TeacherConfig,
    arithmetic_conversations,
    arithmetic_root_conversation,
    build_warmup_conversations,
    format_terms,
    paragraph_facts,
    parse_terms,
    qa_conversations,
)

_TASK = re.compile(r"^Calculate the value of (.+)\.$")
_RESPONSE = re.compile(r"^turn(\d+)_clone(\d+): (.+)$")


def _replay_arithmetic_root(messages: list[dict[str, str]]) -> tuple[int, list[int]]:
    """Check every spawned task against its tool response; return (final answer, clones per turn)."""
    clones_per_turn = []
    turns = [m for m in messages if m["role"] in ("assistant", "tool")]
    for index, message in enumerate(turns):
        if message["role"] != "assistant" or index == len(turns) - 1:
            continue
        parsed = parse_tool_calls(message["content"], max_calls=2, max_objectives=8)
        assert not parsed.errors and len(parsed.calls) == 1
        tasks = [_TASK.match(o.task).group(1) for o in parsed.calls[0].objectives]
        responses = [_RESPONSE.match(line).groups() for line in turns[index + 1]["content"].splitlines()]
        assert [int(r[1]) for r in responses] == list(range(len(tasks)))
        assert {int(r[0]) for r in responses} == {len(clones_per_turn) + 1}
        for task, response in zip(tasks, responses, strict=True):
            assert int(response[2]) == evaluate_expression(task)
        clones_per_turn.append(len(tasks))
    return int(extract_answer(turns[-1]["content"])), clones_per_turn


def test_arithmetic_roots_are_correct_and_reduce_long_sums_through_clones() -> None:
    rng = random.Random(0)
    config = TeacherConfig(direct_root_fraction=0.0, chunk_sizes=(2, 3), max_root_combine=3)
    seen_turns = Counter()
    for _ in range(200):
        terms = [rng.choice([-1, 1]) * rng.randint(0, 9) for _ in range(rng.randint(2, 12))]
        conversation = arithmetic_root_conversation(terms, rng, config)
        answer, clones_per_turn = _replay_arithmetic_root(conversation["messages"])
        assert answer == sum(terms)
        # the root's own closing sum never has more terms than it may combine
        closing = conversation["messages"][-1]["content"].splitlines()
        assert len(closing) - 1 <= config.max_root_combine - 1
        seen_turns[len(clones_per_turn)] += 1
    assert seen_turns[1] and seen_turns[2]  # short problems in one turn, long ones in a tree


_STEP = re.compile(r"^(-?\d+)([+-])(\d+)=(-?\d+)$")


def _assert_solution_is_right(text: str, expr: str) -> None:
    """Every step line of a sum's solution adds the next term to the previous result, and the
    answer is the expression's value; a thinking solution's check (after "Check:") redoes them."""
    terms = parse_terms(expr)
    body, _, answer = text.rpartition("Answer:")
    assert int(answer) == evaluate_expression(expr) == sum(terms)
    for block in body.split("Check:"):
        steps = [_STEP.match(line).groups() for line in block.strip().splitlines()]
        assert len(steps) == len(terms) - 1
        total = terms[0]
        for (left, sign, operand, right), term in zip(steps, terms[1:], strict=True):
            assert int(left) == total and (1 if sign == "+" else -1) * int(operand) == term
            total += term
            assert int(right) == total


def test_warmup_mix_is_seeded_varied_and_parseable() -> None:
    rng = random.Random(1)
    arithmetic = [
        {"expr": format_terms([rng.choice([-1, 1]) * rng.randint(0, 9) for _ in range(rng.randint(2, 8))])}
        for _ in range(60)
    ]
    qa = [synthetic_record(rng, SyntheticSplitConfig(count=1), split="train", index=i) for i in range(10)]
    config = TeacherConfig(thinking_fraction=0.5)
    first = build_warmup_conversations(arithmetic, qa, seed=3, config=config)
    again = build_warmup_conversations(arithmetic, qa, seed=3, config=config)
    assert json.dumps(first) == json.dumps(again)
    kinds = Counter(c["kind"] for c in first)
    assert kinds["arith_mono"] == 60 and 15 <= kinds["arith_thinking"] <= 45
    assert kinds["arith_root_direct"] and kinds["arith_root_delegate"] and kinds["qa_root"] == 10
    for conversation in first:
        last = conversation["messages"][-1]
        assert last["role"] == "assistant" and extract_answer(last["content"]) is not None
        if conversation["kind"] in ("arith_mono", "arith_thinking", "arith_clone"):
            expr = _TASK.match(conversation["messages"][1]["content"]).group(1)
            _assert_solution_is_right(last["content"], expr)
    assert {"arith_mono", "arith_thinking", "arith_clone"} <= set(kinds)
    assert any("-" in c["messages"][1]["content"] for c in first if c["kind"] == "arith_clone")


def test_qa_root_hands_each_hop_the_paragraph_that_answers_it() -> None:
    rng = random.Random(2)
    for index in range(20):
        record = synthetic_record(rng, SyntheticSplitConfig(count=1), split="train", index=index)
        [root] = [c for c in build_warmup_conversations([], [record], seed=index) if c["kind"] == "qa_root"]
        # The root sees the keys, then the question last, next to its reply (not the keys' text).
        user = root["messages"][1]["content"]
        assert user.endswith("\n" + record["question"])
        assert all(key in user.split("\n")[0] for key in (p["key"] for p in record["paragraphs"]))
        assert not any(p["text"] in user for p in record["paragraphs"])
        calls = [m for m in root["messages"] if m["role"] == "assistant"][:-1]
        assert len(calls) == len(record["hops"])
        for call, hop in zip(calls, record["hops"], strict=True):
            parsed = parse_tool_calls(call["content"], max_calls=1, max_objectives=1)
            [objective] = parsed.calls[0].objectives
            assert objective.task == hop["question"] and objective.context[0] == hop["paragraph_key"]
            # The key is written before the task (a fixed distance after the name it copies).
            assert call["content"].index('"context"') < call["content"].index('"task"')
        assert extract_answer(root["messages"][-1]["content"]) == record["answers"][0]


def test_qa_thinking_quotes_the_monolithic_facts_checks_them_and_answers() -> None:
    rng = random.Random(4)
    records = [
        synthetic_record(rng, SyntheticSplitConfig(count=1), split="train", index=i) for i in range(40)
    ]
    config = TeacherConfig(qa_thinking_fraction=0.5)
    conversations = build_warmup_conversations([], records, seed=5, config=config)
    thinking = [c for c in conversations if c["kind"] == "qa_thinking"]
    assert 8 <= len(thinking) <= 32  # about half the records, not every one
    by_question = {c["messages"][1]["content"]: c for c in conversations if c["kind"] == "qa_mono"}
    for conversation in thinking:
        system, user, reply = (m["content"] for m in conversation["messages"])
        assert system == THINKING_SYSTEM_PROMPT and not conversation["tools"]
        # The same reading as the monolithic conversation of that record, then a check of every fact.
        mono = by_question[user]["messages"][-1]["content"].split("\n")
        facts, answer = mono[:-1], mono[-1]
        assert facts and all(facts)
        assert reply.split("\n") == [*facts, "Check:", *facts, answer]
    assert not any(
        c["kind"] == "qa_thinking"
        for c in build_warmup_conversations([], records, seed=5, config=TeacherConfig())
    )


class CountingRandom(random.Random):
    """random.Random that counts its `random()` draws."""

    draws = 0

    def random(self) -> float:
        self.draws += 1
        return super().random()


def test_zero_qa_thinking_fraction_draws_nothing() -> None:
    """At 0 the teachers draw exactly what they drew before QA thinking existed, so a warm-up with
    the fraction at 0 reproduces the older warm-ups' data; any positive fraction draws once per record."""
    record = synthetic_record(random.Random(6), SyntheticSplitConfig(count=1), split="train", index=0)
    draws = {}
    for fraction in (0.0, 1.0):
        rng = CountingRandom(7)
        conversations = qa_conversations(record, rng, TeacherConfig(qa_thinking_fraction=fraction))
        draws[fraction] = rng.draws
        assert sum(c["kind"] == "qa_thinking" for c in conversations) == int(fraction)
    assert draws[1.0] == draws[0.0] + 1


def test_qa_clone_answers_from_its_paragraph_and_fails_only_without_one() -> None:
    """A clone that holds the hop's paragraph answers with the sentence that states the answer; the
    `failed` replies come only from clones handed no paragraph (a root that forgot the key)."""
    rng = random.Random(4)
    records = [
        synthetic_record(rng, SyntheticSplitConfig(count=1), split="train", index=i) for i in range(30)
    ]
    config = TeacherConfig(qa_failed_clone_fraction=0.3)
    clones = [
        c for c in build_warmup_conversations([], records, seed=1, config=config) if c["kind"] == "qa_clone"
    ]
    failed = [c for c in clones if "failed" in c["messages"][-1]["content"]]
    assert 0 < len(failed) < len(clones)
    for clone in clones:
        prompt, reply = clone["messages"][1]["content"], clone["messages"][-1]["content"]
        handed = re.findall(r"^\[(\w+)\] ", prompt, flags=re.M)
        if clone in failed:
            assert not handed
            continue
        answer = extract_answer(reply)
        fact = reply.splitlines()[0]
        assert handed and answer in fact and fact in prompt


def test_paragraph_facts_reads_every_relation_sentence_and_no_filler() -> None:
    text = "Tote was founded by Kape. Tote is led by Zorine. Tote makes bread. Tote is based in Lora."
    assert paragraph_facts(text) == [
        ("Who founded Tote?", "Kape", "Tote was founded by Kape."),
        ("Who leads Tote?", "Zorine", "Tote is led by Zorine."),
        ("In which city is Tote based?", "Lora", "Tote is based in Lora."),
    ]
    assert paragraph_facts("The capital of Noba is Mira. Noba has many rivers.") == [
        ("What is the capital of Noba?", "Mira", "The capital of Noba is Mira.")
    ]
    assert paragraph_facts("Zono is a teacher. Zono likes long walks.") == []
    assert paragraph_facts("") == []


def test_reading_drills_ask_facts_that_the_handed_paragraph_states() -> None:
    rng = random.Random(5)
    records = [
        synthetic_record(rng, SyntheticSplitConfig(count=1), split="train", index=i) for i in range(20)
    ]
    config = TeacherConfig(qa_reading_drills=2, qa_failed_clone_fraction=0.0, qa_extra_keys_fraction=0.0)
    clones = [
        c for c in build_warmup_conversations([], records, seed=3, config=config) if c["kind"] == "qa_clone"
    ]
    hop_questions = [h["question"] for r in records for h in r["hops"]]
    assert len(clones) == len(hop_questions) + 2 * len(records)
    asks = {relation.ask.split("{x}")[0] for relation in RELATIONS.values()}
    paragraphs = {(p["key"], p["text"]) for r in records for p in r["paragraphs"]}
    drills = 0
    for clone in clones:
        prompt, reply = clone["messages"][1]["content"], clone["messages"][-1]["content"]
        [(key, text)] = re.findall(r"^\[(\w+)\] (.*)$", prompt, flags=re.M)
        question = prompt.splitlines()[-1]
        fact, answer = reply.splitlines()[0], extract_answer(reply)
        assert (key, text) in paragraphs and fact in text and fact.endswith(f"{answer}.")
        assert any(question.startswith(ask) for ask in asks) and key in question
        drills += question not in hop_questions
    assert drills > 0


def test_root_only_qa_records_add_their_root_conversation_and_nothing_else() -> None:
    rng = random.Random(5)
    records = [synthetic_record(rng, SyntheticSplitConfig(count=1), split="train", index=i) for i in range(6)]
    full, root_only = records[:2], records[2:]
    unteachable = {**root_only[0], "hops": []}  # no hop to delegate: a teacher cannot write it
    conversations = build_warmup_conversations(
        [], full, seed=4, qa_root_only_records=[*root_only, unteachable]
    )
    baseline = build_warmup_conversations([], full, seed=4)
    kinds = [c["kind"] for c in conversations]
    assert kinds.count("qa_root") == len(full) + len(root_only)
    for kind in ("qa_clone", "qa_mono"):
        assert kinds.count(kind) == [c["kind"] for c in baseline].count(kind)
    roots = "\n".join(c["messages"][1]["content"] for c in conversations if c["kind"] == "qa_root")
    assert all(record["question"] in roots for record in records)


def test_qa_clones_quote_the_asked_relations_sentence_when_two_name_the_answer() -> None:
    """Zed founded and leads Acme: "Who leads Acme?" quotes "Acme is led by Zed.", not the founding
    sentence that names Zed first."""
    text = "Acme was founded by Zed. Acme is based in Oslo. Acme is led by Zed."
    record = {
        "question": "Who leads Acme?",
        "answers": ["Zed"],
        "paragraphs": [{"key": "Acme", "title": "Acme", "text": text, "supporting": True}],
        "hops": [{"question": "Who leads Acme?", "answer": "Zed", "paragraph_key": "Acme"}],
    }
    config = TeacherConfig(qa_failed_clone_fraction=0.0, qa_extra_keys_fraction=0.0, qa_thinking_fraction=1.0)
    conversations = qa_conversations(record, random.Random(0), config)
    replies = [
        c["messages"][-1]["content"]
        for c in conversations
        if c["kind"] in ("qa_clone", "qa_mono", "qa_thinking")
    ]
    quoted = [
        line for reply in replies for line in reply.splitlines() if "Zed" in line and "Answer" not in line
    ]
    assert quoted and "Acme was founded by Zed." not in quoted


def test_clone_conversations_never_ask_a_held_out_problem_and_cover_reduction_turns() -> None:
    """A chunk of a training expression that is a whole test expression is redrawn (it would teach
    that test problem with its answer); reduction turns' sums of partial results are taught too."""
    records = [{"expr": "3+4-2+5"}, {"expr": "1+2+3+4+5+6+7+8+9-1-2-3"}] * 20
    held_out = ["3+4", "4-2", "-2+5", "3+4-2", "4-2+5", "1+2"]
    config = TeacherConfig(direct_root_fraction=0.0, chunk_sizes=(2, 3), max_root_combine=2)
    conversations = build_warmup_conversations(
        records, [], seed=3, config=config, held_out_expressions=held_out
    )
    asked = {c["messages"][-2]["content"] for c in conversations if c["kind"] == "arith_clone"}
    assert asked and not asked & {f"Calculate the value of {e}." for e in held_out}
    operands = [parse_terms(_TASK.match(q).group(1)) for q in asked]
    assert any(abs(term) > 9 for terms in operands for term in terms)  # a reduction turn's partial sums
    without = build_warmup_conversations(records, [], seed=3, config=config)
    assert {c["messages"][-2]["content"] for c in without if c["kind"] == "arith_clone"} & {
        f"Calculate the value of {e}." for e in held_out
    }  # the check is what keeps them out


# ---------------------------------------------------------------------------- halves
def _halves_agent_sum(conversation: dict) -> list[int]:
    """The sum an agent of a halves conversation holds: the root's prompt, or a clone's document."""
    message = conversation["messages"][1]["content"]
    if message.startswith("["):
        key, _, rest = message[1:].partition("] ")
        expr, _, task = rest.partition("\n")
        assert key in ("first half", "second half") and task == "sum"
        return parse_terms(expr)
    return parse_terms(_TASK.match(message).group(1))


def test_halves_teacher_delegates_long_sums_by_key_and_adds_the_two_answers() -> None:
    rng = random.Random(0)
    config = TeacherConfig(arithmetic_delegation="halves", halves_leaf_terms=5, halves_max_depth=3)
    seen = Counter()
    for _ in range(300):
        terms = [rng.choice([-1, 1]) * rng.randint(0, 9) for _ in range(rng.randint(2, 8))]
        conversations = arithmetic_conversations(format_terms(terms), rng, config)
        kinds = [c["kind"] for c in conversations]
        assert kinds.count("arith_root_direct") + kinds.count("arith_root_delegate") == 1
        # the clone holding the whole sum, and one clone from the trees when there is one
        assert (
            kinds.count("arith_half_clone") == 2
            if len(terms) > 5
            else 1 <= kinds.count("arith_half_clone") <= 2
        )
        for conversation in conversations:
            if not conversation["kind"].startswith(("arith_root", "arith_half")):
                continue
            held = _halves_agent_sum(conversation)
            turns = conversation["messages"][2:]
            seen[(conversation["kind"], len(turns))] += 1
            if len(held) > config.halves_leaf_terms and conversation["tools"]:
                assert len(turns) == 3  # a long sum is always halved by an agent holding the tool
            if len(turns) == 1:
                _assert_solution_is_right(turns[0]["content"], format_terms(held))
                continue
            assert conversation["tools"]  # only an agent holding the tool delegates
            [call] = parse_tool_calls(turns[0]["content"], max_calls=2, max_objectives=8).calls
            assert [(o.context, o.task) for o in call.objectives] == [
                (["first half"], "sum"),
                (["second half"], "sum"),
            ]
            middle = (len(held) + 1) // 2
            sums = [sum(held[:middle]), sum(held[middle:])]
            assert turns[1]["content"] == f"turn1_clone0: {sums[0]}\nturn1_clone1: {sums[1]}"
            assert int(extract_answer(turns[2]["content"])) == sum(held)
            _assert_solution_is_right(turns[2]["content"], format_terms(sums))
    # short sums are sometimes halved anyway, and clones of every size solve or halve
    assert seen[("arith_root_direct", 1)] and seen[("arith_root_delegate", 3)]
    assert seen[("arith_half_clone", 1)] and seen[("arith_half_clone", 3)]


def test_halves_clones_never_hold_a_held_out_sum() -> None:
    config = TeacherConfig(arithmetic_delegation="halves", halves_needless_fraction=1.0)
    terms = [3, -4, 5, 1, -2, 6, 7, -8]
    held_out = {arithmetic_question("3-4+5+1"), arithmetic_question("3-4+5+1-2+6-7+8")}
    for seed in range(30):
        for conversation in arithmetic_conversations(
            format_terms(terms), random.Random(seed), config, held_out
        ):
            if conversation["kind"] == "arith_half_clone":
                assert arithmetic_question(format_terms(_halves_agent_sum(conversation))) not in held_out


def test_halves_conversations_are_what_the_runtime_renders(tiny_tokenizer) -> None:
    """The prompts the teacher trains on are the runtime's, token for token: the root's, and those
    of clones holding a half at depth 1 (with the tool) and at the last depth (without it)."""
    from selfcest.runtime import Runtime, RuntimeConfig, Task
    from selfcest.scripted import ScriptedEngine

    terms = [3, -4, 5, 1, -2, 6, 7, -8, 9, 1, 2, -3]
    config = TeacherConfig(arithmetic_delegation="halves", halves_max_depth=2)
    teacher: dict[str, set[str]] = {}  # a sum's prompts: with the tool (depth 1) and without (depth 2)
    for seed in range(40):  # both keys for the whole-sum clones, and draws of every tree node
        for expr in (format_terms(terms), format_terms(terms[:6]), format_terms(terms[6:])):
            for conversation in arithmetic_conversations(expr, random.Random(seed), config):
                if conversation["kind"].startswith(("arith_root", "arith_half")):
                    tools = json.loads(conversation["tools"]) if conversation["tools"] else None
                    teacher.setdefault(conversation["messages"][1]["content"], set()).add(
                        tiny_tokenizer.apply_chat_template(
                            conversation["messages"][:2],
                            tools=tools,
                            add_generation_prompt=True,
                            tokenize=False,
                        )
                    )
    runtime_prompts: dict[str, str] = {}

    def policy(prompt: str) -> str:
        held = last_user(prompt).split("<|im_end|>", 1)[0]
        if "<tool_response>" not in held:
            runtime_prompts[held] = prompt
        return halving_policy(prompt)

    runtime = Runtime(
        ScriptedEngine(tiny_tokenizer, policy), RuntimeConfig(expression_halves=True, expression_max_depth=2)
    )
    [episode] = runtime.run([Task("t", arithmetic_question(format_terms(terms)))])
    assert episode.final_answer == str(sum(terms))
    assert sorted(a.depth for a in episode.agents) == [0, 1, 1, 2, 2, 2, 2]
    assert set(runtime_prompts) <= set(teacher)  # every prompt the runtime wrote, the teacher taught
    for held, prompt in runtime_prompts.items():
        assert prompt in teacher[held], held


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"chunk_sizes": (1,)}, r"warmup\.teacher\.chunk_sizes: every size must be >= 2"),
        ({"chunk_sizes": ()}, r"warmup\.teacher\.chunk_sizes"),
        ({"max_root_combine": 0}, r"warmup\.teacher\.max_root_combine: expected >= 1"),
    ],
)
def test_teacher_settings_that_would_never_end_a_root_are_refused(setting: dict, message: str) -> None:
    """`chunk_sizes: [1]` hung the warm-up's data building: chunks of one term never shorten a sum."""
    with pytest.raises(ValueError, match=message):
        TeacherConfig(**setting)


@pytest.mark.parametrize("long_fraction", [0.0, 0.5, 1.0])
def test_halves_long_fraction_sets_how_often_long_sums_are_halved(long_fraction: float) -> None:
    """Below 1 a long sum's root solves alone that share of the time: the warm-up then teaches both
    strategies at every length and leaves the choice to RL; 1 (the default) always halves."""
    config = TeacherConfig(
        arithmetic_delegation="halves", halves_long_fraction=long_fraction, halves_needless_fraction=0.0
    )
    terms = [3, -4, 5, 1, -2, 6, 7, -8]  # longer than halves_leaf_terms (5)
    kinds = Counter(
        conversation["kind"]
        for seed in range(200)
        for conversation in arithmetic_conversations(format_terms(terms), random.Random(seed), config)
        if conversation["kind"].startswith("arith_root")
    )
    assert kinds["arith_root_delegate"] + kinds["arith_root_direct"] == 200
    if long_fraction in (0.0, 1.0):
        assert kinds["arith_root_delegate"] == 200 * long_fraction
    else:
        assert 70 <= kinds["arith_root_delegate"] <= 130  # seeded: 200 draws at 0.5


def test_halves_negative_lead_fraction_hands_clones_halves_that_start_with_a_subtracted_term() -> None:
    """Training problems start with a positive term, so by default no clone holds a `first half`
    starting with a subtracted term; with the share above 0 the clone handed the whole sum sometimes
    holds it with its first term negated, and that clone and its own halves answer their own sums."""
    terms = [3, -4, 5, 1, -2, 6, 7, -8]

    def half_clones(fraction: float) -> list[tuple[str, list[int], dict]]:
        config = TeacherConfig(arithmetic_delegation="halves", halves_negative_lead_fraction=fraction)
        held = []
        for seed in range(200):
            for conversation in arithmetic_conversations(format_terms(terms), random.Random(seed), config):
                if conversation["kind"] == "arith_half_clone":
                    key = conversation["messages"][1]["content"][1:].partition("]")[0]
                    held.append((key, _halves_agent_sum(conversation), conversation))
        return held

    assert not [h for key, h, _ in half_clones(0.0) if key == "first half" and h[0] < 0]
    negated = [-terms[0], *terms[1:]]
    clones = half_clones(0.5)
    wholes = [h for _, h, _ in clones if len(h) == len(terms)]
    assert negated in wholes and terms in wholes
    assert [h for key, h, _ in clones if key == "first half" and h[0] < 0 and len(h) > 1]
    for _, held, conversation in clones:
        assert int(extract_answer(conversation["messages"][-1]["content"])) == sum(held)


@pytest.mark.parametrize(
    "name",
    [
        "halves_long_fraction",
        "halves_needless_fraction",
        "halves_negative_lead_fraction",
        "qa_extra_keys_fraction",
    ],
)
@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_teacher_shares_outside_zero_to_one_are_refused_by_name(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"warmup\.teacher\.{name}: expected a share in \[0, 1\]"):
        TeacherConfig(**{name: value})
