"""Prompts and the `spawn_clone` tool schema shared by the runtime, the teachers and the tokenizer.

The schema goes beyond the released code: each objective carries its own `task`, the `context`
keys of the paragraphs the clone may read, and its own `max_tokens` generation budget. The runtime
enforces all three (see `selfcest.runtime`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SPAWN_CLONE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "spawn_clone",
        "description": (
            "Run clones of yourself in parallel. Each clone starts a fresh context holding only "
            "its task and the documents named in its context, and returns a short answer."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "objectives": {
                    "type": "array",
                    "description": "Independent sub-tasks, one clone each.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "task": {"type": "string", "description": "The sub-task."},
                            "context": {
                                "type": "array",
                                "items": {"type": "string"},
                                "description": "Keys of the documents this clone may read.",
                            },
                            "max_tokens": {
                                "type": "integer",
                                "description": "Generation budget of this clone in tokens.",
                            },
                        },
                        "required": ["task"],
                    },
                }
            },
            "required": ["objectives"],
        },
    },
}

ANSWER_MARKER = "Answer:"

# Short system prompts: the tiny default model pays for every prompt token in context length.
ROOT_SYSTEM_PROMPT = (
    "You solve the task. You may delegate independent parts to clones with spawn_clone, "
    "then combine their answers. Finish with Answer: <answer>."
)
CLONE_SYSTEM_PROMPT = (
    "You are a helper clone. Solve only your task. Give a concise final answer after Answer:. "
    "If you cannot, say why after Answer: failed."
)
MONOLITHIC_SYSTEM_PROMPT = "You solve the task step by step. Finish with Answer: <answer>."
THINKING_SYSTEM_PROMPT = (
    "You solve the task step by step, then check every step again. Finish with Answer: <answer>."
)


def arithmetic_question(expr: str) -> str:
    """The paper's arithmetic prompt."""
    return f"Calculate the value of {expr}."


def qa_root_question(question: str, keys: Sequence[str]) -> str:
    """Multi-hop QA as the root sees it: only the keys (titles) of the paragraphs, then the question.

    The question comes last, as in the monolithic and clone prompts, so that the name a root copies
    into its first context key (the question's anchor) sits a few tokens before the root's reply
    whatever the number and length of the keys. With the keys last, that distance grew with the key
    list, and a seed whose warm-up learned the look-up by position never found the anchor (seed 44:
    93.8% of qa/test roots made protocol errors, keys naming another document)."""
    return f"Documents: {', '.join(keys)}\n{question}"


def qa_monolithic_question(question: str, documents: Mapping[str, str]) -> str:
    """Multi-hop QA as a monolithic reader sees it: every paragraph in full, then the question."""
    return f"{render_documents(documents)}\n{question}"


def render_documents(documents: Mapping[str, str]) -> str:
    return "\n".join(f"[{key}] {text}" for key, text in documents.items())


def clone_user_message(task: str, documents: Mapping[str, str]) -> str:
    """A clone's only input besides its system prompt: its task and the paragraphs it was handed."""
    if not documents:
        return task
    return f"{render_documents(documents)}\n{task}"


def root_messages(question: str, *, system_prompt: str = ROOT_SYSTEM_PROMPT) -> list[dict[str, str]]:
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
