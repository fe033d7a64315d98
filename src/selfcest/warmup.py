"""Warm-up (default profile): supervised fine-tuning on the teachers' conversations with TRL.

Loss is on assistant tokens only (the chat template's `{% generation %}` marks them), so the model
learns to act as root, clone and monolithic solver without learning to predict prompts or tool
responses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices
from trl import SFTConfig, SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from selfcest.checkpoints import CsvLogCallback, prepare_run_dir
from selfcest.param_checks import int_setting
from selfcest.teachers import TeacherConfig, build_warmup_conversations

log = logging.getLogger(__name__)


@dataclass
class WarmupConfig:
    """Supervised warm-up settings (tiny model, CPU)."""

    max_steps: int = 1500
    learning_rate: float = 3e-3
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    batch_size: int = 32
    max_length: int = 1024
    """Longer conversations are truncated (the tiny model's context)."""
    logging_steps: int = 25
    save_steps: int = 250
    """Checkpoint cadence: a killed run resumes from the last one. A multiple of `logging_steps`: a
    resumed run starts its first logging window at its checkpoint, so otherwise that window's loss
    would average fewer steps than an uninterrupted run's."""
    seed: int = 42
    threads: int = 0
    """torch threads; 0 keeps torch's default."""

    def __post_init__(self) -> None:
        # transformers reads max_steps <= 0 as "train by epochs" (-1: three of them, 0: one step):
        # a run of another length than asked, written as a normal one
        for name in ("max_steps", "batch_size", "max_length", "logging_steps", "save_steps"):
            int_setting(getattr(self, name), f"warmup.{name}", minimum=1)
        if self.save_steps % self.logging_steps:
            raise ValueError(
                f"warmup.save_steps ({self.save_steps}) must be a multiple of warmup.logging_steps "
                f"({self.logging_steps}): a resumed run's first logging window starts at its checkpoint"
            )


def mean_logged_loss(history: Sequence[Mapping[str, Any]]) -> float:
    """The run's mean training loss from its log history: each logged window's mean loss weighted by
    its steps (NaN when nothing was logged).

    Not `TrainOutput.training_loss`: after a resume that averages only the steps run since the
    checkpoint (0.0 when the run was killed after its last one), while the log history is restored
    from the checkpoint, so a resumed run reports what an uninterrupted one does and its model card,
    which DVC hashes with the weights, does not change."""
    total, previous_step = 0.0, 0
    for entry in history:
        total += float(entry["loss"]) * (int(entry["step"]) - previous_step)
        previous_step = int(entry["step"])
    return total / previous_step if previous_step else float("nan")


@dataclass
class WarmupSettings:
    """The `warmup` parameter group, read into the objects that use it."""

    training: WarmupConfig
    teacher: TeacherConfig
    qa_records: int
    """Synthetic QA train records (from the first) that give all their conversations."""
    qa_root_only_records: int
    """The records after those that give their root conversation only."""


def warmup_settings(warmup: Mapping[str, Any], *, seed: int) -> WarmupSettings:
    """Read a `warmup` parameter mapping (`params.yaml`): every key but `teacher`, `qa_records` and
    `qa_root_only_records` is a `WarmupConfig` field, `teacher` holds `TeacherConfig`'s fields
    (YAML lists become the tuples the dataclass declares). Unknown keys fail here, by name."""
    training = dict(warmup)
    teacher = training.pop("teacher", {}) or {}
    # Slice bounds: a negative count would slice from the list's end, 1.9 or true be read as 1
    qa_records = int_setting(training.pop("qa_records", 0), "warmup.qa_records", minimum=0)
    qa_root_only_records = int_setting(
        training.pop("qa_root_only_records", 0), "warmup.qa_root_only_records", minimum=0
    )
    return WarmupSettings(
        training=WarmupConfig(seed=seed, **training),
        teacher=TeacherConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in teacher.items()}),
        qa_records=qa_records,
        qa_root_only_records=qa_root_only_records,
    )


