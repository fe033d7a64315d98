"""The supervised warm-up trains on assistant tokens only, through a replaceable collator."""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from trl import SFTConfig, SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from selfcest.data.qa import SyntheticSplitConfig, synthetic_record
from selfcest.model import load_model
from selfcest.teachers import build_warmup_conversations
from selfcest.warmup import (
    BOOKKEEPING_COLUMNS,
    AssistantTokenLossSFTTrainer,
    WarmupConfig,
    run_warmup,
    tokenize_conversations,
    warmup_conversations,
    warmup_settings,
)
from stages.common import load_params


def logged_rows(path: Path) -> list[tuple[int, float]]:
    """The (step, loss) rows of a warm-up's CSV log."""
    with path.open(newline="") as handle:
        return [(int(row["step"]), float(row["loss"])) for row in csv.DictReader(handle)]


class RecordingCollator(DataCollatorForLanguageModeling):
    """TRL's collator, keeping every batch it builds."""

    def __init__(self, pad_token_id: int) -> None:
        super().__init__(pad_token_id=pad_token_id)
        self.batches: list[dict[str, Any]] = []

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().torch_call(examples)
        self.batches.append(batch)
        return batch


def test_warmup_trains_through_the_given_collator_on_assistant_tokens_only(
    tiny_checkpoint: Path, tiny_tokenizer, tmp_path: Path
) -> None:
    conversations = build_warmup_conversations([{"expr": "3+4-2"}, {"expr": "5-1+7+2"}], [], seed=0)
    dataset = tokenize_conversations(conversations, tiny_tokenizer, max_length=512)
    model = load_model(tiny_checkpoint, dtype="float32")
    before = [p.detach().clone() for p in model.parameters()]
    collator = RecordingCollator(tiny_tokenizer.pad_token_id)
    metrics = run_warmup(
        model,
        tiny_tokenizer,
        dataset,
        WarmupConfig(max_steps=2, batch_size=2, logging_steps=1, save_steps=100),
        run_dir=tmp_path / "run",
        run_fingerprint="test",
        log_csv=tmp_path / "log.csv",
        data_collator=collator,
    )
    assert metrics["steps"] == 2 and len(collator.batches) >= 2  # every batch came through it
    logged = logged_rows(tmp_path / "log.csv")  # one row per logged step, with its loss
    assert [step for step, _ in logged] == [1, 2] and all(math.isfinite(loss) for _, loss in logged)
    assistant = {
        tuple(ids): mask for ids, mask in zip(dataset["input_ids"], dataset["assistant_masks"], strict=True)
    }
    for batch in collator.batches:
        for ids, labels, attention in zip(
            batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True
        ):
            length = int(attention.sum())
            mask = torch.tensor(assistant[tuple(ids[:length].tolist())], dtype=torch.bool)
            # Loss only on the assistant's tokens: prompts, tool replies and padding are -100.
            assert torch.equal(labels[:length] != -100, mask) and (labels[length:] == -100).all()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_warmup_settings_read_the_committed_params_and_refuse_unknown_keys() -> None:
    params = load_params(Path(__file__).parents[1] / "params.yaml")
    warmup = params["warmup"]
    settings = warmup_settings(warmup, seed=7)
    assert settings.training.seed == 7 and settings.training.max_steps == warmup["max_steps"]
    assert settings.training.learning_rate == warmup["learning_rate"]  # a float, not YAML's string
    assert settings.qa_records == warmup["qa_records"]
    assert settings.qa_root_only_records == warmup["qa_root_only_records"]
    assert settings.teacher.chunk_sizes == tuple(warmup["teacher"]["chunk_sizes"])
    assert settings.teacher.qa_thinking_fraction == warmup["teacher"]["qa_thinking_fraction"]
    with pytest.raises(TypeError, match="max_stepz"):
        warmup_settings({**warmup, "max_stepz": 3}, seed=7)
    with pytest.raises(TypeError, match="chunk_size"):
        warmup_settings({**warmup, "teacher": {"chunk_size": [2]}}, seed=7)


