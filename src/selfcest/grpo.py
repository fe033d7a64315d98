"""SELFCEST GRPO on TRL: root rollouts from the project's runtime, plus one training row per clone.

TRL's `GRPOTrainer` does the group-relative advantages, the clipped surrogate, the KL term and the
training loop. This module adds what SELFCEST needs on top:

- `rollout_func`: each TRL prompt (a task id, repeated G times by TRL's sampler) becomes one
  whole episode of the runtime; the root's multi-turn trajectory is one row whose tool-response
  tokens are masked out with TRL's `env_mask`.
- `SelfcestGRPOTrainer._generate_and_score_completions`: after TRL has computed the roots'
  advantages A_root (group mean, optionally / group std), every clone trajectory of the episode is
  appended as an extra row with advantage

      A_clone = A_root * w_i,   w_i = gate (none | protocol | ratio, see `rewards.clone_gate`)

  optionally divided by the episode's clone count (`clone_weighting="group"`), so that a root that
  spawns many clones does not get a larger update. With beta = 0 and w_i >= 0 the clipped
  surrogate is linear in the advantage, so this is exactly a per-row weight on TRL's own loss. A
  clone gated to w_i = 0 also leaves the loss mask, so that with beta > 0 it gets no KL term either.
- TRL's hidden rules: every rank must hold the same row count (clone rows are padded with
  zero-weight dummy rows to the largest rank), the generation batch must split evenly into
  `steps_per_generation` slices (padded the same way), `num_items_in_batch` is recounted with the
  clone tokens, and old/reference log-probs are recomputed for the augmented batch when TRL uses them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from accelerate.utils import is_peft_model
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler, pad

from selfcest.engine import GenerationEngine, SamplingConfig, TransformersEngine
from selfcest.halves import HALF_KEYS, expression_halves, format_terms, parse_terms, question_expression
from selfcest.rewards import GateConfig, RewardConfig, clone_gate, episode_reward
from selfcest.runtime import AgentRecord, Episode, Runtime, RuntimeConfig, Task
from selfcest.tasks import score_episode

ROLE_ROOT, ROLE_CLONE, ROLE_PAD = 0, 1, 2


def normal_sum(expr: str) -> str | None:
    """One spelling of a flat `+`/`-` sum ("12 + 7 - 3" and "12+7-3" alike), or None if it is not one."""
    try:
        return format_terms(parse_terms(expr))
    except ValueError:
        return None


@dataclass
class SelfcestConfig:
    """SELFCEST's knobs beside TRL's `GRPOConfig`."""

    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Limits and budgets of training episodes; `use_tools=False` trains the no-clone baseline."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    clone_weighting: Literal["token", "group"] = "token"
    """`token`: every clone row counts like a root row (the release); `group`: clone advantages are
    divided by the episode's clone count (clones that ran), so the number of clones does not scale
    the update."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts; `build_trainer` hands it to `GRPOConfig` too, so that the
    loss's log-probabilities are those of the distribution the tokens were drawn from."""
    seed: int = 42
    """Seeds the rollouts (with the step and process index mixed in)."""
    held_out_sums: frozenset[str] = frozenset()
    """Sums (any spelling `parse_terms` reads) that no clone row may train on: the test and ood
    problems. A half of a training sum is often a whole short test problem (22% of the tier sums and
    30% of the `rl` sums have one in their halves tree), and a clone row trains that problem with the
    answer the clone gave; the warm-up's teacher holds the same sums out of its clone conversations.
    The episode itself and the other rows are unchanged: only the held-out clone's row is left out."""
    engine_factory: Callable[[Any, Any], GenerationEngine] | None = None
    """Builds the rollout engine from (model, tokenizer) at every rollout; default `TransformersEngine`,
    which generates with the policy's live weights. Tests pass a scripted policy here. `VLLMEngine`
    does not fit as it is: it loads weights from disk once, and rollouts from it would come from stale
    weights without a weight sync after every optimiser step (not built; vLLM serves evaluation)."""

    def __post_init__(self) -> None:
        normal = {expr: normal_sum(expr) for expr in self.held_out_sums}
        if bad := sorted(expr for expr, n in normal.items() if n is None):
            raise ValueError(f"held-out sums must be +/- sums of integers, got {bad[:3]}")
        self.held_out_sums = frozenset(n for n in normal.values() if n)
        # The release's ratio gate zeroes a clone that wrote more than `ratio_min_tokens` without an
        # answer. Its 192 suits 1024-token clones; under the tiny profile's 96-token cap no clone can
        # ever write that much, so the gate would silently be the ungated ablation.
        cap = self.runtime.clone_max_tokens
        if self.gate.mode == "ratio" and self.gate.ratio_min_tokens >= cap:
            raise ValueError(
                f"grpo gate `ratio`: ratio_min_tokens {self.gate.ratio_min_tokens} is not below the clone "
                f"token cap {cap} (grpo.runtime.clone_max_tokens), so no clone could ever be gated; set "
                "grpo.gate_options.ratio_min_tokens below the cap"
            )


