"""Gemma 3's text model for inference, written here so that serving it imports none of
transformers' model classes.

Importing them (``transformers.modeling_utils`` and what it pulls in: ``torch.distributed.tensor``,
``torch._dynamo``, sympy) is the largest step of a cold start, larger than reading the weights.
This module computes what ``Gemma3ForCausalLM`` of transformers 5 computes with its ``sdpa``
attention, operation for operation, for the calls the engine and the decoders make: token ids,
a 2D padding mask or a 4D mask of their own, explicit positions, a transformers ``Cache`` that
each layer appends to, ``logits_to_keep``. Its modules carry transformers' names, so a state dict,
a LoRA merge (:mod:`.lora_merge`), the fast linear layers and the exact GELU apply unchanged.
Training and any adapter that is not merged keep transformers' class (:mod:`.model_loading`).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: The ``model_type`` of the checkpoints this module reads.
MODEL_TYPE = "gemma3_text"
#: Its two kinds of attention layer: over every token before, and over the last ``sliding_window``.
LAYER_TYPES = ("full_attention", "sliding_attention")


class UnsupportedCheckpointError(ValueError):
    """A checkpoint this module does not compute exactly (another architecture or setting)."""


@dataclass
class Gemma3Config:
    """The settings of a Gemma 3 text checkpoint that its forward reads (``config.json``)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    query_pre_attn_scalar: float
    sliding_window: int
    layer_types: list[str]
    rope_theta: dict[str, float]
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = True
    use_cache: bool = True
    model_type: str = MODEL_TYPE
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, folder: Path) -> "Gemma3Config":
        """The config of ``folder``; :class:`UnsupportedCheckpointError` for anything computed otherwise."""
        raw = json.loads((folder / "config.json").read_text())
        if raw.get("model_type") != MODEL_TYPE:
            raise UnsupportedCheckpointError(f"{folder} holds a {raw.get('model_type')!r} model, not {MODEL_TYPE!r}")
        departures = {
            "attn_logit_softcapping": raw.get("attn_logit_softcapping"), "final_logit_softcapping": raw.get("final_logit_softcapping"),
            "attention_bias": raw.get("attention_bias", False), "use_bidirectional_attention": raw.get("use_bidirectional_attention", False),
            "hidden_activation": raw.get("hidden_activation") != "gelu_pytorch_tanh",
        }
        ropes = raw.get("rope_parameters") or {}
        departures["rope_parameters"] = any((ropes.get(kind) or {}).get("rope_type") != "default" for kind in LAYER_TYPES)
        departures["layer_types"] = not set(raw.get("layer_types") or ["none"]) <= set(LAYER_TYPES)
        names = {f.name for f in fields(cls)} - {"rope_theta", "extra"}
        departures["a setting it needs"] = any(f.name in names and f.default is MISSING and f.name not in raw for f in fields(cls))
        if any(departures.values()):
            raise UnsupportedCheckpointError(f"{folder}: {', '.join(k for k, v in departures.items() if v)} not computed here")
        return cls(**{name: raw[name] for name in names if name in raw},
                   rope_theta={kind: float(ropes[kind]["rope_theta"]) for kind in LAYER_TYPES},
                   extra={k: v for k, v in raw.items() if k not in names})


def supported(folder: Path) -> bool:
    """Whether ``folder`` holds a checkpoint this module computes."""
    try:
        Gemma3Config.read(folder)
    except (OSError, ValueError, KeyError):
        return False
    return True


@dataclass
class ModelOutput:
    """What a forward returns, under transformers' names: the text model's ``last_hidden_state`` or
    the causal LM's ``logits``, and the cache (also as ``past_key_values``)."""

    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    cache: Any = None

    @property
    def past_key_values(self) -> Any:
        return self.cache


class RMSNorm(nn.Module):
    """Gemma's RMS norm: computed in float32, scaled by ``1 + weight``."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        return (hidden * (1.0 + self.weight.float())).type_as(x)


class ScaledEmbedding(nn.Embedding):
    """Token embeddings times ``sqrt(hidden_size)`` rounded to the weights' dtype."""

    def __init__(self, vocab_size: int, hidden_size: int, padding_idx: int | None) -> None:
        super().__init__(vocab_size, hidden_size, padding_idx)
        self.scale = float(hidden_size) ** 0.5

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:  # on the meta device, before loading: drawing random values there imports torch._dynamo
            super().reset_parameters()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * torch.tensor(self.scale).to(self.weight.dtype)


