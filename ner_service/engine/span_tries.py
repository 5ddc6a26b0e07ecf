"""The answers a mention query may give when it must copy the text: every span of whole units,
as a token trie per text (for constrained decoding, :mod:`general_decoding.constraints`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from general_decoding.constraints import TokenTrie
from ner_service.engine import prompts
from ner_service.engine.spans import CJK

#: A unit: one CJK character, a run of other word characters, or one punctuation mark.
UNIT = re.compile(rf"[{CJK}]|[^\W{CJK}]+|[^\w\s]")


class SpanTries:
    """Per text, built on first use: the token trie of every answer that is a span of the text
    (:func:`prompts.mention_answer` of it, then the end token ``eos``). A span runs over whole
    units and at most ``max_units`` of them."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], eos: int, max_units: int) -> None:
        self.tokenizer, self.texts, self.eos, self.max_units = tokenizer, list(texts), eos, max_units
        self._tries: dict[int, TokenTrie] = {}

    def __getitem__(self, index: int) -> TokenTrie:
        if index not in self._tries:
            self._tries[index] = self._build(self.texts[index])
        return self._tries[index]

    def _build(self, text: str) -> TokenTrie:
        units = [m.span() for m in UNIT.finditer(text)]
        spans = sorted({text[start:end] for i, (start, _) in enumerate(units) for _, end in units[i:i + self.max_units]})
        answers = self.tokenizer([prompts.mention_answer(span) for span in spans], add_special_tokens=False).input_ids if spans else []
        return TokenTrie(answer + [self.eos] for answer in answers)