def test_warmup_conversations_read_full_then_root_only_qa_records_and_hold_sums_out() -> None:
    """The stage's (and `benchmarks/teacher_lines.py`'s) conversations: the first `qa_records` QA
    records in full, the next `qa_root_only_records` as roots only, the rest unread; no clone asks a
    held-out sum."""
    rng = random.Random(3)
    qa = [synthetic_record(rng, SyntheticSplitConfig(count=1), split="train", index=i) for i in range(5)]
    settings = warmup_settings(
        {"qa_records": 2, "qa_root_only_records": 2, "teacher": {"qa_reading_drills": 0}}, seed=11
    )
    arithmetic = [{"expr": "3+4-2"}, {"expr": "5-1+7+2"}, {"expr": "9-8+1"}]
    conversations = warmup_conversations(
        settings,
        arithmetic_records=arithmetic,
        qa_train_records=qa,
        held_out_expressions=["5-1+7+2"],
    )
    assert conversations == build_warmup_conversations(
        arithmetic,
        qa[:2],
        seed=11,
        config=settings.teacher,
        qa_root_only_records=qa[2:4],
        held_out_expressions=["5-1+7+2"],
    )
    everything = "\n".join(m["content"] for c in conversations for m in c["messages"] if m["role"] == "user")
    assert all(record["question"] in everything for record in qa[:4])
    assert qa[4]["question"] not in everything  # past both counts: not read
    roots = [c for c in conversations if c["kind"] == "qa_root"]
    assert len(roots) == 4 and sum(c["kind"] == "qa_mono" for c in conversations) <= 2
    clone_questions = [
        m["content"]
        for c in conversations
        if "clone" in c["kind"]
        for m in c["messages"]
        if m["role"] == "user"
    ]
    assert clone_questions and not any("5-1+7+2" in q for q in clone_questions)


def test_warmup_loss_and_gradients_are_trls_on_the_same_batch(
    tiny_checkpoint: Path, tiny_tokenizer, tmp_path: Path
) -> None:
    """The warm-up's own loss (plain cross-entropy on the scored positions) is TRL's objective:
    the same value, gradients, token accuracy and token count as `SFTTrainer` on one collated batch."""
    conversations = build_warmup_conversations(
        [{"expr": "3+4-2"}, {"expr": "5-1+7+2"}, {"expr": "9-8"}], [], seed=0
    )
    dataset = tokenize_conversations(conversations, tiny_tokenizer, max_length=512).remove_columns(
        list(BOOKKEEPING_COLUMNS)
    )
    args = SFTConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_length=512,
        report_to="none",
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
    )
    results = []
    for trainer_class in (SFTTrainer, AssistantTokenLossSFTTrainer):
        model = load_model(tiny_checkpoint, dtype="float32")
        trainer = trainer_class(
            model=model, args=args, train_dataset=dataset, processing_class=tiny_tokenizer
        )
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])  # unequal lengths: padded
        assert (batch["attention_mask"] == 0).any() and (batch["labels"] == -100).any()
        model.train()
        loss = trainer.compute_loss(model, dict(batch))
        loss.backward()
        gradient = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        metrics = trainer._metrics["train"]
        results.append((loss.item(), gradient, metrics["mean_token_accuracy"][-1], metrics["num_tokens"]))
    trl, own = results  # each: loss, gradient, token accuracy, token count
    trl_loss, trl_gradient, trl_accuracy, trl_tokens = trl
    own_loss, own_gradient, own_accuracy, own_tokens = own
    assert own_loss == pytest.approx(trl_loss, rel=1e-5)
    assert torch.allclose(own_gradient, trl_gradient, rtol=1e-4, atol=1e-7)
    assert own_accuracy == pytest.approx(trl_accuracy)
    assert own_tokens == trl_tokens == [int(batch["attention_mask"].sum())]


