"""The CPU inference path of issue 78: ``dtype auto``, threads from the CPU quota, PaDeLLM's answers
over the tokens they may take, and commands that load no model without torch. Real forward passes
on the tiny model and the shipped tokenizers; nothing here depends on how fast the machine is."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from corpora import read_corpus
from general_decoding import StopCriteria, get_decoder, left_pad
from general_decoding.row_vocabulary import RowVocabulary, SparseLogprobs
from ner_service.engine import NEREngine, prompts
from ner_service.engine import cpu
from ner_service.engine.answer_vocabulary import AnswerVocabulary, model_answer_tokens
from ner_service.engine.chunking import Window
from ner_service.engine.queries import count_query_ids
from ner_service.engine.query_runners import SharedPrefixRunner
from ner_service.engine.results import ExtractionStats
from ner_service.engine.span_tries import SpanTries
from ner_service.engine.strategies.padellm import PaDeLLM
from tests.conftest import TINY_DIR

REPO = Path(__file__).resolve().parent.parent
TEXTS = ["Peter Blackburn met John Smith in BRUSSELS .", "EU rejects German call to boycott British lamb .",
         "Japan began the defence of their Asian Cup title with a lucky 2-1 win against Syria in Al Ain on Friday ."]


def test_auto_is_bfloat16_only_where_the_cpu_multiplies_bfloat16_in_hardware(tmp_path: Path) -> None:
    with_amx, without = tmp_path / "amx", tmp_path / "avx2"
    with_amx.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f amx_bf16 amx_tile\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    without.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 fma\n")
    assert cpu.cpu_flags(with_amx) & cpu.BFLOAT16_FLAGS == {"amx_bf16"}
    assert not cpu.cpu_flags(without) & cpu.BFLOAT16_FLAGS and cpu.cpu_flags(tmp_path / "missing") == frozenset()
    assert cpu.inference_dtype("auto", "cpu", bfloat16_cpu=True) == "bfloat16"
    assert cpu.inference_dtype("auto", "cpu", bfloat16_cpu=False) == cpu.inference_dtype(None, "cpu", bfloat16_cpu=False) == "float32"
    assert cpu.inference_dtype("auto", "cuda") == "bfloat16"
    assert cpu.inference_dtype("float32", "cpu", bfloat16_cpu=True) == "float32" and cpu.inference_dtype("torch.bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="unknown dtype"):
        cpu.inference_dtype("float16")
    assert cpu.torch_dtype("auto") == (torch.bfloat16 if cpu.cpu_has_bfloat16() else torch.float32)


def test_threads_follow_the_cgroup_quota_and_are_shared_among_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    v2, v1 = tmp_path / "cpu.max", tmp_path / "v1"
    v2.write_text("max 100000\n")
    assert cpu.cgroup_cpu_quota(v2, v1) is None
    v2.write_text("150000 100000\n")
    assert cpu.cgroup_cpu_quota(v2, v1) == 1.5
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu.cgroup_cpu_quota(tmp_path / "none", v1) == 3.0
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu.cgroup_cpu_quota(tmp_path / "none", v1) is None
    assert cpu.available_cpus(quota=1.5) == 1 and cpu.available_cpus(quota=1024.0) == len(os.sched_getaffinity(0))
    monkeypatch.delenv(cpu.THREADS_ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cpu.inference_threads(processes=1, cpus=4) == 4 and cpu.inference_threads(processes=2, cpus=4) == 2
    assert cpu.inference_threads(processes=8, cpus=2) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert cpu.inference_threads(cpus=4) == 1
    monkeypatch.setenv(cpu.THREADS_ENV, "3")
    assert cpu.inference_threads(processes=2, cpus=2) == 3


def test_the_pool_loads_in_ner_dtype_else_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    from ner_service.engine.pool import EnginePool

    monkeypatch.delenv(cpu.DTYPE_ENV, raising=False)
    auto = EnginePool("tiny-conll03")
    assert auto.dtype == cpu.inference_dtype("auto")
    assert auto.ner_model("tiny-conll03").model.dtype == getattr(torch, auto.dtype)
    monkeypatch.setenv(cpu.DTYPE_ENV, "float32")
    assert EnginePool("tiny-conll03").dtype == "float32" and EnginePool("tiny-conll03", dtype="bfloat16").dtype == "bfloat16"


def test_a_row_vocabulary_gives_the_whole_layers_log_probabilities_renormalised_over_each_rows_tokens(tiny_engine: NEREngine) -> None:
    model = tiny_engine.ner_model.model
    head = model.get_output_embeddings()
    size = head.weight.shape[0]
    torch.manual_seed(0)
    hidden = torch.randn(3, 2, head.weight.shape[1], dtype=head.weight.dtype)
    shared = torch.tensor([5, 17, 3, 200])
    rows = [shared, torch.tensor([1, 2]), shared]
    vocabulary = RowVocabulary(rows, size)
    assert vocabulary.ids.tolist() == [1, 2, 3, 5, 17, 200] and vocabulary.allowed(1).tolist() == [1, 2]
    got = vocabulary.logprobs(hidden, head)
    with torch.inference_mode():
        whole = head(hidden).float()
    for row, ids in enumerate(rows):
        ids = ids.sort().values
        assert torch.allclose(got[row][:, ids], whole[row][:, ids].log_softmax(-1), atol=1e-5)
        outside = torch.ones(size, dtype=torch.bool)
        outside[ids] = False
        assert bool(torch.isneginf(got[row][:, outside]).all())
    again = vocabulary.rows([2, 1]).logprobs(hidden[[2, 1]], head)  # row i is row rows[i]; the gathered layer rows are shared
    assert torch.equal(torch.isneginf(again), torch.isneginf(got[[2, 1]]))
    assert torch.allclose(again[~torch.isneginf(again)], got[[2, 1]][~torch.isneginf(again)], atol=1e-5)
    with pytest.raises(ValueError):
        RowVocabulary([torch.tensor([size])], size)


def test_sparse_log_probabilities_answer_as_the_whole_layout_does(tiny_engine: NEREngine) -> None:
    """The engine chooses tokens and scores over a row vocabulary's own columns: what it reads
    there is what the whole vocabulary's layout holds at those token ids."""
    head = tiny_engine.ner_model.model.get_output_embeddings()
    size = head.weight.shape[0]
    torch.manual_seed(1)
    hidden = torch.randn(3, 1, head.weight.shape[1], dtype=head.weight.dtype)
    vocabulary = RowVocabulary([torch.tensor([5, 17, 3, 200]), torch.tensor([1, 2]), torch.tensor([3, 5])], size)
    sparse = vocabulary.sparse_logprobs(hidden, head)[:, 0]
    dense = vocabulary.logprobs(hidden, head)[:, 0]
    assert sparse.values.shape == (3, 6) and torch.equal(sparse.to_dense(), dense)
    assert sparse.argmax().tolist() == dense.argmax(-1).tolist()
    assert sparse.picked([5, 17, 9]) == [float(dense[0, 5]), float("-inf"), float("-inf")]  # 17 is not row 1's, 9 no row's
    assert torch.equal(sparse.of([3, 9, 200]), dense[:, [3, 9, 200]])
    with torch.inference_mode():  # what a forward gives: values that cannot change in place
        frozen = vocabulary.sparse_logprobs(hidden, head)[:, 0]
    plus = frozen.plus([5, 9, 1], torch.tensor([[0.0, 0.0, 0.0], [2.0, 1.0, 0.5], [2.0, 1.0, 0.5]]))
    assert torch.equal(frozen.to_dense(), dense)  # a copy
    dense[1:, 5] += 2.0
    dense[1:, 1] += 0.5
    assert torch.equal(plus.to_dense(), dense)
    whole = SparseLogprobs.dense(dense)
    assert whole.argmax().tolist() == plus.argmax().tolist() and whole.picked([3, 1, 5]) == plus.picked([3, 1, 5])
    assert whole.to_dense() is not whole.values  # a copy, which constraints may change


