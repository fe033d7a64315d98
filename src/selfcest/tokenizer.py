"""A small byte-level BPE tokenizer trained on the project's own task text, with a Qwen3 chat format.

Digits are split one per token (as Qwen does), so arithmetic is learnable by a tiny model. The chat
template renders system/user/assistant/tool messages and tool schemas in the Hermes `<tool_call>`
style that Qwen3 uses, and marks assistant text with `{% generation %}` so that TRL can train on
assistant tokens only. Any Hugging Face tokenizer with a chat template can stand in its place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Qwen3 keeps the tool tags as added (non-special) tokens so that they survive decoding.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# Qwen3's Hermes tool format, trimmed of the reasoning-content branches that the tiny model never uses.
# Content `None` renders as '', as in Qwen3's template (an OpenAI-style message may carry it).
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- (messages[0].content or '') + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + (messages[0].content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{{- message.content or '' }}"
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if loop.first and message.content %}{{- '\\n' }}{%- elif not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# Capitalised words (names) stand alone: BPE merges within them but never across their edges, so
# a name is the same token(s) wherever it stands (sentence start, after a space, inside a JSON key
# list) and a frequent name becomes one token. The synthetic QA names (256 two-syllable names,
# `selfcest.data.qa.NAMES`) are all frequent, so each is one token, which the tiny model can copy.
# History, measured: whole names from a 4,352-name space were often rare tokens that the first
# warm-up did not copy; two-letter pieces (session 2) made them frequent but multi-token, and the
# 5,000-step warm-up still failed to copy them (it has no induction circuit at this scale).
CAPITALISED_WORD = r"[A-Z][a-z]+"


_ADDED_TOKEN_SPLIT = re.compile("|".join(re.escape(token) for token in [*SPECIAL_TOKENS, *TOOL_TOKENS]))


def _without_added_tokens(corpus: Iterable[str]) -> Iterator[str]:
    """The pieces of each text between special and tool tokens, which BPE itself never sees.

    At encoding time those tokens are cut out before BPE runs, so training on the raw text would
    learn merges across them (`<tool_call>` + the JSON after it) that encoding can never apply,
    and leave the text after them in small pieces (measured: a QA `spawn_clone` call's opening JSON
    stayed 5 tokens however often the corpus repeated it)."""
    for text in corpus:
        yield from (piece for piece in _ADDED_TOKEN_SPLIT.split(text) if piece)


def train_tokenizer(
    corpus: Iterable[str], *, vocab_size: int, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `corpus` and wrap it as a transformers fast tokenizer.

    Byte-level BPE never produces an unknown token, so text outside the corpus still round-trips,
    once in Unicode NFC: the normalizer composes it (a decomposed `e` + U+0301 comes back as `é`).
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    # No GPT-2 word regex: merges may cross spaces, so the boilerplate every prompt repeats (system
    # prompts, the tool schema, JSON keys) costs few tokens. Capitalised words (names) and digits are
    # split out first, so a name is the same tokens wherever it stands and can be copied.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CAPITALISED_WORD), behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_without_added_tokens(corpus), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        model_max_length=1 << 20,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    wrapped.add_special_tokens({"additional_special_tokens": [IM_START]})
    # Added but not special: decoding with skip_special_tokens keeps the tool tags the parser reads.
    wrapped.add_tokens([AddedToken(token, special=False, normalized=False) for token in TOOL_TOKENS])
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load any local tokenizer (ours or a Hugging Face checkpoint's) without touching the network."""
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids that end an assistant turn: `<|im_end|>` for the Qwen chat format, plus eos."""
    ids: set[int] = set()
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)
