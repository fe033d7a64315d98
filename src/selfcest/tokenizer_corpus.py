"""Protocol text for training the tokenizer: prompts, the tool schema and tool-call/response shapes.

The data stages add the task text itself (arithmetic prompts, QA paragraphs) from their files.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from transformers.utils.chat_template_utils import render_jinja_template

from selfcest.prompts import (
    CLONE_SYSTEM_PROMPT,
    MONOLITHIC_SYSTEM_PROMPT,
    ROOT_SYSTEM_PROMPT,
    SPAWN_CLONE_TOOL,
    THINKING_SYSTEM_PROMPT,
)
from selfcest.tokenizer import CHAT_TEMPLATE

SYSTEM_PROMPTS = (ROOT_SYSTEM_PROMPT, CLONE_SYSTEM_PROMPT, MONOLITHIC_SYSTEM_PROMPT, THINKING_SYSTEM_PROMPT)


def rendered_system_turns() -> list[str]:
    """Every system turn exactly as the chat template renders it, with and without the tool schema.

    Rendered from `CHAT_TEMPLATE` itself so that the tokenizer's merges follow the template text.
    """
    turns = []
    for prompt in SYSTEM_PROMPTS:
        for tools in (None, [SPAWN_CLONE_TOOL]):
            rendered, _ = render_jinja_template(
                [[{"role": "system", "content": prompt}]], tools=tools, chat_template=CHAT_TEMPLATE
            )
            turns.append(rendered[0])
    return turns


def protocol_corpus(*, seed: int, repeats: int = 200) -> Iterator[str]:
    """Texts that every conversation contains, repeated so that BPE merges them into few tokens."""
    rng = random.Random(seed)
    fixed = [*SYSTEM_PROMPTS, *rendered_system_turns(), CHAT_TEMPLATE]
    for _ in range(repeats):
        yield from fixed
        objectives = [
            {
                "task": f"Calculate the value of {rng.randint(0, 99)}+{rng.randint(0, 99)}.",
                "max_tokens": rng.randint(8, 96),
            }
            for _ in range(rng.randint(1, 4))
        ]
        call = {"name": "spawn_clone", "arguments": {"objectives": objectives}}
        yield f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        yield "\n".join(f"turn1_clone{i}: {rng.randint(-99, 999)}" for i in range(len(objectives)))
        yield f"Answer: {rng.randint(-999, 999)}"
        yield "Answer: failed (no information)"