def warmup_conversations(
    settings: WarmupSettings,
    *,
    arithmetic_records: Sequence[Mapping[str, Any]],
    qa_train_records: Sequence[Mapping[str, Any]],
    held_out_expressions: Sequence[str],
) -> list[dict[str, Any]]:
    """The warm-up's conversations, as `stages/warmup.py` trains on them: the first
    `settings.qa_records` QA train records give all their conversations, the next
    `settings.qa_root_only_records` their root's only; no clone asks a `held_out_expressions` sum.
    The teacher's draws follow the run's seed (`settings.training.seed`). One function, so that a
    benchmark that counts what the teacher wrote (`benchmarks/teacher_lines.py`) reads the very
    conversations the warm-up trained on."""
    qa_records, root_only = settings.qa_records, settings.qa_root_only_records
    return build_warmup_conversations(
        arithmetic_records,
        qa_train_records[:qa_records],
        seed=settings.training.seed,
        config=settings.teacher,
        qa_root_only_records=qa_train_records[qa_records : qa_records + root_only],
        held_out_expressions=held_out_expressions,
    )


def tokenize_conversations(
    conversations: Sequence[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    *,
    chunk_size: int = 512,
) -> Dataset:
    """Pre-tokenize with the model's chat template, keeping the assistant-token mask for the loss.

    Done here rather than by SFTTrainer so that the tool schema (stored as a JSON string, since
    Arrow cannot hold it beside rows without tools) is decoded before templating. Conversations
    that share a tool schema are templated in batches of `chunk_size`: one batched encode is half
    the time of one call per conversation (measured: 3.4 s against 7.2 s for 8,000) and gives the
    same ids and masks. Rows keep the input order.

    A conversation longer than `max_length` tokens is cut to its first `max_length` (its end is then
    not learned); the column `cut_tokens` says how many tokens each row lost, and a warning counts
    the cut rows, so that a too-small `max_length` shows in the log and the stage's metrics.
    """
    by_tools: dict[str | None, list[int]] = {}
    for index, conversation in enumerate(conversations):
        by_tools.setdefault(conversation["tools"] or None, []).append(index)
    encoded_ids: list[list[int]] = [[] for _ in conversations]
    encoded_masks: list[list[int]] = [[] for _ in conversations]
    cut_tokens = [0 for _ in conversations]
    for tools_json, indices in by_tools.items():
        tools = json.loads(tools_json) if tools_json else None
        for start in range(0, len(indices), chunk_size):
            chunk = indices[start : start + chunk_size]
            encoded = tokenizer.apply_chat_template(
                [conversations[index]["messages"] for index in chunk],
                tools=tools,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            for row, index in enumerate(chunk):
                cut_tokens[index] = max(0, len(encoded["input_ids"][row]) - max_length)
                encoded_ids[index] = list(encoded["input_ids"][row])[:max_length]
                encoded_masks[index] = list(encoded["assistant_masks"][row])[:max_length]
    for index, mask in enumerate(encoded_masks):
        if sum(mask) == 0:
            kind = conversations[index]["kind"]
            raise ValueError(f"conversation {index} (kind {kind}) has no assistant token within {max_length}")
    cut = [index for index, tokens in enumerate(cut_tokens) if tokens]
    if cut:
        log.warning(
            "%d of %d conversations are longer than max_length %d and were cut (the longest by %d "
            "tokens; first: conversation %d, kind %s)",
            len(cut),
            len(conversations),
            max_length,
            max(cut_tokens),
            cut[0],
            conversations[cut[0]]["kind"],
        )
    return Dataset.from_dict(
        {
            "input_ids": encoded_ids,
            "assistant_masks": encoded_masks,
            "kind": [conversation["kind"] for conversation in conversations],
            "length": [len(ids) for ids in encoded_ids],
            "cut_tokens": cut_tokens,
        }
    )


BOOKKEEPING_COLUMNS = ("kind", "cut_tokens")
"""Columns of `tokenize_conversations` for the stage's counts, not for the trainer."""


class EpochSeededLengthGroupedSampler(LengthGroupedSampler):
    """transformers' `LengthGroupedSampler` with a shuffle that is a function of (seed, epoch).

    Why: transformers builds it without a generator, so each epoch's order came from the global
    torch RNG, which a resumed run restores only after the epoch's iterator exists. A warm-up killed
    in epoch 2 or later then redrew epoch 0's order and skipped the wrong batches (some rows twice,
    some never). The Trainer calls `set_epoch` before every epoch, so a resumed epoch is the same."""

    def __init__(self, batch_size: int, lengths: list[int], seed: int) -> None:
        super().__init__(batch_size, lengths=lengths)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):  # type: ignore[override]
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=generator))


