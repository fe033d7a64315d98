"""Answer extraction and task scorers: arithmetic (exact integer), QA (SQuAD EM/F1), math (math-verify).

Every scorer takes raw model text and never raises on odd input (None, empty, huge, unbalanced
braces): a malformed answer is simply wrong. Answers are read from the LAST `Answer:` marker
(the release reads the last integer anywhere in the text, so a number written after the answer
replaces it) and math from the LAST `\\boxed{}`.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import select
import signal
import string
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Sequence

__all__ = [
    "ANSWER_MARKER",
    "extract_last_answer",
    "last_boxed",
    "last_non_empty_boxed",
    "math_equivalent",
    "normalize_answer",
    "parse_last_integer",
    "qa_exact_match",
    "qa_f1",
    "score_arithmetic",
]

log = logging.getLogger(__name__)

ANSWER_MARKER = "Answer:"
# Math answers longer than this are not parsed: sympy on adversarial LaTeX is the slow path, and
# no MATH/AIME gold comes close (the longest MATH-Hard gold is well under 200 characters).
MAX_MATH_ANSWER_CHARS = 1000
# Seconds per math-verify parse/compare (its own SIGALRM timeout, when usable; see below).
MATH_VERIFY_TIMEOUT_S = 5
# Where those timeouts cannot be used, the comparison runs in a child process, killed after this
# many seconds (a gold parse, an answer parse and a compare, with room to spare).
MATH_VERIFY_DEADLINE_S = 3 * MATH_VERIFY_TIMEOUT_S + 5
# How long that child may take to start (it imports sympy) before it counts as failed.
MATH_VERIFY_STARTUP_S = 120


def extract_last_answer(text: object) -> str | None:
    """First line of the text after the last `Answer:` marker, stripped; None if absent or empty.

    The marker is case-sensitive, as the protocol's prompts spell it, so prose such as "the
    answer: is..." is not mistaken for a final answer.
    """
    if not isinstance(text, str):
        return None
    index = text.rfind(ANSWER_MARKER)
    if index < 0:
        return None
    rest = text[index + len(ANSWER_MARKER) :].strip()
    answer = rest.splitlines()[0].strip() if rest else ""
    return answer or None


# --------------------------------------------------------------------------- arithmetic

# An optional sign only where it cannot be a binary operator (not after a digit, letter or ')'),
# digits with optional comma thousands groups, and an optional decimal part (so "42.0" is 42 and
# "42.5" is not an integer rather than being read as "5").
# The minus sign (U+2212) and the en dash (U+2013, a typeset minus) are signs too.
_NUMBER_RE = re.compile(r"(?:(?<![\w)])[-+\u2212\u2013])?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
# LaTeX's thousands separators, `1{,}234` and `1\,234`, between digits: read as `1,234`.
_LATEX_THOUSANDS_RE = re.compile(r"(?<=\d)(?:\{,\}|\\,)(?=\d{3})")


def parse_last_integer(text: str | None) -> int | None:
    """The last number in `text` as an int; None if there is none or it has a non-zero fraction."""
    if not text:
        return None
    matches = _NUMBER_RE.findall(_LATEX_THOUSANDS_RE.sub(",", text))
    if not matches:
        return None
    token = matches[-1].replace(",", "").replace("\u2212", "-").replace("\u2013", "-")
    whole, _, fraction = token.partition(".")
    if fraction.strip("0"):
        return None
    try:
        return int(whole)
    except ValueError:  # beyond CPython's int/str digit limit: not a plausible answer
        return None


def score_arithmetic(prediction_text: str | None, gold: int) -> float:
    """1.0 if the last integer after the last `Answer:` equals `gold` exactly, else 0.0.

    No partial credit (the release gives some for near misses, which rewards guessing).
    """
    value = parse_last_integer(extract_last_answer(prediction_text))
    return 1.0 if value is not None and value == int(gold) else 0.0


# --------------------------------------------------------------------------- QA

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
# HotpotQA / 2Wiki official evaluation: a yes/no(/noanswer) mismatch gets no token-overlap credit.
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str) -> str:
    """SQuAD official normalisation: lower-case, drop punctuation, articles and extra whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: str | Sequence[str]) -> list[str]:
    gold_list = [golds] if isinstance(golds, str) else [g for g in golds if isinstance(g, str)]
    if not gold_list:
        raise ValueError("at least one gold answer is required")
    return gold_list


