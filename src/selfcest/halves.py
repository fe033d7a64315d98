"""Expression halves: how an agent hands part of a `+`/`-` sum to a clone without copying it.

The tiny model cannot copy a sum longer than those it was trained on: it finds the next term by
its distance, and past the training lengths that look-up fails in every mode (docs/results.md,
"Arithmetic length generalisation"). So, with `RuntimeConfig.expression_halves`, the runtime offers
every agent that holds a flat sum two documents, keyed `first half` and `second half`, cut from the
sum by the runtime, the way QA paragraphs are handed by key. A clone handed one half holds that
half, and may hand on halves of it in turn (up to `RuntimeConfig.expression_max_depth`). The agent
chooses whether to delegate, which halves to hand out and how to combine the answers; what it no
longer has to do is copy terms whose positions it has never seen.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from selfcest.prompts import arithmetic_question

HALF_KEYS = ("first half", "second half")

# [0-9], not \d: \d also matches other scripts' digits ("١٢+٣" would parse as 12+3).
_TERM = re.compile(r"[+-]?[0-9]+")
_SPACED_DIGITS = re.compile(r"[0-9] +[0-9]")
# The prompt's words around the sum, taken from the prompt itself so that the two cannot drift apart.
_QUESTION_PREFIX, _QUESTION_SUFFIX = arithmetic_question("\0").split("\0")
_QUESTION = re.compile(re.escape(_QUESTION_PREFIX) + r"(?P<expr>[0-9+\- ]+)" + re.escape(_QUESTION_SUFFIX))


def parse_terms(expr: str) -> list[int]:
    """Signed terms of a `+`/`-` expression: "12+7-3" and "12 + 7 - 3" -> [12, 7, -3]."""
    # Spaces around operators are a user's spelling (`selfcest solve "12 + 7"`), but a space never
    # parts two digits of a sum: "12 7" is not 12+7.
    compact = expr.replace(" ", "")
    found = _TERM.findall(compact)
    if not found or "".join(found) != compact or _SPACED_DIGITS.search(expr):
        raise ValueError(f"not a +/- expression of integers: {expr!r}")
    return [int(t) for t in found]


def format_terms(terms: Sequence[int]) -> str:
    first = str(terms[0])
    return first + "".join(f"+{t}" if t >= 0 else f"-{-t}" for t in terms[1:])


def split_terms(terms: Sequence[int]) -> tuple[list[int], list[int]]:
    """The two halves of a sum's terms; the first is the longer when their count is odd."""
    middle = (len(terms) + 1) // 2
    return list(terms[:middle]), list(terms[middle:])


def expression_halves(expr: str) -> dict[str, str]:
    """`{"first half": ..., "second half": ...}` of a flat `+`/`-` sum of two or more terms, else `{}`
    (a single term, or an expression with other operators or parentheses, is not cut)."""
    try:
        terms = parse_terms(expr)
    except ValueError:
        return {}
    if len(terms) < 2:
        return {}
    first, second = split_terms(terms)
    return {HALF_KEYS[0]: format_terms(first), HALF_KEYS[1]: format_terms(second)}


def question_expression(question: str) -> str | None:
    """The sum of an arithmetic prompt (`selfcest.prompts.arithmetic_question`), or None."""
    match = _QUESTION.fullmatch(question.strip())
    return match.group("expr") if match else None
