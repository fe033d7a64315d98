"""Turning dataset records into runtime `Task`s, and scoring a final answer against the golds.

Shared by GRPO training (`task_from_record`, `score_episode`) and the budget-sweep evaluation
(`qa_task`, `score_final_answer`), so that training and evaluation pose and score a problem the
same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from selfcest.data.qa import record_documents
from selfcest.prompts import ANSWER_MARKER, arithmetic_question, qa_monolithic_question, qa_root_question
from selfcest.runtime import Episode, Task
from selfcest.scoring import qa_exact_match, qa_f1, score_arithmetic

View = Literal["delegate", "monolithic"]


def qa_task(
    task_id: str,
    question: str,
    documents: Mapping[str, str],
    view: View,
    metadata: Mapping[str, Any] | None = None,
) -> Task:
    """Multi-hop QA as the root sees it.

    Delegating roots see the paragraph keys only and hand texts to clones by key; monolithic
    readers see every paragraph in their prompt.
    """
    if view == "delegate":
        return Task(
            task_id,
            qa_root_question(question, list(documents)),
            documents=dict(documents),
            metadata=dict(metadata or {}),
        )
    return Task(task_id, qa_monolithic_question(question, documents), metadata=dict(metadata or {}))


def task_from_record(record: Mapping[str, Any], view: View) -> Task:
    """An arithmetic record (`expr`) or a unified QA record (`paragraphs`) as a runtime task."""
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
    documents = record_documents(record)
    metadata = {"kind": "qa", "answers": list(record["answers"]), "size": int(record.get("num_hops", 0))}
    return qa_task(str(record["id"]), record["question"], documents, view, metadata)


def score_final_answer(kind: str, answer: str | None, golds: Sequence[str]) -> tuple[float, float | None]:
    """(correctness in {0, 1}, QA token F1 or None) of the text after the final `Answer:`.

    Arithmetic: exact integer match with the first gold. QA: SQuAD exact match and F1 over aliases.
    """
    if kind == "arithmetic":
        return (score_arithmetic(f"{ANSWER_MARKER} {answer}", int(golds[0])) if answer else 0.0), None
    if kind == "qa":
        if not answer:
            return 0.0, 0.0
        return qa_exact_match(answer, golds), qa_f1(answer, golds)
    raise ValueError(f"unknown task kind {kind!r} (expected arithmetic or qa)")


def score_episode(episode: Episode, metadata: Mapping[str, Any]) -> dict[str, float]:
    """Accuracy of the root's final answer: exact integer match, or QA exact match and F1."""
    if metadata["kind"] == "arithmetic":
        accuracy, _ = score_final_answer("arithmetic", episode.final_answer, [metadata["answer"]])
        return {"accuracy": accuracy}
    exact, f1 = score_final_answer("qa", episode.final_answer, metadata["answers"])
    return {"accuracy": exact, "em": exact, "f1": float(f1 or 0.0)}
