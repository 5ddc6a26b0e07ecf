"""Offset alignment, overlapping spans and windowing of long texts."""

from __future__ import annotations

from ner_service.engine.chunking import chunk_spans, mostly_single_sentences, sentence_spans
from ner_service.engine.spans import Entity, Mention, align_mentions, distinct_spans, resolve_overlaps


def test_kth_mention_goes_to_next_untaken_occurrence() -> None:
    text = "Paris and Paris , then Paris"
    mentions = [Mention("LOC", "Paris", -0.1), Mention("LOC", "Paris", -0.2)]
    entities, missing = align_mentions(text, mentions)
    assert [(e.start, e.end) for e in entities] == [(0, 5), (10, 15)]
    assert missing == 0


def test_word_boundaries_are_preferred_and_missing_mentions_counted() -> None:
    text = "USA beat US"
    entities, missing = align_mentions(text, [Mention("LOC", "US", 0.0), Mention("PER", "Bob", 0.0)])
    assert [(e.start, e.end, e.text) for e in entities] == [(9, 11, "US")]
    assert missing == 1


def test_occurrence_not_reused_for_the_same_label_but_shared_across_labels() -> None:
    text = "Jordan met Jordan"
    entities, missing = align_mentions(
        text, [Mention("PER", "Jordan", -1.0), Mention("PER", "Jordan", -1.0), Mention("PER", "Jordan", -1.0), Mention("LOC", "Jordan", -0.5)]
    )
    assert missing == 1
    assert sorted((e.start, e.label) for e in entities) == [(0, "LOC"), (0, "PER"), (11, "PER")]


def test_a_mention_inside_a_longer_entity_moves_to_a_free_occurrence_of_its_text() -> None:
    """"律师" (TITLE) first occurs inside the firm (ORG) and "England" (LOC) inside the bank: each
    takes its own occurrence, which survives the overlaps; one with no other occurrence stays."""
    text = "北京市海问律师事务所律师"
    entities, _ = align_mentions(text, [Mention("TITLE", "律师", -0.1), Mention("ORG", "北京市海问律师事务所", -0.2)])
    assert sorted((e.start, e.end, e.label) for e in resolve_overlaps(entities)) == [(0, 10, "ORG"), (10, 12, "TITLE")]
    text = "the Bank of England left England"
    mentions = [Mention("LOC", "England", -0.1), Mention("ORG", "Bank of England", -0.3)]
    kept = resolve_overlaps(align_mentions(text, mentions)[0])
    assert [(text[e.start:e.end], e.label, e.start) for e in kept] == [("Bank of England", "ORG", 4), ("England", "LOC", 25)]
    text = "the Bank of England left"
    kept = resolve_overlaps(align_mentions(text, mentions)[0])
    assert [(text[e.start:e.end], e.label) for e in kept] == [("Bank of England", "ORG")]


def test_span_under_two_labels_keeps_the_more_probable() -> None:
    kept = resolve_overlaps([Entity(0, 6, "Jordan", "PER", 0.4), Entity(0, 6, "Jordan", "LOC", 0.9), Entity(11, 17, "Jordan", "PER", 0.8)])
    assert [(e.start, e.label) for e in kept] == [(0, "LOC"), (11, "PER")]


def test_a_model_with_a_shorter_span_margin_keeps_a_much_more_probable_shorter_span() -> None:
    """"生物化工专业" (PRO, 0.94) replaces "伦敦大学生物化工专业" (ORG, 0.37) for a model with a
    margin of 0.1, not for one without or at 0.6; a span of the same length never displaces; of a
    chain, the shortest that is more probable than every longer one stays."""
    text = "毕业于伦敦大学生物化工专业，获学士学位。"
    found = [Entity(3, 13, "伦敦大学生物化工专业", "ORG", 0.37), Entity(7, 13, "生物化工专业", "PRO", 0.94),
             Entity(15, 17, "学士", "EDU", 0.9), Entity(15, 17, "学士", "TITLE", 0.3)]

    def labels(kept: list[Entity]) -> list[tuple[str, str]]:
        return [(text[e.start:e.end], e.label) for e in kept]

    assert labels(resolve_overlaps(found, 0.1)) == [("生物化工专业", "PRO"), ("学士", "EDU")]
    assert labels(resolve_overlaps(found)) == labels(resolve_overlaps(found, 0.6)) == [("伦敦大学生物化工专业", "ORG"), ("学士", "EDU")]
    text = "兰州大学经济系硕士毕业"
    chain = [Entity(0, 7, "兰州大学经济系", "ORG", 0.41), Entity(4, 9, "经济系硕士", "TITLE", 0.66), Entity(7, 9, "硕士", "EDU", 0.97)]
    assert labels(resolve_overlaps(chain, 0.1)) == [("硕士", "EDU")]