def agent_row(agent: AgentRecord) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, completion ids, env mask) of one agent: the completion starts at its first
    generated token; tool messages inside it are masked (0)."""
    first = agent.generated_mask.index(1) if 1 in agent.generated_mask else len(agent.token_ids)
    prompt, completion = agent.token_ids[:first], agent.token_ids[first:]
    mask = agent.generated_mask[first:]
    if not completion:  # an agent that never generated (no budget left): one masked token keeps shapes valid
        completion, mask = [agent.token_ids[-1]], [0]
    return list(prompt), list(completion), list(mask)


def episode_stats(
    episodes: Sequence[Episode], accuracies: Sequence[float], gates: Sequence[list[float]]
) -> dict[str, float]:
    n = max(1, len(episodes))
    clone_weights = [w for ws in gates for w in ws]
    return {
        "selfcest/accuracy": sum(accuracies) / n,
        "selfcest/root_tokens": sum(e.root.generated_tokens for e in episodes) / n,
        "selfcest/clone_tokens": sum(e.generated_tokens - e.root.generated_tokens for e in episodes) / n,
        "selfcest/total_tokens": sum(e.total_tokens for e in episodes) / n,
        "selfcest/critical_tokens": sum(e.critical_path_tokens for e in episodes) / n,
        "selfcest/clones_per_episode": sum(e.num_clones for e in episodes) / n,
        "selfcest/delegation_rate": sum(e.num_clones > 0 for e in episodes) / n,
        "selfcest/gate_rate": (sum(w != 0 for w in clone_weights) / len(clone_weights))
        if clone_weights
        else float("nan"),
        "selfcest/protocol_error_rate": sum(bool(e.protocol_errors) for e in episodes) / n,
    }


def agent_sums(episode: Episode, question: str) -> dict[str, set[str]]:
    """The flat sums each agent of an episode is asked, by agent id, in `normal_sum` spelling.

    The root: its question's sum. A clone: the half it was handed by key (`selfcest.halves`: a clone
    handed one half holds it and may hand on halves of it), and any sum its task spells out as an
    arithmetic question (a combining turn's clone). Parents come before their clones in
    `episode.agents` (clones are appended when spawned), so one pass finds every half."""
    held: dict[str, str | None] = {}  # the sum whose halves an agent may hand on
    asked: dict[str, set[str]] = {}
    for agent in episode.agents:
        if agent.parent_id is None:
            expression = question_expression(question)
        elif len(agent.context_keys) == 1 and agent.context_keys[0] in HALF_KEYS:
            parent = held.get(agent.parent_id)
            expression = expression_halves(parent).get(agent.context_keys[0]) if parent else None
        else:
            expression = None  # such a clone holds no halves (the runtime hands it the task's documents)
        held[agent.agent_id] = expression
        written = question_expression(agent.task) if agent.parent_id is not None else None
        asked[agent.agent_id] = {n for e in (expression, written) if e and (n := normal_sum(e))}
    return asked


def make_rollout_func(
    tasks: Mapping[str, Task], config: SelfcestConfig
) -> Callable[[list[str], GRPOTrainer], dict[str, Any]]:
    """TRL `rollout_func`: prompts are task ids; returns one row per prompt, plus clone rows as extras."""

    def rollout(prompts: list[str], trainer: GRPOTrainer) -> dict[str, Any]:
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        factory = config.engine_factory or TransformersEngine
        engine = factory(model, trainer.processing_class)
        seed = config.seed + 7919 * trainer.state.global_step + 104729 * trainer.accelerator.process_index
        try:
            episodes = Runtime(engine, config.runtime).run(
                [tasks[p] for p in prompts],
                sampling=SamplingConfig(temperature=config.temperature, seed=seed),
            )
        finally:
            model.train(was_training)
        out: dict[str, Any] = {
            k: [] for k in ("prompt_ids", "completion_ids", "env_mask", "reward", "clone_rows")
        }
        accuracies, gates = [], []
        held_out_rows = 0
        for prompt, episode in zip(prompts, episodes, strict=True):
            accuracy = score_episode(episode, tasks[prompt].metadata)["accuracy"]
            reward = episode_reward(episode, accuracy, config.reward).total
            prompt_ids, completion_ids, env_mask = agent_row(episode.root)
            out["prompt_ids"].append(prompt_ids)
            out["completion_ids"].append(completion_ids)
            out["env_mask"].append(env_mask)
            out["reward"].append(reward)
            # A clone refused its first turn (no budget left) generated nothing: no row to train, and
            # no share of `group` weighting's division.
            clones = [a for a in episode.agents if a.role == "clone" and a.turns]
            weights = [clone_gate(clone, reward, config.gate) for clone in clones]
            rows = list(zip(clones, weights, strict=True))
            if config.held_out_sums:
                sums = agent_sums(episode, tasks[prompt].question)
                kept = [(c, w) for c, w in rows if not sums[c.agent_id] & config.held_out_sums]
                held_out_rows += len(rows) - len(kept)
                rows = kept
            if config.clone_weighting == "group" and rows:
                # The rows trained, after the held-out ones left: `_add_clone_rows` gives each row a
                # 1/len(rows) share of the loss's denominator, so the advantages divide by the same.
                rows = [(c, w / len(rows)) for c, w in rows]
            out["clone_rows"].append([(*agent_row(c), w) for c, w in rows])
            accuracies.append(accuracy)
            gates.append(weights)
        out["logprobs"] = None  # TRL recomputes log-probs itself when it needs them (no vLLM here)
        mode = "train" if was_training else "eval"
        for name, value in episode_stats(episodes, accuracies, gates).items():
            trainer._metrics[mode][name].append(value)
        trainer._metrics[mode]["selfcest/held_out_clone_rows"].append(float(held_out_rows))
        return out

    return rollout


def reward_from_rollout(
    prompts: list[str], completions: list[Any], completion_ids: list[list[int]], reward: list[float], **_: Any
) -> list[float]:
    """The episode reward computed inside the rollout (it needs the whole tree, not just the root text)."""
    return list(reward)


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` with a shuffle that is a function of (seed, epoch).

    Why: TRL seeds the sampler's generator once, when it is built, and each epoch draws on from it.
    A resumed run builds a fresh sampler, so a run killed in epoch 1 or later replayed epoch 0's
    order and trained on other prompts than an uninterrupted one. The Trainer calls `set_epoch`
    before every epoch (the warm-up's `EpochSeededLengthGroupedSampler` does the same); epoch 0's
    order is TRL's own, so a run that never leaves it is unchanged."""

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):  # type: ignore[override]
        if self.shuffle and self.seed is not None:
            self.generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return super().__iter__()


class SelfcestGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose generation batch also trains every clone trajectory, weighted by its gate."""

    def _get_train_sampler(self, dataset: Any = None) -> EpochSeededRepeatSampler:
        sampler = super()._get_train_sampler(dataset)  # TRL's arguments, kept as they are
        return EpochSeededRepeatSampler(
            data_source=sampler.data_source,
            mini_repeat_count=sampler.mini_repeat_count,
            batch_size=sampler.batch_size,
            repeat_count=sampler.repeat_count,
            shuffle=sampler.shuffle,
            seed=sampler.seed,
        )

    def __init__(
        self,
        *args: Any,
        role_grad_norm_steps: int = 1,
        clone_weighting: Literal["token", "group"] = "token",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        # With beta > 0, TRL builds no reference model for a PEFT (adapter) policy: it takes the
        # roots' reference log-probs from the policy with its adapter switched off (or switched to a
        # frozen "ref" copy). `_recompute_logps`, which redoes them for the batch with the clone rows,
        # would take them from the adapted policy itself, so the KL term would pull towards the
        # current policy, not the reference. The project trains full models only (no config builds
        # an adapter, and peft is not a dependency), so such a policy is refused rather than half
        # supported.
        if self.beta != 0.0 and (is_peft_model(self.model) or self.ref_model is None):
            raise ValueError(
                f"beta is {self.beta} but the policy is a PEFT (adapter) model: the clone rows' KL "
                "reference would be the adapted policy itself, not the reference model. Train a "
                "full model (merge the adapter first) or set grpo.training.beta: 0"
            )
        self.role_grad_norm_steps = role_grad_norm_steps
        self.clone_weighting = clone_weighting

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Log-probabilities (and entropies) of the last `logits_to_keep` tokens, from the model's logits.

        Why not TRL's: TRL 1.16 computes them with its chunked LM-head kernel, which on a CPU (no
        Triton) runs tile by tile in torch ops and recomputes every tile in backward: 9.6 of the 23.8 s
        of backward in a profiled 6-step run of the tiny model. The logits of the completion positions
        are small here. Same values as TRL's, zero where the mask is (tests/test_grpo.py compares
        them); multimodal inputs and MoE auxiliary losses still go to TRL's."""
        if compute_aux_loss or any(value is not None for value in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **multimodal,
            )
        batch_size = batch_size or input_ids.size(0)
        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            ids = input_ids[start : start + batch_size]
            mask = attention_mask[start : start + batch_size]
            with self.accelerator.autocast():
                logits = model(
                    input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1, use_cache=False
                ).logits
            # Position t scores token t + 1; logits over the rollouts' temperature (`GRPOConfig.temperature`).
            log_probs = (logits[:, :-1].float() / self.temperature).log_softmax(dim=-1)
            unscored = mask[:, -logits_to_keep:] == 0
            targets = ids[:, -logits_to_keep:].unsqueeze(-1)
            all_logps.append(log_probs.gather(-1, targets).squeeze(-1).masked_fill(unscored, 0.0))
            if compute_entropy:
                entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
                all_entropies.append(entropy.masked_fill(unscored, 0.0))
        entropies = torch.cat(all_entropies) if compute_entropy else None
        return torch.cat(all_logps), entropies, None

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        return self._add_clone_rows(output, [row.get("clone_rows", []) for row in inputs])

    def _add_clone_rows(self, output: dict[str, Any], clone_rows: list[list[tuple]]) -> dict[str, Any]:
        device = output["prompt_ids"].device
        advantages = output["advantages"]
        roots = output["prompt_ids"].size(0)
        prompts = [ids[m.bool()] for ids, m in zip(output["prompt_ids"], output["prompt_mask"], strict=True)]
        completions = [
            ids[m.bool()] for ids, m in zip(output["completion_ids"], output["completion_mask"], strict=True)
        ]
        tool_mask = output.get("tool_mask")
        env_masks = [
            (
                tool_mask[i][output["completion_mask"][i].bool()]
                if tool_mask is not None
                else torch.ones_like(completions[i])
            )
            for i in range(roots)
        ]
        new_advantages = [a for a in advantages]
        roles = [ROLE_ROOT] * roots
        # How much each row's loss tokens count in the loss's denominator: `group` weighting divides
        # an episode's clone advantages by its clone count, so its clones count as one row of their
        # mean length there too (otherwise a heavily delegating episode still shrank every update).
        token_shares = [1.0] * roots
        # A clone the gate closed (weight 0) gets no gradient at all. Its zero advantage takes away its
        # policy gradient, but with beta > 0 TRL adds the KL term on every token of the loss mask,
        # whatever the advantage, so its tokens leave the loss mask. They still count in the loss's
        # denominator, as with beta = 0, where a gated row is a row of weight 0.
        trained = [1] * roots
        for root_index, rows in enumerate(clone_rows):
            for prompt_ids, completion_ids, env_mask, weight in rows:
                prompts.append(torch.tensor(prompt_ids, device=device))
                completions.append(torch.tensor(completion_ids, device=device))
                env_masks.append(torch.tensor(env_mask, device=device))
                new_advantages.append(advantages[root_index] * weight)
                roles.append(ROLE_CLONE)
                token_shares.append(1.0 / len(rows) if self.clone_weighting == "group" else 1.0)
                trained.append(0 if weight == 0 else 1)
        # Same row count on every rank and a multiple of steps_per_generation: pad with dummy rows
        # that carry no loss token (env mask 0) and no advantage.
        local = torch.tensor([len(prompts)], device=device)
        target = int(self.accelerator.gather(local).max())
        slices = self.args.steps_per_generation if self.model.training else 1
        target += (-target) % slices
        while len(prompts) < target:
            prompts.append(prompts[0].clone())
            completions.append(completions[0][:1].clone())
            env_masks.append(torch.zeros(1, dtype=torch.long, device=device))
            new_advantages.append(advantages.new_zeros(()))
            roles.append(ROLE_PAD)
            token_shares.append(0.0)
            trained.append(1)  # its env mask is already 0
        pad_id = self.processing_class.pad_token_id
        row_tokens = pad(env_masks, padding_value=0, padding_side="right")
        new: dict[str, Any] = {
            "prompt_ids": pad(prompts, padding_value=pad_id, padding_side="left"),
            "prompt_mask": pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left"),
            "completion_ids": pad(completions, padding_value=pad_id, padding_side="right"),
            "completion_mask": pad(
                [torch.ones_like(c) for c in completions], padding_value=0, padding_side="right"
            ),
            "tool_mask": row_tokens
            * torch.tensor(trained, device=device, dtype=row_tokens.dtype).unsqueeze(1),
            "advantages": torch.stack(new_advantages).to(advantages.dtype),
            "row_role": torch.tensor(roles, device=device),
        }
        per_row = (new["completion_mask"] * row_tokens).sum(dim=1).float()
        loss_tokens = (per_row * torch.tensor(token_shares, device=device)).sum()
        new["num_items_in_batch"] = self.accelerator.gather(loss_tokens).sum()
        for key in ("old_per_token_logps", "ref_per_token_logps"):
            if output.get(key) is not None:
                new[key] = self._recompute_logps(new, key)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["selfcest/clone_rows"].append(float(roles.count(ROLE_CLONE)))
        return new

    @torch.no_grad()
    def _recompute_logps(self, batch: dict[str, Any], key: str) -> torch.Tensor:
        model = self.ref_model if key == "ref_per_token_logps" and self.ref_model is not None else self.model
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            batch["completion_ids"].size(1),
            batch_size=self.args.per_device_train_batch_size,
        )
        return logps

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> torch.Tensor:
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if model.training and "row_role" in inputs and self._is_role_grad_norm_step():
            self._log_role_grad_norms(model, inputs)
        return loss

    def _is_role_grad_norm_step(self) -> bool:
        step = self.state.global_step + 1
        every = self.role_grad_norm_steps
        return every > 0 and (step == 1 or step % every == 0)

    def _log_role_grad_norms(self, model: Any, inputs: dict[str, Any]) -> None:
        """Gradient norm of the root rows' loss and of the clone rows' loss, measured separately.

        A forward and a backward pass per role on top of the step's own: measurement only (no
        parameter's `.grad` is touched and dropout is off), so how often it runs does not change
        the weights. With `micro_steps` > 1 each slice is measured alone and the step logs the
        mean of the slices' norms, not the norm of the accumulated gradient."""
        params = [p for p in model.parameters() if p.requires_grad]
        metrics = self._metrics["train"]
        for role, name in ((ROLE_ROOT, "root"), (ROLE_CLONE, "clone")):
            rows = (inputs["row_role"] == role).to(inputs["tool_mask"].dtype).unsqueeze(1)
            if rows.sum() == 0:
                continue
            masked = dict(inputs, tool_mask=inputs["tool_mask"] * rows)
            # TRL's `_compute_loss` logs entropy, clip ratios and KL of whatever it is given; keep
            # the step's own values only, not those of these measurement passes.
            logged = {key: len(values) for key, values in metrics.items()}
            grads = torch.autograd.grad(self._compute_loss(model, masked), params, allow_unused=True)
            for key in list(metrics):
                if key in logged:
                    del metrics[key][logged[key] :]
                else:
                    del metrics[key]
            norm = torch.sqrt(sum((g.detach().float() ** 2).sum() for g in grads if g is not None))
            metrics[f"selfcest/grad_norm_{name}"].append(float(norm))


