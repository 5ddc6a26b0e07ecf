"""Training recipes: every recipe in the repository is valid and trains end to end on a few
sentences on the CPU into a model the engine loads and runs; bad recipes are clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from padellm_ner.cli import main
from training.precision import resolve_precision
from training.recipes import RecipeError, RecipeRun, load_recipe, recipe_names, stage_configs
from training.trainer import TrainConfig

CORPORA = ("conll2003", "resume", "weibo")


def _head(source: Path, target: Path, sentences: int, shortest: bool = False) -> None:
    """The first ``sentences`` blank-line separated blocks of a corpus file, or (``shortest``) the
    ``sentences`` shortest ones that hold an entity, after a leading ``-DOCSTART-`` (an undertrained
    model's dev answers run to the length their text allows: short texts keep a smoke run's dev
    scoring short)."""
    blocks = [b for b in source.read_text(encoding="utf-8").split("\n\n") if b.strip()]
    if shortest:
        start = blocks[:1] if blocks[0].startswith("-DOCSTART-") else []
        tagged = [b for b in blocks if any(line.split()[-1] != "O" for line in b.splitlines() if line.strip())]
        blocks = start + sorted((b for b in tagged if not b.startswith("-DOCSTART-")), key=len)[:sentences]
    else:
        blocks = blocks[:sentences]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")


@pytest.fixture(scope="module")
def small_data(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared corpora's layout with 12 training sentences and the shortest dev sentence per corpus (CoNLL-03: after a -DOCSTART-)."""
    folder = tmp_path_factory.mktemp("data")
    for corpus in CORPORA:
        _head(data_dir / corpus / "train.txt", folder / corpus / "train.txt", 12)
        _head(data_dir / corpus / "dev.txt", folder / corpus / "dev.txt", 1, shortest=True)  # dev scoring is most of a smoke run
    (folder / "open").mkdir()
    shutil.copy(data_dir / "open" / "labels.tsv", folder / "open" / "labels.tsv")
    for corpus in ("scierc", "snips", "cluener"):  # the open recipe's corpora: three of them, 12 records each
        (folder / "open" / corpus).mkdir()
        shutil.copy(data_dir / "open" / corpus / "sources.json", folder / "open" / corpus / "sources.json")
        lines = (data_dir / "open" / corpus / "train.jsonl").read_text(encoding="utf-8").splitlines()[:12]
        (folder / "open" / corpus / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_the_shipped_models_have_recipes() -> None:
    shipped = {p.parent.name for p in (Path(__file__).parent.parent / "ner_service" / "shipped_models").glob("*/ner_model.json")}
    assert shipped <= set(recipe_names())
    assert {"en-conll03-diffusion", "en-conll03-lud"} <= set(recipe_names())


def test_the_experiment_recipes_are_valid_and_name_no_shipped_model() -> None:
    """``training/recipes/experiments/``: runs the docs describe, read and checked as any recipe."""
    experiments = sorted((Path(__file__).parent.parent / "training" / "recipes" / "experiments").glob("*.toml"))
    assert experiments
    for path in experiments:
        recipe = load_recipe(path)
        assert recipe.stages and recipe.name not in recipe_names()


SHIPPED = Path(__file__).parent.parent / "ner_service" / "shipped_models"
#: The settings of an ``lm`` stage that its model card's run must share with the recipe.
LM_SETTINGS = ("formats", "full", "top_layers", "lora_r", "lora_alpha", "lr", "warmup_steps", "epochs", "batch_tokens", "seed",
               "init_adapter", "window_tokens", "document_windows")


def test_the_smollm2_recipes_start_from_one_first_stage_run_on_a_gpu(small_data: Path, tmp_path: Path) -> None:
    """en-conll03-lud and en-conll03-diffusion both start from the same LoRA model of SmolLM2,
    whose card's run had a GPU (its stage says so; the rest ran on the CPU)."""
    lud, diffusion = (load_recipe(name) for name in ("en-conll03-lud", "en-conll03-diffusion"))
    assert lud.stages[0] == diffusion.stages[0] and lud.stages[0].device == "cuda"
    first, *rest = stage_configs(lud, RecipeRun(small_data, tmp_path / "out"))
    assert first.base == "smollm2-135m-instruct" and resolve_precision(first.dtype, first.device).name == "bfloat16"
    assert [config.device for config in rest] == ["cpu", "cpu"] and rest[0].model == first.output
    assert rest[-1].base == "smollm2-135m-instruct"  # stored over the public base
    forced = stage_configs(lud, RecipeRun(small_data, tmp_path / "out", device="cpu"))
    assert {config.device for config in forced} == {"cpu"}


def test_the_english_recipe_builds_its_model_from_the_public_base(small_data: Path, tmp_path: Path) -> None:
    """Stage 1 fully fine-tunes Gemma's top layers, stage 2 stores that in 25 MB, stage 3 trains the
    stored adapter further, stage 4 fully fine-tunes that model's top layers again, stage 5 stores
    it in 25 MB, stage 6 fine-tunes it once more with the question past the count and stage 7 stores
    it and chooses the count biases: one recipe from Gemma 3 270M to the shipped model."""
    tuned, stored, further, again, stored_again, past, shipped_stage = stage_configs(load_recipe("en-conll03"),
                                                                                     RecipeRun(small_data, tmp_path / "out"))
    assert (tuned.base, tuned.full, tuned.top_layers) == ("gemma3-270m", True, 9)
    assert stored.model == tuned.output and (stored.base, stored.max_megabytes) == ("gemma3-270m", 25)
    assert further.init_adapter == stored.output and (further.base, further.full, further.top_layers) == ("gemma3-270m", False, 9)
    assert again.base == further.output and (again.full, again.top_layers) == (True, 9)
    assert stored_again.model == again.output and (stored_again.base, stored_again.max_megabytes) == ("gemma3-270m", 25)
    assert past.base == stored_again.output and past.past_count_queries
    assert shipped_stage.model == past.output and shipped_stage.output == str(tmp_path / "out")


@pytest.mark.parametrize("name", ["en-conll03", "zh-resume"])
def test_the_past_count_recipes_end_with_their_model_cards_run(small_data: Path, tmp_path: Path, name: str) -> None:
    """The last two stages are the shipped model's run (its ``recipe.json`` and ``training.json``):
    the top layers of the stage before, merged, fully fine-tuned with the question past the count,
    then the change from Gemma 3 270M stored in 25 MB and the count biases chosen."""
    recipe = load_recipe(name)
    *before, tuned, stored = stage_configs(recipe, RecipeRun(small_data, tmp_path / "out"))
    assert tuned.base == before[-1].output and before[0].base == "gemma3-270m"
    assert (tuned.full, tuned.top_layers, tuned.kept_vocabulary, tuned.past_count_queries) == (True, 9, True, True)
    assert json.loads((SHIPPED / name / "ner_model.json").read_text())["answers_past_count"] is True
    assert stored.model == tuned.output and (stored.base, stored.max_megabytes, stored.calibrate_counts) == ("gemma3-270m", 25, True)
    ran = json.loads((SHIPPED / name / "recipe.json").read_text())["stages"]  # the run, from the model it continued
    here = [{k: v for k, v in stage.items() if not (k == "device" and v is None)} for stage in recipe.model_dump()["stages"][-2:]]  # unset since the run
    assert [{k: v for k, v in stage["settings"].items() if k != "base"} for stage in ran] == [
        {k: v for k, v in stage["settings"].items() if k != "base"} for stage in here]
    assert ran[-1] == here[-1] and ran[0]["trainer"] == here[0]["trainer"] and here[0]["continues"] is True
    shipped = json.loads((SHIPPED / name / "training.json").read_text())
    assert (shipped["config"]["base"], shipped["config"]["max_megabytes"], shipped["config"]["name"]) == ("gemma3-270m", 25, name)
    for key in (key for key in LM_SETTINGS if key != "init_adapter"):
        assert getattr(tuned, key) == shipped["tuned"]["config"].get(key, getattr(TrainConfig, key, None)), key


def test_the_weibo_recipe_starts_as_the_resume_recipe_and_ends_over_the_public_base(small_data: Path, tmp_path: Path) -> None:
    assert load_recipe("zh-weibo").stages[0] == load_recipe("zh-resume").stages[0]  # Resume teaches the queries and Chinese names
    configs = stage_configs(load_recipe("zh-weibo"), RecipeRun(small_data, tmp_path / "zh-weibo"))
    assert configs[1].base == configs[0].output and configs[2].init_adapter == configs[1].output
    assert configs[2].base == configs[3].base == configs[0].output  # more training of one adapter, on the model it was trained on
    assert (configs[-1].model, configs[-1].base) == (configs[-2].output, "gemma3-270m")
    assert json.loads((SHIPPED / "zh-weibo" / "ner_model.json").read_text())["base"] == "gemma3-270m"


def test_recipes_keep_float32_weights_on_the_cpu(small_data: Path, tmp_path: Path) -> None:
    """A recipe written for a GPU still trains at the CPU's speed when run there: float32 weights,
    with bfloat16 products only where the CPU has the instructions for them."""
    for name in recipe_names():
        for config in stage_configs(load_recipe(name), RecipeRun(small_data, tmp_path / name, device="cpu")):
            if hasattr(config, "dtype"):
                for instructions in (False, True):
                    assert resolve_precision(config.dtype, "cpu", instructions).weights == torch.float32, name


def test_stages_continue_from_the_previous_stage(small_data: Path, tmp_path: Path) -> None:
    path = tmp_path / "two.toml"
    path.write_text('name = "two"\ndescription = "an NER model, then its LUD adapter"\ndevice = "cpu"\n'
                    '[[stages]]\ntrainer = "lm"\ntrain = "conll2003/train.txt"\ndev = "conll2003/dev.txt"\n'
                    '[stages.settings]\nbase = "smollm2-135m-instruct"\n'
                    '[[stages]]\ntrainer = "lud"\ntrain = "conll2003/train.txt"\ncontinues = true\n')
    first, second = stage_configs(load_recipe(path), RecipeRun(small_data, tmp_path / "two", device="cuda", max_steps=3))
    assert second.model == first.output == str(tmp_path / "two-stage1") and second.output == str(tmp_path / "two")
    assert {first.device, second.device} == {"cuda"} and {first.max_steps, second.max_steps} == {3}
    assert first.dev == str(small_data / "conll2003" / "dev.txt") and second.train == str(small_data / "conll2003" / "train.txt")


def test_a_fine_tuned_stage_can_be_stored_as_an_adapter_over_its_base(small_data: Path, tmp_path: Path) -> None:
    path = tmp_path / "stored.toml"
    path.write_text('name = "stored"\ndescription = "top layers fully fine-tuned, stored as a LoRA adapter"\n'
                    '[[stages]]\ntrainer = "lm"\ntrain = "conll2003/train.txt"\n'
                    '[stages.settings]\nbase = "tiny-conll03"\nfull = true\ntop_layers = 1\n'
                    '[[stages]]\ntrainer = "low_rank"\ndev = "conll2003/dev.txt"\ncontinues = true\n'
                    '[stages.settings]\nbase = "tiny-conll03"\nmax_megabytes = 0.5\n')
    tuned, stored = stage_configs(load_recipe(path), RecipeRun(small_data, tmp_path / "stored"))
    assert stored.model == tuned.output and (stored.base, stored.max_megabytes, stored.name) == ("tiny-conll03", 0.5, "stored")
    assert stored.dev == str(small_data / "conll2003" / "dev.txt") and not hasattr(stored, "train")


@pytest.mark.parametrize("repeated", [True, False], ids=["start-repeated", "start-left-out"])
@pytest.mark.parametrize(("trainer", "settings", "start"), [
    ("lm", 'base = "smollm2-135m-instruct"\nlora_r = 8\n', "base"),
    ("diffusion", 'init = "en-conll03"\n', "init"),
])
def test_a_stage_can_train_the_previous_stages_adapter_further(small_data: Path, tmp_path: Path, trainer: str, settings: str,
                                                               start: str, repeated: bool) -> None:
    path = tmp_path / "longer.toml"
    stage = f'[[stages]]\ntrainer = "{trainer}"\ntrain = "conll2003/train.txt"\n'
    again = settings if repeated else settings.replace(f"{start} = ", "# ")
    path.write_text('name = "longer"\ndescription = "a model, then more training of its adapter"\n'
                    f'{stage}[stages.settings]\n{settings}{stage}continues = "adapter"\n[stages.settings]\n{again}')
    first, second = stage_configs(load_recipe(path), RecipeRun(small_data, tmp_path / "longer"))
    assert second.init_adapter == first.output and first.init_adapter is None
    assert getattr(second, start) == getattr(first, start)  # the adapter stays on the model it was trained on


@pytest.mark.parametrize("text, problem", [
    ('name = "x"\ndescription = "x"\n[[stages]]\ntrainer = "lm"\ntrain = "a.txt"\n[stages.settings]\nlora_rank = 8\n', "no setting lora_rank"),
    ('name = "x"\ndescription = "x"\n[[stages]]\ntrainer = "lm"\ntrain = "a.txt"\n[stages.settings]\nlora_r = "big"\n', "lora_r"),
    ('name = "x"\ndescription = "x"\n[[stages]]\ntrainer = "lm"\ntrain = "a.txt"\n[stages.settings]\ndevice = "cuda"\n', "no setting device"),
    ('name = "x"\ndescription = "x"\n[[stages]]\ntrainer = "lm"\ntrain = "a.txt"\n[stages.settings]\ndtype = "int8"\n',
     "dtype: Input should be 'auto', 'float32', 'bfloat16' or 'mixed'"),
    ('name = "x"\ndescription = "x"\n[[stages]]\ntrainer = "lm"\ntrain = "a.txt"\ncontinues = true\n', "no previous stage"),
    ('name = "x"\ndescription = "x"\n[[stages]]\ntrainer = "lm"\ntrain = "a.txt"\n[[stages]]\ntrainer = "lud"\ntrain = "a.txt"\n'
     'continues = "adapter"\n', "cannot train a previous stage's adapter further"),
    ('name = "x"\ndescription = "x"\n[[stages]]\ntrainer = "bpe"\ntrain = "a.txt"\n', "stages.0.trainer"),
    ('name = "x"\ndescription = "x"\nstages = []\n', "stages"),
    ('name = "x"\ndescription = "x"\ngpu = true\n[[stages]]\ntrainer = "lm"\ntrain = "a.txt"\n', "gpu"),
    ('name = "x\n', "not valid TOML"),
    ('name = "x"\ndescription = "x"\n[[stages]]\ntrainer = "lm"\n[stages.settings]\nbase = "b"\n', "needs a training corpus"),
])
def test_bad_recipes_are_clear_errors(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError, match=problem):
        load_recipe(path)


def test_unknown_recipe_and_missing_data_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--recipe", "en-conll03-large"]) == 2
    assert "unknown recipe 'en-conll03-large'" in capsys.readouterr().err
    assert main(["train", "--recipe", "tiny-conll03", "--data", str(tmp_path)]) == 2
    assert "conll2003/train.txt" in capsys.readouterr().err and not (Path("runs") / "tiny-conll03" / "recipe.json").exists()
    with pytest.raises(SystemExit):
        main(["train", "--recipe", "tiny-conll03", "--lr", "0.1"])


#: The one recipe whose smoke run scores dev (its ``lm`` stage's scores and count calibration);
#: the others skip dev scoring (``--eval-limit 0``), which an undertrained model's answers make
#: most of a smoke run (``low_rank``'s dev scores: tests/test_low_rank.py).
DEV_SCORED = "en-conll03-cpu"


def _smoke_runs() -> list:
    """Every recipe; one of many stages gets 5 minutes a stage (a Gemma stage's smoke run, dev
    scoring included, takes one or two on two busy cores)."""
    runs = []
    for name in recipe_names():
        stages = len(load_recipe(name).stages)
        runs.append(pytest.param(name, marks=pytest.mark.timeout(300 * stages)) if stages > 2 else name)
    return runs


@pytest.mark.parametrize("name", _smoke_runs())
def test_recipe_trains_end_to_end_on_the_cpu(name: str, small_data: Path, tmp_path: Path) -> None:
    from ner_service.engine import NEREngine

    output = tmp_path / name
    shrink = ["--limit", "6", "--max-steps", "1"] + ([] if name == DEV_SCORED else ["--eval-limit", "0"])
    assert main(["train", "--recipe", name, "--data", str(small_data), "--output", str(output), "--device", "cpu", *shrink]) == 0
    assert json.loads((output / "recipe.json").read_text(encoding="utf-8"))["name"] == name
    engine = NEREngine.load(output)
    assert engine.ner_model.config.name == name
    if name == DEV_SCORED:
        assert {"padellm", "ar"} <= set(engine.ner_model.config.metrics["dev_during_training"])
    else:
        assert "dev_during_training" not in engine.ner_model.config.metrics
    strategy = "fast_dllm" if engine.ner_model.config.mask_token else "padellm"
    (extraction,) = engine.extract(["Peter Blackburn visited Brussels ."], strategy=strategy)
    text = "Peter Blackburn visited Brussels ."
    assert all(text[e.start:e.end] == e.text for e in extraction.entities)
    assert extraction.stats.forward_passes >= 1
    if (output / "snapshots").is_dir():  # an open run's last stage, an adapter trained further: its snapshot is the model it saved
        from training.open_eval import snapshot_engine

        snapshot = sorted((output / "snapshots").glob("snapshot-*.pt"))[-1]
        scored, saved = snapshot_engine(output, snapshot)
        assert saved["step"] == 1
        (again,) = scored.extract([text])
        assert {(e.start, e.end, e.label) for e in again.entities} == {(e.start, e.end, e.label) for e in extraction.entities}
        assert snapshot_engine(output, snapshot, count_quantile=0.3)[0].count_quantile == 0.3  # open_eval --count-quantile
