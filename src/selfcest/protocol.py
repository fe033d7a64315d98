"""The `spawn_clone` protocol: parsing tool calls out of untrusted model text, answers, tool responses.

Everything here treats model output as hostile: parsing never raises and never evaluates code,
works in time bounded per turn (`MAX_SCAN_CHARS` scanned, `MAX_CALL_CHARS` per call read, at most
`MAX_REPAIR_CHARS` of malformed JSON repaired in all), and records what it could not use as
protocol errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import json_repair
from transformers import PreTrainedTokenizerBase

from selfcest.scoring import extract_last_answer

TOOL_NAME = "spawn_clone"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
MAX_CALL_CHARS = 16_384
"""A tool call longer than this is rejected unparsed."""
MAX_REPAIR_CHARS = 4_096
"""One turn's malformed JSON is repaired up to this many characters in all; a body past what is left
is rejected, not repaired. json_repair's time grows about with the square of the length on
adversarial bodies (measured: 0.05 s at 1,000 characters, 0.7 s at 4,000, 17 s at 16,000; the worst
bodies found since, such as runs of `"[{`, take 2.2 s at 4,096), and parsing runs between the
engine's batches, so one bad turn would stall them all. The allowance is per turn, not per call:
a turn of many malformed 4,000-character blocks took 2 s a block (8 s for four) before. Since the
sum of squares is at most the square of the sum, a turn's repairs take at most one full body's time.
Well-formed calls up to MAX_CALL_CHARS are read by `json.loads`, which is linear."""
MAX_SCAN_CHARS = 262_144
"""Only this much of a turn is scanned for tool calls."""
MAX_TASK_CHARS = 4_096
_CALL_PATTERN = re.compile(
    re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)", re.S
)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value: Any) -> str:
    """`str(value)` as UTF-8 can encode it. JSON spells a surrogate with ASCII (`"\\ud800"`), which
    json reads as a lone one (json_repair even splits a pair into two); no tokenizer encodes those and
    no UTF-8 writer writes them, so a pair becomes its character and a lone surrogate U+FFFD."""
    text = str(value)
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


@dataclass
class Objective:
    """One clone's assignment as the root asked for it (budgets are granted later by the runtime)."""

    task: str
    context: list[str] = field(default_factory=list)
    max_tokens: int | None = None
    invalid: str | None = None
    """Why the objective at this place of the call was unusable (no task, not an object), or None. It
    keeps its place so that the clones after it keep the numbers the root gave them: the runtime
    starts no clone for it and answers its line `failed (invalid objective: ...)`."""


@dataclass
class ToolCall:
    objectives: list[Objective]
    repaired: bool = False
    """True when the JSON had to be repaired before it parsed (penalised in the reward)."""

    @property
    def usable(self) -> bool:
        """Whether any objective can start a clone; a call of unusable ones only starts none, but
        its objectives still hold their places in the turn's numbering."""
        return any(objective.invalid is None for objective in self.objectives)


@dataclass
class ProtocolError:
    kind: str
    detail: str

    def __post_init__(self) -> None:
        self.detail = _text(self.detail)  # details quote model text, which the episode's record keeps

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class ParsedTurn:
    calls: list[ToolCall] = field(default_factory=list)
    """Every call that parsed, in order, usable or not (see `usable_calls`)."""
    errors: list[ProtocolError] = field(default_factory=list)

    @property
    def usable_calls(self) -> list[ToolCall]:
        """The calls that start at least one clone: a turn without any spawns nothing."""
        return [call for call in self.calls if call.usable]

    @property
    def repairs(self) -> int:
        return sum(call.repaired for call in self.calls)