@pytest.mark.parametrize("decoder", ["greedy", "copy"])
def test_a_decoder_over_every_token_decodes_as_over_the_whole_layer_and_within_fewer_tokens_only_those(tiny_engine: NEREngine,
                                                                                                       decoder: str) -> None:
    ner_model = tiny_engine.ner_model
    tokenizer, model = ner_model.tokenizer, ner_model.model
    rows = [prompts.ar_prompt_ids(tokenizer, text) for text in TEXTS]
    ids, mask = left_pad(rows, ner_model.pad_token_id)
    stop = StopCriteria(12, ner_model.stop_token_ids)
    size = model.get_output_embeddings().weight.shape[0]
    whole = get_decoder(decoder).generate(model, ids, stop, attention_mask=mask, context_ids=[[] for _ in rows])
    every = torch.arange(size)
    over_all = get_decoder(decoder).generate(model, ids, stop, attention_mask=mask, context_ids=[[] for _ in rows],
                                             vocabulary=RowVocabulary([every] * len(rows), size))
    assert over_all.tokens == whole.tokens and over_all.scores == pytest.approx(whole.scores, abs=1e-3)
    allowed = [torch.tensor(sorted(set(row) | ner_model.stop_token_ids)) for row in rows]  # the prompt's own tokens
    within = get_decoder(decoder).generate(model, ids, stop, attention_mask=mask, context_ids=[[] for _ in rows],
                                           vocabulary=RowVocabulary(allowed, size))
    assert any(within.tokens) and all(set(tokens) <= set(ids_.tolist()) for tokens, ids_ in zip(within.tokens, allowed))
    with pytest.raises(ValueError, match="row vocabulary"):
        get_decoder("lookahead").generate(model, ids[:1], stop, vocabulary=RowVocabulary([every], size))


