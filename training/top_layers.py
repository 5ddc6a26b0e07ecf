"""Train the top layers only, and run the frozen layers below them once per training row.

When only the top ``k`` decoder layers are trained (LoRA or full), nothing below them gets a
gradient, so their output for a row never changes during the run. :class:`FrozenHidden` computes
it once, without autograd, into a file-backed array in the run folder (a resumed run reads it
back instead of recomputing), and every step then runs the top layers alone, forward and
backward, from those hidden states. :func:`layer_range` runs a slice of a decoder's layers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import PreTrainedModel

from general_decoding.tree_attention import ParentTree, collate_parent_trees
from training.batching import group_by_length

#: The linear layers of a decoder block that LoRA adapts (Llama and Gemma 3 names).
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def layer_count(lm: PreTrainedModel) -> int:
    """The number of decoder layers of a causal LM."""
    return len(lm.get_decoder().layers)


def trained_layer_indices(lm: PreTrainedModel, top_layers: int | None) -> list[int]:
    """Indices of the layers a run trains: the top ``top_layers`` (all when None)."""
    total = layer_count(lm)
    if top_layers is None:
        return list(range(total))
    if not 1 <= top_layers <= total:
        raise ValueError(f"top_layers must be between 1 and {total} (the model's layers), got {top_layers}")
    return list(range(total - top_layers, total))


@contextmanager
def layer_range(lm: PreTrainedModel, start: int, stop: int) -> Iterator[None]:
    """Within the block, the decoder runs layers ``[start, stop)`` only, and leaves out its final
    norm unless ``stop`` is the last layer: feed ``inputs_embeds`` (the hidden states entering
    layer ``start``) to get the hidden states leaving layer ``stop - 1``."""
    decoder = lm.get_decoder()
    layers, norm = decoder.layers, decoder.norm
    decoder.layers = torch.nn.ModuleList(list(layers)[start:stop])
    if stop < len(layers):
        decoder.norm = torch.nn.Identity()
    try:
        yield
    finally:
        decoder.layers, decoder.norm = layers, norm


def _fingerprint(lm: PreTrainedModel, trees: Sequence[ParentTree], frozen: int) -> str:
    """What the frozen layers' output depends on: the model's frozen weights (a sample of each),
    the dtype of its matrix products (autocast) and the rows."""
    device = lm.device.type
    products = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else next(lm.parameters()).dtype
    digest = hashlib.sha256(f"{lm.config.model_type}:{lm.config.hidden_size}:{frozen}:{products}".encode())
    decoder = lm.get_decoder()
    for module in [decoder.embed_tokens, *list(decoder.layers)[:frozen]]:
        for parameter in module.parameters():
            digest.update(parameter.detach().float().flatten()[:64].numpy().tobytes())
    for ids, parents in trees:
        digest.update(np.asarray(ids + parents, dtype=np.int64).tobytes())
    return digest.hexdigest()


@dataclass
class FrozenHidden:
    """The hidden states leaving the frozen layers, for every position of every training row,
    kept in ``folder`` (``hidden.f32`` and ``hidden.json``) so that a resumed run reuses them."""

    offsets: list[int]
    lengths: list[int]
    hidden: torch.Tensor

    @classmethod
    def build(cls, lm: PreTrainedModel, trees: Sequence[ParentTree], frozen: int, folder: Path, pad_token_id: int,
              batch_tokens: int = 4096) -> "FrozenHidden":
        """Compute (or read back) the output of ``lm``'s first ``frozen`` layers for ``trees``;
        an interrupted computation continues where it stopped."""
        lengths = [len(ids) for ids, _ in trees]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        width = lm.config.hidden_size
        folder.mkdir(parents=True, exist_ok=True)
        meta_path, data_path = folder / "hidden.json", folder / "hidden.f32"
        fingerprint = _fingerprint(lm, trees, frozen)
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        shape = (offsets[-1], width)
        if meta.get("fingerprint") != fingerprint or not data_path.is_file():
            meta = {"fingerprint": fingerprint, "done": 0}
            np.memmap(data_path, dtype=np.float32, mode="w+", shape=shape).flush()
            meta_path.write_text(json.dumps(meta))
        array = np.memmap(data_path, dtype=np.float32, mode="r+", shape=shape)
        batches = group_by_length(lengths, batch_tokens)
        device = lm.device
        dtype = next(lm.parameters()).dtype
        finished_rows = [i for batch in batches for i in batch][: meta["done"]]
        done_tokens = sum(lengths[i] for i in finished_rows)
        with tqdm(total=offsets[-1], initial=done_tokens, desc=f"frozen layers 0-{frozen - 1}", unit="tok", unit_scale=True) as bar:
            done = 0
            for batch in batches:
                done += len(batch)
                if done <= meta["done"]:
                    continue
                ids, positions, mask = collate_parent_trees([trees[i] for i in batch], pad_token_id, dtype=dtype)
                with torch.no_grad(), layer_range(lm, 0, frozen):
                    out = lm.get_decoder()(input_ids=ids.to(device), attention_mask=mask.to(device),
                                           position_ids=positions.to(device)).last_hidden_state.float().cpu()
                for row, index in enumerate(batch):
                    array[offsets[index]:offsets[index + 1]] = out[row, : lengths[index]].numpy()
                if done - meta["done"] >= 512 or done == len(trees):
                    array.flush()
                    meta["done"] = done
                    meta_path.write_text(json.dumps(meta))
                bar.update(sum(lengths[i] for i in batch))
        return cls(offsets, lengths, torch.from_numpy(np.memmap(data_path, dtype=np.float32, mode="r+", shape=shape)))

    def padded(self, indices: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``[len(indices), longest, hidden]``: the rows' hidden states, right-padded with zeros."""
        longest = max(self.lengths[i] for i in indices)
        out = torch.zeros((len(indices), longest, self.hidden.shape[1]), dtype=dtype)
        for row, index in enumerate(indices):
            out[row, : self.lengths[index]] = self.hidden[self.offsets[index]:self.offsets[index + 1]]
        return out

