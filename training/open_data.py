"""The open-label training mixture: records of many corpora, each asked for a set of label names.

The corpora of ``open/`` (one JSONL format, ``labels.tsv`` naming every raw label in plain
English, ``sources.json`` listing the labels each source annotates) and the supervised corpora
(CoNLL-03, Resume) become :class:`OpenExample` objects: a text, its spans relabelled with the
names a query writes, and the names it is asked for. The rules, each in one place:

* **Asked labels** are the record's own source's labels (a label outside its source's list is
  unknown there, never asked as absent), each kept with a probability drawn per record (label
  dropout; a label the record does not hold less often, ``absent_keep``), at least one kept; two
  raw labels of one name are one question, their spans merged.
* **Negatives**: a few domain-specific names of other domains (a name found in one domain group
  only, asked of a record of another), whose count is 0.
* **How a label is written**: lower-cased names mostly (the zero-shot evaluation asks so), now
  and then the name with its description, the raw label as a synonym, or another way users write
  the same type (:data:`NAME_VARIANTS`: "organisation", "misc", "film"), so that a name is read
  for its meaning rather than matched to a name of the training set.
* **Balance**: records are drawn per corpus with weight ``size ** temperature`` (the 70,000
  biomedical sentences do not drown the rest), the supervised corpora with fixed shares.
* **Held out**: whole corpora of other domains and languages are never trained on; their dev
  (or test) records are the zero-shot dev (:data:`ZERO_SHOT_CORPORA`, or a run's ``held_out``).
  Corpora without a train split are never trained on either.
"""

from __future__ import annotations

import csv
import json
import random
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corpora import Example, Span, read_corpus
from ner_service.engine.chunking import chunk_spans
from ner_service.engine.labels import MAX_OPEN_LABELS

#: Whole corpora held out of training: their records measure labels and domains never seen.
ZERO_SHOT_CORPORA = ("re3d", "harveyner", "sofc_exp", "mobie_de", "ccks2017_cnmer", "slurp", "norne_nob")
#: Domain groups: a negative label comes from another group's domain-specific names.
DOMAINS = {
    "biomedicine": ("mtl_biomed", "anem", "biored", "chineseblue_med", "ccks2017_cnmer"),
    "science": ("scierc", "sofc_exp", "wlp", "few_tk"),
    "cyber-security": ("aptner", "cyner_mitre"),
    "software": ("stackoverflow_ner",),
    "law": ("lener_br", "ler_de"),
    "voice commands": ("snips", "slurp"),
}
#: How the supervised corpora's labels are asked: plain names, and for Resume also its Chinese ones.
SUPERVISED_NAMES = {
    "conll2003": {"PER": "person", "LOC": "location", "ORG": "organization", "MISC": "miscellaneous"},
    "resume": {"NAME": "person", "ORG": "organization", "TITLE": "job title", "EDU": "educational degree",
               "CONT": "nationality", "PRO": "major", "RACE": "ethnicity", "LOC": "location"},
    "weibo": {"PER.NAM": "person", "ORG.NAM": "organization", "LOC.NAM": "location"},
}
#: Raw labels a supervised corpus's queries ask as another of its labels: Weibo's named geo-political
#: entities are locations, as CoNLL-03 and the news corpora annotate them (its nominal mentions,
#: ``*.NOM``, are never asked: the types are named entities).
SUPERVISED_MERGED = {"weibo": {"GPE.NAM": "LOC.NAM"}}
SUPERVISED_DESCRIPTIONS = {
    "conll2003": {"MISC": "other named entity: nationality, event, work, product"},
    "resume": {"PRO": "field of study or profession", "CONT": "country of citizenship"},
}
#: Other ways users write a type name (lower case): spellings, short forms, near synonyms that
#: mean the same type in the corpora that use the name. A label is asked so at ``variant_rate``.
NAME_VARIANTS: dict[str, tuple[str, ...]] = {
    "person": ("person name", "individual", "human", "people"),
    "person name": ("person", "name of a person"),
    "organization": ("organisation", "org", "organization name"),
    "location": ("place", "loc", "geographical location"),
    "place": ("location", "place name"),
    "miscellaneous": ("misc", "other entity"),
    "miscellaneous entity": ("misc", "miscellaneous"),
    "city": ("town", "city name"),
    "country": ("nation", "country name"),
    "state or province": ("province", "region"),
    "date or time": ("date", "time expression"),
    "movie title": ("movie", "film", "film title"),
    "book title": ("book", "title of a book"),
    "song": ("track", "song title"),
    "album": ("album title", "record"),
    "artist": ("musician", "performer"),
    "music genre": ("genre", "musical genre"),
    "disease": ("illness", "disorder", "medical condition"),
    "chemical": ("chemical compound", "chemical substance", "compound"),
    "gene or protein": ("gene", "gene product"),
    "species": ("species name", "taxon"),
    "organism": ("living organism",),
    "software application": ("software", "application", "app"),
    "software library": ("library", "framework"),
    "job title": ("position", "occupation", "role"),
    "profession": ("occupation", "job"),
    "work of art": ("artwork", "creative work"),
    "creative work": ("work of art", "work"),
    "award": ("prize", "honour"),
    "quantity": ("amount", "measurement"),
    "money": ("monetary amount", "amount of money"),
    "percentage": ("percent",),
    "company": ("business", "firm", "corporation"),
    "institution": ("organisation",),
    "dish": ("food", "meal"),
    "cuisine": ("type of cuisine", "food style"),
    "restaurant name": ("restaurant",),
    "amenity": ("facility", "feature"),
    "facility": ("building", "installation"),
    "metric": ("evaluation metric", "measure"),
    "task": ("research task", "problem"),
    "method": ("technique", "approach"),
    "law": ("legislation", "legal act"),
    "game": ("video game",),
    "tourist attraction": ("sight", "landmark"),
    "government body": ("government agency", "authority"),
    "nationality": ("demonym",),
    "event": ("happening",),
}
SUPERVISED_CHINESE = {"resume": {"NAME": "人名", "ORG": "机构", "TITLE": "职位", "EDU": "学历", "CONT": "国籍",
                                 "PRO": "专业", "RACE": "民族", "LOC": "地名"},
                      "weibo": {"PER.NAM": "人名", "ORG.NAM": "机构", "LOC.NAM": "地名"}}