def _span_tokens(trie) -> set[int]:
    found: set[int] = set()
    stack = [trie]
    while stack:
        node = stack.pop()
        found.update(node.children)
        stack.extend(node.children.values())
    return found


@pytest.mark.parametrize("model, corpus, limit", [("en-conll03", "conll2003/dev.txt", 300), ("zh-resume", "resume/dev.txt", 100),
                                                  ("tiny-conll03", "conll2003/dev.txt", 300)])
def test_a_mention_may_take_every_token_of_every_answer_the_unaligned_repair_allows(model: str, corpus: str, limit: int,
                                                                                    data_dir: Path) -> None:
    """The restriction keeps what a copy of the text needs: every token of every span answer
    (what the unaligned repair's span tries allow) is a token the window's mentions may take."""
    from ner_service.engine.ner_model import NERModelConfig, resolve_ner_model
    from ner_service.engine.model_loading import resolve_model_folder
    from transformers import AutoTokenizer

    config = NERModelConfig.read(resolve_ner_model(model))
    folder = resolve_ner_model(model) if config.base == "." else resolve_model_folder(_causal_base(config.base))
    tokenizer = AutoTokenizer.from_pretrained(folder)

    class Tokens:  # what AnswerVocabulary reads of a model to list a window's mention tokens
        def __init__(self) -> None:
            self.tokenizer, self.query_stop_token_ids = tokenizer, frozenset({tokenizer.eos_token_id})

    texts = [e.text for e in read_corpus(data_dir / corpus) if e.text.strip()][:limit]
    vocabulary = AnswerVocabulary(Tokens(), [Window(i, 0, text) for i, text in enumerate(texts)], [])  # type: ignore[arg-type]
    tries = SpanTries(tokenizer, texts, tokenizer.eos_token_id, config.max_mention_tokens)
    missing = {i: _span_tokens(tries[i]) - set(vocabulary.mention_ids(i).tolist()) for i in range(len(texts))}
    assert not any(missing.values()), {texts[i]: tokenizer.convert_ids_to_tokens(sorted(m)) for i, m in missing.items() if m}


def _causal_base(base: str) -> str:
    """The causal LM at the bottom of a chain of NER models."""
    from ner_service.engine.model_loading import ModelNotFoundError
    from ner_service.engine.ner_model import NERModelConfig, resolve_ner_model

    while True:
        try:
            base = NERModelConfig.read(resolve_ner_model(base)).base
        except ModelNotFoundError:
            return base