def qa_exact_match(pred: str | None, golds: str | Sequence[str]) -> float:
    """Max over gold answers (and aliases) of normalised exact match; `pred` is the answer text."""
    gold_list = _golds(golds)
    if pred is None:
        return 0.0
    normalized = normalize_answer(pred)
    return float(any(normalized == normalize_answer(g) for g in gold_list))


def _f1(pred: str, gold: str) -> float:
    pred_norm, gold_norm = normalize_answer(pred), normalize_answer(gold)
    if (pred_norm in _SPECIAL_ANSWERS or gold_norm in _SPECIAL_ANSWERS) and pred_norm != gold_norm:
        return 0.0
    pred_tokens, gold_tokens = pred_norm.split(), gold_norm.split()
    if not pred_tokens or not gold_tokens:
        # As the SQuAD 2.0 script: an answer of articles and punctuation only ("The") matches only
        # another such answer, as exact match (which compares the two normalised strings) says.
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1(pred: str | None, golds: str | Sequence[str]) -> float:
    """Max over gold answers (and aliases) of SQuAD token F1, with the HotpotQA yes/no rule."""
    gold_list = _golds(golds)
    if pred is None:
        return 0.0
    return max(_f1(pred, g) for g in gold_list)


# --------------------------------------------------------------------------- math

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\b")


def last_boxed(text: object, max_chars: int = 20_000) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces included.

    Also reads the brace-less form `\\boxed 5`. Returns None when there is no box, the last box
    is unbalanced (e.g. a truncated generation) or its content exceeds `max_chars` (bounded work).
    """
    if not isinstance(text, str):
        return None
    matches = list(_BOXED_RE.finditer(text))
    return _box_content(text, matches[-1].end(), max_chars) if matches else None


def all_boxed(text: object, max_chars: int = 20_000) -> list[str]:
    """Contents of every `\\boxed{...}` (or `\\fbox{...}`) in `text`, in order; unbalanced boxes and
    boxes longer than `max_chars` are skipped (bounded work, as `last_boxed`)."""
    if not isinstance(text, str):
        return []
    contents = (_box_content(text, match.end(), max_chars) for match in _BOXED_RE.finditer(text))
    return [content for content in contents if content is not None]


def last_non_empty_boxed(text: object, max_chars: int = 20_000) -> str | None:
    """Content of the last `\\boxed{...}` that has any: an empty box after the answer (a model that
    echoes "put your answer in \\boxed{}") does not hide it. None when no box has content, or when an
    unbalanced box (a cut generation: its answer is unknown) or one longer than `max_chars` comes
    after the last box with content, as `last_boxed` gives None for such a last box."""
    return _last_non_empty_box(text, max_chars)[0]


def _last_non_empty_box(text: object, max_chars: int = 20_000) -> tuple[str | None, int]:
    """`last_non_empty_boxed`'s content, and where its `\boxed` starts (-1 when there is none)."""
    if not isinstance(text, str):
        return None, -1
    for match in reversed(list(_BOXED_RE.finditer(text))):
        content = _box_content(text, match.end(), max_chars)
        if content is None or content.strip():
            return content, match.start()
    return None, -1


def _box_content(text: str, i: int, max_chars: int) -> str | None:
    """The box content that starts at `text[i]` (just after `\\boxed`); None when unbalanced or too long."""
    while i < len(text) and text[i].isspace():  # `\boxed {5}`, and `\boxed` at a line's end
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":
        # `\boxed 5`: the content runs to the next whitespace or `$`, less a sentence's "." or ","
        bare = re.match(r"[^\s$]*", text[i:])
        return (bare.group(0).rstrip(".,;") or None) if bare else None
    depth, start = 0, i + 1
    for j in range(i, min(len(text), start + max_chars + 1)):
        ch = text[j]
        if text[j - 1] == "\\":  # `\{` and `\}` are literal braces, not grouping
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:j].strip()
    return None


