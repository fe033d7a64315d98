"""Benchmark: where a checkpoint's arithmetic stops generalising in length, off every test split.

    python benchmarks/length_probe.py artifacts/warmup_model [--operators 3 5 7 8 9 10 12 14 18]

Fresh expressions from the active arithmetic profile's generator in `params.yaml` (the default
`tiny`: sums and differences of single digits), with the operator count set to each length,
`--problems` per length, drawn with their own seed, so neither
`arithmetic/test` nor `arithmetic/ood` is read. For each length it prints one JSON line:
- `monolithic_accuracy`: the checkpoint without tools (the `base` method);
- `delegate_accuracy` and `delegation_rate`: the checkpoint with the spawn tool (`prompted` for the
  warm-up model, `selfcest` for a GRPO one), and how often its root spawned at all;
- `exact_chunks`: of the delegating roots, the share whose first spawn's clone tasks, joined, give
  back the expression exactly (no term lost, repeated or altered), which is what a root must do
  before any clone can help. Defined for sums and differences, the only expressions the warm-up
  teaches roots to chunk.
- with `runtime.expression_halves` (a root hands the runtime-cut halves of its sum by key, so there
  is nothing to copy and `exact_chunks` is None): `halves_clones_right`, of the roots that halved
  their sum, the share whose two clones (each with its own subtree) answered their half's sum; and
  `root_combines_right`, of those, the share whose final answer is right: the root's own last step,
  reading its clones' answers back and adding them.
- `oracle_spawn_accuracy` (with `--oracle-spawn`): the same delegating episodes, except that every
  root's first turn is the warm-up teacher's spawn call for its expression (`teachers.
  arithmetic_root_conversation`, always delegating, its chunk sizes and budgets; sizes that would
  need more clones than `runtime.max_clones_per_call` are left out at that length) instead of the
  model's. The clones, any reduction turns and the final answer are the model's own, so this is what
  the rest of the tree does at each length when the root's copy of the prompt is right: the part of
  delegation that the copy look-up does not limit. `oracle_clones_right`: the share of those first
  clones that answer their chunk's sum. A diagnostic, never a method: no eval cell runs it.

`--operand-digits MIN MAX` draws operands of that many digits instead of the profile's, and each line
gives `root_prompt_tokens`, the mean length of the root's prompt (the position of its first token):
with wider operands the same number of terms makes a longer prompt, which separates what a length
does to the root's choice by the number of terms from what it does by the prompt's length.

`--attention-scale TAU` multiplies every attention logit of the checkpoint by TAU (an inference-time
attention temperature, as length-extrapolation methods use to keep a longer context's look-ups
sharp), by scaling the weight of each layer's query RMSNorm (`q_norm`): Qwen3 normalises queries
before RoPE, so that weight scales q, and with it q.k, linearly. Also a diagnostic.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from selfcest.determinism import pin_cpu_kernels

pin_cpu_kernels()  # before torch is imported: the pipeline's CPU kernels (selfcest/determinism.py)

import torch  # noqa: E402

from selfcest.data.arithmetic import ArithmeticConfig, config_from_mapping, generate_expression  # noqa: E402
from selfcest.engine import (  # noqa: E402
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    SamplingConfig,
    TransformersEngine,
)
from selfcest.evaluation import (  # noqa: E402
    Evaluator,
    MethodSpec,
    Problem,
    ProblemResult,
    problem_from_record,
    runtime_config_from_params,
)
from selfcest.grpo import agent_row  # noqa: E402
from selfcest.halves import HALF_KEYS, expression_halves  # noqa: E402
from selfcest.model import load_model  # noqa: E402
from selfcest.prompts import ROOT_SYSTEM_PROMPT, arithmetic_question  # noqa: E402
from selfcest.runtime import AgentRecord  # noqa: E402
from selfcest.scripted import ScriptedEngine  # noqa: E402
from selfcest.teachers import TeacherConfig, arithmetic_root_conversation, parse_terms  # noqa: E402
from selfcest.tokenizer import IM_START, load_tokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.probes import active_generator  # noqa: E402
from stages.common import load_params  # noqa: E402


def probe_problems(
    generator: ArithmeticConfig, num_operators: int, count: int, rng: random.Random
) -> list[tuple[str, Problem]]:
    config = config_from_mapping({"num_operators": (num_operators, num_operators)}, generator)
    problems = []
    for index in range(count):
        expr, value = generate_expression(config, rng)
        record = {"id": f"probe-{num_operators}-{index}", "expr": expr, "answer": value}
        problems.append((expr, problem_from_record("arithmetic", record)))
    return problems


# "Calculate the value of " and ".": what a question puts around its expression.
QUESTION_PREFIX, QUESTION_SUFFIX = arithmetic_question("\0").split("\0")


def first_spawn_is_exact(result: ProblemResult, expr: str) -> bool | None:
    """None when the root never spawned; else whether its first spawn's tasks rebuild `expr`."""
    # The root's own clones: a clone that halves again (expression halves) spawns clones of its
    # own, whose `spawn_turn` is their parent's turn, not the root's
    clones = [agent for agent in result.episodes[0].agents if agent.depth == 1]
    if not clones:
        return None
    first_turn = min(agent.spawn_turn for agent in clones)
    chunks = [
        agent.task.removeprefix(QUESTION_PREFIX).removesuffix(QUESTION_SUFFIX)
        for agent in clones
        if agent.spawn_turn == first_turn
    ]
    # A clone's task writes its first term unsigned when it is positive (`teachers.format_terms`),
    # so a chunk that does not start with `-` continues the sum with a `+`.
    joined = chunks[0] + "".join(chunk if chunk.startswith("-") else f"+{chunk}" for chunk in chunks[1:])
    return joined in (expr, f"+{expr}")


