"""A scripted delegating policy and a trainer factory shared by the GRPO tests and the gloo script."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from selfcest.grpo import SelfcestConfig, SelfcestGRPOTrainer, TrainingConfig, build_trainer  # noqa: E402
from selfcest.model import load_model  # noqa: E402
from selfcest.prompts import CLONE_SYSTEM_PROMPT, arithmetic_question  # noqa: E402
from selfcest.rewards import GateConfig, RewardConfig  # noqa: E402
from selfcest.runtime import RuntimeConfig, Task  # noqa: E402
from selfcest.scripted import ScriptedEngine  # noqa: E402
from selfcest.tokenizer import load_tokenizer  # noqa: E402


class CoinFlipDelegator:
    """Root: spawns 1-3 clones (sometimes a clone rambles without an answer), then answers right or
    wrong at random, so that rollouts of one prompt get different rewards. Stateful, seeded."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, prompt: str) -> str:
        user = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        if CLONE_SYSTEM_PROMPT in prompt:
            return "thinking " * 3 if self.rng.random() < 0.3 else f"Answer: {self.rng.randint(0, 9)}"
        if "<tool_response>" in user:
            gold = int(re.search(r"of (\d+)\+(\d+)", prompt).group(1)) + int(
                re.search(r"of (\d+)\+(\d+)", prompt).group(2)
            )
            return f"Answer: {gold if self.rng.random() < 0.5 else gold + 1}"
        objectives = [{"task": f"part {i}", "max_tokens": 12} for i in range(self.rng.randint(1, 3))]
        return (
            "<tool_call>\n"
            + json.dumps({"name": "spawn_clone", "arguments": {"objectives": objectives}})
            + "\n</tool_call>"
        )


def arithmetic_tasks(n: int) -> list[Task]:
    return [
        Task(
            f"t{i}",
            arithmetic_question(f"{i}+{i + 1}"),
            metadata={"kind": "arithmetic", "answer": str(2 * i + 1)},
        )
        for i in range(n)
    ]


def make_trainer(
    checkpoint: Path,
    output_dir: Path,
    *,
    gate: str = "protocol",
    seed: int = 0,
    temperature: float = 1.0,
    clone_weighting: str = "token",
    callbacks: Any = (),
    **training: Any,
) -> SelfcestGRPOTrainer:
    tokenizer = load_tokenizer(checkpoint)
    model = load_model(checkpoint, dtype="float32")
    policy = CoinFlipDelegator(seed)
    selfcest = SelfcestConfig(
        runtime=RuntimeConfig(root_max_tokens=64, clone_max_tokens=16, episode_token_budget=256),
        reward=RewardConfig(),
        gate=GateConfig(mode=gate),
        temperature=temperature,
        clone_weighting=clone_weighting,
        seed=seed,
        engine_factory=lambda _model, tok: ScriptedEngine(tok, policy),
    )
    defaults = {
        "max_steps": 2,
        "prompts_per_step": 2,
        "num_generations": 4,
        "logging_steps": 1,
        "save_steps": 100,
        "learning_rate": 1e-3,
    }
    defaults.update(training)
    return build_trainer(
        model,
        tokenizer,
        arithmetic_tasks(16),
        selfcest,
        TrainingConfig(**defaults),
        output_dir=str(output_dir),
        callbacks=list(callbacks),
    )