class AssistantTokenLossSFTTrainer(SFTTrainer):
    """`SFTTrainer` whose loss is PyTorch's cross-entropy on the logits of the scored positions only.

    Why not TRL's own loss: TRL 1.16 always computes it with its chunked LM-head kernel, which on a CPU
    (no Triton) runs tile by tile in torch ops and recomputes every tile in backward. On the tiny model
    (vocabulary 2,048) that kernel took a third of a warm-up step (profiled: 48 of 164 ms). The logits
    of the positions that carry a label are a few MB here, so materialising them costs nothing worth
    saving. Same objective: the summed negative log-likelihood of the assistant tokens over their count.
    """

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        sampler = super()._get_train_sampler(train_dataset)
        if type(sampler) is LengthGroupedSampler:
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            return EpochSeededLengthGroupedSampler(sampler.batch_size, list(sampler.lengths), seed)
        return sampler

    def compute_loss(
        self,
        model: PreTrainedModel,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        labels = inputs["labels"][:, 1:]  # position t predicts token t + 1
        backbone_inputs = {key: value for key, value in inputs.items() if key != "labels"}
        hidden = model.base_model(**backbone_inputs, use_cache=False).last_hidden_state[:, :-1]
        scored = labels != -100
        logits = model.get_output_embeddings()(hidden[scored])
        targets = labels[scored]
        count = scored.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch)
        loss = F.cross_entropy(logits, targets, reduction="sum") / count.clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes  # DDP averages; the count spans every rank
        mode = "train" if model.training else "eval"
        with torch.no_grad():  # TRL's own metrics, counted over every process as TRL counts them
            gather = self.accelerator.gather_for_metrics
            num_correct = gather((logits.argmax(dim=-1) == targets).sum()).sum()
            num_valid = gather(scored.sum()).sum()
            accuracy = (num_correct / num_valid).item() if num_valid > 0 else 0.0
            if mode == "train":
                self._total_train_tokens += gather(inputs["attention_mask"].sum()).sum().item()
        self._metrics[mode]["mean_token_accuracy"].append(accuracy)
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        return (loss, logits) if return_outputs else loss


def run_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    config: WarmupConfig,
    *,
    run_dir: Path,
    run_fingerprint: str,
    log_csv: Path,
    data_collator: DataCollatorForLanguageModeling | None = None,
) -> dict[str, float]:
    """Train in place and return the final metrics; resumes a killed run from `run_dir`.

    `data_collator` replaces TRL's default padding collator (a subclass of it, so that labels stay
    masked as the dataset's `assistant_masks` say); `benchmarks/position_ids.py` passes one that
    rewrites the position ids."""
    if config.threads:
        torch.set_num_threads(config.threads)
    resume = prepare_run_dir(run_dir, run_fingerprint)
    if resume:
        log.info("resuming warm-up from %s", resume)
    args = SFTConfig(
        output_dir=str(run_dir),
        max_steps=config.max_steps,
        learning_rate=config.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, int(config.warmup_ratio * config.max_steps)),
        weight_decay=config.weight_decay,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=1,
        max_length=config.max_length,
        logging_steps=config.logging_steps,
        save_steps=config.save_steps,
        save_total_limit=2,
        save_only_model=False,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        fp16=False,
        seed=config.seed,
        data_seed=config.seed,
        dataloader_num_workers=0,
        activation_checkpointing=False,  # TRL defaults to True; it only costs time on a tiny model
        train_sampling_strategy="group_by_length",  # less padding: arithmetic and QA lengths differ a lot
        disable_tqdm=False,
        remove_unused_columns=True,
    )
    trainer = AssistantTokenLossSFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset.remove_columns([c for c in BOOKKEEPING_COLUMNS if c in dataset.column_names]),
        processing_class=tokenizer,
        data_collator=data_collator,
        callbacks=[CsvLogCallback(log_csv, ["loss", "learning_rate", "grad_norm", "mean_token_accuracy"])],
    )
    result = trainer.train(resume_from_checkpoint=resume)
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    final = history[-1] if history else {}
    return {
        "train_loss": round(mean_logged_loss(history), 5),
        "final_loss": round(float(final.get("loss", float("nan"))), 5),
        "final_token_accuracy": round(float(final.get("mean_token_accuracy", float("nan"))), 5),
        "steps": int(trainer.state.global_step),
        "train_seconds": round(float(result.metrics.get("train_runtime", 0.0)), 1),
    }
