"""Operations on Hugging Face ``Cache`` objects that decoders and the engine share.

Decoding appends one column (or a few) per forward. ``DynamicLayer`` appends by
concatenation, which copies the whole layer cache every step: for a batch of mention
queries on the CPU that copying took about a tenth of the engine's time. A
:class:`ReservedLayer` keeps spare columns after the used ones and writes new columns in
place; :class:`ReservedCache` is a ``DynamicCache`` made of them.
"""

from __future__ import annotations

import torch
from transformers import Cache, DynamicCache
from transformers.cache_utils import DynamicLayer

#: spare columns a reserved layer keeps after its used ones (at least; it grows by half its length)
RESERVED_COLUMNS = 16


class _Columns:
    """A ``[batch, heads, columns, head_dim]`` tensor stored with spare columns after its
    ``length`` used ones."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.length = 0

    def view(self) -> torch.Tensor | None:
        return None if self.buffer is None else self.buffer[..., : self.length, :]

    def assign(self, tensor: torch.Tensor | None) -> None:
        """Hold ``tensor``: a leading slice of the buffer keeps the buffer; anything else replaces it."""
        if tensor is None or tensor.dim() != 4:
            self.buffer, self.length = None, 0
        elif (self.buffer is not None and tensor.data_ptr() == self.buffer.data_ptr()
              and tensor.shape[:2] == self.buffer.shape[:2] and tensor.stride() == self.buffer.stride()):
            self.length = tensor.shape[-2]
        else:
            self.buffer, self.length = tensor, tensor.shape[-2]

    def reserve(self, rows: int, like: torch.Tensor) -> torch.Tensor:
        """A fresh buffer of ``rows`` rows of ``like``'s columns plus spare ones; returns the part to fill."""
        heads, columns, head_dim = like.shape[1:]
        self.buffer = like.new_empty(rows, heads, columns + RESERVED_COLUMNS, head_dim)
        self.length = columns
        return self.buffer[..., :columns, :]

    def append(self, new: torch.Tensor) -> torch.Tensor:
        """Write ``new`` after the used columns (growing the buffer when full); the used columns."""
        need = self.length + new.shape[-2]
        if self.buffer is None or need > self.buffer.shape[-2]:
            grown = new.new_empty(*new.shape[:2], need + max(RESERVED_COLUMNS, need // 2), new.shape[-1])
            if self.length:
                grown[..., : self.length, :] = self.view()
            self.buffer = grown
        self.buffer[..., self.length:need, :] = new
        self.length = need
        return self.buffer[..., :need, :]

    def select(self, rows: torch.Tensor) -> None:
        if self.buffer is not None:
            self.buffer = self.buffer.index_select(0, rows.to(self.buffer.device))

    def nbytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel() * self.buffer.element_size()


class _UsedColumns:
    """The used columns of a layer's ``_keys`` or ``_values`` (:class:`_Columns`) as a plain
    tensor attribute: reading gives them, assigning a tensor holds it (:meth:`_Columns.assign`)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.store = f"_{name}"

    def __get__(self, layer: object, owner: type | None = None) -> "torch.Tensor | None | _UsedColumns":
        return self if layer is None else getattr(layer, self.store).view()

    def __set__(self, layer: object, tensor: torch.Tensor | None) -> None:
        getattr(layer, self.store).assign(tensor)


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose :meth:`update` writes the new columns into reserved room
    instead of concatenating. ``keys`` and ``values`` are the used columns; assigning them
    (a crop, a gather) works as on a ``DynamicLayer``."""

    keys = _UsedColumns()
    values = _UsedColumns()

    def __init__(self) -> None:
        self._keys, self._values = _Columns(), _Columns()
        super().__init__()

    @classmethod
    def gathered(cls, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor) -> "ReservedLayer":
        """A layer holding rows ``rows`` of ``keys`` and ``values``, copied once into reserved room."""
        layer = cls()
        for columns, tensor in ((layer._keys, keys), (layer._values, values)):
            torch.index_select(tensor, 0, rows, out=columns.reserve(len(rows), tensor))
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
        return layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
        return self._keys.append(key_states), self._values.append(value_states)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of columns to remove, not {tokens_to_remove}")
        for columns in (self._keys, self._values):
            columns.length = max(0, columns.length + tokens_to_remove)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._keys.select(indices)
        self._values.select(indices)

    def reserved_bytes(self) -> int:
        """Bytes held, spare columns included."""
        return self._keys.nbytes() + self._values.nbytes()


class ReservedCache(DynamicCache):
    """A ``DynamicCache`` of :class:`ReservedLayer` s: decoding appends without copying the cache."""

    def __init__(self, layers: list[ReservedLayer] | None = None) -> None:
        Cache.__init__(self, layers=layers or None, layer_class_to_replicate=None if layers else ReservedLayer)


def select_rows(cache: Cache, rows: torch.Tensor | list[int]) -> ReservedCache:
    """A new cache holding rows ``rows`` of ``cache`` (a row may repeat: a branch of a shared
    prefix), copied once, with room to decode after them."""
    index = torch.as_tensor(rows, dtype=torch.long)
    return ReservedCache([ReservedLayer.gathered(layer.keys, layer.values, index.to(layer.keys.device)) for layer in cache.layers])


def select_visible(cache: Cache, rows: list[int], visible: torch.Tensor) -> tuple[ReservedCache, torch.Tensor]:
    """A new cache holding, for each ``rows[i]`` of ``cache``, only the columns ``visible[i]`` marks
    (in order, left-padded to the widest), with room to decode after them, and the attention mask
    of its columns: a row decoded on from a shared cache copies what it attends to, not the whole
    row (the positions, counted over the mask, stay those of the whole row)."""
    width = int(visible.sum(1).max())
    index = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row_visible in enumerate(visible.bool()):
        columns = row_visible.nonzero().squeeze(1)
        index[i, width - len(columns):] = columns
        mask[i, width - len(columns):] = 1
    layers = []
    for layer in cache.layers:
        device = layer.keys.device
        row_index, column_index = torch.as_tensor(rows, dtype=torch.long, device=device)[:, None], index.to(device)
        # advanced indices around a slice put their [rows, width] first: back to [rows, heads, width, dim]
        keys = layer.keys[row_index, :, column_index].permute(0, 2, 1, 3)
        values = layer.values[row_index, :, column_index].permute(0, 2, 1, 3)
        layers.append(ReservedLayer.gathered(keys, values, torch.arange(len(rows), device=device)))
    return ReservedCache(layers), mask


def keep_rows(cache: Cache, rows: torch.Tensor) -> None:
    """Keep only the batch rows ``rows`` (in that order), in place: drop rows that finished."""
    for layer in cache.layers:
        if layer.get_seq_length() > 0:
            layer.batch_select_indices(rows.to(layer.keys.device))


def keep_first(cache: Cache, length: int) -> None:
    """Drop every cached column after the first ``length`` (roll back rejected tokens), in place."""
    for layer in cache.layers:
        surplus = layer.get_seq_length() - length
        if surplus > 0:
            layer.crop(-surplus)


def release_after(cache: Cache, length: int) -> None:
    """Drop every cached column after the first ``length`` and free their memory, in place (the
    kept columns are copied, which a crop's view would not do): for a cache held on after a
    decode grew it with columns nothing reads again."""
    for layer in cache.layers:
        if layer.get_seq_length() > length:
            layer.keys, layer.values = layer.keys[..., :length, :].clone(), layer.values[..., :length, :].clone()


def cache_bytes(cache: Cache) -> int:
    """Bytes held by the keys and values of ``cache`` (a reserved layer's spare columns included)."""
    return sum(layer.reserved_bytes() if isinstance(layer, ReservedLayer) else
               sum(t.numel() * t.element_size() for t in (layer.keys, layer.values) if t is not None)
               for layer in cache.layers)


def keep_columns(cache: Cache, columns: list[int]) -> None:
    """Keep only the cached columns ``columns`` (in that order), in place: the accepted
    tokens of a verified branch that was not at the end of the sequence."""
    for layer in cache.layers:
        index = torch.as_tensor(columns, dtype=torch.long, device=layer.keys.device)
        layer.keys = layer.keys.index_select(2, index)
        layer.values = layer.values.index_select(2, index)
