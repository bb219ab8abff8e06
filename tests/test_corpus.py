"""Corpus readers: formats, compression, stable ids, bad rows, paths; Ray Data and plain Python agree.

Documents are AG News texts from the benchmark mirror written to a temporary directory in each
format, so every expected id and text is known.
"""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import os
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


# --------------------------------------------------------------------------- broken files, hub streams


def _broken_files(root: Path, texts: list[str]) -> None:
    """Compressed jsonl files cut short, and a parquet file that is not one.

    The .gz file breaks inside its 4th line, right after a flush point. zstd and bz2 decode whole
    blocks (128 KiB; 100 KiB at bz2 level 1), so their files hold all 2600 texts (~650 KB) and are cut
    halfway: the lines of the complete blocks survive.
    """
    import bz2 as bz2mod
    import zlib

    lines = [json.dumps({"text": t}).encode() + b"\n" for t in texts]
    gz = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = gz.compress(b"".join(lines[:3])) + gz.flush(zlib.Z_FULL_FLUSH)
    rest = gz.compress(b"".join(lines[3:40])) + gz.flush()
    (root / "cut.jsonl.gz").write_bytes(head + rest[:40])
    zst = zstandard.ZstdCompressor().compress(b"".join(lines))
    (root / "cut.jsonl.zst").write_bytes(zst[: len(zst) // 2])
    bz = bz2mod.compress(b"".join(lines), compresslevel=1)
    (root / "cut.jsonl.bz2").write_bytes(bz[: len(bz) // 2])
    (root / "cut.parquet").write_bytes(b"PAR1 this is not a parquet file")


def test_truncated_and_corrupt_files_keep_what_precedes_the_break(
    tmp_path: Path, texts: list[str], caplog: pytest.LogCaptureFixture, ray_local
):
    _broken_files(tmp_path, texts)
    (tmp_path / "good.jsonl").write_text(json.dumps({"text": texts[50]}) + "\n")
    with caplog.at_level(logging.WARNING, logger="contamray.corpus.readers"):
        docs = list(iter_documents(tmp_path))
    by_file: dict[str, list[str]] = {}
    for d in docs:
        name, line = d["doc_id"].rsplit(":", 1)
        by_file.setdefault(Path(name).name, []).append(line)
    # gzip: the three lines before the flush point, exactly; zstd and bz2: a prefix, in order
    assert by_file["cut.jsonl.gz"] == ["1", "2", "3"]
    for name in ("cut.jsonl.zst", "cut.jsonl.bz2"):
        got = by_file[name]
        assert 100 < len(got) < len(texts) and got == [str(i) for i in range(1, len(got) + 1)], name
    assert by_file["good.jsonl"] == ["1"] and "cut.parquet" not in by_file
    assert [d["text"] for d in docs if "cut.jsonl.gz" in d["doc_id"]] == texts[:3]
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        f"{tmp_path}/cut.jsonl.gz:4: the file is truncated or corrupt after line 3" in m for m in messages
    )
    for name in ("cut.jsonl.zst", "cut.jsonl.bz2"):
        n = len(by_file[name])
        assert any(f"{tmp_path}/{name}:{n + 1}: the file is truncated" in m for m in messages), name
    assert any(f"{tmp_path}/cut.parquet: not a readable parquet file" in m for m in messages)
    # Ray Data reads the same documents, and the run goes on past every broken file
    assert sorted((r["doc_id"], r["text"]) for r in read_corpus(str(tmp_path)).take_all()) == sorted(
        (d["doc_id"], d["text"]) for d in docs
    )
    with pytest.raises(ValueError, match=r"cut.jsonl.gz:4: the file is truncated"):
        list(iter_documents(tmp_path / "cut.jsonl.gz", errors="raise"))


def test_invalid_utf8_and_concatenated_gzip_members(tmp_path: Path, texts: list[str], caplog):
    (tmp_path / "bad.jsonl").write_bytes(
        json.dumps({"text": texts[0]}).encode()
        + b"\n"
        + b'{"text": "caf\xe9"}\n'
        + json.dumps({"text": texts[1]}).encode()
    )
    with caplog.at_level(logging.WARNING, logger="contamray.corpus.readers"):
        docs = list(iter_documents(tmp_path / "bad.jsonl"))
    assert [d["text"] for d in docs] == texts[:2]
    assert any(f"{tmp_path}/bad.jsonl:2: not valid UTF-8" in r.getMessage() for r in caplog.records)
    members = gzip.compress(json.dumps({"text": texts[2]}).encode() + b"\n") + gzip.compress(
        json.dumps({"text": texts[3]}).encode() + b"\n"
    )
    (tmp_path / "two.jsonl.gz").write_bytes(members)
    assert [d["text"] for d in iter_documents(tmp_path / "two.jsonl.gz")] == texts[2:4]


def test_hub_datasets_stream_with_ids_and_bad_rows(tmp_path: Path, texts: list[str], caplog, ray_local):
    """A hub URI streams through ``datasets`` (here its packaged ``json`` builder on local files)."""
    from contamray.corpus import HubSource, parse_hub_uri

    write_jsonl(
        tmp_path / "h1.jsonl", [{"text": texts[0], "id": "a"}, {"title": "x"}, {"text": texts[1], "id": "b"}]
    )
    write_jsonl(tmp_path / "h2.jsonl", [{"text": texts[2], "id": "c"}])
    uri = f"hub://json?split=train&data_files={tmp_path}/h1.jsonl,{tmp_path}/h2.jsonl"
    assert parse_hub_uri(uri) == HubSource(
        "json", None, "train", (f"{tmp_path}/h1.jsonl", f"{tmp_path}/h2.jsonl"), None
    )
    with caplog.at_level(logging.WARNING, logger="contamray.corpus.readers"):
        docs = list(iter_documents(uri))
    assert [d["text"] for d in docs] == texts[:3]
    assert [d["doc_id"] for d in docs] == [
        "hub://json/default/train:0:0", "hub://json/default/train:0:2", "hub://json/default/train:1:0",
    ]  # fmt: skip
    assert any("hub://json/default/train:0:1: no field 'text'" in r.getMessage() for r in caplog.records)
    assert [d["doc_id"] for d in iter_documents(uri, id_field="id")] == ["a", "b", "c"]
    rows = read_corpus([uri, str(tmp_path / "h2.jsonl")]).take_all()  # hub and files together
    assert sorted(r["text"] for r in rows) == sorted(texts[:3] + [texts[2]])
    with pytest.raises(ValueError, match="unknown parameter"):
        parse_hub_uri("hub://allenai/c4?config=en")
    with pytest.raises(ValueError, match="cannot stream hub://no-such-builder-xyz"):
        list(iter_documents("hub://no-such-builder-xyz?split=train"))


def test_fingerprint_follows_file_listing_sizes_and_mtimes(tmp_path: Path):
    from contamray.corpus.fingerprint import corpus_fingerprint, file_listing

    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n')
    (tmp_path / "b.jsonl").write_text('{"text": "two"}\n')
    cfg = {"kind": "files", "paths": [str(tmp_path / "*.jsonl")]}
    first = corpus_fingerprint(cfg, {})
    assert first == corpus_fingerprint(cfg, {}) and len(first) == 16
    assert [p for p, _, _ in file_listing(cfg["paths"])] == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n{"text": "three"}\n')  # grown
    grown = corpus_fingerprint(cfg, {})
    assert grown != first
    stat = (tmp_path / "b.jsonl").stat()
    os.utime(tmp_path / "b.jsonl", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten, same size
    touched = corpus_fingerprint(cfg, {})
    assert touched != grown
    (tmp_path / "c.jsonl").write_text('{"text": "four"}\n')  # a new shard matches the glob
    assert corpus_fingerprint(cfg, {}) != touched
    hub = {"kind": "files", "paths": ["hub://org/corpus?split=train"]}
    pinned = {"kind": "files", "paths": ["hub://org/corpus?split=train&revision=abc123"]}
    assert file_listing(hub["paths"]) == [("hub://org/corpus?split=train#unpinned", -1, -1)]
    assert corpus_fingerprint(hub, {}) != corpus_fingerprint(pinned, {})
    planted = {"kind": "planted"}
    assert corpus_fingerprint(planted, {"gsm8k": "x"}) != corpus_fingerprint(planted, {"gsm8k": "y"})
    assert corpus_fingerprint({"kind": "none"}, {}) == ""
