"""Plain greedy decoding: the reference every lossless decoder must reproduce."""

from __future__ import annotations

import torch
from transformers import Cache, DynamicCache, PreTrainedModel

from general_decoding.base import Decoder, Generation, StopCriteria, position_ids_from_mask
from general_decoding.registry import register_decoder


@register_decoder("greedy")
class GreedyDecoder(Decoder):
    """One token per row per forward pass; rows stop independently."""

    def _generate(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        past_key_values: Cache | None,
        stop: StopCriteria,
        context_ids: list[list[int]] | None,
    ) -> Generation:
        batch = input_ids.shape[0]
        cache = past_key_values if past_key_values is not None else DynamicCache()
        positions = position_ids_from_mask(attention_mask)[:, -input_ids.shape[1]:]
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        scores = [0.0] * batch
        stopped = [False] * batch
        done = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)
        stop_ids = torch.tensor(sorted(stop.stop_token_ids), device=input_ids.device)
        forwards = 0
        accepted: list[int] = []
        step_ids = input_ids
        for _ in range(stop.max_new_tokens + 1):
            out = model(
                input_ids=step_ids,
                attention_mask=attention_mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            forwards += 1
            step_logprobs = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
            next_ids = step_logprobs.argmax(-1)
            next_lp = step_logprobs.gather(-1, next_ids[:, None])[:, 0]
            is_stop = torch.isin(next_ids, stop_ids)
            emitted = 0
            for row in torch.nonzero(~done).flatten().tolist():
                scores[row] += float(next_lp[row])
                if bool(is_stop[row]):
                    stopped[row] = True
                else:
                    tokens[row].append(int(next_ids[row]))
                    logprobs[row].append(float(next_lp[row]))
                emitted += 1
            accepted.append(emitted)
            done |= is_stop | torch.tensor([len(t) >= stop.max_new_tokens for t in tokens], device=done.device)
            if bool(done.all()):
                break
            step_ids = next_ids[:, None]
            attention_mask = torch.cat([attention_mask, (~done).long()[:, None]], dim=1)
            positions = positions[:, -1:] + 1
        return Generation(tokens, logprobs, scores, stopped, forwards, accepted)
