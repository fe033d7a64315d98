"""SELFCEST GRPO on TRL: clone rows, the loss they get, training, resume, and two processes on gloo."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from grpo_helpers import make_trainer
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import TrainerCallback
from trl import GRPOTrainer

from selfcest.checkpoints import code_sha256, prepare_run_dir
from selfcest.determinism import KERNEL_VARIABLE, PINNED_CAPABILITY, cpu_flags
from selfcest.grpo import (
    ROLE_CLONE,
    ROLE_PAD,
    ROLE_ROOT,
    SelfcestConfig,
    SelfcestGRPOTrainer,
    make_rollout_func,
)
from selfcest.prompts import CLONE_SYSTEM_PROMPT, arithmetic_question
from selfcest.rewards import (
    GateConfig,
    RewardConfig,
    clone_gate,
    episode_reward,
    length_penalty,
)
from selfcest.runtime import AgentRecord, Episode, Runtime, RuntimeConfig, Task, TurnRecord
from selfcest.scripted import ScriptedEngine


def clone(status: str, generated: int = 10, answer: str | None = "1") -> AgentRecord:
    agent = AgentRecord("root/turn1_clone0", "clone", 1, "root", 1, "t", [], None, 16)
    agent.status, agent.generated_tokens, agent.answer = status, generated, answer  # type: ignore[assignment]
    agent.critical_path_tokens = generated  # a clone without clones of its own
    return agent


def test_length_penalty_matches_the_release_formula() -> None:
    assert length_penalty(512, 512, 256, 0.3) == 0.0
    assert length_penalty(768, 512, 256, 0.3) == pytest.approx(0.3 * (1 - math.exp(-1)))
    assert length_penalty(10**6, 512, 256, 0.3) == pytest.approx(0.3)


def test_episode_reward_terms() -> None:
    root = AgentRecord("root", "root", 0, None, None, "q", [], None, 1000)
    root.generated_tokens, root.children, root.tool_calls = 600, [[1, 2], [3]], 3
    clones = [clone("ok", 700), clone("ok", 100), clone("ok", 300)]
    episode = Episode("t", 0, "delegate", 2000, [root, *clones], num_tool_calls=3, repairs=1)
    r = episode_reward(episode, 1.0, RewardConfig())
    assert r.root_penalty == pytest.approx(length_penalty(600, 512, 256, 0.3))
    assert r.clone_penalty == pytest.approx(
        length_penalty(700, 512, 512, 0.2)
    )  # max over turns of the slowest clone
    assert r.call_penalty == pytest.approx(0.1)
    assert r.total == pytest.approx(1.0 - r.root_penalty - r.clone_penalty - 0.1 - 0.05)
    math_r = episode_reward(episode, 0.0, RewardConfig(math_style=True))
    assert math_r.total == pytest.approx(-0.05)
    # both spawn turns over the threshold: the penalty is the larger turn's, not their sum
    slow = [clone("ok", 700), clone("ok", 100), clone("ok", 900)]
    both = episode_reward(
        Episode("t", 0, "delegate", 2000, [root, *slow], num_tool_calls=3), 1.0, RewardConfig()
    )
    assert both.clone_penalty == pytest.approx(length_penalty(900, 512, 512, 0.2))


def test_a_nested_tree_is_charged_for_its_critical_path_not_for_its_clones_calls(tiny_tokenizer) -> None:
    """With halving clones (depth > 1) the clone term reads each clone's subtree critical path, and
    the call penalty counts the root's calls: the same leaf work costs the same whether the root
    halves once into four clones or twice through two."""
    from scripted_policies import halving_policy

    from selfcest.prompts import arithmetic_question
    from selfcest.runtime import Runtime, Task
    from selfcest.scripted import ScriptedEngine

    terms = [3, -4, 5, 1, -2, 6, 7, -8, 9, 1, 2, -3, 4, 5, -6, 7, 8, -9, 1, 2]  # 20 -> 10 -> 5
    expr = "3" + "".join(f"{t:+d}" for t in terms[1:])
    config = RuntimeConfig(expression_halves=True, expression_max_depth=3, episode_token_budget=1024)
    [episode] = Runtime(ScriptedEngine(tiny_tokenizer, halving_policy), config).run(
        [Task("long", arithmetic_question(expr))]
    )
    assert (episode.num_tool_calls, episode.root.tool_calls) == (3, 1)
    [spawned] = episode.root.children
    halving = [episode.agents[i] for i in spawned]
    assert all(a.children for a in halving)  # each depth-1 clone halved its ten terms again
    slowest = max(a.critical_path_tokens for a in halving)
    assert slowest > max(a.generated_tokens for a in halving)  # its sub-clones' tokens count
    constants = RewardConfig(clone_threshold=0, clone_scale=64.0, call_penalty_free=0.0)
    reward = episode_reward(episode, 1.0, constants)
    assert reward.clone_penalty == pytest.approx(length_penalty(slowest, 0, 64.0, 0.2))
    assert reward.call_penalty == pytest.approx(0.1)  # one call, the root's


def test_gates() -> None:
    assert clone_gate(clone("truncated"), 0.7, GateConfig("none")) == 1.0
    assert clone_gate(clone("truncated"), 0.7, GateConfig("protocol")) == 0.0
    assert clone_gate(clone("no_answer"), 0.7, GateConfig("protocol")) == 0.0
    assert (
        clone_gate(clone("failed", answer=None), 0.7, GateConfig("protocol")) == 1.0
    )  # a stated failure follows protocol
    assert clone_gate(clone("ok"), 0.7, GateConfig("protocol")) == 1.0
    # the release: no answer after > 192 tokens -> R_clone = 0; otherwise R_clone = R_root
    assert clone_gate(clone("truncated", 300, None), -0.4, GateConfig("ratio")) == 0.0
    assert clone_gate(clone("truncated", 100, None), -0.4, GateConfig("ratio")) == 1.0
    assert clone_gate(clone("failed", 300, None), -0.4, GateConfig("ratio")) == 1.0  # a stated failure
    assert clone_gate(clone("ok"), 0.0, GateConfig("ratio")) == 0.0  # the release's 0/0 side effect
    assert clone_gate(clone("ok"), 0.0, GateConfig("ratio", credit_clones_of_zero_reward_roots=True)) == 1.0
    # a clone the runtime stopped gave no answer: not a stated failure
    stopped = clone("aborted", 300, None)
    assert clone_gate(stopped, 0.7, GateConfig("protocol")) == 0.0
    assert clone_gate(stopped, -0.4, GateConfig("ratio")) == 0.0
    assert clone_gate(stopped, 0.7, GateConfig("none")) == 1.0


def test_a_clone_the_runtime_stopped_at_its_round_limit_gets_no_credit(tiny_tokenizer) -> None:
    """The round limit (and a template that does not re-render a turn) stops an agent with status
    `aborted`, not `failed` (a clone that wrote `Answer: failed`, which the protocol gate credits): a
    clone stopped while it waited for its own clone gave no answer and broke off: its row is gated."""
    spawn_outer = (
        "<tool_call>\n"
        + json.dumps({"name": "spawn_clone", "arguments": {"objectives": [{"task": "Outer task."}]}})
        + "\n</tool_call>"
    )
    spawn_inner = spawn_outer.replace("Outer task.", "Inner task.")

    def policy(prompt: str) -> str:
        if "<tool_response>" in prompt.rsplit("<|im_start|>user", 1)[-1] or "Inner task." in prompt:
            return "Answer: 2"
        return spawn_inner if "Outer task." in prompt else spawn_outer

    def rollout(max_rounds: int) -> tuple[Episode, list[float]]:
        runtime = RuntimeConfig(max_depth=2, max_rounds=max_rounds, episode_token_budget=512)
        config = SelfcestConfig(
            runtime=runtime,
            gate=GateConfig("protocol"),
            engine_factory=lambda _model, tokenizer: ScriptedEngine(tokenizer, policy),
        )
        task = Task("t", arithmetic_question("1+1"), metadata={"kind": "arithmetic", "answer": "2"})
        [rows] = make_rollout_func({"t": task}, config)(["t"], rollout_trainer(tiny_tokenizer))["clone_rows"]
        [episode] = Runtime(ScriptedEngine(tiny_tokenizer, policy), runtime).run([task])
        return episode, [weight for *_, weight in rows]

    episode, settled = rollout(max_rounds=64)
    assert [a.status for a in episode.agents] == ["ok", "ok", "ok"] and settled == [1.0, 1.0]
    # The outer clone spawned, then waited for its clone when the rounds ran out.
    episode, stopped = rollout(max_rounds=2)
    outer = episode.agents[1]
    assert (outer.status, outer.failure, len(outer.turns)) == ("aborted", "round limit", 1)
    assert {a.status for a in episode.agents} == {"aborted"}
    assert stopped == [0.0]  # the inner clone never generated: no row


def test_a_clone_that_ran_on_to_its_token_limit_after_answering_is_gated() -> None:
    """Its status is `ok` (the runtime hands its answer on), but the paper counts hitting the token
    limit as breaking protocol, as `GateConfig` says: it got full credit."""
    rambler = clone("ok", generated=16)
    rambler.turns = [TurnRecord("Answer: 2\nblah blah", 16, 16, "length")]
    assert clone_gate(rambler, 0.7, GateConfig("protocol")) == 0.0
    assert clone_gate(rambler, 0.0, GateConfig("ratio", credit_clones_of_zero_reward_roots=True)) == 0.0
    assert clone_gate(rambler, 0.7, GateConfig("none")) == 1.0
    stopped = clone("ok", generated=9)
    stopped.turns = [TurnRecord("Answer: 2", 9, 16, "stop")]
    assert clone_gate(stopped, 0.7, GateConfig("protocol")) == 1.0


def test_a_ratio_gate_that_no_clone_can_reach_is_refused() -> None:
    """The release's 192-token threshold under the tiny profile's 96-token clone cap would never gate."""
    tiny = RuntimeConfig(clone_max_tokens=96)
    with pytest.raises(ValueError, match="ratio_min_tokens 192 is not below the clone token cap 96"):
        SelfcestConfig(runtime=tiny, gate=GateConfig("ratio"))
    SelfcestConfig(runtime=tiny, gate=GateConfig("ratio", ratio_min_tokens=48))  # reachable: accepted
    SelfcestConfig(runtime=tiny, gate=GateConfig("protocol"))  # the threshold is unused: accepted
    SelfcestConfig(runtime=RuntimeConfig(clone_max_tokens=1024), gate=GateConfig("ratio"))  # the release


def rollout_trainer(tokenizer) -> SimpleNamespace:
    """The parts of a `GRPOTrainer` that `make_rollout_func` reads."""
    return SimpleNamespace(
        accelerator=SimpleNamespace(unwrap_model=lambda model: model, process_index=0),
        model=torch.nn.Linear(1, 1),
        processing_class=tokenizer,
        state=SimpleNamespace(global_step=0),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )


def spawning_policy(objectives: list[dict]) -> tuple[str, Callable[[str], str]]:
    """A root that spawns `objectives` in one call and answers 6 once its clones (who answer 2) return."""
    spawn = "<tool_call>\n" + json.dumps({"name": "spawn_clone", "arguments": {"objectives": objectives}})
    spawn += "\n</tool_call>"

    def policy(prompt: str) -> str:
        if CLONE_SYSTEM_PROMPT in prompt:
            return "Answer: 2"
        return "Answer: 6" if "<tool_response>" in prompt.rsplit("<|im_start|>user", 1)[-1] else spawn

    return spawn, policy


def test_group_weighting_counts_only_the_clones_that_ran(tiny_tokenizer) -> None:
    """A clone refused for lack of budget never generated: it gets no training row and does not
    divide its episode's clone advantages under `group` weighting (three clones ran of four spawned)."""
    objectives = [{"task": "Calculate the value of 1+1.", "max_tokens": 16}] * 4
    spawn, policy = spawning_policy(objectives)

    # After the spawn turn, 7 tokens above the root's 16-token reserve: four equal shares would be
    # below `min_clone_tokens` (2), so the last clone is refused and the other three share the 7.
    budget = len(tiny_tokenizer.encode(spawn, add_special_tokens=False)) + 1 + 16 + 7
    config = SelfcestConfig(
        runtime=RuntimeConfig(episode_token_budget=budget, root_max_tokens=400),
        gate=GateConfig("none"),
        clone_weighting="group",
        engine_factory=lambda _model, tokenizer: ScriptedEngine(tokenizer, policy),
    )
    task = Task("t", arithmetic_question("1+1+1+1+1+1"), metadata={"kind": "arithmetic", "answer": "6"})
    trainer = rollout_trainer(tiny_tokenizer)
    out = make_rollout_func({"t": task}, config)(["t"], trainer)
    [rows] = out["clone_rows"]
    assert [weight for *_, weight in rows] == pytest.approx([1 / 3] * 3)
    assert all(1 in env_mask for _, _, env_mask, _ in rows)  # every row has tokens to train
    assert trainer._metrics["train"]["selfcest/clones_per_episode"] == [3.0]


