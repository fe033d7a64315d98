"""benchmarks/copy_drills.py: the drills copy their expression, avoid held-out ones, and are scored
by the model's argmax."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from oracles import ArgmaxOracle

from selfcest.teachers import parse_terms
from selfcest.warmup import tokenize_conversations

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("copy_drills", REPO / "benchmarks" / "copy_drills.py")
copy_drills = importlib.util.module_from_spec(spec)
spec.loader.exec_module(copy_drills)

PARAMS = {
    "arithmetic": {
        "profile": "tiny",
        "profiles": {
            "tiny": {"generator": {"operator_weights": {"+": 4, "-": 3, "*": 0}, "operand_digits": [1, 1]}}
        },
    }
}


def _expression(drill: dict) -> str:
    return drill["messages"][1]["content"].removeprefix("Repeat ").removeprefix("List the terms of ")[:-1]


def test_drills_copy_their_expression_at_the_asked_lengths() -> None:
    drills = copy_drills.drill_conversations(PARAMS, 40, (11, 13), set(), seed=0)
    assert len(drills) == 40
    assert {d["kind"] for d in drills} == {"copy_repeat", "copy_terms"}
    for drill in drills:
        expr, answer = _expression(drill), drill["messages"][2]["content"]
        terms = parse_terms(expr)
        assert 12 <= len(terms) <= 14
        if drill["kind"] == "copy_repeat":
            assert answer == expr
        else:
            assert [int(line) for line in answer.split("\n")] == terms


def test_held_out_expressions_are_never_drilled_and_a_shortage_is_an_error() -> None:
    one_operator = {f"{a}{op}{b}" for a in range(10) for b in range(10) for op in "+-"}
    held_out = set(sorted(one_operator)[:150])
    drills = copy_drills.drill_conversations(PARAMS, 20, (1, 1), held_out, seed=0)
    assert not {_expression(d) for d in drills} & held_out
    with pytest.raises(ValueError, match="held-out"):
        copy_drills.drill_conversations(PARAMS, 20, (1, 1), one_operator, seed=0)


def test_exactness_follows_the_argmax_of_the_answer_tokens(tiny_tokenizer) -> None:
    drills = copy_drills.drill_conversations(PARAMS, 2, (5, 5), set(), seed=0)
    rows = tokenize_conversations(drills, tiny_tokenizer, max_length=2048)
    vocab = len(tiny_tokenizer)

    def exactness(wrong: set[int]) -> dict[str, float]:
        # The measure the script prints for its drills (position_ids.py's, contiguous positions).
        return copy_drills.teacher_forced_exactness(ArgmaxOracle(vocab, wrong), rows, "contiguous")

    assert exactness(set()) == {
        "copy_repeat": 1.0,
        "copy_terms": 1.0,
    }
    answer_token = rows[0]["assistant_masks"].index(1) + 2
    prompt_token = 3  # not scored: a wrong guess inside the prompt changes nothing
    assert exactness({answer_token, prompt_token}) == {
        "copy_repeat": 0.0,
        "copy_terms": 1.0,
    }


def test_a_finished_warmup_is_loaded_again_and_another_fingerprint_retrains(
    tiny_checkpoint, tmp_path, capsys
) -> None:
    from selfcest.warmup import WarmupConfig

    config = WarmupConfig(max_steps=2, batch_size=2, logging_steps=1, save_steps=100)
    built: list[int] = []

    def conversations() -> list[dict]:
        built.append(1)
        return copy_drills.drill_conversations(PARAMS, 8, (2, 3), set(), seed=0)

    def run(fingerprint: str):
        return copy_drills.trained_warmup(  # benchmarks/probes.py's, as the script imports it
            tmp_path, init=str(tiny_checkpoint), run_fingerprint=fingerprint, config=config,
            conversations=conversations, label={"run": fingerprint},
        )  # fmt: skip

    _, trained = run("a")
    assert built == [1] and (tmp_path / "model" / "fingerprint.txt").read_text() == "a"
    _, loaded = run("a")
    assert built == [1]  # measured again without training
    for (name, weight), (_, again) in zip(
        trained.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(weight, again), name
    assert '"trained_before"' in capsys.readouterr().out.splitlines()[-1]
    run("b")
    assert built == [1, 1] and (tmp_path / "model" / "fingerprint.txt").read_text() == "b"
