"""Programmatic teachers: the conversations the tiny model is warmed up on (default profile only).

The warm-up checkpoint plays the part Qwen3-4B-Instruct plays in the paper: the starting point of
every method. So it must be able to solve problems monolithically (and in a longer "thinking"
mode), act as a clone, and act as a root that delegates. Root conversations deliberately mix
strategies (solving directly, needless delegation, different split sizes, tight and generous
budgets) so that reinforcement learning has real choices to learn from, rather than one imitated
policy.

Arithmetic teachers cover the default profile's sums and differences (`+`/`-` only), which is what
the tiny model is trained on; the paper profile starts from an instruct model and skips warm-up.
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from selfcest.data.qa import fact_sentences, record_documents, sentences
from selfcest.halves import HALF_KEYS, format_terms, parse_terms, split_terms
from selfcest.prompts import (
    CLONE_SYSTEM_PROMPT,
    MONOLITHIC_SYSTEM_PROMPT,
    ROOT_SYSTEM_PROMPT,
    SPAWN_CLONE_TOOL,
    THINKING_SYSTEM_PROMPT,
    arithmetic_question,
    clone_user_message,
    qa_monolithic_question,
    qa_root_question,
)

Message = dict[str, str]


@dataclass
class TeacherConfig:
    """Mixture of warm-up conversations (counts per training problem, seeded)."""

    direct_root_fraction: float = 0.3
    """Share of root conversations that solve directly without delegating."""
    thinking_fraction: float = 1.0
    """Share of arithmetic problems that also get a thinking-mode (solve, then check) conversation.

    The thinking baseline only needs the style; its conversations are the longest arithmetic ones,
    so a fraction keeps warm-up steps for the skills every method shares."""
    chunk_sizes: tuple[int, ...] = (2, 3, 4, 5)
    """Terms per clone when a root delegates arithmetic; a size >= the problem is needless delegation."""
    tokens_per_step: int = 10
    """Rough clone cost per `a+b=c` line, used to pick budgets (tight: x1, generous: x2)."""
    max_root_combine: int = 3
    """Most partial results a delegating root adds up itself; with more, it hands groups of them to
    clones in another turn (a reduction tree), so no context ever holds a long sum."""
    qa_thinking_fraction: float = 0.0
    """Share of QA records that also get a thinking-mode conversation: the monolithic reader's
    quoted facts, then every fact quoted again as a check, then the answer. Without it the thinking
    baseline had never seen QA in its own style and answered exactly as `base` (same tokens)."""
    arithmetic_delegation: str = "chunks"
    """How delegating arithmetic agents split a sum. `chunks`: the root copies chunks of
    `chunk_sizes` terms into its clones' tasks and adds their answers up (in reduction turns when
    there are more than `max_root_combine`). `halves`: an agent hands the runtime-cut `first half`
    and `second half` of its sum to two clones by context key and adds the two answers; a clone
    holding a half may do the same (`selfcest.halves`; the runtime's `expression_halves`)."""
    halves_leaf_terms: int = 5
    """`halves`: an agent whose sum has more terms than this always delegates it."""
    halves_needless_fraction: float = 0.2
    """`halves`: share of agents with at most `halves_leaf_terms` terms that delegate anyway (a
    choice for RL to weigh: more tokens, shorter steps)."""
    halves_long_fraction: float = 1.0
    """`halves`: share of agents with more than `halves_leaf_terms` terms that delegate; the rest
    solve their sum alone. Below 1 the warm-up teaches both strategies for long sums too, so that
    *when* to delegate is left to RL, as in the paper, whose starting model has no delegation policy
    (with both fractions equal the teacher's choice does not depend on the sum's length at all)."""
    halves_max_depth: int = 3
    """`halves`: depth below which an agent holds the tool (the runtime's `expression_max_depth`)."""
    halves_negative_lead_fraction: float = 0.0
    """`halves`: share of the clone conversations that hand a whole training sum as a half in which
    that sum's first term is negated. Every training problem starts with a positive term, so without
    them no clone is ever handed a `first half` that starts with a subtracted term, nor a half of
    more than 4 terms that does; the halves of a longer sum's `second half` do (docs/results.md,
    "Session 53"). At 0 nothing is drawn, so the warm-up data keep their bytes."""
    qa_extra_keys_fraction: float = 0.2
    """Share of QA hops that hand the clone a needless extra paragraph."""
    qa_mono_distractors: tuple[int, int] = (1, 8)
    """Distractor paragraphs beside the supporting ones in monolithic QA warm-up (up to a full context)."""
    qa_reading_drills: int = 0
    """Extra clone conversations per QA record, each asking another fact stated in one of the record's
    paragraphs (in the words of that relation's hop question): more practice at the clone's whole job,
    finding the sentence that answers and copying its name, from data the record already has."""
    qa_failed_clone_fraction: float = 0.15
    """Share of QA clone conversations handed no paragraph at all (the root forgot the context key),
    which must answer `failed`. Why not a wrong paragraph: telling a wrong paragraph from the right one
    needs the name matching the tiny model learns last, so it learned to fail at random, and greedy
    decoding then picks the one frequent `failed` reply over the many names it spreads the rest over
    (measured: 1% clone accuracy with the gold paragraph; 80% after 700 clone-only steps without)."""

    def __post_init__(self) -> None:
        # A chunk of one term does not shorten the sum, and a root that adds up no operand itself
        # never stops handing them on: the root's reduction loop would never end.
        if not self.chunk_sizes or min(self.chunk_sizes) < 2:
            raise ValueError(
                f"warmup.teacher.chunk_sizes: every size must be >= 2, got {list(self.chunk_sizes)}"
            )
        fractions = (
            "direct_root_fraction",
            "thinking_fraction",
            "qa_thinking_fraction",
            "halves_needless_fraction",
            "halves_long_fraction",
            "halves_negative_lead_fraction",
            "qa_extra_keys_fraction",
            "qa_failed_clone_fraction",
        )
        for name in fractions:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"warmup.teacher.{name}: expected a share in [0, 1], got {value}")
        if self.max_root_combine < 1:
            raise ValueError(f"warmup.teacher.max_root_combine: expected >= 1, got {self.max_root_combine}")