def test_no_clone_row_trains_on_a_held_out_sum(tiny_tokenizer) -> None:
    """A clone handed a half that is a test problem (here a quarter of a 12-term sum, held out in
    another spelling) gets no row; its sibling and the clones above it keep theirs, and the step logs
    how many rows were held out. Under `group` weighting the rows kept share the episode's one row of
    weight: the trainer gives each 1/len(kept) of the loss's denominator, so their advantages divide
    by the same count (they divided by the count before the held-out rows left)."""
    from scripted_policies import halving_policy

    terms = [3, -4, 5, 1, -2, 6, 7, -8, 9, 1, 2, -3]  # 12 -> 6 + 6 -> four quarters of 3
    expr = "3" + "".join(f"{t:+d}" for t in terms[1:])
    task = Task("t", arithmetic_question(expr), metadata={"kind": "arithmetic", "answer": str(sum(terms))})

    def rows_and_count(held_out: frozenset[str]) -> tuple[list[str], list[float], float]:
        config = SelfcestConfig(
            runtime=RuntimeConfig(expression_halves=True, expression_max_depth=2, episode_token_budget=1024),
            gate=GateConfig("none"),
            clone_weighting="group",
            held_out_sums=held_out,
            engine_factory=lambda _model, tokenizer: ScriptedEngine(tokenizer, halving_policy),
        )
        trainer = rollout_trainer(tiny_tokenizer)
        [rows] = make_rollout_func({"t": task}, config)(["t"], trainer)["clone_rows"]
        prompts = [tiny_tokenizer.decode(prompt_ids) for prompt_ids, *_ in rows]
        [count] = trainer._metrics["train"]["selfcest/held_out_clone_rows"]
        return [re.findall(r"\] (\S+)", p)[-1] for p in prompts], [w for *_, w in rows], count

    every, weights, count = rows_and_count(frozenset())
    assert sorted(every) == sorted(["3-4+5+1-2+6", "7-8+9+1+2-3", "3-4+5", "1-2+6", "7-8+9", "1+2-3"])
    assert count == 0 and weights == pytest.approx([1 / 6] * 6)
    kept, kept_weights, count = rows_and_count(frozenset({"1 + 2 - 3", "99+1"}))
    assert sorted(kept) == sorted(h for h in every if h != "1+2-3")
    assert count == 1 and kept_weights == pytest.approx([1 / 5] * 5)