@dataclass(frozen=True)
class LabelInfo:
    """A raw label of a corpus: the name a query writes for it and its one-line description."""

    raw: str
    name: str
    description: str | None


@dataclass
class Source:
    """A label set annotated together: its corpus and each raw label's :class:`LabelInfo`."""

    corpus: str
    labels: dict[str, LabelInfo]


@dataclass(frozen=True)
class OpenExample:
    """A text, its spans under the names its queries write, and those names (asked in any order)."""

    example: Example
    labels: tuple[str, ...]
    corpus: str
    ar: bool = False


@dataclass
class Catalogue:
    """Every corpus's sources and labels, read from ``labels.tsv`` and ``sources.json``."""

    folder: Path
    labels: dict[str, dict[str, LabelInfo]] = field(default_factory=dict)  # corpus -> raw -> info

    @classmethod
    def read(cls, folder: str | Path) -> "Catalogue":
        folder = Path(folder)
        catalogue = cls(folder)
        with (folder / "labels.tsv").open(encoding="utf-8") as table:
            for row in csv.DictReader(table, delimiter="\t"):
                description = row["description"].strip()
                catalogue.labels.setdefault(row["corpus"], {})[row["raw_label"]] = LabelInfo(
                    row["raw_label"], row["name"].strip(), None if "?" in description or not description else _short(description))
        return catalogue

    def corpora(self) -> list[str]:
        """The corpora of ``labels.tsv`` present in the folder (a partial copy holds some)."""
        return sorted(corpus for corpus in self.labels if (self.folder / corpus / "sources.json").is_file())

    def has_train_split(self, corpus: str) -> bool:
        """Whether ``corpus`` has a train split here (several have only dev and test: never trained on)."""
        return (self.folder / corpus / "train.jsonl").is_file()

    def sources(self, corpus: str) -> dict[str, list[str]]:
        return json.loads((self.folder / corpus / "sources.json").read_text(encoding="utf-8"))

    def records(self, corpus: str, split: str) -> list[tuple[Example, str]]:
        """``(example, source)`` of every record of ``corpus``'s ``split`` (none when it lacks it)."""
        path = self.folder / corpus / f"{split}.jsonl"
        if not path.is_file():
            return []
        found = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                spans = [Span(e["start"], e["end"], e["label"]) for e in record.get("entities", [])]
                found.append((Example(record["text"], sorted(spans, key=lambda s: (s.start, s.end, s.label))), record["source"]))
        return found

    def specific_names(self) -> dict[str, list[str]]:
        """Per domain group, the names found in that group's corpora only: what a negative is drawn from."""
        group_of = {corpus: group for group, corpora in DOMAINS.items() for corpus in corpora}
        groups_of_name: dict[str, set[str]] = defaultdict(set)
        for corpus, labels in self.labels.items():
            for info in labels.values():
                groups_of_name[info.name.lower()].add(group_of.get(corpus, "general"))
        found: dict[str, list[str]] = defaultdict(list)
        for name, groups in sorted(groups_of_name.items()):
            if len(groups) == 1 and "general" not in groups:
                found[next(iter(groups))].append(name)
        return dict(found)