def first_spawn_halves(result: ProblemResult, expr: str) -> bool | None:
    """None unless the root's first spawn handed out halves of its sum by key (`selfcest.halves`);
    else whether every clone of that spawn answered its half's sum."""
    root = result.episodes[0].agents[0]
    if not root.children:
        return None
    clones = [result.episodes[0].agents[index] for index in root.children[0]]
    if not all(len(agent.context_keys) == 1 and agent.context_keys[0] in HALF_KEYS for agent in clones):
        return None
    halves = expression_halves(expr)
    return all(_answered_sum(agent, halves[agent.context_keys[0]]) for agent in clones)


def _question_expr(prompt: str) -> str:
    """The expression of the last arithmetic question in a decoded prompt."""
    return prompt[prompt.rindex(QUESTION_PREFIX) + len(QUESTION_PREFIX) :].split(QUESTION_SUFFIX)[0]


def _answered_sum(agent: AgentRecord, expr: str) -> bool:
    """Whether `agent`'s answer is the sum of `expr`."""
    return agent.answer is not None and agent.answer.strip() == str(sum(parse_terms(expr)))


def _clone_is_right(agent: AgentRecord) -> bool:
    """Whether a clone answered its chunk's sum (its task is a teacher-written arithmetic question)."""
    return _answered_sum(agent, _question_expr(agent.task))