def test_a_clone_whose_task_spells_out_a_held_out_sum_gets_no_row(tiny_tokenizer) -> None:
    objectives = [
        {"task": "Calculate the value of 1+1.", "max_tokens": 16},
        {"task": "Calculate the value of 2+2."},
    ]
    _, policy = spawning_policy(objectives)

    config = SelfcestConfig(
        runtime=RuntimeConfig(episode_token_budget=512, root_max_tokens=400),
        held_out_sums=frozenset({"2+2"}),
        engine_factory=lambda _model, tokenizer: ScriptedEngine(tokenizer, policy),
    )
    task = Task("t", arithmetic_question("1+1+2+2"), metadata={"kind": "arithmetic", "answer": "6"})
    [rows] = make_rollout_func({"t": task}, config)(["t"], rollout_trainer(tiny_tokenizer))["clone_rows"]
    assert ["1+1" in tiny_tokenizer.decode(prompt_ids) for prompt_ids, *_ in rows] == [True]


def test_held_out_sums_must_be_sums() -> None:
    with pytest.raises(ValueError, match="held-out sums must be"):
        SelfcestConfig(held_out_sums=frozenset({"1+1", "What is 2?"}))


def generation_batch(trainer) -> tuple[dict, list[dict]]:
    inputs = [{"prompt": f"t{i // 4}"} for i in range(8)]
    trainer.model.train()
    batch = trainer._generate_and_score_completions(inputs)
    return batch, inputs