class MLP(nn.Module):
    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = nn.GELU(approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: Gemma3Config, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.head_dim = config.head_dim
        self.groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = config.query_pre_attn_scalar ** -0.5
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * config.head_dim, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, cache: Any) -> torch.Tensor:
        batch, length = hidden.shape[:2]
        shape = (batch, length, -1, self.head_dim)
        query = self.q_norm(self.q_proj(hidden).view(shape).transpose(1, 2))
        key = self.k_norm(self.k_proj(hidden).view(shape).transpose(1, 2))
        value = self.v_proj(hidden).view(shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        query = query * cos + rotate_half(query) * sin
        key = key * cos + rotate_half(key) * sin
        if cache is not None:
            key, value = cache.update(key, value, self.layer_index)
        output = attend(query, key, value, mask, self.groups, self.scaling)
        return self.o_proj(output.reshape(batch, length, -1).contiguous())


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, groups: int,
           scaling: float) -> torch.Tensor:
    """Scaled dot-product attention as transformers' ``sdpa_attention_forward`` calls it on the CPU:
    the key heads shared by ``groups`` query heads, causal when no mask is given (``mask`` None), one
    query token's heads attending as rows of one key head. Returns ``[batch, length, heads, dim]``."""
    length = query.shape[2]
    options = {}
    if groups > 1:
        if mask is None and key.shape[-1] == value.shape[-1] <= 256:
            options["enable_gqa"] = True
        elif length == 1:
            query = query.reshape(query.shape[0], query.shape[1] // groups, groups, query.shape[-1])
            if mask is not None and mask.shape[1] != 1:
                mask = mask.reshape(mask.shape[0], mask.shape[1] // groups, groups, mask.shape[-1])
        else:
            key = _repeat_heads(key, groups)
            value = _repeat_heads(value, groups)
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.0, scale=scaling,
                                            is_causal=length > 1 and mask is None, **options)
    return output.reshape(output.shape[0], -1, length, value.shape[-1]).transpose(1, 2)


def _repeat_heads(states: torch.Tensor, groups: int) -> torch.Tensor:
    batch, heads, length, dim = states.shape
    return states[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


class DecoderLayer(nn.Module):
    def __init__(self, config: Gemma3Config, layer_index: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_index)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, cache: Any) -> torch.Tensor:
        hidden = hidden + self.post_attention_layernorm(self.self_attn(self.input_layernorm(hidden), cos, sin, mask, cache))
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))


def causal_mask(padding: torch.Tensor | None, positions: torch.Tensor, length: int, past: int, window: int | None,
                cached: bool) -> torch.Tensor | None:
    """The boolean ``[batch, 1, length, past + length]`` mask transformers builds for new tokens
    after ``past`` cached ones from a 2D ``padding`` mask (or None): causal, within ``window`` on a
    sliding layer, within each sequence where positions restart in an uncached row without padding
    (packed sequences). None where its sdpa path leaves the mask to ``is_causal``: nothing padded
    and one new token, or no cached one."""
    width = past + length
    if padding is not None:
        padding = padding.to(torch.bool)
        if padding.shape[-1] < width:
            padding = F.pad(padding, (0, width - padding.shape[-1]))
        padding = padding[:, :width]
    packed = None
    if padding is None and not cached:
        starts = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1) != 1
        packed = starts.cumsum(-1) if bool(starts[:, 1:].any()) else None
    if packed is None and (window is None or width < window):
        if (length == 1 or width == length) and (padding is None or bool(padding.all())):
            return None
        if past == 0 and (padding is None or (bool(padding[:, :length].all()) and not bool(padding[:, length:].any()))):
            return None
    query_index = torch.arange(past, width, device=positions.device)[:, None]
    key_index = torch.arange(width, device=positions.device)[None, :]
    allowed = key_index <= query_index
    if window is not None:
        allowed = allowed & (key_index > query_index - window)
    allowed = allowed[None, None]
    if padding is not None:
        allowed = allowed & padding[:, None, None, :]
    if packed is not None:
        allowed = allowed & (packed[:, None, :, None] == packed[:, None, None, :])
    return allowed.expand(positions.shape[0], 1, length, width)