def _signal_timeouts_usable() -> bool:
    """Whether math-verify's SIGALRM-based timeouts can be used here.

    They raise ValueError off the main thread (documented: pass timeout=None there). On the main
    thread they are still unsafe if an outer ITIMER_REAL alarm is armed (pytest-timeout's signal
    method, a caller's own watchdog): math-verify's `signal.alarm(0)` would cancel it. In both
    cases the comparison runs in `_VerifyWorker`'s child process instead: the bounded input size
    alone does not bound it (`9^{9^{9}}`, nine characters, never returns).
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        return signal.getitimer(signal.ITIMER_REAL)[0] == 0.0
    except (AttributeError, OSError):  # platforms without itimers
        return False


# `\frac 43`, `\frac \pi4`, `\frac1{2x}`: brace-less arguments, common in MATH solutions.
# math-verify 0.9 misreads some of them (`\frac \pi4 + 2 - \sqrt2` parses to 2, so a bare "2"
# would be judged correct); rewriting them as `\frac{a}{b}` first avoids that.
_FRAC_ARG = r"(\{[^{}]*\}|\\[a-zA-Z]+|[0-9a-zA-Z])"
_BARE_FRAC_RE = re.compile(r"\\([dt]?frac)(?!\s*\{[^{}]*\}\s*\{)\s*" + _FRAC_ARG + r"\s*" + _FRAC_ARG)


def _brace_fractions(latex: str) -> str:
    def fix(match: re.Match[str]) -> str:
        num, den = (arg if arg.startswith("{") else "{" + arg + "}" for arg in match.group(2, 3))
        return f"\\{match.group(1)}{num}{den}"

    return _BARE_FRAC_RE.sub(fix, latex)


def _as_boxed(answer: str) -> str:
    # math-verify's LaTeX extractor needs a delimiter; \boxed{} also makes bare "1/2" or "C" parse.
    answer = _brace_fractions(answer)
    return answer if "\\boxed" in answer else "\\boxed{" + answer + "}"


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold_text: str, timeout: int | None) -> tuple[object, ...]:
    # Evaluations score k samples per problem against one gold: parse each gold once.
    from math_verify import parse

    return tuple(parse(_as_boxed(gold_text), parsing_timeout=timeout))


_DISPLAY_MATH = {"\\[": "\\]", "$$": "$$", "\\(": "\\)"}
"""An opening delimiter alone on the answer line, and what closes it."""


def math_final_answer(text: object) -> str | None:
    """The answer a math prediction gives, whichever of these comes last: the content of its last
    non-empty `\\boxed{}`, or the line after its last `Answer:` without a sentence's closing
    punctuation or Markdown bold, since the prompts ask for `Answer: <answer>.` and math-verify reads
    "204." as a string, not as 204. A box in the `Answer:` line is that box.

    Whichever comes last, because the prompts ask for `Answer:`, not a box: a model that boxes a
    step and then corrects it ("x = \\boxed{3} ... step 2 was wrong ... Answer: 5") answers 5, as
    the episode's own final answer says (the box used to win wherever it stood)."""
    boxed, boxed_at = _last_non_empty_box(text)
    answer = extract_last_answer(text)
    marker_at = text.rfind(ANSWER_MARKER) if isinstance(text, str) else -1
    if boxed is not None and boxed.strip() and (answer is None or boxed_at > marker_at):
        return boxed.strip()
    if answer is None:
        return None
    if answer in _DISPLAY_MATH:  # `Answer:` then `\[`, the answer, `\]` on lines of their own
        rest = text[marker_at + len(ANSWER_MARKER) :]  # type: ignore[index]
        start = rest.index(answer) + len(answer)
        end = rest.find(_DISPLAY_MATH[answer], start)
        answer = " ".join(rest[start:end].split()) if end > start else answer
    answer = answer.rstrip(" .;,")  # not "!": 5! is a factorial
    if len(answer) > 4 and answer.startswith("**") and answer.endswith("**"):
        answer = answer[2:-2].strip().rstrip(" .;,")
    return answer or None