@dataclass
class TrainingConfig:
    """The subset of TRL's `GRPOConfig` that the stages set (documented there); CPU-friendly defaults."""

    max_steps: int = 60
    learning_rate: float = 2e-4
    prompts_per_step: int = 8
    num_generations: int = 4
    """G rollouts per prompt (the release: 4)."""
    beta: float = 0.0
    """KL coefficient (the release: 5e-4, low-variance k3 estimator)."""
    epsilon: float = 0.2
    loss_type: str = "dapo"
    advantage: Literal["std", "mean"] = "std"
    """`std`: (R - mean) / std within the group (GRPO, the release); `mean`: mean-centred only."""
    max_grad_norm: float = 1.0
    micro_steps: int = 1
    """Gradient accumulation: the generation batch (prompts_per_step x num_generations roots, with
    their clone rows) is generated once, split into this many slices, each a forward and backward
    pass, and followed by one optimiser step, so a large policy need not hold every row's
    activations at once. Still on-policy, and the same update up to float rounding (tested)."""
    bf16: bool = False
    """bf16 mixed precision (autocast; the weights and optimiser state stay fp32): for a GPU policy."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in backward instead of keeping them: less memory, the
    same gradients (tested), about a third more compute."""
    warmup_steps: int = 2
    logging_steps: int = 2
    role_grad_norm_steps: int = 8
    """The root rows' and clone rows' gradient norms are measured on step 1 and every this many
    steps (0: never). Each measurement costs two extra forward and backward passes: taken on every
    second step, they were about a third of the stage's time (profiled)."""
    save_steps: int = 10
    max_completion_length: int = 1024
    threads: int = 0