def test_clone_rows_carry_gated_root_advantages(tiny_checkpoint: Path, tmp_path: Path) -> None:
    trainer = make_trainer(tiny_checkpoint, tmp_path / "run")
    batch, inputs = generation_batch(trainer)
    roles = batch["row_role"].tolist()
    assert roles[:8] == [ROLE_ROOT] * 8
    expected = []
    for i, row in enumerate(inputs):
        for *_, weight in row["clone_rows"]:
            expected.append(float(batch["advantages"][i]) * weight)
    clone_advantages = [float(a) for a, r in zip(batch["advantages"], roles, strict=True) if r == ROLE_CLONE]
    assert clone_advantages == pytest.approx(expected)
    assert len(clone_advantages) > 0
    # each weight is its own clone's gate, read from the clone's text rather than from the code under
    # test: a rambling clone (no `Answer:`) broke protocol and gets 0, an answering one 1
    answered = [
        [
            "Answer:" in trainer.processing_class.decode(completion)
            for _, completion, _, _ in row["clone_rows"]
        ]
        for row in inputs
    ]
    weights = [[w for *_, w in row["clone_rows"]] for row in inputs]
    assert weights == [[1.0 if a else 0.0 for a in row] for row in answered]
    assert {a for row in answered for a in row} == {True, False}  # the gate closed and stayed open
    mask = batch["completion_mask"] * batch["tool_mask"]
    # a gated row (weight 0) has no loss token, yet its tokens count in the denominator, as a row of weight 0
    clone_weights = [weight for row in inputs for *_, weight in row["clone_rows"]]
    gated = [8 + i for i, weight in enumerate(clone_weights) if weight == 0.0]
    assert gated and int(mask[gated].sum()) == 0
    clone_tokens = sum(sum(env_mask) for row in inputs for _, _, env_mask, _ in row["clone_rows"])
    assert int(batch["num_items_in_batch"]) == int(mask[:8].sum()) + clone_tokens
    # the root rows mask the tool responses: fewer loss tokens than completion tokens
    assert (mask[:8].sum(1) < batch["completion_mask"][:8].sum(1)).any()
    assert all(r != ROLE_PAD or float(a) == 0.0 for a, r in zip(batch["advantages"], roles, strict=True))