class OracleFirstSpawnEngine:
    """`engine`, except that a root's first turn is the warm-up teacher's spawn call (`--oracle-spawn`).

    A root's first turn is a prompt with the root's system prompt and no assistant turn before the one
    it opens; those requests are answered by a `ScriptedEngine` (tokenised like a model that stopped on
    its own), every other request (clones, the root's later turns) by `engine`, in the same call."""

    def __init__(self, engine: GenerationEngine, teacher_seed: int, max_clones_per_call: int) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        teacher = TeacherConfig()

        def teacher_spawn(prompt: str) -> str:
            terms = parse_terms(_question_expr(prompt))
            # Always delegate, in the teacher's chunk sizes that the runtime's clone limit allows for
            # this length (the warm-up's expressions never needed more than four clones).
            sizes = tuple(s for s in teacher.chunk_sizes if -(-len(terms) // s) <= max_clones_per_call)
            if not sizes:
                raise ValueError(
                    f"{len(terms)} terms need more than {max_clones_per_call} clones in the teacher's "
                    f"largest chunks ({max(teacher.chunk_sizes)} terms)"
                )
            config = replace(teacher, direct_root_fraction=0.0, chunk_sizes=sizes)
            # One draw per expression, so the chunking does not depend on batch order.
            rng = random.Random(f"{teacher_seed}:{terms}")
            messages = arithmetic_root_conversation(terms, rng, config)["messages"]
            return next(m["content"] for m in messages if m["role"] == "assistant")

        self.oracle = ScriptedEngine(engine.tokenizer, teacher_spawn)

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingConfig
    ) -> list[GenerationResult]:
        prompts = [self.tokenizer.decode(r.prompt_ids, skip_special_tokens=False) for r in requests]
        is_first = [ROOT_SYSTEM_PROMPT in p and p.count(f"{IM_START}assistant") == 1 for p in prompts]
        first_turns = [r for r, first in zip(requests, is_first, strict=True) if first]
        others = [r for r, first in zip(requests, is_first, strict=True) if not first]
        scripted = iter(self.oracle.generate(first_turns, sampling) if first_turns else [])
        generated = iter(self.engine.generate(others, sampling) if others else [])
        return [next(scripted) if first else next(generated) for first in is_first]


def scale_attention_logits(model: torch.nn.Module, tau: float) -> int:
    """Multiply every attention logit by `tau` in place: each `q_norm` weight times `tau`.
    Returns the number of layers scaled; a model without Qwen3's query norm is refused."""
    if not tau > 0:
        raise ValueError(f"--attention-scale must be positive, got {tau}")
    norms = [module for name, module in model.named_modules() if name.endswith("self_attn.q_norm")]
    if not norms:
        raise ValueError(
            "--attention-scale needs Qwen3's per-layer query norm (self_attn.q_norm); none found"
        )
    with torch.no_grad():
        for norm in norms:
            norm.weight.mul_(tau)
    return len(norms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument(
        "--params", default="params.yaml", help="the `runtime` limits and the arithmetic generator"
    )
    parser.add_argument("--operators", type=int, nargs="+", default=[3, 5, 7, 8, 9, 10, 12, 14, 18])
    parser.add_argument("--problems", type=int, default=48, help="per operator count")
    parser.add_argument("--budget", type=int, default=512, help="tree-wide generated-token budget")
    parser.add_argument("--seed", type=int, default=12345, help="draw of the probe expressions")
    parser.add_argument("--device", default="cpu", help="where the checkpoint runs (cpu, cuda)")
    parser.add_argument(
        "--oracle-spawn",
        action="store_true",
        help="also run delegation with the teacher's first spawn in place of the root's (a diagnostic)",
    )
    parser.add_argument(
        "--operand-digits",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="digits per operand instead of the profile's (a longer prompt with the same number of terms)",
    )
    parser.add_argument(
        "--attention-scale",
        type=float,
        default=1.0,
        help="multiply every attention logit by this (an inference-time attention temperature)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = load_params(Path(args.params))
    generator = active_generator(params)
    if args.operand_digits:
        generator = replace(generator, operand_digits=tuple(args.operand_digits))
    tokenizer, model = load_tokenizer(args.checkpoint), load_model(args.checkpoint, device=args.device).eval()
    if args.attention_scale != 1.0:
        scale_attention_logits(model, args.attention_scale)
    engine = TransformersEngine(model, tokenizer, max_batch_size=64)
    runtime = runtime_config_from_params(params["runtime"])
    evaluator = Evaluator(engine, runtime)
    oracle = (
        Evaluator(OracleFirstSpawnEngine(engine, args.seed, runtime.max_clones_per_call), runtime)
        if args.oracle_spawn
        else None
    )
    for num_operators in args.operators:
        # One draw per length, so a length's problems do not depend on which others are listed.
        pairs = probe_problems(
            generator, num_operators, args.problems, random.Random(args.seed * 1000 + num_operators)
        )
        problems = [problem for _, problem in pairs]
        monolithic, _ = evaluator.run(MethodSpec("monolithic"), problems, args.budget)
        delegate, _ = evaluator.run(MethodSpec("delegate", mode="delegate"), problems, args.budget)
        exact = [
            first_spawn_is_exact(result, expr) for (expr, _), result in zip(pairs, delegate, strict=True)
        ]
        halved = [
            (flag, result.correct)
            for (expr, _), result in zip(pairs, delegate, strict=True)
            if (flag := first_spawn_halves(result, expr)) is not None
        ]
        spawned = [flag for flag in exact if flag is not None]
        count = len(problems)
        prompt_tokens = [len(agent_row(result.episodes[0].agents[0])[0]) for result in delegate]
        line = {
            "operators": num_operators,
            "problems": count,
            "monolithic_accuracy": round(sum(r.correct for r in monolithic) / count, 3),
            "delegate_accuracy": round(sum(r.correct for r in delegate) / count, 3),
            "delegation_rate": round(len(spawned) / count, 3),
            "root_prompt_tokens": round(sum(prompt_tokens) / count, 1),  # where the root's first token is
            # halves are cut by the runtime, not copied: no chunk to check
            "exact_chunks": round(sum(spawned) / len(spawned), 3) if spawned and not halved else None,
        }
        if halved:
            right = [correct for clones_right, correct in halved if clones_right]
            line["halves_clones_right"] = round(len(right) / len(halved), 3)
            line["root_combines_right"] = round(sum(right) / len(right), 3) if right else None
        if oracle is not None:
            forced, _ = oracle.run(MethodSpec("delegate", mode="delegate"), problems, args.budget)
            line["oracle_spawn_accuracy"] = round(sum(r.correct for r in forced) / count, 3)
            first_clones = [
                agent
                for result in forced
                for agent in result.episodes[0].agents
                if agent.depth == 1 and agent.spawn_turn == 1  # the root's first spawn, not its clones'
            ]
            line["oracle_clones_right"] = round(
                sum(_clone_is_right(agent) for agent in first_clones) / max(1, len(first_clones)), 3
            )
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