def build_trainer(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    selfcest: SelfcestConfig,
    training: TrainingConfig,
    *,
    output_dir: str,
    callbacks: Sequence[Any] = (),
) -> SelfcestGRPOTrainer:
    """A ready `SelfcestGRPOTrainer` over `tasks` (each task id is one TRL prompt)."""
    from datasets import Dataset
    from trl import GRPOConfig

    if training.threads:
        torch.set_num_threads(training.threads)
    by_id = {task.id: task for task in tasks}
    if len(by_id) != len(tasks):
        raise ValueError("task ids must be unique")
    roots = training.prompts_per_step * training.num_generations
    if training.micro_steps < 1 or roots % training.micro_steps:
        raise ValueError(
            f"grpo.training.micro_steps {training.micro_steps} must divide prompts_per_step x "
            f"num_generations = {roots}"
        )
    args = GRPOConfig(
        output_dir=output_dir,
        max_steps=training.max_steps,
        learning_rate=training.learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=training.warmup_steps,
        per_device_train_batch_size=roots // training.micro_steps,
        num_generations=training.num_generations,
        # One generation batch per optimiser step (on-policy, no stale log-probs), taken in
        # `micro_steps` accumulated slices; TRL pads nothing here, `_add_clone_rows` makes the
        # augmented batch a multiple of the slice count.
        steps_per_generation=training.micro_steps,
        gradient_accumulation_steps=training.micro_steps,
        # The log-probs of the policy gradient are those of the distribution the rollouts sampled
        # from: TRL divides the logits by this temperature, as its own generation would sample.
        temperature=selfcest.temperature,
        beta=training.beta,
        epsilon=training.epsilon,
        loss_type=training.loss_type,
        scale_rewards="group" if training.advantage == "std" else "none",
        max_grad_norm=training.max_grad_norm,
        max_completion_length=training.max_completion_length,
        logging_steps=training.logging_steps,
        save_strategy="steps",
        save_steps=training.save_steps,
        save_total_limit=2,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        bf16=training.bf16,
        fp16=False,
        # transformers 5 renamed gradient_checkpointing (a deprecated alias until v6); params keep the old name
        activation_checkpointing=training.gradient_checkpointing,
        seed=selfcest.seed,
        data_seed=selfcest.seed,
        dataloader_num_workers=0,
        log_completions=False,
        disable_dropout=True,
    )
    return SelfcestGRPOTrainer(
        model=model,
        reward_funcs=reward_from_rollout,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [task.id for task in tasks]}),
        processing_class=tokenizer,
        rollout_func=make_rollout_func(by_id, selfcest),
        callbacks=list(callbacks),
        role_grad_norm_steps=training.role_grad_norm_steps,
        clone_weighting=selfcest.clone_weighting,
    )