def conversation(messages: list[Message], *, tools: bool, kind: str) -> dict[str, Any]:
    return {"messages": messages, "tools": json.dumps([SPAWN_CLONE_TOOL]) if tools else "", "kind": kind}


def _solo(system_prompt: str, question: str, answer: str, kind: str) -> dict[str, Any]:
    """A one-turn conversation without tools: system prompt, question, the teacher's answer."""
    messages = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer},
    ]
    return conversation(messages, tools=False, kind=kind)


# ---------------------------------------------------------------------------- arithmetic
def sum_steps(terms: Sequence[int]) -> list[str]:
    """One line per addition, `acc op term=new`: the step-by-step trace the tiny model can follow."""
    lines = []
    total = terms[0]
    for term in terms[1:]:
        new = total + term
        lines.append(f"{total}{'+' if term >= 0 else '-'}{abs(term)}={new}")
        total = new
    return lines


def solve_text(terms: Sequence[int]) -> str:
    return "\n".join([*sum_steps(terms), f"Answer: {sum(terms)}"])


def thinking_text(terms: Sequence[int]) -> str:
    """Serial long reasoning: solve, then check every step again (the "Thinking" baseline's style)."""
    steps = sum_steps(terms)
    return "\n".join([*steps, "Check:", *steps, f"Answer: {sum(terms)}"])


def spawn_call(objectives: list[dict[str, Any]]) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": "spawn_clone", "arguments": {"objectives": objectives}})
        + "\n</tool_call>"
    )


HELD_OUT_REDRAWS = 20
"""Draws of a clone chunk before a problem gives up its clone conversation (every chunk held out)."""