def parse_tool_calls(
    text: str,
    *,
    max_calls: int,
    max_objectives: int,
    known_context_keys: Iterable[str] | None = None,
) -> ParsedTurn:
    """Every `spawn_clone` call in one assistant turn, up to the limits; never raises.

    Calls beyond `max_calls` and objectives beyond `max_objectives` are dropped with a recorded
    error; a block that does not parse as a call is an error of its own and does not count towards
    `max_calls`. Context keys not in `known_context_keys` (when given) are dropped with an error too.
    A call whose objectives are all unusable is kept, with a `no_objectives` error, so that its
    objectives keep their places in the turn's clone numbering (`ParsedTurn.usable_calls`).
    """
    result = ParsedTurn()
    try:
        _parse_into(result, str(text)[:MAX_SCAN_CHARS], max_calls, max_objectives, known_context_keys)
    except Exception as error:  # noqa: BLE001 - the parser's contract is that model text never raises
        result.errors.append(ProtocolError("parser_error", f"{type(error).__name__}: {error}"[:200]))
    return result


def _parse_into(
    result: ParsedTurn,
    text: str,
    max_calls: int,
    max_objectives: int,
    known_context_keys: Iterable[str] | None,
) -> None:
    known = set(known_context_keys) if known_context_keys is not None else None
    allowance = _RepairAllowance()
    bodies = [match.group(1) for match in _CALL_PATTERN.finditer(text)]  # bounded by MAX_SCAN_CHARS
    for read, body in enumerate(bodies):
        if len(result.calls) == max_calls:
            result.errors.append(
                ProtocolError(
                    "too_many_calls", f"{len(bodies) - read} blocks after call {max_calls}, limit {max_calls}"
                )
            )
            break
        try:  # one malformed call must not cost the turn its other calls
            call = _parse_call(body.strip(), result.errors, allowance)
        except Exception as error:  # noqa: BLE001
            result.errors.append(ProtocolError("parser_error", f"{type(error).__name__}: {error}"[:200]))
            continue
        if call is None:
            continue
        if len(call.objectives) > max_objectives:
            result.errors.append(
                ProtocolError("too_many_clones", f"{len(call.objectives)} objectives, limit {max_objectives}")
            )
            call.objectives = call.objectives[:max_objectives]
        if known is not None:
            for objective in call.objectives:
                unknown = [key for key in objective.context if key not in known]
                if unknown:
                    result.errors.append(ProtocolError("unknown_context_key", ", ".join(unknown)[:200]))
                    objective.context = [key for key in objective.context if key in known]
        if not call.usable:
            result.errors.append(ProtocolError("no_objectives", "call has no usable objective"))
        if call.objectives:  # a call without any holds no places: it is only its errors
            result.calls.append(call)


_TOO_LONG_TO_REPAIR = object()


@dataclass
class _RepairAllowance:
    """What is left of one turn's MAX_REPAIR_CHARS."""

    chars_left: int = MAX_REPAIR_CHARS


def _load_json(text: str, errors: list[ProtocolError], allowance: _RepairAllowance) -> tuple[Any, bool]:
    """`text` read as JSON, and whether it had to be repaired. Malformed text longer than what is
    left of the turn's repair allowance is not repaired: an error is recorded and
    `_TOO_LONG_TO_REPAIR` returned."""
    try:
        return json.loads(text), False
    except (ValueError, RecursionError):  # JSONDecodeError, and int() past 4,300 digits
        pass
    if len(text) > allowance.chars_left:
        if len(text) > MAX_REPAIR_CHARS:
            errors.append(ProtocolError("call_too_long", f"{len(text)} characters of malformed JSON"))
        else:
            errors.append(
                ProtocolError(
                    "repair_limit",
                    f"{len(text)} characters of malformed JSON, {allowance.chars_left} left of the turn's "
                    f"{MAX_REPAIR_CHARS}-character repair allowance",
                )
            )
        return _TOO_LONG_TO_REPAIR, False
    allowance.chars_left -= len(text)
    # json_repair is a maintained repairer for the truncated/unquoted JSON that LLMs emit.
    try:
        return json_repair.loads(text), True
    except Exception:  # noqa: BLE001
        return None, True