def test_overlapping_spans_keep_the_longer() -> None:
    """"Merkel" found only inside "Angela Merkel" repeats it; "England" inside "Bank of England"
    too, however probable; a span that only touches another stays."""
    text = "Angela Merkel at the Bank of England , Paris"
    kept = resolve_overlaps([Entity(0, 13, "Angela Merkel", "PER", 0.6), Entity(7, 13, "Merkel", "PER", 0.9),
                             Entity(21, 36, "Bank of England", "ORG", 0.5), Entity(29, 36, "England", "LOC", 0.99),
                             Entity(13, 16, " at", "MISC", 0.1)])
    assert [(text[e.start:e.end], e.label) for e in kept] == [("Angela Merkel", "PER"), (" at", "MISC"), ("Bank of England", "ORG")]


def test_chunks_respect_the_budget_and_keep_offsets() -> None:
    text = "First sentence here. Second one is longer than that! Third.\nAnd a fourth line"
    count = lambda s: len(s.split())  # noqa: E731
    chunks = chunk_spans(text, count, 6)
    assert all(count(text[s:e]) <= 6 for s, e in chunks)
    assert " ".join(text[s:e] for s, e in chunks).split() == text.split()
    unspaced = "中" * 50
    pieces = chunk_spans(unspaced, len, 8)
    assert "".join(unspaced[s:e] for s, e in pieces) == unspaced and all(e - s <= 8 for s, e in pieces)


def test_packed_windows_cut_where_sentences_end_else_between_words() -> None:
    """Packing cuts where one-sentence windows would, never after "U.S." or inside "3.5"."""
    text = "The U.S. Army said costs rose 3.5 percent. Officials in Washington agreed."
    count = lambda s: len(s.split())  # noqa: E731
    roomy = [text[s:e] for s, e in chunk_spans(text, count, 9)]
    assert roomy == ["The U.S. Army said costs rose 3.5 percent.", "Officials in Washington agreed."]
    tight = [text[s:e] for s, e in chunk_spans(text, count, 5)]
    assert all(count(window) <= 5 and set(window.split()) <= set(text.split()) for window in tight)
    assert " ".join(tight) == text


def test_sentences_end_at_stops_but_not_after_abbreviations_initials_or_list_numbers() -> None:
    text = 'Mr. Smith went to the U.S. on Monday. He met J. Doe there! "Great," he said. 2. England 8.61\nBRUSSELS 1996-08-22 Somerset 4 . Kent 108-3 .'
    assert [text[s:e].strip() for s, e in sentence_spans(text)] == [
        "Mr. Smith went to the U.S. on Monday.", "He met J. Doe there!", '"Great," he said.', "2. England 8.61", "BRUSSELS 1996-08-22 Somerset 4 .", "Kent 108-3 ."]
    chinese = "张三毕业于北京大学。现任华为公司工程师！他说：“好。”然后走了；"
    assert [chinese[s:e] for s, e in sentence_spans(chinese)] == ["张三毕业于北京大学。", "现任华为公司工程师！", "他说：“好。”", "然后走了；"]
    assert "".join(text[s:e] for s, e in sentence_spans(text)) == text  # the spans tile the text


def test_a_model_of_single_sentences_reads_one_sentence_per_window() -> None:
    text = "EU rejects German call . Peter Blackburn\nThe Commission said on Thursday it disagreed ."
    count = lambda s: len(s.split())  # noqa: E731
    packed = chunk_spans(text, count, 40)
    alone = chunk_spans(text, count, 40, one_sentence=True)
    assert [text[s:e] for s, e in packed] == [text]
    assert [text[s:e] for s, e in alone] == ["EU rejects German call .", "Peter Blackburn", "The Commission said on Thursday it disagreed ."]
    assert mostly_single_sentences(["One sentence .", "Another one"]) and not mostly_single_sentences(["One . Two .", "Three"])


