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
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from selfcest.determinism import pin_cpu_kernels

pin_cpu_kernels()  # before torch is imported: the pipeline's CPU kernels (selfcest/determinism.py)

import torch  # noqa: E402

from selfcest.data.arithmetic import ArithmeticConfig, config_from_mapping, generate_expression  # noqa: E402
from selfcest.engine import TransformersEngine  # noqa: E402
from selfcest.evaluation import (  # noqa: E402
    Evaluator,
    MethodSpec,
    Problem,
    ProblemResult,
    problem_from_record,
    runtime_config_from_params,
)
from selfcest.model import load_model  # noqa: E402
from selfcest.prompts import arithmetic_question  # noqa: E402
from selfcest.tokenizer import load_tokenizer  # noqa: E402

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


def first_spawn_is_exact(result: ProblemResult, expr: str) -> bool | None:
    """None when the root never spawned; else whether its first spawn's tasks rebuild `expr`."""
    clones = [agent for agent in result.episodes[0].agents if agent.role != "root"]
    if not clones:
        return None
    first_turn = min(agent.spawn_turn for agent in clones)
    prefix, suffix = arithmetic_question("\0").split("\0")
    chunks = [
        agent.task.removeprefix(prefix).removesuffix(suffix)
        for agent in clones
        if agent.spawn_turn == first_turn
    ]
    # A clone's task writes its first term unsigned when it is positive (`teachers.format_terms`),
    # so a chunk that does not start with `-` continues the sum with a `+`.
    joined = chunks[0] + "".join(chunk if chunk.startswith("-") else f"+{chunk}" for chunk in chunks[1:])
    return joined in (expr, f"+{expr}")


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
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = load_params(Path(args.params))
    generator = active_generator(params)
    tokenizer, model = load_tokenizer(args.checkpoint), load_model(args.checkpoint, device=args.device).eval()
    evaluator = Evaluator(
        TransformersEngine(model, tokenizer, max_batch_size=64), runtime_config_from_params(params["runtime"])
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
        spawned = [flag for flag in exact if flag is not None]
        count = len(problems)
        print(
            json.dumps(
                {
                    "operators": num_operators,
                    "problems": count,
                    "monolithic_accuracy": round(sum(r.correct for r in monolithic) / count, 3),
                    "delegate_accuracy": round(sum(r.correct for r in delegate) / count, 3),
                    "delegation_rate": round(len(spawned) / count, 3),
                    "exact_chunks": round(sum(spawned) / len(spawned), 3) if spawned else None,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