def _short(description: str) -> str:
    """A description cut to its first clause (labels.tsv's end in the source's citation)."""
    text = description.split(" (")[0].split("; ")[0].rstrip(".")
    return text[:100]


@dataclass(frozen=True)
class MixtureSettings:
    """How the mixture is drawn; every probability is per record (or per label, where said)."""

    records: int = 60000
    temperature: float = 0.5
    #: Fixed shares of the supervised corpora (the rest is the open corpora's).
    supervised_shares: Mapping[str, float] = field(default_factory=lambda: {"conll2003/train.txt": 0.2, "resume/train.txt": 0.12})
    keep_label_min: float = 0.5  # each record keeps each of its labels with a probability drawn from [min, 1]
    #: A label its record does not hold is kept with that probability times this: below 1 fewer
    #: questions answer 0 (four in five do at 1), against a prior that undercounts unseen names.
    absent_keep: float = 1.0
    negatives_max: int = 3
    description_rate: float = 0.1  # per label: name and description
    synonym_rate: float = 0.1  # per label: the raw label, where it reads as another name
    variant_rate: float = 0.0  # per label: another way users write its name (NAME_VARIANTS), where it has one
    chinese_names_rate: float = 0.3  # per Resume record: its Chinese names
    ar_rate: float = 0.25  # records also given the AR query with its label list
    #: Records longer than this many characters are cut into pieces of whole sentences of at most
    #: that many (None: kept whole, and the trainer leaves out those over its ``max_text_chars``,
    #: most of gum, wlp, biored, nerel_ru and chinese_literature).
    cut_chars: int | None = None
    #: Whole corpora never trained on: the zero-shot dev.
    held_out: Sequence[str] = ZERO_SHOT_CORPORA
    seed: int = 0


def raw_label_synonym(raw: str, name: str) -> str | None:
    """The raw label read as words, when it is another name than ``name`` (``Simple_chemical``; not
    a code with a dot, Weibo's ``PER.NAM``)."""
    if "." in raw:
        return None
    words = raw.replace("_", " ").replace("-", " ").strip().lower()
    return words if len(words) >= 4 and words != name.lower() and any(c.isalpha() for c in words) and not words.isupper() else None


def _written(info: LabelInfo, rng: random.Random, settings: MixtureSettings) -> str:
    roll = rng.random()
    name = info.name if rng.random() < 0.15 else info.name.lower()
    if info.description and roll < settings.description_rate:
        return f"{name} ({info.description})"
    synonym = raw_label_synonym(info.raw, info.name)
    if synonym and roll < settings.description_rate + settings.synonym_rate:
        return synonym
    variants = NAME_VARIANTS.get(info.name.lower()) if settings.variant_rate else None
    if variants and roll < settings.description_rate + settings.synonym_rate + settings.variant_rate:
        return rng.choice(variants)
    return name


def ask(example: Example, corpus: str, source_labels: Sequence[str], infos: Mapping[str, LabelInfo], negatives: Sequence[str],
        rng: random.Random, settings: MixtureSettings) -> OpenExample:
    """One record asked for a dropout of its source's labels (two raw labels written alike are one
    question) and ``negatives`` (names of other domains, count 0)."""
    keep = rng.uniform(settings.keep_label_min, 1.0)
    held = {s.label for s in example.spans}
    kept = [raw for raw in source_labels if raw in infos and rng.random() < (keep if raw in held else keep * settings.absent_keep)]
    kept = kept or [rng.choice([r for r in source_labels if r in infos])]
    written: dict[str, str] = {}
    shown_for: dict[str, str] = {}
    for raw in kept:
        shown = _written(infos[raw], rng, settings)
        key = shown.lower()
        shown_for[raw] = written.setdefault(key, shown)
    spans = sorted({Span(s.start, s.end, shown_for[s.label]) for s in example.spans if s.label in shown_for},
                   key=lambda s: (s.start, s.end, s.label))
    labels = list(dict.fromkeys(shown_for.values()))
    labels += [n for n in negatives if n.lower() not in written]
    rng.shuffle(labels)
    return OpenExample(Example(example.text, spans), tuple(labels), corpus, rng.random() < settings.ar_rate)