def arithmetic_conversations(
    expr: str, rng: random.Random, config: TeacherConfig, held_out: Collection[str] = frozenset()
) -> list[dict[str, Any]]:
    """Monolithic, thinking, clone-side and root-side conversations for one training problem.

    `held_out`: clone questions (`arithmetic_question` of a test or ood expression) that no clone
    conversation may ask, since it would teach that problem with its answer: a chunk of a longer
    training expression is often a whole short test expression (41% of the easy tier's test
    problems, measured before this check)."""
    terms = parse_terms(expr)
    question = arithmetic_question(expr)
    out = [_solo(MONOLITHIC_SYSTEM_PROMPT, question, solve_text(terms), "arith_mono")]
    if rng.random() < config.thinking_fraction:
        out.append(_solo(THINKING_SYSTEM_PROMPT, question, thinking_text(terms), "arith_thinking"))
    if config.arithmetic_delegation == "halves":
        return out + arithmetic_halves_conversations(terms, rng, config, held_out)
    if config.arithmetic_delegation != "chunks":
        raise ValueError(
            f"teacher arithmetic_delegation {config.arithmetic_delegation!r}: expected chunks or halves"
        )
    # Clone side: a random contiguous chunk, with its sign, as a clone would receive it.
    for _ in range(HELD_OUT_REDRAWS):
        start = rng.randrange(len(terms))
        chunk = terms[start : start + rng.choice(config.chunk_sizes)]
        if arithmetic_question(format_terms(chunk)) not in held_out:
            out.append(_arithmetic_clone(chunk))
            break
    reduction_clones: list[list[int]] = []
    out.append(arithmetic_root_conversation(terms, rng, config, reduction_clones))
    # The clones of a root's reduction turns add partial results (multi-digit operands), which the
    # chunks above never are: teach those tasks too, as the runtime will hand them out.
    out += [
        _arithmetic_clone(c) for c in reduction_clones if arithmetic_question(format_terms(c)) not in held_out
    ]
    return out


def _arithmetic_clone(chunk: list[int]) -> dict[str, Any]:
    """A clone's conversation for one chunk of terms: the task as the runtime hands it, then the solution."""
    return _solo(
        CLONE_SYSTEM_PROMPT, arithmetic_question(format_terms(chunk)), solve_text(chunk), "arith_clone"
    )


