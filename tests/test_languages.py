"""Every language in the open-data n-gram methods: NFKC, diacritic folding, scripts without spaces,
and the C-Eval adapter (rows written here: no hub on this machine). Pure Python, no Ray, no model."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
import yaml

from contamray.benchmarks import load_records
from contamray.methods.base import get_method
from contamray.methods.open import exact_match as em
from contamray.methods.open import ngram_overlap as ngo
from contamray.metrics import ngrams as ng
from contamray.records import Record

CONF = Path(__file__).resolve().parents[1] / "conf" / "method"

CAFE_NFC = "caf\u00e9"
CAFE_NFD = "cafe\u0301"
CAFE_WIDE = "\uff43\uff41\uff46\uff45"  # ｃａｆｅ


def _fast_words(text: str, style: str) -> list[str]:
    return [w.decode("utf-8", "surrogatepass") for w in ng._word_bytes(text, style)]


# --------------------------------------------------------------------------- normalisation


def test_nfc_nfd_and_full_width_hash_alike():
    assert unicodedata.normalize("NFD", CAFE_NFC) == CAFE_NFD != CAFE_NFC
    for style in ng.STYLES:
        assert ng.word_hashes(CAFE_NFC, style).tolist() == ng.word_hashes(CAFE_NFD, style).tolist()
        assert ng.word_hashes(CAFE_WIDE, style).tolist() == ng.word_hashes("CAFE", style).tolist()
        assert (
            ng.word_hashes("\uff34\uff23\uff30\uff0d\uff14", style).tolist() == ng.word_hashes("TCP-4", style).tolist()
        )
    # folding (off by default, as the papers keep accented letters) makes all four one word
    folded = {tuple(ng.word_hashes(t, "gpt3+fold").tolist()) for t in (CAFE_NFC, CAFE_NFD, CAFE_WIDE, "cafe")}
    assert folded == {(ng.word_hash(b"cafe"),)}
    assert ng.words(CAFE_NFD, "gpt3") == [CAFE_NFC] and ng.words(CAFE_NFD, "gpt2") == [CAFE_NFC]
    assert ng.word_hashes(CAFE_NFC).tolist() != ng.word_hashes("cafe").tolist()
    assert ng.style_name("gpt2", True) == "gpt2+fold" and ng.style_name("gpt3") == "gpt3"
    with pytest.raises(ValueError, match="unknown normalization 'gpt3\\+fold\\+fold'"):
        ng.style_name("gpt3+fold", True)


def test_compatibility_characters_and_capitals_from_nfkc():
    # ligature, fraction, ellipsis, script capital, Kelvin sign, superscript
    assert ng.words("\ufb01ne \u00bd\u2026 \u210cello \u212a x\u00b2") == ["fine", "12", "hello", "k", "x2"]
    assert ng.words("\u00bd", "gpt2") == ["1", "2"]


def test_combining_marks_stay_inside_their_word():
    hindi = "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e"  # हिन्दी भाषा
    for style in ("gpt3", "gpt2"):
        assert ng.words(hindi, style) == hindi.split()
    # folding deletes the non-spacing marks (virama, ...) and keeps the spacing vowel signs
    assert ng.words(hindi, "gpt3+fold") == ["\u0939\u093f\u0928\u0926\u0940", "\u092d\u093e\u0937\u093e"]
    assert ng.words("Vi\u1ec7t Nam", "gpt2+fold") == ["viet", "nam"]


def test_scripts_without_spaces_are_a_word_per_character():
    assert ng.words("GPT-4在中文上", "gpt2") == ["gpt", "4", "在", "中", "文", "上"]
    assert ng.words("GPT-4在中文上", "gpt3") == ["gpt4", "在", "中", "文", "上"]
    assert ng.words("日本語、かなカナ。", "gpt3") == ["日", "本", "語", "か", "な", "カ", "ナ"]
    # half-width katakana with its voicing mark: NFKC makes one full-width letter
    assert ng.words("\uff8a\uff9f", "gpt3") == ["\u30d1"]
    # Thai: a letter keeps the vowel and tone marks that follow it
    assert ng.words("\u0e2b\u0e34\u0e19 \u0e44\u0e17\u0e22") == ["\u0e2b\u0e34", "\u0e19", "\u0e44", "\u0e17", "\u0e22"]
    # Hangul is written with spaces: words as they are
    assert ng.words("한국어 문장입니다") == ["한국어", "문장입니다"]


@pytest.mark.parametrize("style", ng.STYLES)
def test_fast_path_equals_the_reference_in_every_script(style: str):
    texts = [
        "计算机网络（Computer Network）中，ＴＣＰ协议工作在传输层。",
        "「東京」はｶﾀｶﾅで書けます…ﾊﾟﾝ!",
        "ภาษาไทย-ั ไม่มีช่องว่าง, ພາສາລາວ ភាសាខ្មែរ မြန်မာဘာသာ",
        "Ça coûte 3,50 € — naïve CAFÉ\u0301 résumé\u00a0x",
        "हिन्दी, العَرَبِيَّة, עִבְרִית, Tiếng Việt, ᄒ\u1161\u11ab",
        "\U00020000\U0002a6d6 〇々 \u2f00 \uf900 ℌ ﬁ ½ x² \ud800",
    ]
    for text in texts:
        assert _fast_words(text, style) == ng.words(text, style), text
    batch = ng.TokenBatch(texts, style)
    for d, text in enumerate(texts):
        assert batch.hashes[d].tolist() == ng.word_hashes(text, style).tolist()
        assert [w.decode("utf-8", "surrogatepass") for w in batch.words[d]] == ng.words(text, style)


# --------------------------------------------------------------------------- a Chinese benchmark item in a corpus

QUESTION = "在计算机网络中，TCP协议工作在OSI参考模型的哪一层？"
LABEL = "传输层"
# the words: 7 characters, "tcp", 5 characters, "osi", 8 characters; then the label's 3
QUESTION_WORDS = 22
FILLER = "以下是一些练习题。"  # 8 words: the punctuation goes
OTHER = "下列哪种排序算法在最坏情况下的时间复杂度是O(n log n)？"


def _config(name: str, **overrides) -> ngo.NGramOverlapConfig:
    params = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    assert params.pop("method") == "ngram_overlap"
    return get_method("ngram_overlap").make_config({**params, **overrides})


def _records() -> list[Record]:
    def rec(rid: str, question: str, label: str) -> Record:
        return Record(
            id=rid, partition="ceval/computer_network/val", input=question, label=label, reference=question,
            task="multiple_choice",
        )  # fmt: skip

    return [rec("planted", QUESTION, LABEL), rec("unplanted", OTHER, "堆排序")]


def _corpus() -> list[dict[str, str]]:
    # the planted copy: full-width Latin letters, ASCII punctuation instead of full-width
    planted = FILLER + "在计算机网络中,ＴＣＰ协议工作在ＯＳＩ参考模型的哪一层?" + LABEL + "。后面还有别的内容。"
    unrelated = "时间复杂度是算法分析中的一个重要概念，排序算法有很多种，例如冒泡排序和快速排序。"
    return [{"doc_id": "d0", "text": unrelated}, {"doc_id": "d1", "text": planted}]


@pytest.mark.parametrize("name", ["gpt3_13gram", "ngram13", "gpt2_8gram"])
def test_planted_chinese_item_found_and_unplanted_not(name: str):
    method = get_method("ngram_overlap")
    cfg = _config(name)
    records = _records()
    index = method.build_index(records, cfg)
    matches = method.match(_corpus(), index, cfg)
    rows = {r["record_id"]: r for r in method.score(records, matches, cfg)}
    found, clean = rows["planted"], rows["unplanted"]
    assert found["status"] == ngo.STATUS_NGRAMS and found["n_words"] == QUESTION_WORDS + 3
    assert found["contaminated"] and found["contamination_type"] == "input_and_label"
    assert found["fraction_matched"] == 1.0 and found["doc_ids"] == ["d1"]
    # the evidence span: word offsets of the normalised document, the item after the 8 filler words
    assert found["spans"] == [{"doc_id": "d1", "start": 8, "end": 8 + QUESTION_WORDS + 3, "unit": "word"}]
    assert not clean["contaminated"] and clean["status"] == ngo.STATUS_NGRAMS and clean["matched_total"] == 0
    verdict = method.reduce(method.score(records, matches, cfg), cfg)
    assert verdict.rate == 0.5 and verdict.details["n_too_short"] == 0


def test_chinese_item_is_no_longer_too_short():
    cfg = _config("gpt3_13gram")
    grams = ngo.example_grams(_records()[0], cfg)
    assert (grams.status, grams.n_words) == (ngo.STATUS_NGRAMS, QUESTION_WORDS + 3)
    # what whitespace splitting made of it: one "word"
    assert len(QUESTION.split()) == 1


def test_exact_match_finds_the_chinese_input():
    cfg = em.ExactMatchConfig()
    records = _records()
    index = em.build_index(records, cfg)
    rows = {r["record_id"]: r for r in em.score(records, em.match(_corpus(), index, cfg), cfg)}
    assert rows["planted"]["contaminated"] and rows["planted"]["contamination_type"] == "input_and_label"
    assert not rows["unplanted"]["contaminated"]


def test_fold_diacritics_is_a_config_knob():
    record = Record(
        id="fr", partition="p", input="Le café de la gare est ouvert tous les jours de la semaine à Paris",
        label="oui", reference="", task="question_answering",
    )  # fmt: skip
    doc = [{"doc_id": "d", "text": "le cafe de la gare est ouvert tous les jours de la semaine a paris oui"}]
    plain = ngo.NGramOverlapConfig()
    folded = _config("gpt3_13gram", fold_diacritics=True)
    for cfg, expected in ((plain, False), (folded, True)):
        index = ngo.build_index([record], cfg)
        assert ngo.score([record], ngo.match(doc, index, cfg), cfg)[0]["contaminated"] is expected
    with pytest.raises(ValueError, match="rebuild the index"):
        ngo.match(doc, ngo.build_index([record], folded), plain)
    with pytest.raises(ValueError, match="fold_diacritics"):
        ngo.NGramOverlapConfig(fold_diacritics="yes")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the C-Eval adapter


def _row(i: int, answer: str | None = "B", **fields: str) -> dict:
    row = {
        "id": i,
        "question": QUESTION,
        "A": "网络层",
        "B": "传输层",
        "C": "会话层",
        "D": "数据链路层",
        "explanation": "",
    }
    if answer is not None:
        row["answer"] = answer
    return {**row, **fields}


def _write(folder: Path, split: str, rows: list[dict]) -> Path:
    path = folder / "ceval" / "ceval-exam" / "computer_network" / f"{split}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_ceval_rows_become_multiple_choice_records(tmp_path: Path):
    rows = [_row(0), _row(1, "d", explanation="解析：……"), _row(2, None), _row(3, "E"), _row(4, C="  ")]
    path = _write(tmp_path, "val", rows)
    result = load_records("ceval", config="computer_network", split="val", mirror_dir=tmp_path, strict=False)
    assert result.partition == "ceval/computer_network/val" and result.source == str(path)
    first, second = result.records
    assert (first.id, first.label, first.answer) == ("ceval/computer_network/val#0", LABEL, "B")
    assert first.choices == ("网络层", "传输层", "会话层", "数据链路层") and first.task == "multiple_choice"
    assert first.input == QUESTION and first.verbalized == f"{QUESTION} {LABEL}"
    assert first.meta["subject"] == "computer_network" and "explanation" not in first.meta
    assert (second.label, second.answer, second.meta["explanation"]) == ("数据链路层", "D", "解析：……")
    failures = [(f.row_index, f.row_id, f.field) for f in result.failures]
    assert failures == [
        (2, "ceval/computer_network/val#2", "answer"),
        (3, "ceval/computer_network/val#3", "answer"),
        (4, "ceval/computer_network/val#4", "C"),
    ]
    messages = [f.message for f in result.failures]
    assert "row 2" in messages[0] and "is missing" in messages[0]
    assert "'E'" in messages[1] and "A, B, C, D" in messages[1] and "is empty" in messages[2]
    assert all(str(path) in m and "ceval/ceval-exam" in m for m in messages)


def test_ceval_test_split_has_no_answers(tmp_path: Path):
    _write(tmp_path, "test", [_row(0, ""), _row(1, None)])
    records = load_records("ceval", config="computer_network", split="test", mirror_dir=tmp_path).records
    assert [(r.label, r.answer) for r in records] == [("", ""), ("", "")]
    with pytest.raises(ValueError, match="no config 'all'.*accountant"):
        load_records("ceval", config="all", mirror_dir=tmp_path)
