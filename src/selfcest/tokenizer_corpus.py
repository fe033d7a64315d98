"""Protocol text for training the tokenizer: prompts, the tool schema and tool-call/response shapes.

The data stages add the task text itself (arithmetic prompts, QA paragraphs) from their files.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from transformers.utils.chat_template_utils import render_jinja_template

from selfcest.halves import HALF_KEYS
from selfcest.prompts import (
    CLONE_SYSTEM_PROMPT,
    MONOLITHIC_SYSTEM_PROMPT,
    ROOT_SYSTEM_PROMPT,
    SPAWN_CLONE_TOOL,
    THINKING_SYSTEM_PROMPT,
    arithmetic_question,
    clone_user_message,
)
from selfcest.teachers import HALF_TASK, halves_call, spawn_call
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


# Stand-in (context key, question) pairs for QA-shaped calls when the caller has no QA records.
_FALLBACK_QA_HOPS = (("Example", "Who founded Example?"), ("Sample", "In which city was Sample born?"))


def protocol_corpus(
    *, seed: int, repeats: int = 200, qa_hops: Sequence[tuple[str, str]] = ()
) -> Iterator[str]:
    """Texts that every conversation contains, repeated so that BPE merges them into few tokens.

    Both shapes of `spawn_clone` call the roots write: arithmetic (a task per clone) and QA (context
    keys, then the task). `qa_hops` gives the (paragraph key, question) pairs the QA calls are built
    from (the QA train records' hops; a stand-in pair when empty). Why QA calls too: without them the
    QA call's boilerplate (`{"context": ["`, `"], "task": "`, ...) was left in small pieces: a one-clone
    call was 27 tokens (12 with them, measured on a `qa/validation` call), so a two-hop delegation
    (~78 generated tokens; ~49 with them) could not fit the smallest QA budget (64)."""
    rng = random.Random(seed)
    hops = list(qa_hops) or list(_FALLBACK_QA_HOPS)
    # Not the template's Jinja source: it is never text the model reads or writes, and repeated here
    # it took 164 of the 2,052 vocabulary entries (measured) for fragments no conversation contains.
    fixed = [*SYSTEM_PROMPTS, *rendered_system_turns()]
    for _ in range(repeats):
        yield from fixed
        objectives: list[dict[str, object]] = [
            {
                "task": arithmetic_question(f"{rng.randint(0, 99)}+{rng.randint(0, 99)}"),
                "max_tokens": rng.randint(8, 96),
            }
            for _ in range(rng.randint(1, 4))
        ]
        yield spawn_call(objectives)
        # Halves: the call every delegating arithmetic agent writes, and a clone's prompt around its half.
        yield halves_call(HALF_KEYS)
        yield clone_user_message(
            HALF_TASK, {rng.choice(HALF_KEYS): f"{rng.randint(0, 9)}+{rng.randint(0, 9)}"}
        )
        yield "\n".join(f"turn1_clone{i}: {rng.randint(-99, 999)}" for i in range(len(objectives)))
        yield f"Answer: {rng.randint(-999, 999)}"
        yield "Answer: failed (no information)"
        # QA: a two-hop question's two turns, one clone per hop handed the hop's paragraph key before
        # its task; the second turn's clone also gets an extra key, as some teacher calls do.
        for turn, num_keys in ((1, 1), (2, 2)):
            key, question = rng.choice(hops)
            keys = [key, *(rng.choice(hops)[0] for _ in range(num_keys - 1))]
            yield spawn_call([{"context": keys, "task": question, "max_tokens": rng.choice((24, 32, 48))}])
            yield f"turn{turn}_clone0: {rng.choice(hops)[0]}"
