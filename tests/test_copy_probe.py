"""benchmarks/copy_probe.py: term spans per index, and scoring that follows the model's argmax."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

from oracles import ArgmaxOracle

from selfcest.teachers import TeacherConfig, arithmetic_root_conversation, solve_text
from selfcest.warmup import tokenize_conversations

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "copy_probe.py"
spec = importlib.util.spec_from_file_location("copy_probe", SCRIPT)
copy_probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(copy_probe)

TERMS = [3, -4, 5, 2, -1, 7, 6]


def _root_conversation() -> dict:
    config = TeacherConfig(direct_root_fraction=0.0, chunk_sizes=[3])
    return arithmetic_root_conversation(list(TERMS), random.Random(0), config)


def test_root_spans_number_every_copied_term_in_order() -> None:
    turn = _root_conversation()["messages"][2]["content"]
    spans = copy_probe.term_spans("arith_root_delegate", turn)
    assert [index for _, _, index in spans] == list(range(len(TERMS)))
    # A chunk's first term is written unsigned when positive (teachers.format_terms).
    assert [int(turn[start:end]) for start, end, _ in spans] == TERMS


def test_monolithic_spans_are_each_step_lines_term() -> None:
    turn = solve_text(TERMS)
    spans = copy_probe.term_spans("arith_mono", turn)
    assert [index for _, _, index in spans] == list(range(1, len(TERMS)))
    assert [int(turn[start:end]) for start, end, _ in spans] == TERMS[1:]


def test_scores_follow_the_argmax_term_by_term(tiny_tokenizer) -> None:
    conversation = _root_conversation()
    vocab = len(tiny_tokenizer)
    perfect = copy_probe.copy_accuracy(ArgmaxOracle(vocab, set()), tiny_tokenizer, [conversation])
    assert perfect["root"] == dict.fromkeys(range(len(TERMS)), 1.0)
    # Break one token of the third term (the `5`): only index 2 drops.
    row = tokenize_conversations([conversation], tiny_tokenizer, max_length=2048)[0]
    ids, mask = row["input_ids"], row["assistant_masks"]
    first = mask.index(1)
    turn_text = tiny_tokenizer.decode(ids[first:], skip_special_tokens=False)
    offset = len(tiny_tokenizer.decode(ids[:first], skip_special_tokens=False))
    start, _, _ = copy_probe.term_spans("arith_root_delegate", turn_text)[2]
    position = next(
        t
        for t in range(first, len(ids))
        if len(tiny_tokenizer.decode(ids[: t + 1], skip_special_tokens=False)) > offset + start
    )
    broken = copy_probe.copy_accuracy(ArgmaxOracle(vocab, {position}), tiny_tokenizer, [conversation])
    assert broken["root"] == {**dict.fromkeys(range(len(TERMS)), 1.0), 2: 0.0}