def math_equivalent(pred_text: str | None, gold: str | int) -> bool:
    """Whether the prediction's final answer is mathematically equivalent to `gold` (math-verify).

    The answer is `math_final_answer(pred_text)`: the last non-empty `\\boxed{}` or the text after the
    last `Answer:`, whichever comes last.
    `gold` is the reference answer (LaTeX without `$`, e.g. `\\frac{1}{8}` or "033"). Never raises.
    """
    answer = math_final_answer(pred_text)
    gold_text = str(gold).strip()
    if not answer or not gold_text or len(answer) > MAX_MATH_ANSWER_CHARS:
        return False
    if _signal_timeouts_usable():
        return _verify(answer, gold_text, MATH_VERIFY_TIMEOUT_S)
    return _VERIFY_WORKER.verify(answer, gold_text)


def _verify(answer: str, gold_text: str, timeout: int) -> bool:
    """math-verify's verdict on `answer` against `gold_text`, under its own SIGALRM timeouts (main
    thread, no outer timer); False where it fails or times out."""
    from math_verify import parse, verify  # deferred: importing sympy takes about a second
    from math_verify.errors import TimeoutException

    try:
        gold_parsed = _parse_gold(gold_text, timeout)
        pred_parsed = parse(_as_boxed(answer), parsing_timeout=timeout)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(list(gold_parsed), pred_parsed, timeout_seconds=timeout))
    # TimeoutException derives from BaseException: named, so that a caller's own watchdog exception
    # (pytest-timeout's, say) is not swallowed with it.
    except (Exception, TimeoutException) as exc:
        log.debug("math-verify failed on %r vs %r: %s", answer, gold_text, exc)
        return False


class _VerifyWorker:
    """math-verify in one child process with a hard deadline, for callers where its SIGALRM timeouts
    cannot be used (off the main thread, or under an outer timer).

    Why a process: sympy evaluates `9^{9^{9}}` in one C call that neither a signal nor a thread can
    stop; only killing the process bounds it. The child (`serve_verifications`) reads one JSON
    `[answer, gold]` per line and answers `true`/`false`; it runs on its own main thread, so the
    SIGALRM timeouts work there too. Calls from several threads take turns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None

    def verify(self, answer: str, gold_text: str) -> bool:
        with self._lock:
            finished = False
            try:
                process = self._running()
                if process is None:
                    return False
                assert process.stdin is not None
                process.stdin.write(json.dumps([answer, gold_text]) + "\n")
                process.stdin.flush()
                line = self._read_line(process, MATH_VERIFY_DEADLINE_S)
                finished = line is not None
                if line is None:
                    log.warning(
                        "math-verify took over %d s on %r: judged wrong", MATH_VERIFY_DEADLINE_S, answer
                    )
                return line == "true"
            except OSError as exc:  # the child died between calls
                log.debug("math-verify's worker failed: %s", exc)
                return False
            finally:
                if not finished:  # killed, timed out, or interrupted mid-request: its reply would
                    self._stop()  # answer the next call

    def _running(self) -> subprocess.Popen[str] | None:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from selfcest.scoring import serve_verifications; serve_verifications()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self._read_line(self._process, MATH_VERIFY_STARTUP_S) != "ready":
            log.warning("math-verify's worker did not start: math answers are judged wrong")
            self._stop()
            return None
        return self._process

    @staticmethod
    def _read_line(process: subprocess.Popen[str], seconds: float) -> str | None:
        """The child's next line, or None when none comes within `seconds` (one request is in flight
        at a time, so nothing waits in the reader's buffer when select() is asked)."""
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], seconds)
        line = process.stdout.readline() if ready else ""
        return line.strip() if line else None

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            for stream in (self._process.stdin, self._process.stdout):
                if stream is not None:
                    stream.close()
        self._process = None


_VERIFY_WORKER = _VerifyWorker()


def serve_verifications() -> None:
    """`_VerifyWorker`'s child: `ready` once math-verify is imported, then one verdict per request."""
    import math_verify  # noqa: F401  (the slow import, done before `ready`)

    print("ready", flush=True)
    for line in sys.stdin:
        answer, gold_text = json.loads(line)
        print("true" if _verify(str(answer), str(gold_text), MATH_VERIFY_TIMEOUT_S) else "false", flush=True)
