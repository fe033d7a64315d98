"""Scripted policies for `selfcest.scripted.ScriptedEngine`, shared by the runtime and teacher tests."""

from __future__ import annotations

import json
import re

from selfcest.halves import HALF_KEYS

_RESULT = re.compile(r"turn\d+_clone\d+: (-?\d+)")
_TERM = re.compile(r"[+-]?\d+")


def last_user(prompt: str) -> str:
    """The last user or tool turn of a decoded prompt, up to the end of the prompt."""
    return prompt.rsplit("<|im_start|>user\n", 1)[-1]


def halving_policy(prompt: str) -> str:
    """Any agent holding more than 5 terms and the tool hands both halves to clones by key, then adds
    their two answers; a shorter sum it adds itself. It reads its sum from its prompt, as the model
    does: a root's arithmetic question, or a clone's `[key] sum` document."""
    message = last_user(prompt)
    if "<tool_response>" in message:
        return f"Answer: {sum(int(v) for v in _RESULT.findall(message))}"
    expr = message.split("] ", 1)[1].split("\n", 1)[0] if message.startswith("[") else message
    terms = _TERM.findall(expr)
    if len(terms) > 5 and "spawn_clone" in prompt:  # an agent without the tool adds them itself
        objectives = [{"context": [key], "task": "sum"} for key in HALF_KEYS]
        call = json.dumps({"name": "spawn_clone", "arguments": {"objectives": objectives}})
        return f"<tool_call>\n{call}\n</tool_call>"
    return f"Answer: {sum(int(t) for t in terms)}"