def _merged(example: Example, merged: Mapping[str, str]) -> Example:
    """``example`` with each span of a raw label in ``merged`` under the label it is asked as."""
    if not merged or not any(s.label in merged for s in example.spans):
        return example
    return Example(example.text, [Span(s.start, s.end, merged.get(s.label, s.label)) for s in example.spans], example.source)


def _supervised_infos(corpus: str, chinese: bool) -> dict[str, LabelInfo]:
    names = SUPERVISED_CHINESE[corpus] if chinese else SUPERVISED_NAMES[corpus]
    descriptions = {} if chinese else SUPERVISED_DESCRIPTIONS.get(corpus, {})
    return {raw: LabelInfo(raw, name, descriptions.get(raw)) for raw, name in names.items()}


def pieces_of(example: Example, labels: Sequence[str], max_chars: int | None) -> list[tuple[Example, list[str]]]:
    """``example`` with the labels it may be asked, or, when it is longer than ``max_chars``, its
    pieces of whole sentences of at most ``max_chars`` characters (``chunk_spans``, as the engine cuts
    texts), each with the entities wholly inside it; a label with an entity the cut runs through is
    not asked of that piece, where its count is unknown."""
    if max_chars is None or len(example.text) <= max_chars:
        return [(example, list(labels))]
    pieces = []
    for start, end in chunk_spans(example.text, len, max_chars):
        inside = [Span(s.start - start, s.end - start, s.label) for s in example.spans if start <= s.start and s.end <= end]
        cut = {s.label for s in example.spans if s.start < end and start < s.end and not (start <= s.start and s.end <= end)}
        pieces.append((Example(example.text[start:end], inside, example.source), [label for label in labels if label not in cut]))
    return pieces


def training_mixture(open_folder: str | Path, data_folder: str | Path, settings: MixtureSettings) -> list[OpenExample]:
    """``settings.records`` training examples: open corpora (the zero-shot ones left out) drawn by
    size to the power ``temperature``, the supervised corpora at their fixed shares."""
    rng = random.Random(settings.seed)
    catalogue = Catalogue.read(open_folder)
    specific = catalogue.specific_names()
    unknown = sorted(set(settings.held_out) - set(catalogue.labels))  # a corpus labels.tsv names, whether or not its folder is here
    if unknown:
        raise ValueError(f"held_out: no corpus {', '.join(map(repr, unknown))} in {catalogue.folder}")
    group_of = {corpus: group for group, corpora in DOMAINS.items() for corpus in corpora}
    pools: dict[str, list[tuple[Example, list[str]]]] = {}
    for corpus in catalogue.corpora():
        if corpus in settings.held_out:
            continue
        sources = catalogue.sources(corpus)
        records = [piece for example, source in catalogue.records(corpus, "train")
                   for piece in pieces_of(example, sources[source], settings.cut_chars)]
        if records:
            pools[corpus] = records
    weights = {corpus: len(records) ** settings.temperature for corpus, records in pools.items()}
    open_share = 1.0 - sum(settings.supervised_shares.values())
    total = sum(weights.values())
    found: list[OpenExample] = []
    for corpus, records in sorted(pools.items()):
        infos = catalogue.labels[corpus]
        others = [name for group, names in specific.items() if group != group_of.get(corpus, "general") for name in names]
        for _ in range(round(settings.records * open_share * weights[corpus] / total)):
            example, source_labels = rng.choice(records)
            negatives = rng.sample(others, rng.randint(0, settings.negatives_max)) if others else []
            found.append(ask(example, corpus, source_labels, infos, negatives, rng, settings))
    all_specific = [name for names in specific.values() for name in names]
    for relative, share in sorted(settings.supervised_shares.items()):
        corpus = relative.split("/")[0]
        if corpus not in SUPERVISED_NAMES:
            raise ValueError(f"supervised_shares: {relative!r} is none of the supervised corpora ({', '.join(SUPERVISED_NAMES)})")
        examples = [_merged(e, SUPERVISED_MERGED.get(corpus, {})) for e in read_corpus(str(Path(data_folder) / relative))]
        labels = sorted(SUPERVISED_NAMES[corpus])
        for _ in range(round(settings.records * share)):
            chinese = corpus in SUPERVISED_CHINESE and rng.random() < settings.chinese_names_rate
            negatives = rng.sample(all_specific, rng.randint(0, settings.negatives_max))
            found.append(ask(rng.choice(examples), corpus, labels, _supervised_infos(corpus, chinese), negatives, rng, settings))
    rng.shuffle(found)
    return found


