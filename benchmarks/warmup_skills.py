"""Benchmark: a checkpoint's two warm-up skills, measured off every test split.

    python benchmarks/warmup_skills.py artifacts/warmup_model [more checkpoint dirs]

For choosing warm-up settings without looking at the claim splits:
- QA delegation on `data/qa/validation.jsonl` (greedy, budget 128): accuracy, how often the
  root's first spawn hands the clone the first hop's paragraph key, and a later spawn the second's,
  and where each wrong problem first went wrong (`qa_failure_stages`): the root's first key, the
  hop-1 clone's reading, the root's copy of that clone's answer into the second key, or after that.
  The second key's rate alone cannot tell a root that copies badly from a clone that read wrongly
  (the root then copies a wrong name faithfully);
- arithmetic on 96 train records that GRPO's seeded sample leaves out (the warm-up saw them, so
  this measures how well it kept the skill, not generalisation): monolithic by default, or with
  the spawn tool (`--arithmetic-mode delegate`, how a GRPO checkpoint is evaluated as `selfcest`);
  `--arithmetic-split arithmetic_rl` takes them from the GRPO-only `rl` split instead (longer sums
  the warm-up never saw), outside GRPO's draw in the same way.
Prints one JSON line per checkpoint, with mean generated tokens per problem beside each accuracy.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

from selfcest.determinism import pin_cpu_kernels

pin_cpu_kernels()  # before torch is imported: the pipeline's CPU kernels (selfcest/determinism.py)

import torch  # noqa: E402

from selfcest.engine import TransformersEngine  # noqa: E402
from selfcest.evaluation import (  # noqa: E402
    Evaluator,
    MethodSpec,
    ProblemResult,
    load_problems,
    problem_from_record,
    runtime_config_from_params,
)
from selfcest.model import load_model  # noqa: E402
from selfcest.runtime import AgentRecord, Episode  # noqa: E402
from selfcest.scoring import qa_exact_match  # noqa: E402
from selfcest.tokenizer import load_tokenizer  # noqa: E402

# The stages' own params and JSONL readers (OmegaConf: PyYAML reads `3e-05` as a string).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stages.common import load_params, read_jsonl  # noqa: E402
from stages.train_grpo import TASK_FILES, grpo_records  # noqa: E402


def first_and_later_clones(episode: Episode) -> tuple[list[AgentRecord], list[AgentRecord]]:
    """The root's clones of its earliest spawn turn, and its other clones (both empty: no
    delegation). The root's own: a clone's clones carry their parent's turn as `spawn_turn`."""
    clones = [agent for agent in episode.agents if agent.depth == 1]
    if not clones:
        return [], []
    first_turn = min(agent.spawn_turn for agent in clones)
    first = [agent for agent in clones if agent.spawn_turn == first_turn]
    later = [agent for agent in clones if agent.spawn_turn != first_turn]
    return first, later


def hop_keys_copied(episode: Episode, hops: list[dict]) -> tuple[bool, bool]:
    """(first spawn holds hop 1's key, a later spawn holds hop 2's key)."""
    first, later = first_and_later_clones(episode)
    if not first:
        return False, False
    return (  # any clone of the first spawn, as `qa_failure_stage` reads it
        any(hops[0]["paragraph_key"] in agent.context_keys for agent in first),
        len(hops) > 1 and any(hops[1]["paragraph_key"] in agent.context_keys for agent in later),
    )


QA_FAILURE_STAGES = ("root_first_key", "hop1_clone_answer", "root_second_key", "after_second_spawn")


