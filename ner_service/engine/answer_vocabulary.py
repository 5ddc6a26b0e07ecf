"""The tokens PaDeLLM's answers may take, so that their logits alone are computed.

A count answer is digits and then a stop; a mention answer copies the text (as copy drafting and
the unaligned repair assume) and then stops. For a batch of windows an :class:`AnswerVocabulary`
gives each branch the token ids its answer may take:

* after a count query (or a count's first digit): every token that writes digits only, and the
  stop tokens (the end token and every token holding a line break, ``query_stop_token_ids``);
* after a mention query: the window's own tokens as the prompt holds them, every token of
  ``" " + the text from each unit on`` (a mention answer is :func:`prompts.mention_answer` of a
  span, tokenised on its own, so it may merge differently than the text does; these cover the
  answers the unaligned repair's span tries allow, ``tests/test_cpu_inference.py``), each unit
  tokenised alone, every token written in CJK characters of the window only (a Chinese span's
  tokens depend on where it starts and ends: rather than tokenise every span, the characters
  bound them), and the stop tokens.

The whole output layer stays for AR answers (any label name, any line) and for the old path
(``NEREngine(restricted_output=False)``, ``--whole-output-layer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import torch

from general_decoding.row_vocabulary import RowVocabulary
from ner_service.engine import prompts
from ner_service.engine.chunking import Window
from ner_service.engine.model_loading import vocabulary
from ner_service.engine.ner_model import NERModel
from ner_service.engine.span_tries import UNIT
from ner_service.engine.spans import is_cjk

#: The marks a tokenizer writes for a leading space (SentencePiece, byte-level BPE).
SPACE_MARKS = "▁Ġ"


class ModelAnswerTokens:
    """What a model's answers may take regardless of the text: its stop and its digit tokens
    (built once per model: the tokenizer's vocabulary is read once)."""

    def __init__(self, ner_model: NERModel) -> None:
        self.ner_model = ner_model

    @cached_property
    def stops(self) -> list[int]:
        return sorted(self.ner_model.query_stop_token_ids)

    @cached_property
    def digits(self) -> frozenset[int]:
        """Every token that writes a number below 1,000 (``"7"``, and ``"19"`` in a tokenizer that
        has it): looked up, not scanned for (reading a 262,144-token vocabulary costs a cold start)."""
        tokenizer = self.ner_model.tokenizer
        found = {tokenizer.convert_tokens_to_ids(written) for n in range(1000) for written in {str(n), f"{n:02d}", f"{n:03d}"}}
        return frozenset(found - {None, tokenizer.unk_token_id})

    @cached_property
    def count_ids(self) -> torch.Tensor:
        return torch.tensor(sorted(set(self.digits) | set(self.stops)), dtype=torch.long)

    @cached_property
    def cjk_tokens(self) -> dict[str, list[tuple[int, frozenset[str]]]]:
        """Per CJK character, the tokens written in CJK characters only (a leading space mark
        allowed) that hold it, with their characters."""
        index: dict[str, list[tuple[int, frozenset[str]]]] = {}
        for token, token_id in vocabulary(self.ner_model.tokenizer).items():
            text = token.lstrip(SPACE_MARKS)
            if text and all(is_cjk(char) for char in text):
                characters = frozenset(text)
                for char in characters:
                    index.setdefault(char, []).append((token_id, characters))
        return index

    def cjk_tokens_of(self, text: str) -> set[int]:
        """The tokens written in CJK characters of ``text`` only."""
        characters = {char for char in text if is_cjk(char)}
        if not characters:
            return set()
        index = self.cjk_tokens
        return {token_id for char in characters for token_id, needs in index.get(char, ()) if needs <= characters}


def model_answer_tokens(ner_model: NERModel) -> ModelAnswerTokens:
    """The :class:`ModelAnswerTokens` of ``ner_model``, kept on it (built once per loaded model;
    not on its tokenizer, which the pool deep-copies for every adapter on a shared base)."""
    found = ner_model.__dict__.get("_answer_tokens")
    if found is None or found.ner_model is not ner_model:
        found = ner_model.__dict__["_answer_tokens"] = ModelAnswerTokens(ner_model)
    return found


class AnswerVocabulary:
    """The answer tokens of a batch's windows; ``count_queries``: the token ids of the count
    queries asked (a branch that is one, or one and a first digit, is answered by a count)."""

    def __init__(self, ner_model: NERModel, windows: Sequence[Window], count_queries: Sequence[Sequence[int]]) -> None:
        self.ner_model = ner_model
        self.model_tokens = model_answer_tokens(ner_model)
        self.windows = list(windows)
        self.count_queries = {tuple(q) for q in count_queries}
        self._mention_ids: list[torch.Tensor] | None = None

    @property
    def vocab_size(self) -> int:
        return self.ner_model.model.get_output_embeddings().weight.shape[0]

    def mention_ids(self, window_index: int) -> torch.Tensor:
        """The token ids a mention answer of window ``window_index`` may take."""
        if self._mention_ids is None:
            self._mention_ids = self._build_mention_ids()
        return self._mention_ids[window_index]

    def _build_mention_ids(self) -> list[torch.Tensor]:
        """Every window's mention tokens, from one call of the tokenizer."""
        tokenizer, stops = self.ner_model.tokenizer, self.model_tokens.stops
        pieces: list[str] = []
        owners: list[int] = []
        for w, window in enumerate(self.windows):
            units = list(UNIT.finditer(window.text))
            strings = [prompts.prefix(window.text)] + [" " + window.text[u.start():] for u in units] + [u.group() for u in units]
            pieces += strings
            owners += [w] * len(strings)
        found: list[set[int]] = [set(stops) | self.model_tokens.cjk_tokens_of(window.text) for window in self.windows]
        if pieces:
            for owner, ids in zip(owners, tokenizer(pieces, add_special_tokens=False).input_ids):
                found[owner].update(ids)
        return [torch.tensor(sorted(ids), dtype=torch.long) for ids in found]

    def is_count(self, tokens: Sequence[int]) -> bool:
        """Whether a branch of ``tokens`` is answered by (the rest of) a count."""
        key = tuple(tokens)
        return key in self.count_queries or (key[:-1] in self.count_queries and key[-1] in self.model_tokens.digits)

    def ids(self, window_index: int, tokens: Sequence[int]) -> torch.Tensor:
        """The token ids the answer of a branch of ``tokens`` behind window ``window_index`` may take."""
        return self.model_tokens.count_ids if self.is_count(tokens) else self.mention_ids(window_index)

    def rows(self, branches: Sequence[tuple[int, Sequence[int]]]) -> RowVocabulary:
        """The :class:`RowVocabulary` of ``(window index, tokens)`` branches, one row each."""
        return RowVocabulary([self.ids(w, tokens) for w, tokens in branches], self.vocab_size)