def _parse_call(body: str, errors: list[ProtocolError], allowance: _RepairAllowance) -> ToolCall | None:
    if len(body) > MAX_CALL_CHARS:
        errors.append(ProtocolError("call_too_long", f"{len(body)} characters"))
        return None
    payload, repaired = _load_json(body, errors, allowance)
    if payload is _TOO_LONG_TO_REPAIR:
        return None
    if not isinstance(payload, dict):
        errors.append(ProtocolError("invalid_json", body[:120]))
        return None
    name = payload.get("name")
    if name != TOOL_NAME:
        errors.append(ProtocolError("unknown_tool", str(name)[:80]))
        return None
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models double-encode the arguments
        arguments, arguments_repaired = _load_json(arguments, errors, allowance)
        if arguments is _TOO_LONG_TO_REPAIR:
            return None
        repaired = repaired or arguments_repaired
    if not isinstance(arguments, dict):
        errors.append(ProtocolError("invalid_arguments", str(arguments)[:120]))
        return None
    objectives = _objectives(arguments, errors)
    return ToolCall(objectives=objectives, repaired=repaired)


def _objectives(arguments: dict[str, Any], errors: list[ProtocolError]) -> list[Objective]:
    raw = arguments.get("objectives")
    if raw is None:
        errors.append(ProtocolError("missing_objectives", "arguments have no 'objectives'"))
        return []
    if not isinstance(raw, list):
        raw = [raw]
    # The release's `shared_context` applies one list of keys to every objective.
    shared = _context_keys(arguments.get("shared_context"), "shared_context", errors)
    objectives = []
    for index, item in enumerate(raw):
        if isinstance(item, str):
            item = {"task": item}
        if not isinstance(item, dict):
            errors.append(ProtocolError("invalid_objective", f"objective {index} is {type(item).__name__}"))
            objectives.append(Objective(task="", invalid=f"not an object but {type(item).__name__}"))
            continue
        task = item.get("task", item.get("objective"))
        if not isinstance(task, str | int | float) or not str(task).strip():
            errors.append(ProtocolError("invalid_objective", f"objective {index} has no task"))
            objectives.append(Objective(task="", invalid="no task"))
            continue
        max_tokens = item.get("max_tokens")
        if isinstance(max_tokens, bool):  # int(True) is 1: a yes/no is no token count
            errors.append(ProtocolError("invalid_max_tokens", f"objective {index}: {max_tokens}"))
            max_tokens = None
        if max_tokens is not None:
            try:
                max_tokens = int(max_tokens)
            except (TypeError, ValueError, OverflowError):
                errors.append(
                    ProtocolError("invalid_max_tokens", f"objective {index}: {str(max_tokens)[:40]}")
                )
                max_tokens = None
        if max_tokens is not None and max_tokens < 1:
            errors.append(ProtocolError("invalid_max_tokens", f"objective {index}: {max_tokens}"))
            max_tokens = None
        own = _context_keys(item.get("context"), f"objective {index}", errors)
        context = list(dict.fromkeys(shared + own))  # each key once
        objectives.append(
            Objective(task=_text(task).strip()[:MAX_TASK_CHARS], context=context, max_tokens=max_tokens)
        )
    return objectives


def _context_keys(value: Any, where: str, errors: list[ProtocolError]) -> list[str]:
    """The context keys `value` offers; anything else it offered (a mapping, or items that are no
    key) is left out and recorded as an `invalid_context` error at `where`."""
    keys, dropped = _string_list(value)
    if dropped:
        errors.append(ProtocolError("invalid_context", f"{where}: {str(value)[:80]}"))
    return keys


def _string_list(value: Any) -> tuple[list[str], bool]:
    """The keys `value` offers (one scalar, or a list's strings and numbers), and whether it offered
    anything else (a mapping, or list items that are no key), which is left out."""
    if value is None:
        return [], False
    if isinstance(value, str | int | float):
        value = [value]
    if not isinstance(value, list):
        return [], True
    keys = [_text(v) for v in value if isinstance(v, str | int | float)]
    return keys, len(keys) < len(value)


def extract_answer(text: str) -> str | None:
    """The first non-blank line after the LAST `Answer:` marker, stripped; None when absent or empty.

    The scorer's reading (`selfcest.scoring.extract_last_answer`), so that what a parent is told and
    what a final answer scores agree: any line break ends the line (`str.splitlines`), not only "\n"."""
    return extract_last_answer(str(text))