def trained_names(open_folder: str | Path, held_out: Collection[str] = ZERO_SHOT_CORPORA) -> set[str]:
    """Every name, lower-cased, that the mixture may write a trained label as (descriptions aside):
    the plain names and raw-label synonyms of the corpora with a train split (the ``held_out`` ones
    left out), the supervised corpora's names, and :data:`NAME_VARIANTS` of them. A zero-shot label
    among them is a name the model has seen, in another domain; the rest are names it never read."""
    catalogue = Catalogue.read(open_folder)
    names = {name.lower() for table in (SUPERVISED_NAMES, SUPERVISED_CHINESE) for labels in table.values() for name in labels.values()}
    for corpus, infos in catalogue.labels.items():
        if corpus in held_out or not catalogue.has_train_split(corpus):
            continue
        names.update(written for info in infos.values() for written in (info.name.lower(), raw_label_synonym(info.raw, info.name)) if written)
    return names | {variant.lower() for name in names for variant in NAME_VARIANTS.get(name, ())}


@dataclass(frozen=True)
class ZeroShotSet:
    """One held-out corpus's records and the label names they are asked for (their source's, lower-cased)."""

    corpus: str
    split: str
    examples: list[Example]
    labels: list[str]
    #: Each name's one-line definition from labels.tsv, where it has one (what a user may add as its description).
    descriptions: dict[str, str] = field(default_factory=dict)

    def asked(self, described: bool = False, bare: Collection[str] = ()) -> list[object]:
        """The labels as a request writes them: names, or with ``described`` each name that has a
        definition, and is not among ``bare``, as ``{"name": ..., "description": ...}``."""
        return [{"name": name, "description": self.descriptions[name]} if described and name in self.descriptions and name not in bare
                else name for name in self.labels]


def zero_shot_sets(open_folder: str | Path, limit: int = 100, seed: int = 0, corpora: Sequence[str] = ZERO_SHOT_CORPORA) -> list[ZeroShotSet]:
    """A sample of ``limit`` records of each held-out corpus's dev split (test where it has none),
    spans relabelled with their lower-cased names; a corpus's records are asked every name of it
    (of a corpus of more names than one request takes, those its sample holds). Other ``corpora``
    of one source each are asked the same way: corpora trained on give the same questions on
    labels the model has seen, the yardstick of its zero-shot figures."""
    catalogue = Catalogue.read(open_folder)
    sets = []
    for corpus in [c for c in corpora if c in catalogue.corpora()]:
        split = "dev" if (catalogue.folder / corpus / "dev.jsonl").is_file() else "test"
        records = catalogue.records(corpus, split)
        random.Random(seed).shuffle(records)
        infos = catalogue.labels[corpus]
        examples = [Example(e.text, sorted({Span(s.start, s.end, infos[s.label].name.lower()) for s in e.spans if s.label in infos},
                                           key=lambda s: (s.start, s.end, s.label))) for e, _ in records[:limit]]
        labels = sorted({info.name.lower() for info in infos.values()})
        if len(labels) > MAX_OPEN_LABELS:  # more than one request may ask (slurp's 55): the names its sample holds
            labels = sorted({s.label for e in examples for s in e.spans})[:MAX_OPEN_LABELS]
            examples = [Example(e.text, [s for s in e.spans if s.label in labels]) for e in examples]
        descriptions: dict[str, str] = {}
        for info in infos.values():
            if info.description:
                descriptions.setdefault(info.name.lower(), info.description)
        sets.append(ZeroShotSet(corpus, split, examples, labels, {name: descriptions[name] for name in labels if name in descriptions}))
    return sets


def seen_corpora_problem(open_folder: str | Path, corpora: Sequence[str], held_out: Collection[str] = ZERO_SHOT_CORPORA) -> str | None:
    """Why ``corpora`` cannot be scored as seen corpora (None: they can): each must be a corpus of
    ``open_folder`` of one source (every record is asked every name of its corpus), not ``held_out``
    and with a train split."""
    if not corpora:
        return "name at least one corpus"
    catalogue = Catalogue.read(open_folder)
    for corpus in corpora:
        if corpus in held_out:
            return f"{corpus!r} is held out (never trained on): its score is a zero-shot one"
        if corpus not in catalogue.corpora():
            return f"no corpus {corpus!r} in {catalogue.folder}"
        if not catalogue.has_train_split(corpus):
            return f"{corpus!r} has no train split, so it was never trained on: its score is a zero-shot one"
        if len(catalogue.sources(corpus)) != 1:
            return f"{corpus!r} has several sources of different labels: its records cannot all be asked every name"
    return None