def qa_failure_stage(episode: Episode, hops: list[dict]) -> str:
    """Where a wrong multi-hop QA episode first left the gold path (one of `QA_FAILURE_STAGES`, or
    `no_delegation` when the root spawned nothing). The first spawn must hold hop 1's paragraph key;
    a clone of that spawn must then answer hop 1's answer (SQuAD-normalised); a later spawn must hold
    hop 2's key; anything wrong after that (hop 2's clone, the root's final answer) is the last stage."""
    first, later = first_and_later_clones(episode)
    if not first:
        return "no_delegation"
    if not any(hops[0]["paragraph_key"] in agent.context_keys for agent in first):
        return "root_first_key"
    if not any(qa_exact_match(agent.answer, hops[0]["answer"]) for agent in first):
        return "hop1_clone_answer"
    if len(hops) > 1 and not any(hops[1]["paragraph_key"] in agent.context_keys for agent in later):
        return "root_second_key"
    return "after_second_spawn"


def mean_generated(results: list[ProblemResult]) -> float:
    return sum(r.generated_tokens for r in results) / len(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--qa-budget", type=int, default=128)
    parser.add_argument("--arithmetic-budget", type=int, default=256)
    parser.add_argument("--arithmetic-problems", type=int, default=96)
    parser.add_argument("--arithmetic-seed", type=int, default=7, help="draw of the arithmetic records")
    parser.add_argument("--arithmetic-mode", choices=["monolithic", "delegate"], default="monolithic")
    parser.add_argument(
        "--arithmetic-split",
        choices=["arithmetic", "arithmetic_rl"],
        default="arithmetic",
        help="the train split's records (the warm-up saw them) or the GRPO-only rl split's",
    )
    parser.add_argument("--device", default="cpu", help="where the checkpoint runs (cpu, cuda)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = load_params(Path(args.params))
    qa_path = Path("data/qa/validation.jsonl")
    hops = {record["id"]: record["hops"] for record in read_jsonl(qa_path)}
    qa = load_problems("qa", qa_path, max_problems=None, seed=params["seed"])
    # stages/train_grpo.py's own seeded draw, so these records are outside GRPO's sample.
    in_grpo = {r["id"] for r in grpo_records(params["grpo"]["tasks"], params["seed"], TASK_FILES)}
    outside = [r for r in read_jsonl(TASK_FILES[args.arithmetic_split]) if r["id"] not in in_grpo]
    arithmetic = [
        problem_from_record("arithmetic", r)
        for r in random.Random(args.arithmetic_seed).sample(
            outside, min(args.arithmetic_problems, len(outside))
        )
    ]
    runtime = runtime_config_from_params(params["runtime"])
    for checkpoint in args.checkpoints:
        tokenizer, model = load_tokenizer(checkpoint), load_model(checkpoint, device=args.device).eval()
        evaluator = Evaluator(
            TransformersEngine(model, tokenizer, max_batch_size=64), runtime, seed=params["seed"]
        )
        qa_results, _ = evaluator.run(MethodSpec("delegate", mode="delegate"), qa, args.qa_budget)
        keys = [hop_keys_copied(r.episodes[0], hops[r.problem_id]) for r in qa_results]
        stages = Counter(
            qa_failure_stage(r.episodes[0], hops[r.problem_id]) for r in qa_results if not r.correct
        )
        arithmetic_results, _ = evaluator.run(
            MethodSpec(args.arithmetic_mode, mode=args.arithmetic_mode), arithmetic, args.arithmetic_budget
        )
        n_qa, n_arithmetic = len(qa_results), len(arithmetic_results)
        print(
            json.dumps(
                {
                    "checkpoint": checkpoint,
                    "qa_validation_delegate_accuracy": sum(r.correct for r in qa_results) / n_qa,
                    "qa_first_key_copied": sum(first for first, _ in keys) / n_qa,
                    "qa_second_key_copied": sum(second for _, second in keys) / n_qa,
                    "qa_validation_generated_tokens": round(mean_generated(qa_results), 1),
                    "qa_failure_stages": {stage: stages[stage] for stage in sorted(stages)},
                    f"{args.arithmetic_split}_{args.arithmetic_mode}_accuracy": sum(
                        r.correct for r in arithmetic_results
                    )
                    / n_arithmetic,
                    f"{args.arithmetic_split}_generated_tokens": round(mean_generated(arithmetic_results), 1),
                    "qa_problems": n_qa,
                    "arithmetic_problems": n_arithmetic,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