def test_group_weighting_counts_each_episodes_clones_as_one_row(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """`group` divides an episode's clone advantages by its clone count; the loss's denominator must
    count those clones as one row of their mean length, or the clone count still scales the update."""
    trainer = make_trainer(tiny_checkpoint, tmp_path / "run", clone_weighting="group")
    batch, inputs = generation_batch(trainer)
    # every row's own tokens (a gated row's too, which the loss mask leaves out; see above)
    per_row = (batch["completion_mask"] * batch["tool_mask"]).sum(1).tolist()[:8]
    per_row += [sum(env_mask) for item in inputs for _, _, env_mask, _ in item["clone_rows"]]
    roles = batch["row_role"].tolist()
    expected, row = sum(per_row[:8]), 8
    for item in inputs:
        clones = len(item["clone_rows"])
        expected += sum(per_row[row : row + clones]) / max(clones, 1)
        for _, completion, _, weight in item["clone_rows"]:  # the gate, then divided by the clone count
            answered = "Answer:" in trainer.processing_class.decode(completion)
            assert weight == pytest.approx((1.0 if answered else 0.0) / clones)
        assert roles[row : row + clones] == [ROLE_CLONE] * clones
        row += clones
    assert any(len(item["clone_rows"]) > 1 for item in inputs)  # the case where the two weightings differ
    assert float(batch["num_items_in_batch"]) == pytest.approx(expected)
    assert float(batch["num_items_in_batch"]) < sum(per_row)


def test_gradient_norm_passes_leave_the_steps_logged_metrics_alone(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """The root/clone gradient-norm measurement runs TRL's loss twice more; what those passes log
    (entropy, clip ratios) must not be averaged into the step's own values."""
    trainer = make_trainer(tiny_checkpoint, tmp_path / "run", role_grad_norm_steps=1)
    batch, _ = generation_batch(trainer)
    trainer.current_gradient_accumulation_steps = 1
    metrics = trainer._metrics["train"]
    before = {key: len(values) for key, values in metrics.items()}
    trainer.compute_loss(trainer.model, batch)
    added = {key: len(values) - before.get(key, 0) for key, values in metrics.items()}
    assert added["entropy"] == 1 and added["clip_ratio/region_mean"] == 1
    assert added["selfcest/grad_norm_root"] == 1 and added["selfcest/grad_norm_clone"] == 1
    assert all(values for values in metrics.values())  # no key left with an empty list


def test_clone_row_loss_equals_trl_compute_loss(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """TRL's `_compute_loss` on the augmented batch has the gradient of the policy-gradient surrogate
    -sum_rows A_row * sum_t mask * logp_t / N computed row by row without padding (dapo, beta 0, on-policy).
    An upgrade of TRL that changes these semantics fails here."""
    trainer = make_trainer(tiny_checkpoint, tmp_path / "run")
    batch, _ = generation_batch(trainer)
    model = trainer.model
    params = [p for p in model.parameters() if p.requires_grad]
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() in a real run
    trl_loss = trainer._compute_loss(model, batch)
    trl_grads = torch.autograd.grad(trl_loss, params, allow_unused=True)

    n_items = float(batch["num_items_in_batch"])
    surrogate = torch.zeros(())
    for row in range(batch["prompt_ids"].size(0)):
        prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()]
        completion = batch["completion_ids"][row][batch["completion_mask"][row].bool()]
        mask = batch["tool_mask"][row][: completion.size(0)].float()
        ids = torch.cat([prompt, completion]).unsqueeze(0)
        logits = model(input_ids=ids).logits[0, prompt.size(0) - 1 : -1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(1, completion.unsqueeze(1)).squeeze(1)
        ratio = torch.exp(logp - logp.detach())
        surrogate = surrogate - (batch["advantages"][row] * ratio * mask).sum() / n_items
    assert float(trl_loss) == pytest.approx(float(surrogate), abs=1e-5)
    ref_grads = torch.autograd.grad(surrogate, params, allow_unused=True)
    for ours, theirs in zip(ref_grads, trl_grads, strict=True):
        if ours is None or theirs is None:
            assert (ours is None or not ours.any()) and (theirs is None or not theirs.any())
            continue
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-3)


def test_a_gated_clone_row_adds_no_kl_term(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """With beta > 0 TRL adds a KL term on every loss token whatever the row's advantage; a clone the
    gate closed (weight 0) must get no gradient at all: moving its reference log-probs (so its KL is
    not zero) leaves the loss and its gradient as they were, while moving a root's changes them."""
    trainer = make_trainer(tiny_checkpoint, tmp_path / "run", beta=0.5)
    batch, inputs = generation_batch(trainer)
    trainer.current_gradient_accumulation_steps = 1
    weights = [weight for row in inputs for *_, weight in row["clone_rows"]]
    gated = [8 + i for i, weight in enumerate(weights) if weight == 0.0]  # clone rows follow the 8 roots
    assert gated and all(r == ROLE_CLONE for r in batch["row_role"][gated].tolist())
    params = [p for p in trainer.model.parameters() if p.requires_grad]

    def loss_and_grads(rows: list[int]) -> tuple[float, list[torch.Tensor]]:
        ref = batch["ref_per_token_logps"].clone()
        ref[rows] -= 1.0
        loss = trainer._compute_loss(trainer.model, dict(batch, ref_per_token_logps=ref))
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return float(loss), [
            torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)
        ]

    base_loss, base_grads = loss_and_grads([])
    gated_loss, gated_grads = loss_and_grads(gated)
    assert gated_loss == pytest.approx(base_loss, abs=1e-7)
    for ours, theirs in zip(gated_grads, base_grads, strict=True):
        torch.testing.assert_close(ours, theirs)
    root_loss, root_grads = loss_and_grads([0])
    assert root_loss > base_loss + 1e-3  # the KL term is live on an ungated row
    assert any(not torch.allclose(a, b) for a, b in zip(root_grads, base_grads, strict=True))


@pytest.mark.slow
def test_train_runs_and_updates_the_policy(tiny_checkpoint: Path, tmp_path: Path) -> None:
    trainer = make_trainer(tiny_checkpoint, tmp_path / "run", max_steps=3, role_grad_norm_steps=2)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 3
    assert any(
        not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters(), strict=True)
    )
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 3 and all("selfcest/clone_rows" in h for h in logs)
    # Role gradient norms on step 1 and every second step, not on step 3.
    assert [h["step"] for h in logs if "selfcest/grad_norm_root" in h] == [1, 2]
    assert any(h.get("selfcest/grad_norm_clone", 0) > 0 for h in logs)


class _Crash(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.global_step == 3:
            raise KeyboardInterrupt("simulated kill")


def test_a_resumed_epoch_draws_the_prompts_an_uninterrupted_run_draws(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """TRL's sampler seeds its generator once, so a run resumed in epoch 1 or later (a fresh sampler)
    replayed epoch 0's order. The trainer's sampler now draws each epoch's order from (seed, epoch),
    and the Trainer's `set_epoch` reaches it through the dataloader."""
    from trl.trainer.utils import RepeatSampler

    from selfcest.grpo import EpochSeededRepeatSampler

    settings = {"data_source": list(range(10)), "mini_repeat_count": 2, "batch_size": 3, "seed": 7}
    running = EpochSeededRepeatSampler(**settings)
    epochs = []
    for epoch in range(3):
        running.set_epoch(epoch)
        epochs.append(list(running))
    assert epochs[0] == list(RepeatSampler(**settings))  # epoch 0 is TRL's own order
    assert epochs[1] != epochs[0]
    for epoch in (1, 2):
        resumed = EpochSeededRepeatSampler(**settings)
        resumed.set_epoch(epoch)
        assert list(resumed) == epochs[epoch]

    trainer = make_trainer(tiny_checkpoint, tmp_path / "run")
    loader = trainer.get_train_dataloader()
    loader.set_epoch(2)
    sampler = loader.batch_sampler.sampler  # accelerate's DataLoaderShard passes set_epoch on to it
    assert isinstance(sampler, EpochSeededRepeatSampler) and sampler.epoch == 2


@pytest.mark.slow
def test_killed_run_resumes_from_its_last_checkpoint(tiny_checkpoint: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert prepare_run_dir(run, "fp") is None
    trainer = make_trainer(tiny_checkpoint, run, max_steps=4, save_steps=2, callbacks=[_Crash()])
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    resume = prepare_run_dir(run, "fp")
    assert resume is not None and resume.endswith("checkpoint-2")
    trainer = make_trainer(tiny_checkpoint, run, max_steps=4, save_steps=2)
    trainer.train(resume_from_checkpoint=resume)
    assert trainer.state.global_step == 4
    steps = [h["step"] for h in trainer.state.log_history if "loss" in h]
    assert steps[:2] == [1, 2] and steps[-1] == 4  # history restored from the checkpoint, then continued
    assert prepare_run_dir(run, "other-params") is None  # a changed config never resumes stale state


@pytest.mark.slow
def test_two_processes_on_gloo(tiny_checkpoint: Path, tmp_path: Path) -> None:
    script = Path(__file__).parent / "scripts" / "grpo_gloo.py"
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="true")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29517",
            str(script),
            str(tiny_checkpoint),
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # Both ranks print to one pipe, so their lines can interleave without a newline between them
    # (seen: "rank=1 ... rank=0 ..." on one line); match the reports anywhere in the output.
    reports = re.findall(r"rank=(\d) world=2 steps=2 ", result.stdout)
    assert sorted(reports) == ["0", "1"], result.stdout


def test_log_probs_and_entropies_are_trls_with_their_gradients(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """The trainer's own per-token log-probs (plain logits) equal TRL's chunked kernel's, masks and
    gradients included, on a real generation batch (left-padded prompts, right-padded completions),
    and both are the log-probs of the rollouts' sampling temperature, not of temperature 1."""
    trainer = make_trainer(tiny_checkpoint, tmp_path / "run", temperature=0.7)
    assert trainer.temperature == 0.7
    batch, _ = generation_batch(trainer)
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    assert (attention_mask == 0).any()
    keep = batch["completion_ids"].size(1)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    results = []
    for compute in (
        GRPOTrainer._get_per_token_logps_and_entropies,
        SelfcestGRPOTrainer._get_per_token_logps_and_entropies,
    ):
        logps, entropies, _ = compute(
            trainer, trainer.model, input_ids, attention_mask, keep, batch_size=3, compute_entropy=True
        )
        grads = torch.autograd.grad((logps * 0.7).sum() + entropies.sum(), params, allow_unused=True)
        results.append((logps.detach(), entropies.detach(), grads))
    (trl_logps, trl_entropies, trl_grads), (own_logps, own_entropies, own_grads) = results
    torch.testing.assert_close(own_logps, trl_logps, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # the first completion token of row 0, from the logits by hand
        logits = trainer.model(input_ids=input_ids[:1], attention_mask=attention_mask[:1]).logits
    first = input_ids.size(1) - keep
    by_hand = (logits[0, first - 1] / 0.7).log_softmax(-1)[input_ids[0, first]]
    torch.testing.assert_close(own_logps[0, 0], by_hand, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(own_entropies, trl_entropies, atol=1e-5, rtol=1e-4)
    assert (own_logps[batch["completion_mask"] == 0] == 0).all()
    for ours, theirs in zip(own_grads, trl_grads, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-3)


def test_code_fingerprint_changes_with_the_stage_script(tmp_path: Path) -> None:
    """A run killed under one version of the code is not resumed by another: the fingerprint's code
    part covers the package and the stage script."""
    script = tmp_path / "stage.py"
    script.write_text("LOSS = 'old'\n")
    before = code_sha256(script)
    assert code_sha256(script) == before and len(before) == 64
    script.write_text("LOSS = 'new'\n")
    assert code_sha256(script) != before
    assert code_sha256() != code_sha256(script)


def test_micro_steps_give_the_same_update_as_one_batch(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """`micro_steps: 2` generates the same batch once and accumulates two slices into one optimiser
    step: the gradient norm and the updated weights equal one whole-batch step's."""
    updates = {}
    for micro_steps in (1, 2):
        trainer = make_trainer(
            tiny_checkpoint,
            tmp_path / f"run{micro_steps}",
            max_steps=1,
            micro_steps=micro_steps,
            warmup_steps=0,
        )
        trainer.train()
        [log] = [h for h in trainer.state.log_history if "grad_norm" in h]
        updates[micro_steps] = (log["grad_norm"], [p.detach().clone() for p in trainer.model.parameters()])
    (norm_one, weights_one), (norm_two, weights_two) = updates[1], updates[2]
    assert norm_two == pytest.approx(norm_one, rel=1e-4) and norm_one > 0
    # Adam's first step is lr * g / (|g| + eps) per entry: an entry whose gradient is of the order of
    # eps moves by a visibly different amount under another float summation order (measured: 1 of
    # 512 entries of one matrix, by 1e-5 against lr 1e-3), every other one identically.
    assert all(torch.allclose(a, b, atol=5e-5) for a, b in zip(weights_one, weights_two, strict=True))
    with pytest.raises(ValueError, match="micro_steps 3 must divide prompts_per_step x num_generations = 8"):
        make_trainer(tiny_checkpoint, tmp_path / "run3", micro_steps=3)


def _bf16_cpu_attention() -> contextlib.AbstractContextManager:
    """PyTorch 2.13's fused CPU attention in bf16 packs its operands with AVX-512 BF16 / AMX code
    wherever the CPU has those, but that code refuses to run when ATen's kernels are pinned to AVX2
    ("pack_vnni2 is only supported when avx512 is supported"; measured on an Intel Sapphire Rapids
    machine, and the suite runs pinned once any test has imported `stages`). The math backend is
    the same attention without that packing; elsewhere nothing changes."""
    pinned = os.environ.get(KERNEL_VARIABLE, "").lower() == PINNED_CAPABILITY
    if pinned and {"avx512_bf16", "amx_bf16"} & cpu_flags():
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


def test_gradient_checkpointing_and_bf16_train_the_same_step(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """Gradient checkpointing recomputes activations: the same gradient norm as keeping them. bf16
    autocast changes the float format only: a gradient norm within a few percent."""
    norms = {}
    for name, flags in {
        "fp32": {},
        "checkpointing": {"gradient_checkpointing": True},
        "bf16": {"bf16": True},
    }.items():
        trainer = make_trainer(tiny_checkpoint, tmp_path / name, max_steps=1, warmup_steps=0, **flags)
        with _bf16_cpu_attention():
            trainer.train()
        [log] = [h for h in trainer.state.log_history if "grad_norm" in h]
        norms[name] = log["grad_norm"]
        assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert norms["checkpointing"] == pytest.approx(norms["fp32"], rel=1e-4)
    assert norms["bf16"] == pytest.approx(norms["fp32"], rel=0.05) and norms["bf16"] != norms["fp32"]


def test_grpo_draws_each_source_in_order_and_names_a_bad_task_setting(tmp_path: Path) -> None:
    from stages.train_grpo import grpo_records

    def write(name: str, count: int) -> Path:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"id": f"{name}-{i}"}) + "\n" for i in range(count)))
        return path

    paths = {"arithmetic": write("arith", 50), "qa": write("qa", 40), "arithmetic_rl": write("rl", 30)}
    without = grpo_records({"arithmetic": 10, "qa": 5}, 42, paths)
    with_rl = grpo_records({"arithmetic": 10, "qa": 5, "arithmetic_rl": 7}, 42, paths)
    assert len(without) == 15 and len(with_rl) == 22
    assert sum(r["id"].startswith("rl-") for r in with_rl) == 7
    # the rl draw comes last, so adding it leaves the train records drawn (and those left out) alone
    assert {r["id"] for r in without} == {r["id"] for r in with_rl if not r["id"].startswith("rl-")}
    assert with_rl == grpo_records({"arithmetic": 10, "qa": 5, "arithmetic_rl": 7}, 42, paths)
    # a count of 0 reads no file; a count over an empty (or absent) one is refused, naming both
    missing = dict(paths, arithmetic_rl=tmp_path / "absent.jsonl")
    assert len(grpo_records({"arithmetic": 10, "qa": 5, "arithmetic_rl": 0}, 42, missing)) == 15
    empty = dict(paths, arithmetic_rl=write("empty", 0))
    with pytest.raises(
        ValueError, match=r"grpo.tasks.arithmetic_rl asks 7 problems but .*empty.jsonl holds none"
    ):
        grpo_records({"arithmetic": 10, "qa": 5, "arithmetic_rl": 7}, 42, empty)
    with pytest.raises(ValueError, match=r"grpo.tasks: unknown key\(s\) \['arithmetc'\]"):
        grpo_records({"arithmetc": 10}, 42, paths)
    with pytest.raises(ValueError, match=r"grpo.tasks.qa: expected an integer >= 0, got -1"):
        grpo_records({"arithmetic": 10, "qa": -1}, 42, paths)


def test_a_peft_policy_with_a_kl_term_is_refused(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With beta > 0 TRL keeps no reference model for a PEFT policy (it switches the adapter off for
    the roots' reference log-probs); the clone rows' recomputed ones would come from the adapted
    policy itself, so the KL term would pull towards the current policy. The project trains full
    models only, so such a trainer is refused, naming the way out; a full model with beta > 0 gets
    TRL's own reference model. peft is not installed here: the policy is reported as a PEFT model
    the way TRL tells one (accelerate's `is_peft_model`)."""
    full = make_trainer(tiny_checkpoint, tmp_path / "full", beta=0.1)
    assert full.ref_model is not None and full.ref_model is not full.model
    monkeypatch.setattr("selfcest.grpo.is_peft_model", lambda model: True, raising=False)
    with pytest.raises(ValueError, match=r"beta is 0.1 but the policy is a PEFT \(adapter\) model"):
        make_trainer(tiny_checkpoint, tmp_path / "peft", beta=0.1)
    assert make_trainer(tiny_checkpoint, tmp_path / "peft_no_kl", beta=0.0).ref_model is None  # no KL: fine


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="peft is not installed")
def test_a_real_lora_policy_with_a_kl_term_is_refused(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with a real LoRA-wrapped policy, where peft is installed."""
    import grpo_helpers
    from peft import LoraConfig, get_peft_model

    load = grpo_helpers.load_model

    def load_lora(*args: Any, **kwargs: Any) -> Any:
        return get_peft_model(load(*args, **kwargs), LoraConfig(r=2, target_modules=["q_proj"]))

    monkeypatch.setattr(grpo_helpers, "load_model", load_lora)
    with pytest.raises(ValueError, match=r"policy is a PEFT \(adapter\) model"):
        make_trainer(tiny_checkpoint, tmp_path / "run", beta=0.1)


def test_held_out_splits_of_the_paper_profile_keep_only_the_sums_a_clone_can_hold(tmp_path: Path) -> None:
    """The stage handed every held-out `expr` to SelfcestConfig, which refuses a sum with `*` or
    brackets: the paper profile's GRPO stopped before its first step. Only flat sums can be a
    clone's (the runtime halves no other), so the rest are left out, and a record without `expr`
    names its file."""
    from stages.train_grpo import held_out_sums

    ood = tmp_path / "ood.jsonl"
    exprs = ["2509*3605+681525-450", "(12+7)*3-4", "12+7-3", "5 - 2"]
    ood.write_text("".join(json.dumps({"id": f"o{i}", "expr": e}) + "\n" for i, e in enumerate(exprs)))
    held = held_out_sums([ood])
    assert held == {"12+7-3", "5 - 2"}
    assert SelfcestConfig(held_out_sums=held).held_out_sums == {"12+7-3", "5-2"}
    bad = tmp_path / "test.jsonl"
    bad.write_text(json.dumps({"id": "t0", "expr": "1+1"}) + "\n" + json.dumps({"id": "t1"}) + "\n")
    with pytest.raises(ValueError, match=r"test.jsonl, line 2: a held-out split's record needs an 'expr'"):
        held_out_sums([ood, bad])


def test_a_metric_no_step_logged_is_recorded_as_missing_not_zero() -> None:
    """TRL logs None for `gate_rate` where no clone ran (the no-clone variant); the stage's metrics
    file recorded that as a gate rate of 0.0, and a window with one None step averaged it in as 0."""
    from stages.train_grpo import _mean_of_logged

    assert _mean_of_logged([None, None, None]) is None
    assert _mean_of_logged([0.97, None, 1.0]) == 0.985
    assert _mean_of_logged([0.5, 0.25, 0.0]) == 0.25
