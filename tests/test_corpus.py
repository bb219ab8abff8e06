"""Corpus readers: formats, compression, stable ids, bad rows, paths; Ray Data and plain Python agree.

Documents are AG News texts from the benchmark mirror written to a temporary directory in each
format, so every expected id and text is known.
"""

from __future__ import annotations

import bz2
import gzip
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import zstandard

from contamray.corpus import detect_format, iter_documents, read_corpus, readers, resolve_paths

AG_NEWS = "fancyzhx/ag_news/default/test.jsonl"


@pytest.fixture(scope="module")
def texts(mirror_dir: Path) -> list[str]:
    with open(mirror_dir / AG_NEWS, encoding="utf-8") as f:
        return [json.loads(line)["text"] for _, line in zip(range(2600), f)]


def write_jsonl(path: Path, rows: list, opener=open) -> None:
    with opener(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")


@pytest.fixture(scope="module")
def corpus(texts: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mixed directory: every format, compressions, one bad line and one row without text."""
    root = tmp_path_factory.mktemp("mixed")
    write_jsonl(root / "a.jsonl", [{"text": texts[0]}, "{not json", {"title": "no text"}, {"text": texts[1]}])
    write_jsonl(root / "b.jsonl.gz", [{"text": t} for t in texts[2:5]], opener=gzip.open)
    (root / "c.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(
            "".join(json.dumps({"text": t}) + "\n" for t in texts[5:7]).encode()
        )
    )
    write_jsonl(root / "d.ndjson.bz2", [{"text": texts[7]}], opener=bz2.open)
    pq.write_table(pa.table({"text": [texts[8], None, texts[9]]}), root / "e.parquet")
    (root / "sub").mkdir()
    (root / "sub" / "f.txt").write_text(texts[10] + "\n" + texts[11], encoding="utf-8")
    (root / "sub" / ".hidden.jsonl").write_text(json.dumps({"text": "hidden"}) + "\n")
    (root / "_SUCCESS").write_text("")
    return root


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_every_format_with_stable_ids(corpus: Path, texts: list[str]):
    docs = list(iter_documents(corpus))
    root = str(corpus)
    assert [(d["doc_id"], d["text"]) for d in docs] == [
        (f"{root}/a.jsonl:1", texts[0]),
        (f"{root}/a.jsonl:4", texts[1]),  # lines 2 (not JSON) and 3 (no text) skipped
        (f"{root}/b.jsonl.gz:1", texts[2]),
        (f"{root}/b.jsonl.gz:2", texts[3]),
        (f"{root}/b.jsonl.gz:3", texts[4]),
        (f"{root}/c.jsonl.zst:1", texts[5]),
        (f"{root}/c.jsonl.zst:2", texts[6]),
        (f"{root}/d.ndjson.bz2:1", texts[7]),
        (f"{root}/e.parquet:0", texts[8]),  # row 1 is null: skipped
        (f"{root}/e.parquet:2", texts[9]),
        (f"{root}/sub/f.txt", texts[10] + "\n" + texts[11]),  # hidden and _ files skipped
    ]


def test_text_per_line_and_id_field(tmp_path: Path, texts: list[str]):
    (tmp_path / "lines.txt").write_text(f"{texts[0]}\n\n{texts[1]}\r\n", encoding="utf-8")
    docs = list(iter_documents(tmp_path / "lines.txt", text_mode="line"))
    assert docs == [
        {"doc_id": f"{tmp_path}/lines.txt:1", "text": texts[0]},
        {"doc_id": f"{tmp_path}/lines.txt:3", "text": texts[1]},
    ]
    write_jsonl(tmp_path / "ids.jsonl", [{"id": 7, "text": "a"}, {"text": "b"}, {"id": "x", "text": "c"}])
    assert [d["doc_id"] for d in iter_documents(tmp_path / "ids.jsonl", id_field="id")] == [
        "7",
        f"{tmp_path}/ids.jsonl:2",  # no id in the row: the path:line id
        "x",
    ]
    pq.write_table(pa.table({"body": ["p", "q"], "key": ["k1", "k2"]}), tmp_path / "t.parquet")
    got = list(iter_documents(tmp_path / "t.parquet", text_field="body", id_field="key"))
    assert got == [{"doc_id": "k1", "text": "p"}, {"doc_id": "k2", "text": "q"}]


def test_bad_rows_are_reported_skipped_kept_or_raised(corpus: Path, caplog: pytest.LogCaptureFixture):
    path = corpus / "a.jsonl"
    with caplog.at_level(logging.WARNING, logger="contamray.corpus.readers"):
        assert len(list(iter_documents(path))) == 2
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"{path}:2: not a JSON line" in m for m in messages)
    assert any(f"{path}:3: no field 'text' (fields: title)" in m and "set text_field" in m for m in messages)
    kept = list(iter_documents(path, errors="keep"))
    assert [(d["doc_id"], d["text"] == "", bool(d["error"])) for d in kept] == [
        (f"{path}:1", False, False),
        (f"{path}:2", True, True),
        (f"{path}:3", True, True),
        (f"{path}:4", False, False),
    ]
    with pytest.raises(ValueError, match=rf"{path}:2: not a JSON line"):
        list(iter_documents(path, errors="raise"))
    with pytest.raises(ValueError, match=r"e.parquet:1: column 'text' is null"):
        list(iter_documents(corpus / "e.parquet", errors="raise"))


def test_wrong_text_field_and_bad_encoding_are_named(corpus: Path, tmp_path: Path):
    with pytest.raises(ValueError, match=r"e.parquet: no column 'content' \(columns: text\)"):
        list(iter_documents(corpus / "e.parquet", text_field="content", errors="raise"))
    (tmp_path / "bad.txt").write_bytes(b"good line\n\xff\xfe broken\nlast line\n")
    docs = list(iter_documents(tmp_path / "bad.txt", text_mode="line", errors="keep"))
    assert [d["doc_id"].rsplit(":", 1)[1] for d in docs] == ["1", "2", "3"]
    assert "not valid utf-8" in docs[1]["error"] and docs[2]["text"] == "last line"


def test_lone_surrogates_become_replacement_characters(tmp_path: Path, ray_local):
    # valid JSON (an escaped lone surrogate), but not encodable in UTF-8 or Arrow
    (tmp_path / "s.jsonl").write_text('{"text": "caf\\ud800 au lait", "id": "x\\udfff"}\n', encoding="utf-8")
    want = [{"doc_id": "x\ufffd", "text": "caf\ufffd au lait"}]
    assert list(iter_documents(tmp_path / "s.jsonl", id_field="id")) == want
    assert read_corpus(str(tmp_path / "s.jsonl"), id_field="id").take_all() == want


def test_lines_split_across_read_chunks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, texts: list[str]):
    write_jsonl(tmp_path / "x.jsonl", [{"text": t} for t in texts[:50]])
    whole = list(iter_documents(tmp_path / "x.jsonl"))
    monkeypatch.setattr(readers, "_READ_CHUNK", 7)
    assert list(iter_documents(tmp_path / "x.jsonl")) == whole
    assert [d["text"] for d in whole] == texts[:50]


def test_paths_globs_uris_and_filesystems(corpus: Path):
    root = str(corpus)
    files = resolve_paths(corpus).paths
    assert files == sorted(files) and not any("hidden" in f or "_SUCCESS" in f for f in files)
    assert resolve_paths(f"{root}/*.jsonl*").paths == [
        f"{root}/a.jsonl",
        f"{root}/b.jsonl.gz",
        f"{root}/c.jsonl.zst",
    ]
    assert resolve_paths(f"{root}/**/*.txt").paths == [f"{root}/sub/f.txt"]
    assert resolve_paths(f"file://{root}/a.jsonl").paths == [f"{root}/a.jsonl"]
    want = list(iter_documents(corpus / "a.jsonl"))
    assert list(iter_documents(f"{root}/a.jsonl", filesystem=pafs.LocalFileSystem())) == want
    fsspec = pytest.importorskip("fsspec")
    assert list(iter_documents(f"{root}/a.jsonl", filesystem=fsspec.filesystem("file"))) == want
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_paths(f"{root}/nope.jsonl")
    with pytest.raises(FileNotFoundError, match="matches no file"):
        resolve_paths(f"{root}/*.csv")


def test_format_detection_and_option_errors(corpus: Path, tmp_path: Path):
    assert [detect_format(p) for p in ("a.jsonl", "a.JSON.gz", "a.parquet", "b.txt.zst")] == [
        "jsonl", "jsonl", "parquet", "text",
    ]  # fmt: skip
    (tmp_path / "data.csv").write_text("text\nhello\n")
    with pytest.raises(ValueError, match=r"data.csv.*pass format="):
        list(iter_documents(tmp_path / "data.csv"))
    assert list(iter_documents(tmp_path / "data.csv", format="text", text_mode="line"))[1]["text"] == "hello"
    with pytest.raises(ValueError, match="format 'csv' is unknown"):
        list(iter_documents(corpus, format="csv"))
    with pytest.raises(ValueError, match="errors 'ignore' is unknown"):
        list(iter_documents(corpus, errors="ignore"))


def test_ray_reader_equals_plain_reader(corpus: Path, tmp_path: Path, texts: list[str], ray_local):
    ray_rows = read_corpus(str(corpus)).take_all()
    assert sorted((r["doc_id"], r["text"]) for r in ray_rows) == sorted(
        (d["doc_id"], d["text"]) for d in iter_documents(corpus)
    )
    kept = read_corpus(str(corpus / "a.jsonl"), errors="keep").take_all()
    assert sorted(r["doc_id"].rsplit(":", 1)[1] for r in kept if r["error"]) == ["2", "3"]
    # a file bigger than one block, text per line, read by several tasks together with a glob
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "1.txt").write_text("\n".join(texts[:2500]), encoding="utf-8")
    (tmp_path / "big" / "2.txt").write_text("\n".join(texts[2500:]), encoding="utf-8")
    dataset = read_corpus(f"{tmp_path}/big/*.txt", text_mode="line")
    rows = dataset.take_all()
    assert len(rows) == len(texts) and set(dataset.schema().names) == {"doc_id", "text"}
    by_id = {r["doc_id"]: r["text"] for r in rows}
    assert by_id[f"{tmp_path}/big/1.txt:2500"] == texts[2499]
    assert by_id[f"{tmp_path}/big/2.txt:1"] == texts[2500]
