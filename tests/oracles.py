"""A stand-in language model whose argmax is known, for the benchmarks' teacher-forced scoring."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch


class ArgmaxOracle:
    """Predicts each next token of the row it is given, except at `wrong` positions, where its
    argmax is another token."""

    def __init__(self, vocab_size: int, wrong: set[int]) -> None:
        self.vocab_size, self.wrong = vocab_size, wrong

    def __call__(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        # Attention masks and position ids change nothing for an oracle.
        ids = input_ids[0].tolist()
        logits = torch.zeros(1, len(ids), self.vocab_size)
        for t, nxt in enumerate(ids[1:]):
            logits[0, t, (nxt + 1) % self.vocab_size if t + 1 in self.wrong else nxt] = 1.0
        return SimpleNamespace(logits=logits)