def arithmetic_root_conversation(
    terms: list[int],
    rng: random.Random,
    config: TeacherConfig,
    reduction_clones: list[list[int]] | None = None,
) -> dict[str, Any]:
    """A root's conversation: solve directly, or hand chunks to clones and add up their answers.
    The chunks of turns after the first (sums of partial results) go to `reduction_clones`."""
    question = arithmetic_question(format_terms(terms))
    messages: list[Message] = [
        {"role": "system", "content": ROOT_SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    if len(terms) == 1 or rng.random() < config.direct_root_fraction:
        messages.append({"role": "assistant", "content": solve_text(terms)})
        return conversation(messages, tools=True, kind="arith_root_direct")
    size = rng.choice(config.chunk_sizes)
    generous = rng.random() < 0.5
    operands = list(terms)
    turn = 0
    # Turn 1 hands chunks of the problem to clones; while more partial results come back than the
    # root adds up itself, the next turn hands groups of them to clones again.
    while turn == 0 or len(operands) > config.max_root_combine:
        turn += 1
        chunks = [operands[i : i + size] for i in range(0, len(operands), size)]
        if turn > 1 and reduction_clones is not None:
            reduction_clones.extend(chunks)
        objectives = []
        for chunk in chunks:
            need = len(chunk) * config.tokens_per_step
            objectives.append(
                {
                    "task": arithmetic_question(format_terms(chunk)),
                    "max_tokens": need * (2 if generous else 1),
                }
            )
        messages.append({"role": "assistant", "content": spawn_call(objectives)})
        operands = [sum(chunk) for chunk in chunks]
        messages.append(
            {
                "role": "tool",
                "content": "\n".join(f"turn{turn}_clone{i}: {p}" for i, p in enumerate(operands)),
            }
        )
    messages.append({"role": "assistant", "content": solve_text(operands)})
    return conversation(messages, tools=True, kind="arith_root_delegate")


HALF_TASK = "sum"
"""The task of a clone handed a half: the half itself is its document."""


def halves_call(keys: Sequence[str]) -> str:
    """A spawn call handing each key's half to a clone (the context key before the task, as in QA)."""
    return spawn_call([{"context": [key], "task": HALF_TASK} for key in keys])


def _halves_turns(
    terms: list[int],
    depth: int,
    rng: random.Random,
    config: TeacherConfig,
    clones: list[tuple[list[int], str, int]],
) -> list[Message]:
    """An agent's turns for the sum `terms` at `depth`: solve it, or hand both halves to clones and add
    their two answers. The clones it spawns (terms, key, depth) go to `clones`."""
    delegate = (
        depth < config.halves_max_depth
        and len(terms) > 1
        and (
            # A long sum draws only when its fraction is below 1, so that the default (always halve)
            # consumes the stream as before and keeps the warm-up data's bytes.
            (config.halves_long_fraction >= 1.0 or rng.random() < config.halves_long_fraction)
            if len(terms) > config.halves_leaf_terms
            else rng.random() < config.halves_needless_fraction
        )
    )
    if not delegate:
        return [{"role": "assistant", "content": solve_text(terms)}]
    halves = split_terms(terms)
    clones.extend((half, key, depth + 1) for half, key in zip(halves, HALF_KEYS, strict=True))
    sums = [sum(half) for half in halves]
    return [
        {"role": "assistant", "content": halves_call(HALF_KEYS)},
        {"role": "tool", "content": "\n".join(f"turn1_clone{i}: {s}" for i, s in enumerate(sums))},
        {"role": "assistant", "content": solve_text(sums)},
    ]


def _halves_clone(
    terms: list[int],
    key: str,
    depth: int,
    rng: random.Random,
    config: TeacherConfig,
    clones: list[tuple[list[int], str, int]],
) -> dict[str, Any]:
    """A clone at `depth` handed the half `terms` under `key`: it solves or halves again."""
    messages: list[Message] = [
        {"role": "system", "content": CLONE_SYSTEM_PROMPT},
        {"role": "user", "content": clone_user_message(HALF_TASK, {key: format_terms(terms)})},
        *_halves_turns(terms, depth, rng, config, clones),
    ]
    return conversation(messages, tools=depth < config.halves_max_depth, kind="arith_half_clone")


def arithmetic_halves_conversations(
    terms: list[int], rng: random.Random, config: TeacherConfig, held_out: Collection[str]
) -> list[dict[str, Any]]:
    """`halves` delegation for one training problem: the root's conversation, a clone holding the
    whole sum as if it were a half of a longer one (so that clones learn to halve long sums too, which
    the root's own clones, at most half a training sum, never need), and one clone drawn from the
    clones of both trees (the root's and that clone's)."""
    nodes: list[tuple[list[int], str, int]] = []
    root: list[Message] = [
        {"role": "system", "content": ROOT_SYSTEM_PROMPT},
        {"role": "user", "content": arithmetic_question(format_terms(terms))},
        *_halves_turns(terms, 0, rng, config, nodes),
    ]
    kind = "arith_root_delegate" if len(root) > 3 else "arith_root_direct"
    out = [conversation(root, tools=True, kind=kind)]
    whole_clones: list[tuple[list[int], str, int]] = []
    whole_terms = terms
    if config.halves_negative_lead_fraction > 0 and rng.random() < config.halves_negative_lead_fraction:
        whole_terms = [-terms[0], *terms[1:]]  # another sum, answered by its own steps
    whole = _halves_clone(whole_terms, rng.choice(HALF_KEYS), 1, rng, config, whole_clones)
    if arithmetic_question(format_terms(whole_terms)) not in held_out:
        out.append(whole)
    pool = nodes + whole_clones
    if pool:
        chunk, key, depth = pool[rng.randrange(len(pool))]
        clone = _halves_clone(chunk, key, depth, rng, config, [])
        if arithmetic_question(format_terms(chunk)) not in held_out:
            out.append(clone)
    return out


# ---------------------------------------------------------------------------- multi-hop QA
def _fact_sentence(paragraph_text: str, question: str, answer: str) -> str:
    """The sentence of a hop's paragraph that answers its question (quoted before answering).

    The sentence of the asked relation, read back with the relation templates: the first sentence
    naming the answer was often another relation's ("Who leads X?" quoted "X was founded by Y." when
    Y also leads X: 18.6% of those hops, 12.0% of "In which city does X live?"). Text from other
    sources matches no template, so it falls back to the first sentence that names the answer."""
    for fact_question, fact_answer, sentence in paragraph_facts(paragraph_text):
        if fact_question == question and fact_answer == answer:
            return sentence
    return next((sentence for sentence in sentences(paragraph_text) if answer in sentence), "")


def paragraph_facts(text: str) -> list[tuple[str, str, str]]:
    """(question, answer, sentence) for every relation sentence of a synthetic paragraph.

    The synthetic generator writes each fact from its relation's template (`selfcest.data.qa.RELATIONS`);
    filler sentences and text from other sources match no template and give nothing."""
    return [
        (relation.ask.format(x=subject), obj, sentence)
        for relation, subject, obj, sentence in fact_sentences(text)
    ]


def _teachable_qa_record(record: Mapping[str, Any]) -> bool:
    """A teacher can only write a record whose every hop names a paragraph the record has."""
    keys = {p["key"] for p in record["paragraphs"]}
    return bool(record["hops"]) and all(h["paragraph_key"] in keys for h in record["hops"])


def qa_conversations(
    record: Mapping[str, Any], rng: random.Random, config: TeacherConfig
) -> list[dict[str, Any]]:
    """Root-side decomposition into hops, clone-side reading, and monolithic (sometimes also
    thinking-mode) reading of the context."""
    if not _teachable_qa_record(record):
        return []
    paragraphs = {p["key"]: p for p in record["paragraphs"]}
    documents_by_key = record_documents(record)  # what the runtime hands a clone for each key
    hops = record["hops"]
    answer = record["answers"][0]
    out = []
    # Clone side: each hop's question with its paragraph (sometimes none -> failed).
    for hop in hops:
        if rng.random() < config.qa_failed_clone_fraction:
            out.append(_qa_clone(hop["question"], {}, "failed (no paragraph given)"))
            continue
        keys = [hop["paragraph_key"]]
        if rng.random() < config.qa_extra_keys_fraction:
            keys.append(rng.choice(list(paragraphs)))
        documents = {k: documents_by_key[k] for k in dict.fromkeys(keys)}
        fact = _fact_sentence(paragraphs[hop["paragraph_key"]]["text"], hop["question"], hop["answer"])
        out.append(_qa_clone(hop["question"], documents, hop["answer"], quote=fact))
    for _ in range(config.qa_reading_drills):
        key = rng.choice(list(paragraphs))
        facts = paragraph_facts(paragraphs[key]["text"])
        if facts:
            question, fact_answer, sentence = rng.choice(facts)
            out.append(_qa_clone(question, {key: documents_by_key[key]}, fact_answer, quote=sentence))
    out.append(qa_root_conversation(record, rng, config))
    # Monolithic: the supporting paragraphs plus distractors, from a few up to the whole context.
    support = [h["paragraph_key"] for h in hops]
    others = [k for k in paragraphs if k not in support]
    rng.shuffle(others)
    low, high = config.qa_mono_distractors
    keys = support + others[: rng.randint(low, high)]
    rng.shuffle(keys)
    documents = {k: documents_by_key[k] for k in keys}
    facts = [_fact_sentence(paragraphs[h["paragraph_key"]]["text"], h["question"], h["answer"]) for h in hops]
    question = qa_monolithic_question(record["question"], documents)
    out.append(_solo(MONOLITHIC_SYSTEM_PROMPT, question, "\n".join([*facts, f"Answer: {answer}"]), "qa_mono"))
    # No draw at 0: the other conversations then come out exactly as before this kind existed.
    if config.qa_thinking_fraction > 0 and rng.random() < config.qa_thinking_fraction:
        # The same reading as the monolithic one, checked: every quoted fact once more (as the
        # arithmetic thinking style redoes every step), so the mode spends more tokens serially.
        reply = "\n".join([*facts, "Check:", *facts, f"Answer: {answer}"])
        out.append(_solo(THINKING_SYSTEM_PROMPT, question, reply, "qa_thinking"))
    return out


def qa_root_conversation(
    record: Mapping[str, Any], rng: random.Random, config: TeacherConfig
) -> dict[str, Any]:
    """The root side of a QA record: one clone per hop, in sequence, each handed the key of the
    paragraph it needs, then the answer. The caller has checked that every hop's paragraph exists."""
    paragraphs = {p["key"]: p for p in record["paragraphs"]}
    hops = record["hops"]
    answer = record["answers"][0]
    root: list[Message] = [
        {"role": "system", "content": ROOT_SYSTEM_PROMPT},
        {"role": "user", "content": qa_root_question(record["question"], list(paragraphs))},
    ]
    for turn, hop in enumerate(hops, start=1):
        keys = [hop["paragraph_key"]]
        if rng.random() < config.qa_extra_keys_fraction:
            keys.append(rng.choice(list(paragraphs)))
        budget = rng.choice((24, 32, 48))
        root.append(
            {
                "role": "assistant",
                # Context keys before the task: the key is the name the previous clone just returned
                # (or the question's anchor), and written first it sits a fixed number of tokens after
                # that name, a look-up by position the tiny model learns as it learns to copy digits.
                # Task first, the name's distance depends on the question's wording; measured with that
                # order, 68.8% of qa/test roots made a protocol error, in the traces read nearly always
                # a wrong name in the second hop's key.
                "content": spawn_call(
                    [{"context": list(dict.fromkeys(keys)), "task": hop["question"], "max_tokens": budget}]
                ),
            }
        )
        root.append({"role": "tool", "content": f"turn{turn}_clone0: {hop['answer']}"})
    root.append({"role": "assistant", "content": f"Answer: {answer}"})
    return conversation(root, tools=True, kind="qa_root")


def _qa_clone(
    task: str, documents: Mapping[str, str], answer: str, quote: str | None = None
) -> dict[str, Any]:
    """A clone's reading conversation: quote the sentence that states the answer (if any), then answer."""
    reply = f"Answer: {answer}" if quote is None else f"{quote}\nAnswer: {answer}"
    return _solo(CLONE_SYSTEM_PROMPT, clone_user_message(task, documents), reply, "qa_clone")


def build_warmup_conversations(
    arithmetic_records: Sequence[Mapping[str, Any]],
    qa_records: Sequence[Mapping[str, Any]],
    *,
    seed: int,
    config: TeacherConfig | None = None,
    qa_root_only_records: Sequence[Mapping[str, Any]] = (),
    held_out_expressions: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """All warm-up conversations, shuffled with `seed` (same seed, same list).

    `qa_root_only_records` give their root conversation only (no clone, drill or monolithic one):
    more practice at the root's key copying, the QA skill the tiny model learns last, without
    growing the QA share of clone reading that costs the warm-up its arithmetic.
    `held_out_expressions` (the test and ood expressions) are never a clone conversation's question."""
    config = config or TeacherConfig()
    rng = random.Random(seed)
    held_out = frozenset(arithmetic_question(expr) for expr in held_out_expressions)
    conversations: list[dict[str, Any]] = []
    for record in arithmetic_records:
        conversations.extend(arithmetic_conversations(record["expr"], rng, config, held_out))
    for record in qa_records:
        conversations.extend(qa_conversations(record, rng, config))
    for record in qa_root_only_records:
        if _teachable_qa_record(record):
            conversations.append(qa_root_conversation(record, rng, config))
    rng.shuffle(conversations)
    return conversations