def test_conll_documents_join_their_sentences_and_move_the_spans(tmp_path) -> None:
    from corpora import read_conll_documents

    path = tmp_path / "docs.txt"
    path.write_text("-DOCSTART- -X- O O\n\nEU I-ORG\nrejects O\n\nPeter I-PER\nBlackburn I-PER\n\n"
                    "-DOCSTART- -X- O O\n\nParis I-LOC\nsaid O\n\n", encoding="utf-8")
    first, second = read_conll_documents(path, " ")
    assert first.text == "EU rejects Peter Blackburn" and second.text == "Paris said"
    assert [(first.text[s.start:s.end], s.label) for s in first.spans] == [("EU", "ORG"), ("Peter Blackburn", "PER")]
    assert read_conll_documents(path)[0].text == "EU rejects\nPeter Blackburn"


def test_a_long_sentence_is_cut_into_windows_of_words_at_clause_marks() -> None:
    """A sentence longer than the budget is read in windows of several words, not a word at a
    time, each ending at a comma, colon or bracket where one lies in its second half."""
    text = ("London ( The Oval ) : Warwickshire 195 , Surrey 429-7 ( C. Lewis 80 not out , M. Butcher 70 , "
            "G. Kersey 63 ) Hove : Sussex 363 ( W. Athey 111 , V. Drakes 52 ; I. Austin 4-37 ) , Lancashire 197-8")
    count = lambda s: len(s.split())  # noqa: E731
    windows = [text[s:e] for s, e in chunk_spans(text, count, 16, one_sentence=True)]
    assert windows == ["London ( The Oval ) : Warwickshire 195 ,", "Surrey 429-7 ( C. Lewis 80 not out , M. Butcher 70 ,",
                       "G. Kersey 63 ) Hove : Sussex 363 ( W. Athey 111 ,", "V. Drakes 52 ; I. Austin 4-37 ) , Lancashire 197-8"]
    assert all(count(w) <= 16 for w in windows) and " ".join(windows) == text
    chinese = "1994年3月至今任北京大学教授，兼任中国科学院研究员、清华大学客座教授，曾任华为技术有限公司高级工程师"
    assert [chinese[s:e] for s, e in chunk_spans(chinese, len, 20, one_sentence=True)] == [
        "1994年3月至今任北京大学教授，", "兼任中国科学院研究员、清华大学客座教授，", "曾任华为技术有限公司高级工程师"]


def test_with_overlaps_kept_spans_nest_one_span_takes_several_labels_and_each_comes_once() -> None:
    """``flat_ner`` off: what :func:`resolve_overlaps` would drop stays; a (span, label) found twice
    (two windows) comes once, at its higher score."""
    text = "the Bank of England , England"
    found = [Entity(4, 19, "Bank of England", "ORG", 0.5), Entity(12, 19, "England", "LOC", 0.4),
             Entity(22, 29, "England", "LOC", 0.9), Entity(22, 29, "England", "GPE", 0.3), Entity(22, 29, "England", "LOC", 0.7)]
    kept = distinct_spans(found)
    assert [(text[e.start:e.end], e.start, e.label, e.score) for e in kept] == [
        ("Bank of England", 4, "ORG", 0.5), ("England", 12, "LOC", 0.4), ("England", 22, "GPE", 0.3), ("England", 22, "LOC", 0.9)]
    assert [(e.start, e.label) for e in resolve_overlaps(found)] == [(4, "ORG"), (22, "LOC")]


def test_a_mention_inside_a_longer_entity_moves_to_its_free_occurrence_else_stays_nested() -> None:
    text = "He flew to New York to watch the New York Yankees ."
    entities, missing = align_mentions(text, [Mention("LOC", "New York", -0.1), Mention("ORG", "New York Yankees", -0.1)])
    assert missing == 0 and [(e.start, e.label) for e in entities] == [(11, "LOC"), (33, "ORG")]
    nested, _ = align_mentions("the New York Yankees won", [Mention("LOC", "New York", -0.1), Mention("ORG", "New York Yankees", -0.1)])
    assert [(e.start, e.end, e.label) for e in nested] == [(4, 12, "LOC"), (4, 20, "ORG")]
