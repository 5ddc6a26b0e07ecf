"""The training loss of packed rows, and one optimizer step, shared by every trainer."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from general_decoding.kept_vocabulary import KeptVocabulary
from general_decoding.tree_attention import collate_parent_trees
from training.examples import IGNORE, TrainingRow
from training.top_layers import layer_count, layer_range


def inner_model(model: torch.nn.Module) -> PreTrainedModel:
    """The plain transformers model (LoRA layers, if any, are injected into it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[return-value]


def packed_loss(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                targets: list[list[int]], weights: list[list[float] | None] | None = None,
                frozen_hidden: torch.Tensor | None = None, first_layer: int = 0,
                vocabulary: KeptVocabulary | None = None) -> torch.Tensor:
    """Mean cross-entropy of collated packed rows at their targets (``IGNORE`` elsewhere),
    weighted per target when ``weights`` are given; the LM head runs on the target positions only.
    With ``frozen_hidden`` (the hidden states entering layer ``first_layer``), only the layers from
    ``first_layer`` on run."""
    lm = inner_model(model)
    padded = torch.full(ids.shape, IGNORE, dtype=torch.long)
    for i, row in enumerate(targets):
        padded[i, : len(row)] = torch.tensor(row)
    device = lm.device
    inputs = {"attention_mask": mask.to(device), "position_ids": positions.to(device)}
    if frozen_hidden is None:
        hidden = lm.get_decoder()(input_ids=ids.to(device), **inputs).last_hidden_state
    else:
        with layer_range(lm, first_layer, layer_count(lm)):
            hidden = lm.get_decoder()(inputs_embeds=frozen_hidden.to(device, mask.dtype), **inputs).last_hidden_state
    selected = padded.to(device) != IGNORE
    wanted = padded.to(device)[selected]
    if vocabulary is None:
        logits = lm.get_output_embeddings()(hidden[selected]).float()
    else:
        logits, wanted = vocabulary.logits(hidden[selected], lm.get_output_embeddings()).float(), vocabulary.indices(wanted)
    if weights is None or all(w is None for w in weights):
        return torch.nn.functional.cross_entropy(logits, wanted)
    scale = torch.zeros(ids.shape)
    for i, (row, row_weights) in enumerate(zip(targets, weights)):
        scale[i, : len(row)] = torch.tensor(row_weights) if row_weights is not None else (torch.tensor(row) != IGNORE).float()
    scale = scale.to(device)[selected]
    losses = torch.nn.functional.cross_entropy(logits, wanted, reduction="none")
    return (losses * scale).sum() / scale.sum().clamp(min=1e-9)


def answer_loss(model: torch.nn.Module, rows: list[TrainingRow], pad_token_id: int,
                frozen_hidden: torch.Tensor | None = None, first_layer: int = 0,
                vocabulary: KeptVocabulary | None = None) -> torch.Tensor:
    """Cross-entropy on answer tokens of packed PaDeLLM/AR rows (weighted by the rows' weights)."""
    ids, positions, mask = collate_parent_trees([r.tree for r in rows], pad_token_id, dtype=next(inner_model(model).parameters()).dtype)
    return packed_loss(model, ids, positions, mask, [r.targets for r in rows], [r.weights for r in rows], frozen_hidden, first_layer, vocabulary)


def optimizer_step(loss: torch.Tensor, parameters: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> None:
    """Backward, clip the gradient norm to 1, step (and the schedule), clear the gradients."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
