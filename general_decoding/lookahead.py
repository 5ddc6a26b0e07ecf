"""Lookahead decoding (Fu et al. 2024): a Jacobi window and n-gram verification in one forward.

Each forward holds, after the last emitted token, two kinds of branches under one custom
attention mask: the *lookahead* branch, a window of ``window`` Jacobi guesses whose updated
predictions feed an n-gram pool (keyed by first token), and the *verification* branches, up
to ``candidates`` pooled n-grams that start with the last token. The longest verified n-gram
is accepted with the model's next token, so the output is exactly greedy. One row at a time.

While the verified n-grams do not pay for the wider forward (:class:`DraftLength`'s running
mean), a step feeds the last token alone, a greedy step, with a full step every few to probe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import DynamicCache

from general_decoding.base import DecodeInputs, Decoder, Generation
from general_decoding.draft_verify import DraftLength, prefill
from general_decoding.kv_cache import keep_columns
from general_decoding.registry import register_decoder

if TYPE_CHECKING:  # for types only: the engine may run its own model class (no import of transformers' model classes)
    from transformers import PreTrainedModel


@register_decoder("lookahead")
class LookaheadDecoder(Decoder):
    """Jacobi window of ``window`` tokens, ``ngram``-grams, up to ``candidates`` verified per forward."""

    supports_batch = False
    #: full steps' expected extra tokens (DraftLength's prior): its window is Jacobi's, whose
    #: guesses rarely hold untrained, and a full step costs about 1.8 greedy steps, so it starts
    #: with greedy steps; a full step every 16 probes whether the pool pays
    expected_accepted = 0.1

    def __init__(self, window: int = 5, ngram: int = 3, candidates: int = 5) -> None:
        if window < 1 or ngram < 2 or candidates < 1:
            raise ValueError("window >= 1, ngram >= 2 and candidates >= 1 are required")
        self.window, self.ngram, self.candidates = window, ngram, candidates

    def _generate(self, model: PreTrainedModel, inputs: DecodeInputs) -> Generation:
        device, stop = inputs.input_ids.device, inputs.stop
        cache = inputs.past_key_values if inputs.past_key_values is not None else DynamicCache()
        (state,) = prefill(model, inputs, cache)
        forwards, accepted_per_pass = 1, [1]
        pool: dict[int, list[tuple[int, ...]]] = {}
        guesses = (state.history[-self.window:] * self.window)[: self.window]  # any start works
        mask = inputs.attention_mask
        dtype = next(model.parameters()).dtype
        gram_tail = self.ngram - 1  # tokens a verified n-gram may add
        schedule = DraftLength(1, most=gram_tail, start=gram_tail, least=gram_tail, prior=self.expected_accepted, probe_every=16)
        while not state.done:
            last = state.tokens[-1]
            full = schedule.budget(0) > 0
            window = self.window if full else 0
            branches = [list(ng) for ng in pool.get(last, [])[: self.candidates]] if full else []
            ids = [last] + guesses[:window] + [t for b in branches for t in b]
            # position offsets and which new token each new token may see (itself included)
            offsets = [0] + list(range(1, window + 1)) + [j + 1 for b in branches for j in range(len(b))]
            parents: list[list[int]] = [[0]] + [[0] + list(range(1, i + 2)) for i in range(window)]
            start = 1 + window
            for b in branches:
                parents += [[0] + list(range(start, start + j + 1)) for j in range(len(b))]
                start += len(b)
            q, past = len(ids), cache.get_seq_length()
            allowed = torch.zeros(q, past + q, dtype=torch.bool, device=device)
            allowed[:, :past] = mask[0].bool()
            for row, seen in enumerate(parents):
                allowed[row, [past + c for c in seen]] = True
            bias = torch.zeros(1, 1, q, past + q, dtype=dtype, device=device)
            bias.masked_fill_(~allowed[None, None], torch.finfo(dtype).min)
            base = int(mask.sum())
            pos = torch.tensor([[base + o for o in offsets]], device=device)
            logits = model(input_ids=torch.tensor([ids], device=device), attention_mask=bias, position_ids=pos,
                           cache=cache, use_cache=True).logits[0]
            forwards += 1
            step_lp = torch.log_softmax(logits.float(), dim=-1)
            predicted = step_lp.argmax(-1).tolist()
            # verification: the longest candidate whose tokens are each the greedy next token
            best, best_len, start = [], 0, 1 + window
            for b in branches:
                previous, n = 0, 0
                while n < len(b) and b[n] == predicted[previous]:
                    previous, n = start + n, n + 1
                if n > best_len:
                    best, best_len = list(range(start, start + n)), n
                start += len(b)
            chain = [0] + best  # fed columns whose predictions are emitted, in order
            before = len(state.tokens)
            for column in chain:
                token = predicted[column]
                state.emit(token, float(step_lp[column, token]), stop)
                if state.done:
                    break
            emitted = len(state.tokens) - before + int(state.stopped)
            accepted_per_pass.append(emitted)
            if full:
                schedule.update(0, gram_tail, best_len)
            keep_columns(cache, list(range(past)) + [past + c for c in chain])
            mask = torch.cat([mask, torch.ones(1, len(chain), dtype=mask.dtype, device=device)], dim=1)
            if not full:
                continue
            # the lookahead branch: collect n-grams along the window, then move it forward
            window_pred = predicted[1: 1 + window]
            for i in range(window - self.ngram + 2):
                gram = tuple([guesses[i]] + window_pred[i: i + self.ngram - 1])
                grams = pool.setdefault(gram[0], [])
                if gram not in grams:
                    grams.insert(0, gram)
                    del grams[self.candidates * 2:]
            shifted = ([predicted[0]] + window_pred)[emitted:]
            guesses = (shifted + [shifted[-1] if shifted else last] * self.window)[: self.window]
        return Generation([state.tokens], [state.logprobs], [state.score], [state.stopped], forwards, accepted_per_pass)