def test_counts_and_mentions_answer_within_the_tokens_they_may_take(tiny_engine: NEREngine, data_dir: Path) -> None:
    """Over the whole output layer, every count the model writes and every mention it copies from
    the text is within the tokens the restricted path computes: the restriction drops no token an
    answer needs."""
    ner_model = tiny_engine.ner_model
    answers: list[tuple[int, list[int], list[int]]] = []

    class Recording(SharedPrefixRunner):
        def decode(self, branches, decoder, max_new_tokens, stats, constraints=()):
            out = super().decode(branches, decoder, max_new_tokens, stats, constraints)
            answers.extend((b.window_index, b.tokens, tokens) for b, tokens in zip(branches, out.tokens))
            return out

    texts = [e.text for e in read_corpus(data_dir / "conll2003" / "dev.txt") if e.text.strip()][:24]
    windows = tiny_engine.windows(texts)
    whole = PaDeLLM(ner_model, replace(tiny_engine.strategy_options(), restricted_output=False),
                    runner=lambda m, w, one_row: Recording(m, w, one_row))
    whole.mentions(windows, tiny_engine.labels, get_decoder("greedy"), ExtractionStats())
    vocabulary = AnswerVocabulary(ner_model, windows, [count_query_ids(ner_model, label) for label in tiny_engine.labels])
    counts = mentions = 0
    for window_index, branch, tokens in answers:
        allowed = set(vocabulary.ids(window_index, branch).tolist())
        if vocabulary.is_count(branch):
            counts += 1
            assert set(tokens) <= allowed, tokens
        elif tokens and prompts.parse_mention(ner_model.tokenizer.decode(tokens)) in windows[window_index].text:
            mentions += 1
            assert set(tokens) <= allowed, (windows[window_index].text, ner_model.tokenizer.convert_ids_to_tokens(tokens))
    assert counts and mentions > 10
    assert set(model_answer_tokens(ner_model).count_ids.tolist()) >= set(PaDeLLM(ner_model, tiny_engine.strategy_options()).digit_ids.values())


def test_padellm_over_its_answer_tokens_finds_the_entities_of_the_whole_output_layer(tiny_engine: NEREngine, data_dir: Path) -> None:
    """The same spans and labels, but where an answer normalised over fewer tokens, and so scored
    higher, passes the unaligned repair's threshold where it did not (the tiny model, whose answers
    are often not in the text: one text of 24; en-conll03: none of the first 96 dev sentences,
    docs/benchmarks.md); every entity found both ways scores at least as high."""
    texts = [e.text for e in read_corpus(data_dir / "conll2003" / "dev.txt") if e.text.strip()][:24]
    restricted = NEREngine(tiny_engine.ner_model, max_batch_texts=8)
    whole = NEREngine(tiny_engine.ner_model, max_batch_texts=8, restricted_output=False)
    assert restricted.strategy_options().restricted_output and not whole.strategy_options().restricted_output
    new, old = restricted.extract(texts), whole.extract(texts)
    spans = [[(e.start, e.end, e.label) for e in r.entities] for r in new]
    same = [a == [(e.start, e.end, e.label) for e in r.entities] for a, r in zip(spans, old)]
    assert sum(same) >= len(texts) - 2 and sum(map(len, spans)) > 5, [t for t, s in zip(texts, same) if not s]
    for a, b in zip(new, old):
        scores = {(e.start, e.end, e.label): e.score for e in b.entities}
        assert all(e.score >= scores[e.start, e.end, e.label] - 1e-4 for e in a.entities if (e.start, e.end, e.label) in scores)
    # AR keeps the whole output layer: the same answers either way
    assert [r.entities for r in restricted.extract(texts[:4], strategy="ar")] == [r.entities for r in whole.extract(texts[:4], strategy="ar")]


#: Run in a fresh interpreter (pytest's has torch loaded): a command's exit code and which heavy libraries it imported.
HEAVY_IMPORTS_OF = """
import contextlib, io, json, sys
from padellm_ner.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as done:  # --help
        code = done.code
print(json.dumps({"code": code, "stdout": out.getvalue(), "loaded": [m for m in ("torch", "transformers", "peft") if m in sys.modules]}))
"""