def strip_tool_calls(text: str) -> str:
    """The turn's text without its tool-call blocks (an answer inside a call is not an answer)."""
    return _CALL_PATTERN.sub("", str(text)[:MAX_SCAN_CHARS])


@dataclass
class CloneOutcome:
    """What the root is told about one clone."""

    answer: str | None
    failure: str | None = None


def format_tool_response(
    turn: int,
    outcomes: Sequence[CloneOutcome],
    tokenizer: PreTrainedTokenizerBase,
    *,
    line_max_tokens: int,
    message_max_tokens: int,
) -> str:
    """One line per clone, `turn{t}_clone{i}: <answer>`, as the release; bounded by tokens.

    The release cuts lines at 256 and the message at 512 characters; bounding by tokens keeps the
    cost the same whatever the tokenizer. Unlike the release, a cut never passes for an answer: a
    line over `line_max_tokens` is cut and ends in `CUT_MARKER` ("12..." of "123456", never "12"),
    and the message keeps whole lines only, ending with a line that counts the clones left out
    when the next one does not fit in `message_max_tokens`. The runtime treats a clone's own cut
    answer the same way (status `truncated`).
    """
    lines = []
    for index, outcome in enumerate(outcomes):
        if outcome.answer is not None:
            body = outcome.answer
        else:
            body = f"failed ({outcome.failure or 'no answer'})"
        lines.append(_cut_line(f"turn{turn}_clone{index}: {body}", tokenizer, line_max_tokens))
    message = "\n".join(lines)
    if _token_count(message, tokenizer) <= message_max_tokens:
        return message
    # Upwards from no line kept, stopping at the first that does not fit: each try encodes at most
    # about `message_max_tokens` tokens, so a 300-clone turn costs what a 3-clone one does (searching
    # down from all lines re-encoded nearly the whole message per try: 2.3 s at 300 clones).
    fitting = None
    for kept in range(len(lines)):  # bounded: one try per line, and each kept line costs a token
        missing = len(lines) - kept
        left_out = f"({missing} more clone answer{'s' if missing > 1 else ''} left out: message limit)"
        candidate = "\n".join([*lines[:kept], left_out])
        if _token_count(candidate, tokenizer) > message_max_tokens:
            break
        fitting = candidate
    if fitting is not None:
        return fitting
    # Not even the note fits: the message cut with `CUT_MARKER`, so that a cut never reads as whole.
    return _cut_line(message, tokenizer, message_max_tokens)


CUT_MARKER = "..."
"""Ends a tool-message line cut at `line_max_tokens`: a cut answer must not read as a whole one."""


def _token_count(text: str, tokenizer: PreTrainedTokenizerBase) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def _cut_line(line: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> str:
    """`line` if it fits in `max_tokens`, else its longest cut that fits with `CUT_MARKER` after it
    (or the bare cut, when not even the marker fits)."""
    if _token_count(line, tokenizer) <= max_tokens:
        return line
    room = max_tokens - _token_count(CUT_MARKER, tokenizer)
    if room <= 0:
        return _truncate_tokens(line, tokenizer, max_tokens)
    for keep in range(room, 0, -1):  # bounded; the marker may merge with the cut's last token
        marked = _truncate_tokens(line, tokenizer, keep) + CUT_MARKER
        if _token_count(marked, tokenizer) <= max_tokens:
            return marked
    return _truncate_tokens(line, tokenizer, max_tokens)


def _truncate_tokens(text: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> str:
    """`text` cut to at most `max_tokens` tokens as it will be encoded again.

    Decoding a cut can split a multi-byte character (U+FFFD) or merge differently when re-encoded,
    so the cut is re-encoded and shortened until it fits (bounded by `max_tokens` tries)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    keep = max_tokens
    for _ in range(max_tokens + 1):
        cut = tokenizer.decode(ids[:keep], skip_special_tokens=True).rstrip("\ufffd")
        if _token_count(cut, tokenizer) <= max_tokens:
            return cut
        keep -= 1
    return ""
