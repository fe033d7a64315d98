"""benchmarks/length_probe.py --oracle-spawn: the teacher writes each root's first turn, the model the rest."""

from __future__ import annotations

import importlib.util
import random
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from selfcest.evaluation import Evaluator, MethodSpec, problem_from_record
from selfcest.prompts import CLONE_SYSTEM_PROMPT
from selfcest.runtime import RuntimeConfig
from selfcest.scripted import ScriptedEngine
from selfcest.teachers import format_terms, parse_terms, solve_text

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "length_probe.py"
spec = importlib.util.spec_from_file_location("length_probe", SCRIPT)
length_probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(length_probe)

_RESULT_LINE = re.compile(r"turn\d+_clone\d+: (-?\d+)")


def _model(prompt: str) -> str:
    """Stands in for the checkpoint: clones solve their chunk, a root adds up the clones' answers.
    A root's first turn must never reach it (that turn is the teacher's)."""
    if CLONE_SYSTEM_PROMPT in prompt:
        return solve_text(parse_terms(length_probe._question_expr(prompt)))
    partials = [int(value) for value in _RESULT_LINE.findall(prompt)]
    assert partials, "a root's first turn reached the model"
    return solve_text(partials)


def test_oracle_spawn_hands_the_expression_to_clones_and_leaves_the_rest_to_the_model(tiny_tokenizer) -> None:
    rng = random.Random(3)
    runtime = RuntimeConfig(max_clones_per_call=8)
    inner = ScriptedEngine(tiny_tokenizer, _model)
    evaluator = Evaluator(length_probe.OracleFirstSpawnEngine(inner, 7, runtime.max_clones_per_call), runtime)
    exprs = [format_terms([rng.choice([-1, 1]) * rng.randint(1, 9) for _ in range(n)]) for n in (4, 12, 20)]
    problems = [
        problem_from_record("arithmetic", {"id": f"p{i}", "expr": e, "answer": sum(parse_terms(e))})
        for i, e in enumerate(exprs)
    ]
    results, _ = evaluator.run(MethodSpec("delegate", mode="delegate"), problems, 1024)
    for expr, result in zip(exprs, results, strict=True):
        # The first spawn rebuilds the expression, within the clone limit even at 19 operators
        # (chunks of 2 would need 10 clones there), and the model's own turns finish the sum.
        assert length_probe.first_spawn_is_exact(result, expr) is True
        clones = [a for a in result.episodes[0].agents if a.role != "root" and a.spawn_turn == 1]
        assert len(clones) <= runtime.max_clones_per_call
        assert result.correct, expr
        assert all(length_probe._clone_is_right(clone) for clone in clones)
    # Every request the model saw was a clone's or a root's later turn (`_model` asserts it), and the
    # teacher's chunking is one draw per expression: the same again in another batch.
    again, _ = evaluator.run(MethodSpec("delegate", mode="delegate"), problems[::-1], 1024)
    tasks = [[a.task for a in r.episodes[0].agents if a.role != "root"] for r in results]
    assert [[a.task for a in r.episodes[0].agents if a.role != "root"] for r in again[::-1]] == tasks


def test_attention_scale_raises_every_first_layer_attention_row_to_that_power(tiny_checkpoint) -> None:
    """Logits times tau means softmax(tau * s) = softmax(s) ** tau, renormalised, in every head and row
    of layer 0 (whose input the scaling leaves alone)."""

    def first_layer_attention(tau: float) -> torch.Tensor:
        model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, attn_implementation="eager").eval()
        if tau != 1.0:
            assert length_probe.scale_attention_logits(model, tau) == model.config.num_hidden_layers
        with torch.no_grad():
            out = model(torch.arange(3, 40).unsqueeze(0), output_attentions=True)
        return out.attentions[0][0].double()

    plain, sharper = first_layer_attention(1.0), first_layer_attention(1.5)
    expected = plain**1.5 / (plain**1.5).sum(-1, keepdim=True)
    assert not torch.allclose(plain, sharper, atol=1e-3)
    torch.testing.assert_close(sharper, expected, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="positive"):
        length_probe.scale_attention_logits(torch.nn.Linear(2, 2), 0.0)
    with pytest.raises(ValueError, match="q_norm"):
        length_probe.scale_attention_logits(torch.nn.Linear(2, 2), 2.0)


def test_halves_diagnostic_separates_the_clones_sums_from_the_roots_own_addition(tiny_tokenizer) -> None:
    """Roots halve, clones answer their half's sum (one clone is off by one on `p1`), and the root of
    `p2` adds its clones' answers wrongly: the probe's two halves measures tell the steps apart."""

    def policy(prompt: str) -> str:
        user = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        if "<tool_response>" in user:
            partials = [int(v) for v in _RESULT_LINE.findall(user)]
            return f"Answer: {sum(partials) + (1 if '9-9+9' in prompt else 0)}"
        if CLONE_SYSTEM_PROMPT not in prompt:
            return '<tool_call>\n{"name": "spawn_clone", "arguments": {"objectives": [{"context": ["first half"], "task": "sum"}, {"context": ["second half"], "task": "sum"}]}}\n</tool_call>'
        held = user.split("] ", 1)[1].split("\n", 1)[0]
        return f"Answer: {sum(parse_terms(held)) + (1 if held == '5+5' else 0)}"

    exprs = ["1+2+3+4", "5+5+1+1", "9-9+9-9"]
    problems = [
        problem_from_record("arithmetic", {"id": f"p{i}", "expr": e, "answer": sum(parse_terms(e))})
        for i, e in enumerate(exprs)
    ]
    runtime = RuntimeConfig(expression_halves=True, expression_max_depth=1)
    results, _ = Evaluator(ScriptedEngine(tiny_tokenizer, policy), runtime).run(
        MethodSpec("delegate", mode="delegate"), problems, 512
    )
    flags = [length_probe.first_spawn_halves(r, e) for r, e in zip(results, exprs, strict=True)]
    assert flags == [True, False, True]
    assert [r.correct for r in results] == [1.0, 0.0, 0.0]
    # halves are cut by the runtime: the chunk-copy measure does not apply to them
    assert length_probe.first_spawn_is_exact(results[0], exprs[0]) is False


def test_the_first_spawn_is_the_roots_own_not_its_clones_clones() -> None:
    """A clone that halves again spawns clones whose `spawn_turn` is its own turn: they were read as
    the root's first spawn, so an exact spawn read as not exact and the oracle's clones as wrong."""
    from types import SimpleNamespace

    def agent(depth: int, turn: int | None, expr: str) -> SimpleNamespace:
        return SimpleNamespace(
            depth=depth,
            spawn_turn=turn,
            task=length_probe.QUESTION_PREFIX + expr + length_probe.QUESTION_SUFFIX,
        )

    agents = [agent(0, None, "1+2-3+4"), agent(1, 1, "1+2"), agent(1, 1, "-3+4"), agent(2, 1, "1")]
    result = SimpleNamespace(episodes=[SimpleNamespace(agents=agents)])
    assert length_probe.first_spawn_is_exact(result, "1+2-3+4") is True