def test_ingest_and_jobs_status_do_not_load_torch(tmp_path: Path) -> None:
    documents = tmp_path / "documents.txt"
    documents.write_text("Angela Merkel visited Paris .\nEU rejects German call .\n", encoding="utf-8")
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}"}
    for argv in (["ingest", "--help"], ["ingest", str(documents)], ["jobs", "status"]):
        done = subprocess.run([sys.executable, "-c", HEAVY_IMPORTS_OF, *argv], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["code"] == 0, report
        assert report["loaded"] == [], f"padellm-ner {' '.join(argv)} imported {report['loaded']}"


@pytest.mark.parametrize("base", ["smollm2-135m-instruct", "gemma3-270m"])
def test_the_line_break_tokens_are_those_of_decoding_every_token(base: str) -> None:
    from transformers import AutoTokenizer

    from ner_service.engine.model_loading import resolve_model_folder
    from ner_service.engine.ner_model import line_break_tokens

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_folder(base))
    every = {index for index, text in enumerate(tokenizer.batch_decode([[index] for index in range(len(tokenizer))])) if "\n" in text}
    assert line_break_tokens(tokenizer) == every and len(every) > 10


def test_the_cache_keeps_gemmas_tokenizer_with_its_vocabulary_and_without_its_construction_copies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    from ner_service.engine.model_loading import CONSTRUCTION_COPIES, cached_tokenizer, resolve_model_folder

    folder = resolve_model_folder("gemma3-270m")
    monkeypatch.setenv("PADELLM_CACHE", str(tmp_path / "cache"))
    built = cached_tokenizer(folder, AutoTokenizer.from_pretrained)
    copies = CONSTRUCTION_COPIES[type(built).__name__]
    assert all(getattr(built, name) for name in copies)  # the tokenizer in use keeps them
    [stored] = (tmp_path / "cache" / "tokenizers").glob("*.pickle")
    with stored.open("rb") as file:
        kept = pickle.load(file)
    assert all(getattr(kept.tokenizer, name) is None for name in copies)
    assert kept.vocabulary == built.get_vocab() and len(kept.vocabulary) == 262_144
    again = cached_tokenizer(folder, AutoTokenizer.from_pretrained)
    assert again(TEXTS[0]).input_ids == built(TEXTS[0]).input_ids and again.decode(again(TEXTS[0]).input_ids) == built.decode(built(TEXTS[0]).input_ids)
    again.save_pretrained(tmp_path / "saved")  # what training does with a loaded tokenizer
    assert AutoTokenizer.from_pretrained(tmp_path / "saved")(TEXTS[0]).input_ids == built(TEXTS[0]).input_ids