class Gemma3TextModel(nn.Module):
    """The decoder stack: embeddings, layers, final norm (transformers' ``Gemma3TextModel``)."""

    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = ScaledEmbedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(config, index) for index in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.inverse_frequencies = {
            kind: 1.0 / (theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float, device="cpu") / config.head_dim))
            for kind, theta in config.rope_theta.items()
        }

    def rotary(self, positions: torch.Tensor, kind: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        frequencies = positions[..., None].float() * self.inverse_frequencies[kind].to(positions.device)
        angles = torch.cat((frequencies, frequencies), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                cache: Any = None, use_cache: bool | None = None, past_key_values: Any = None, **unused: Any) -> ModelOutput:
        cache = cache if cache is not None else past_key_values
        if (self.config.use_cache if use_cache is None else use_cache) and cache is None:  # as transformers: a cache unless told not to
            from transformers.cache_utils import DynamicCache

            cache = DynamicCache()
        hidden = self.embed_tokens(input_ids)
        length = hidden.shape[1]
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = (torch.arange(length, device=hidden.device) + past)[None]
        if attention_mask is not None and attention_mask.dim() == 4:
            masks = dict.fromkeys(LAYER_TYPES, attention_mask)
        else:
            batch_positions = position_ids.expand(hidden.shape[0], -1)
            masks = {kind: causal_mask(attention_mask, batch_positions, length, past, window, cache is not None)
                     for kind, window in zip(LAYER_TYPES, (None, self.config.sliding_window))}
        rotations = {kind: self.rotary(position_ids, kind, hidden.dtype) for kind in set(self.config.layer_types)}
        for layer, kind in zip(self.layers, self.config.layer_types):
            hidden = layer(hidden, *rotations[kind], masks[kind], cache)
        return ModelOutput(last_hidden_state=self.norm(hidden), cache=cache)


class Gemma3ForCausalLM(nn.Module):
    """The text model and its output layer (tied to the embeddings), with the parts of transformers'
    ``PreTrainedModel`` interface the engine and the decoders use."""

    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.config = config
        self.model = Gemma3TextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @classmethod
    def from_folder(cls, folder: Path, dtype: torch.dtype = torch.float32, weights: Path | None = None) -> "Gemma3ForCausalLM":
        """The checkpoint of ``folder`` (safetensors, one file or an indexed set) in ``dtype``, in
        evaluation mode and without gradients; ``weights``: a safetensors file to read the weights
        from instead (a merged model kept by :mod:`.merged_weights`), the config staying the folder's."""
        from safetensors.torch import load_file

        config = Gemma3Config.read(folder)
        index = folder / "model.safetensors.index.json"
        if weights is not None:
            files = [weights]
        elif index.is_file():
            files = [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        else:
            files = [folder / "model.safetensors"]
        state = {}
        for path in files:
            state.update(load_file(str(path)))
        state = {name: tensor.to(dtype) for name, tensor in state.items()}
        with torch.device("meta"):
            model = cls(config)
        if config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        model.load_state_dict(state, strict=not config.tie_word_embeddings, assign=True)
        if config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        missing = [name for name, tensor in model.state_dict().items() if tensor.is_meta]
        if missing:
            raise UnsupportedCheckpointError(f"{folder} lacks {', '.join(missing[:5])}")
        model.requires_grad_(False)
        return model.eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def get_decoder(self) -> Gemma3TextModel:
        return self.model

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, module: nn.Module) -> None:
        self.lm_head = module

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                cache: Any = None, use_cache: bool | None = None, past_key_values: Any = None,
                logits_to_keep: int | torch.Tensor = 0, **unused: Any) -> ModelOutput:
        out = self.model(input_ids, attention_mask, position_ids, cache=cache, use_cache=use_cache, past_key_values=past_key_values)
        hidden = out.last_hidden_state
        if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.ndim == 2:
            hidden = hidden[logits_to_keep] if logits_to_keep.dtype == torch.bool else torch.take_along_dim(hidden, logits_to_keep[..., None], dim=1)
        else:
            hidden = hidden[:, slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep, :]
        return ModelOutput(logits=self.lm_head(hidden), cache=out.cache)