def test_batched_templating_keeps_order_ids_and_masks_of_one_call_per_conversation(tiny_tokenizer) -> None:
    conversations = build_warmup_conversations(
        [{"expr": "3+4-2"}, {"expr": "5-1+7+2"}, {"expr": "9-8"}, {"expr": "1+2+3+4+5-6"}], [], seed=0
    )
    assert {bool(c["tools"]) for c in conversations} == {True, False}  # both schemas, interleaved
    dataset = tokenize_conversations(conversations, tiny_tokenizer, max_length=512, chunk_size=3)
    for row, conversation in enumerate(conversations):
        one = tiny_tokenizer.apply_chat_template(
            conversation["messages"],
            tools=json.loads(conversation["tools"]) if conversation["tools"] else None,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        assert dataset["input_ids"][row] == list(one["input_ids"])
        assert dataset["assistant_masks"][row] == list(one["assistant_masks"])
        assert dataset["kind"][row] == conversation["kind"] and dataset["length"][row] == len(
            one["input_ids"]
        )
    with pytest.raises(
        ValueError, match=r"conversation \d+ \(kind arith_\w+\) has no assistant token within 4"
    ):
        tokenize_conversations(conversations, tiny_tokenizer, max_length=4)


def test_a_conversation_cut_to_max_length_is_counted_and_warned_about(
    tiny_tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    """A conversation longer than `max_length` loses its end from training: that used to happen
    without a word. Each row now says how many tokens it lost, and the log counts the cut rows."""
    conversations = build_warmup_conversations([{"expr": "3+4-2"}, {"expr": "5-1+7+2-3+6"}], [], seed=0)
    whole = tokenize_conversations(conversations, tiny_tokenizer, max_length=4096)
    assert whole["cut_tokens"] == [0] * len(whole)
    longest = max(whole["length"])
    limit = longest - 3
    with caplog.at_level("WARNING", logger="selfcest.warmup"):
        cut = tokenize_conversations(conversations, tiny_tokenizer, max_length=limit)
    assert cut["cut_tokens"] == [max(0, n - limit) for n in whole["length"]]
    assert cut["length"] == [min(n, limit) for n in whole["length"]]
    assert sum(1 for n in cut["cut_tokens"] if n) >= 1
    assert f"longer than max_length {limit} and were cut (the longest by 3 tokens" in caplog.text


def test_a_warmup_killed_after_its_first_epoch_resumes_to_the_same_weights(
    tiny_checkpoint: Path, tiny_tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed in epoch 2 and resumed, the warm-up must see the batches an uninterrupted run sees (the
    length-grouped shuffle used the global RNG, so a resume redrew epoch 0's order and skipped the
    wrong batches) and end with the same weights."""
    import selfcest.warmup as warmup_module

    conversations = build_warmup_conversations(
        [{"expr": "3+4-2"}, {"expr": "5-1+7+2"}, {"expr": "8-6"}], [], seed=1
    )
    dataset = tokenize_conversations(conversations, tiny_tokenizer, max_length=512)
    steps_per_epoch = (len(dataset) + 1) // 2
    stop_at: list[int | None] = [None]

    class StoppingLog(warmup_module.CsvLogCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if stop_at[0] is not None and state.global_step == stop_at[0]:
                control.should_training_stop = True
            return control

    monkeypatch.setattr(warmup_module, "CsvLogCallback", StoppingLog)

    def run(run_dir: Path) -> tuple[list[list[int]], Any, dict[str, Any]]:
        model = load_model(tiny_checkpoint, dtype="float32")
        collator = RecordingCollator(tiny_tokenizer.pad_token_id)
        config = WarmupConfig(
            max_steps=3 * steps_per_epoch, batch_size=2, logging_steps=1, save_steps=steps_per_epoch + 2
        )
        metrics = run_warmup(
            model, tiny_tokenizer, dataset, config, run_dir=run_dir, run_fingerprint="fp",
            log_csv=tmp_path / f"{run_dir.name}.csv", data_collator=collator,
        )  # fmt: skip
        return [b["input_ids"][:, :8].sum(1).tolist() for b in collator.batches], model, metrics

    full_batches, full_model, full_metrics = run(tmp_path / "full")
    stop_at[0] = steps_per_epoch + 2  # a checkpoint inside the second epoch
    run(tmp_path / "resumed")
    # `dvc repro` deletes a stage's plots outputs before it reruns the stage: the resumed run finds
    # no log of the killed one and rebuilds its rows from the checkpoint's state.
    (tmp_path / "resumed.csv").unlink()
    stop_at[0] = None
    resumed_batches, resumed_model, resumed_metrics = run(tmp_path / "resumed")
    # The run's mean loss, which the model card (hashed by DVC with the weights) shows: it averaged
    # only the steps since the checkpoint.
    assert resumed_metrics["train_loss"] == pytest.approx(full_metrics["train_loss"], rel=1e-4)
    assert resumed_metrics["steps"] == full_metrics["steps"]
    assert 0 < len(resumed_batches) < len(full_batches)
    assert resumed_batches == full_batches[-len(resumed_batches) :]
    for ours, theirs in zip(full_model.parameters(), resumed_model.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)
    # The resumed log keeps the rows up to the checkpoint and appends the rest: every step once, in
    # order, with the losses of the uninterrupted run.
    full_log, resumed_log = logged_rows(tmp_path / "full.csv"), logged_rows(tmp_path / "resumed.csv")
    assert [step for step, _ in full_log] == list(range(1, 3 * steps_per_epoch + 1))
    assert [step for step, _ in resumed_log] == [step for step, _ in full_log]
    assert [loss for _, loss in resumed_log] == pytest.approx([loss for _, loss in full_log], rel=1e-4)


def test_the_stage_refuses_a_teacher_that_delegates_otherwise_than_the_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks in the teacher with the runtime's halves on trained clones on prompts without the
    tool schema that the runtime gives them: nothing said so."""
    import yaml

    from stages import warmup as stage

    params = load_params(Path(__file__).parents[1] / "params.yaml")
    params["warmup"]["teacher"]["arithmetic_delegation"] = "chunks"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["warmup", "--params", str(path), "--out", str(tmp_path / "out")])
    with pytest.raises(
        ValueError, match=r"arithmetic_delegation is 'chunks' but runtime.expression_halves is True"
    ):
        stage.main()


def test_a_checkpoint_cadence_off_the_logging_cadence_is_refused_by_name() -> None:
    """A resumed run starts its first logging window at its checkpoint: with saves every 15 steps
    and logs every 10, its step-20 row averaged 5 steps where an uninterrupted run's averaged 10."""
    with pytest.raises(
        ValueError, match=r"warmup.save_steps \(15\) must be a multiple of warmup.logging_steps \(10\)"
    ):
        WarmupConfig(logging_steps=10, save_steps=15)
    WarmupConfig(logging_steps=10, save_steps=20)


def test_counts_that_are_no_whole_number_of_at_least_their_minimum_are_refused_by_name() -> None:
    """transformers reads max_steps <= 0 as "train by epochs" (-1 trained three, 0 one step), and
    the QA record counts are slice bounds: -1 sliced from the end, 1.9 and true were read as 1."""
    from selfcest.warmup import warmup_settings

    for name, bad in [("max_steps", 0), ("max_steps", -1), ("batch_size", 0), ("logging_steps", 0)]:
        with pytest.raises(ValueError, match=rf"^warmup.{name}: expected an integer >= 1, got {bad}"):
            WarmupConfig(**{name: bad})
    for name in ("qa_records", "qa_root_only_records"):
        for bad in (-1, 1.9, True):
            with pytest.raises(ValueError, match=rf"^warmup.{name}: expected an integer >= 0, got {bad!r}"):
                warmup_settings({name: bad}, seed=1)
    settings = warmup_settings({"qa_records": 2, "qa_root_only_records": 0}, seed=1)
    assert (settings.qa_records, settings.qa_root_only_records) == (2, 0)