def test_models_of_one_tokenizer_share_its_backend_and_keep_their_own_special_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tokenizer read back in one process is built once: every model of those files holds its own
    tokenizer over one backend (Gemma 3's is about 200 MB), a special token set on one stays its
    own, and a token added to an own copy reaches no other model."""
    import shutil

    from transformers import AutoTokenizer

    from ner_service.engine.model_loading import cached_tokenizer, own_tokenizer

    monkeypatch.setenv("PADELLM_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    shutil.copytree(TINY_DIR, folder)
    cached_tokenizer(folder, AutoTokenizer.from_pretrained)  # built and written to the cache
    first, second = (NEREngine.load(folder).ner_model.tokenizer for _ in range(2))
    assert first is not second and first.backend_tokenizer is second.backend_tokenizer
    assert first(TEXTS[0]).input_ids == AutoTokenizer.from_pretrained(folder)(TEXTS[0]).input_ids
    second.sep_token = second.eos_token
    assert second.sep_token == "<eos>" and first.sep_token is None
    masked = own_tokenizer(second)
    masked.add_special_tokens({"mask_token": "<mask-for-the-test>"})
    assert len(masked) == len(first) + 1 and len(second) == len(first) and masked.backend_tokenizer is not first.backend_tokenizer
    assert NEREngine.load(folder).ner_model.tokenizer.mask_token is None


def test_a_vocabulary_is_built_once_per_tokenizer_and_again_after_a_token_is_added(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    from ner_service.engine.model_loading import cached_tokenizer, vocabulary
    from ner_service.engine.ner_model import resolve_ner_model

    monkeypatch.setenv("PADELLM_CACHE", str(tmp_path / "cache"))
    folder = resolve_ner_model("tiny-conll03")
    expected = AutoTokenizer.from_pretrained(folder).get_vocab()
    cached_tokenizer(folder, AutoTokenizer.from_pretrained)
    tokenizer = cached_tokenizer(folder, AutoTokenizer.from_pretrained)  # read back with its vocabulary
    built: list[int] = []
    get_vocab = type(tokenizer).get_vocab
    monkeypatch.setattr(type(tokenizer), "get_vocab", lambda self, *a, **k: built.append(1) or get_vocab(self, *a, **k))
    assert dict(vocabulary(tokenizer)) == expected and dict(vocabulary(tokenizer)) == expected and built == []
    tokenizer.add_special_tokens({"mask_token": "<mask-for-the-test>"})
    assert vocabulary(tokenizer)["<mask-for-the-test>"] == tokenizer.mask_token_id and built == [1]
    fresh = AutoTokenizer.from_pretrained(folder)  # not from the cache: built on the first call only
    assert dict(vocabulary(fresh)) == expected and dict(vocabulary(fresh)) == expected and built == [1, 1]


def test_the_lexical_unit_model_decodes_in_bfloat16_as_greedy_does() -> None:
    """Its placeholder adapter (kept in float32 by peft) multiplies in the base's dtype: ``dtype auto``
    is bfloat16 on this project's CPUs, and the LUD model must run there too."""
    if not (REPO / "ner_service" / "shipped_models" / "en-conll03-lud" / "ner_model.json").is_file():
        pytest.skip("the shipped en-conll03-lud model is not in this checkout")
    engine = NEREngine.load("en-conll03-lud", dtype="bfloat16")
    assert engine.ner_model.model.dtype == torch.bfloat16
    for strategy in ("ar", "padellm"):
        lud = [r.entities for r in engine.extract(TEXTS[:2], strategy=strategy, decoder="lud")]  # bfloat16 is slow where emulated
        greedy = [r.entities for r in engine.extract(TEXTS[:2], strategy=strategy, decoder="greedy")]
        assert [[(e.start, e.end, e.label) for e in x] for x in lud] == [[(e.start, e.end, e.label) for e in x] for x in greedy]
        assert sum(map(len, lud)) >= 3


def test_a_tokenizer_is_read_back_from_the_cache_until_its_files_change_wherever_they_lie(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from transformers import AutoTokenizer

    from ner_service.engine.model_loading import cached_tokenizer
    from ner_service.engine.ner_model import resolve_ner_model

    monkeypatch.setenv("PADELLM_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    shutil.copytree(resolve_ner_model("tiny-conll03"), folder)
    built = cached_tokenizer(folder, AutoTokenizer.from_pretrained)
    assert len(list((tmp_path / "cache" / "tokenizers").glob("*.pickle"))) == 1

    def never(_: Path):
        raise AssertionError("built again, not read from the cache")

    again = cached_tokenizer(folder, never)
    assert again is not built and again(TEXTS[0]).input_ids == built(TEXTS[0]).input_ids and again.get_vocab() == built.get_vocab()
    saved_beside = tmp_path / "stage-2"  # the same files saved beside another model (each stage of a recipe): not built again
    shutil.copytree(folder, saved_beside)
    assert cached_tokenizer(saved_beside, never).name_or_path == str(saved_beside)
    config = folder / "tokenizer_config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))  # touched, the same content
    assert cached_tokenizer(folder, never).name_or_path == str(folder)
    config.write_text(json.dumps({**json.loads(config.read_text(encoding="utf-8")), "model_max_length": 77}), encoding="utf-8")
    calls: list[Path] = []
    changed = cached_tokenizer(folder, lambda f: calls.append(f) or AutoTokenizer.from_pretrained(f))
    assert calls == [folder] and changed.model_max_length == 77
    assert cached_tokenizer(saved_beside, never).model_max_length != 77
    assert len(list((tmp_path / "cache" / "tokenizers").glob("*.pickle"))) == 2
