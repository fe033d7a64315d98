"""SELFCEST's episode reward and clone gates (PAPER.md, "Reward" and "Credit assignment").

pen(n; T, R, M) = 0 if n <= T else M * (1 - exp(-(n - T) / R))
root_pen  = pen(root generated tokens; T_root, R_root, M_root)
clone_pen = max over spawn turns of pen(largest clone's critical path in that turn; T_c, R_c, M_c)
call_pen  = max(0, per_call * root's calls - free)
R = acc - root_pen - clone_pen - call_pen - repair * repaired_calls          (arithmetic, QA)
R = max(0, acc - min(root_pen + clone_pen, cap)) - repair * repaired_calls    (math)

The release's clones have no tools (depth 1), so there a clone's critical path is its own generated
tokens and every call is the root's. Deeper trees (`runtime.max_depth` > 1, the default profile's
halving clones) keep both terms' meaning: a clone's cost is its subtree's critical path (a clone that
halves its sum is charged for its slowest sub-clone, not only for its own turns), and the call
penalty counts the root's calls only, since a clone's calls are work inside its subtree, already
in its critical path. Counting every agent's calls instead charged a nested tree for its width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from selfcest.runtime import AgentRecord, Episode

GateMode = Literal["none", "protocol", "ratio"]


@dataclass
class RewardConfig:
    """Reward constants; defaults are the release's (identical across its tasks)."""

    root_threshold: int = 512
    root_scale: float = 256.0
    root_max: float = 0.3
    clone_threshold: int = 512
    clone_scale: float = 512.0
    clone_max: float = 0.2
    call_penalty_per_call: float = 0.1
    call_penalty_free: float = 0.2
    repair_penalty: float = 0.05
    math_style: bool = False
    """The release's math reward: max(0, acc - min(root_pen + clone_pen, math_cost_cap))."""
    math_cost_cap: float = 0.5


@dataclass
class RewardBreakdown:
    total: float
    accuracy: float
    root_penalty: float
    clone_penalty: float
    call_penalty: float
    repair_penalty: float


def length_penalty(n: int, threshold: int, scale: float, maximum: float) -> float:
    """pen(n; T, R, M): free up to T tokens, then saturating towards M with scale R."""
    if n <= threshold:
        return 0.0
    return maximum * (1.0 - math.exp(-(n - threshold) / scale))


def clone_critical_tokens(episode: Episode) -> list[int]:
    """Per root spawn turn, the slowest clone's critical path: its own generated tokens plus, when it
    spawned clones itself, its slowest sub-clone's per spawn turn (the release's critical-path-like
    term, where clones have no tools and this is their generated tokens)."""
    return [
        max((episode.agents[i].critical_path_tokens for i in spawned), default=0)
        for spawned in episode.root.children
    ]


def episode_reward(episode: Episode, accuracy: float, config: RewardConfig) -> RewardBreakdown:
    root_pen = length_penalty(
        episode.root.generated_tokens, config.root_threshold, config.root_scale, config.root_max
    )
    clone_pen = max(
        (
            length_penalty(n, config.clone_threshold, config.clone_scale, config.clone_max)
            for n in clone_critical_tokens(episode)
        ),
        default=0.0,
    )
    call_pen = max(0.0, config.call_penalty_per_call * episode.root.tool_calls - config.call_penalty_free)
    repair_pen = config.repair_penalty * episode.repairs
    if config.math_style:
        total = max(0.0, accuracy - min(root_pen + clone_pen, config.math_cost_cap)) - repair_pen
        call_pen = 0.0
    else:
        total = accuracy - root_pen - clone_pen - call_pen - repair_pen
    return RewardBreakdown(total, accuracy, root_pen, clone_pen, call_pen, repair_pen)


@dataclass
class GateConfig:
    mode: GateMode = "protocol"
    """`none`: clones get the root's advantage (the paper's no-gating ablation); `protocol`: the
    paper's hard gate, 0 for a clone with no parseable answer or that hit its token limit; `ratio`:
    the release's clamp(R_clone / R_root, -clamp, clamp) with R_clone = 0 for a clone that gave no
    parseable answer after more than `ratio_min_tokens` tokens, else R_root."""
    ratio_clamp: float = 1.5
    ratio_min_tokens: int = 192
    credit_clones_of_zero_reward_roots: bool = False
    """Beyond the release: in `ratio` mode a root with reward exactly 0 gives its clones no gradient
    (0/0); with this option such clones are gated by protocol instead, so they still learn."""


def clone_gate(clone: AgentRecord, root_reward: float, config: GateConfig) -> float:
    """w_i: the factor applied to the root's advantage for one clone's training row.

    A clone that wrote `Answer: failed` (status `failed`) followed the protocol; one the runtime
    stopped before it answered (status `aborted`: the round limit, a turn the template does not
    re-render) gave no answer."""
    # The paper's protocol breaks: no parseable answer, or the token limit hit, which a clone that
    # wrote its `Answer:` line and then ran on to its cap did too (its status is `ok`: the runtime
    # hands its answer on, but its row is not credited).
    hit_limit = bool(clone.turns) and clone.turns[-1].finish_reason == "length"
    broke_protocol = clone.status in ("no_answer", "truncated", "budget_exhausted", "aborted") or hit_limit
    if config.mode == "none":
        return 1.0
    if config.mode == "protocol":
        return 0.0 if broke_protocol else 1.0
    if root_reward == 0.0:
        if config.credit_clones_of_zero_reward_roots:
            return 0.0 if broke_protocol else 1.0
        return 0.0
    no_answer = clone.answer is None and clone.status != "failed"
    clone_reward = 0.0 if (no_answer and clone.generated_tokens > config.ratio_min_tokens) else root_reward
    return max(-config.ratio_clamp, min(config.ratio_clamp, clone_reward / root_reward))
