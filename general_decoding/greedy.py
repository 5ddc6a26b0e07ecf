"""Plain greedy decoding: the reference every lossless decoder must reproduce."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from general_decoding.base import DecodeInputs, Decoder, Generation, position_ids_from_mask
from general_decoding.constraints import choose
from general_decoding.kv_cache import ReservedCache, keep_rows
from general_decoding.registry import register_decoder
from general_decoding.row_vocabulary import next_logprobs

if TYPE_CHECKING:  # for types only: the engine may run its own model class (no import of transformers' model classes)
    from transformers import PreTrainedModel


@register_decoder("greedy")
class GreedyDecoder(Decoder):
    """One token per row per forward pass (the most probable one within the constraints); a row
    that stops leaves the batch and the cache."""

    supports_constraints = True
    supports_vocabulary = True

    def _generate(self, model: PreTrainedModel, inputs: DecodeInputs) -> Generation:
        input_ids, attention_mask, stop, constraints = inputs.input_ids, inputs.attention_mask, inputs.stop, inputs.constraints
        batch = input_ids.shape[0]
        cache = inputs.past_key_values if inputs.past_key_values is not None else ReservedCache()
        positions = position_ids_from_mask(attention_mask)[:, -input_ids.shape[1]:]
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        scores = [0.0] * batch
        stopped = [False] * batch
        rows = list(range(batch))  # the original row of each row still in the batch
        stop_ids = torch.tensor(sorted(stop.stop_token_ids), device=input_ids.device)
        forwards = 0
        accepted: list[int] = []
        step_ids = input_ids
        for _ in range(stop.max_new_tokens + 1):
            vocabulary = inputs.vocabulary.rows(rows) if inputs.vocabulary is not None else None
            step_logprobs = next_logprobs(model, vocabulary, 1, input_ids=step_ids, attention_mask=attention_mask, position_ids=positions,
                                          cache=cache, use_cache=True)[:, -1]
            forwards += 1
            next_ids = choose(step_logprobs.clone() if constraints else step_logprobs, constraints, rows, [tokens[r] for r in rows])
            next_lp = step_logprobs.gather(-1, next_ids[:, None])[:, 0]
            is_stop = torch.isin(next_ids, stop_ids).tolist()
            done = []
            for row, token, lp, ends in zip(rows, next_ids.tolist(), next_lp.tolist(), is_stop):
                scores[row] += lp
                if ends:
                    stopped[row] = True
                else:
                    tokens[row].append(token)
                    logprobs[row].append(lp)
                done.append(ends or len(tokens[row]) >= stop.max_new_tokens)
            accepted.append(len(rows))
            if all(done):
                break
            if any(done):  # finished rows leave the batch (and the cache): later forwards are smaller
                keep = torch.tensor([i for i, d in enumerate(done) if not d], device=input_ids.device)
                keep_rows(cache, keep)
                rows = [rows[i] for i in keep.tolist()]
                attention_mask, positions, next_ids = attention_mask[keep], positions[keep], next_ids[keep]
            step_ids = next_ids[:, None]
            attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
        return Generation(tokens, logprobs, scores, stopped, forwards, accepted)
