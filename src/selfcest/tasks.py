"""Turning dataset records into runtime `Task`s, and scoring an episode against its record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from selfcest.prompts import arithmetic_question, qa_monolithic_question, qa_root_question
from selfcest.runtime import Episode, Task
from selfcest.scoring import qa_exact_match, qa_f1, score_arithmetic

View = Literal["delegate", "monolithic"]


def task_from_record(record: Mapping[str, Any], view: View) -> Task:
    """An arithmetic record (`expr`) or a unified QA record (`paragraphs`) as the root should see it.

    Delegating roots see QA paragraph keys only and hand texts to clones by key; monolithic
    readers see every paragraph in their prompt.
    """
    if "expr" in record:
        return Task(
            id=str(record["id"]),
            question=arithmetic_question(record["expr"]),
            metadata={
                "kind": "arithmetic",
                "answer": str(record["answer"]),
                "size": int(record["num_operators"]) + 1,
            },
        )
    documents = {p["key"]: p["text"] for p in record["paragraphs"]}
    question = (
        qa_root_question(record["question"], list(documents))
        if view == "delegate"
        else qa_monolithic_question(record["question"], documents)
    )
    return Task(
        id=str(record["id"]),
        question=question,
        documents=documents if view == "delegate" else {},
        metadata={"kind": "qa", "answers": list(record["answers"]), "size": int(record.get("num_hops", 0))},
    )


def score_episode(episode: Episode, metadata: Mapping[str, Any]) -> dict[str, float]:
    """Accuracy of the root's final answer: exact integer match, or QA exact match and F1."""
    if metadata["kind"] == "arithmetic":
        accuracy = (
            score_arithmetic(f"Answer: {episode.final_answer}", int(metadata["answer"]))
            if episode.final_answer
            else 0.0
        )
        return {"accuracy": accuracy}
    answer = episode.final_answer or ""
    exact = qa_exact_match(answer, metadata["answers"]) if answer else 0.0
    return {"accuracy": exact, "em": exact, "f1": qa_f1(answer, metadata["answers"]) if answer else 0.0}
