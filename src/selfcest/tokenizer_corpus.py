"""Protocol text for training the tokenizer: prompts, the tool schema and tool-call/response shapes.

The data stages add the task text itself (arithmetic prompts, QA paragraphs) from their files.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from selfcest.prompts import (
    CLONE_SYSTEM_PROMPT,
    MONOLITHIC_SYSTEM_PROMPT,
    ROOT_SYSTEM_PROMPT,
    SPAWN_CLONE_TOOL,
    THINKING_SYSTEM_PROMPT,
)
from selfcest.tokenizer import CHAT_TEMPLATE

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)


def protocol_corpus(*, seed: int, repeats: int = 200) -> Iterator[str]:
    """Texts that every conversation contains, repeated so that BPE merges them into few tokens."""
    rng = random.Random(seed)
    fixed = [
        ROOT_SYSTEM_PROMPT,
        CLONE_SYSTEM_PROMPT,
        MONOLITHIC_SYSTEM_PROMPT,
        THINKING_SYSTEM_PROMPT,
        TOOLS_PREAMBLE + json.dumps(SPAWN_CLONE_TOOL) + "\n</tools>",
        CHAT_TEMPLATE,
    ]
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
