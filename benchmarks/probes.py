"""Fresh arithmetic for the length benchmarks: the active profile's generator, and the teacher
conversations whose length limit is in question. No test split is read."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Any

from selfcest.data.arithmetic import ArithmeticConfig, config_from_mapping, generate_expression
from selfcest.teachers import TeacherConfig, arithmetic_conversations

PROBED_KINDS = ("arith_mono", "arith_root_delegate")


def active_generator(params: Mapping[str, Any]) -> ArithmeticConfig:
    """The active arithmetic profile's generator settings, as stages/generate_arithmetic.py reads them."""
    arithmetic = params["arithmetic"]
    return config_from_mapping(arithmetic["profiles"][arithmetic["profile"]].get("generator") or {})


def probe_teacher(teacher: TeacherConfig) -> TeacherConfig:
    """Every root delegates and no thinking row: the two kinds whose length limit is in question."""
    return dataclasses.replace(teacher, direct_root_fraction=0.0, thinking_fraction=0.0)


def probe_conversations(
    generator: ArithmeticConfig, teacher: TeacherConfig, num_operators: int, count: int, rng: random.Random
) -> list[dict[str, Any]]:
    """The monolithic and delegating-root conversations of `count` fresh `num_operators` expressions."""
    config = config_from_mapping({"num_operators": (num_operators, num_operators)}, generator)
    conversations = []
    for _ in range(count):
        expr, _ = generate_expression(config, rng)
        conversations += [
            c for c in arithmetic_conversations(expr, rng, teacher) if c["kind"] in PROBED_KINDS
        ]
    return conversations
