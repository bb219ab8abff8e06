"""Run artifacts published for every node (``contamray.artifacts``): the round trip through a URI, a publish
cut short, the per-machine fetch cache, and the refusal of a multi-node run with no artifacts root."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from contamray.artifacts import COMPLETE, artifacts_root, content_digest, fetch_dir, needs_artifacts, publish_dir


def folder(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 100)
    return root


def test_a_published_folder_is_fetched_whole_once_per_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CONTAMRAY_CACHE", str(tmp_path / "cache"))
    src = folder(tmp_path / "model")
    uri = f"file://{tmp_path}/artifacts/injected/abc"
    assert publish_dir(src, uri) == uri
    assert (tmp_path / "artifacts" / "injected" / "abc" / COMPLETE).is_file()
    local = fetch_dir(uri)
    assert local != src and content_digest(local / "sub") == content_digest(src / "sub")
    assert (local / "config.json").read_text() == (src / "config.json").read_text()
    (src / "config.json").write_text("changed")  # published once: names are content-addressed, never rewritten
    publish_dir(src, uri)
    assert (tmp_path / "artifacts" / "injected" / "abc" / "config.json").read_text() == '{"model_type": "llama"}'
    stamp = (local / "config.json").stat().st_mtime_ns
    assert fetch_dir(uri) == local and (local / "config.json").stat().st_mtime_ns == stamp  # fetched once


def test_a_publish_cut_short_is_not_fetched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CONTAMRAY_CACHE", str(tmp_path / "cache"))
    partial = folder(tmp_path / "artifacts" / "corpus" / "x")  # files there, no marker: the driver died mid-way
    with pytest.raises(FileNotFoundError, match=r"models\.m\.source: file://.*no complete published folder"):
        fetch_dir(f"file://{partial}", where="models.m.source")
    publish_dir(folder(tmp_path / "again"), f"file://{partial}")  # published again, whole
    assert (fetch_dir(f"file://{partial}") / "sub" / "weights.bin").stat().st_size == 25600


def test_a_model_source_uri_resolves_to_the_fetched_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from contamray.engines import resolve_model_path

    monkeypatch.setenv("CONTAMRAY_CACHE", str(tmp_path / "cache"))
    uri = publish_dir(folder(tmp_path / "model"), f"file://{tmp_path}/published")
    path = Path(resolve_model_path(uri, where="models.m.source"))
    assert (path / "config.json").is_file() and str(path).startswith(str(tmp_path / "cache"))


def test_the_root_and_what_needs_it():
    assert artifacts_root(None, None) is None
    assert artifacts_root(None, "/local/cells") is None  # one machine: the driver's disk serves
    assert artifacts_root(None, "s3://b/run/cells/") == "s3://b/run/cells/artifacts"
    assert artifacts_root("/shared/art/", "s3://b/cells") == "/shared/art"
    plan = SimpleNamespace(
        models={"a": SimpleNamespace(inject={"partitions": []}), "b": SimpleNamespace(inject=None)},
        corpus={"kind": "planted"},
        cells=[SimpleNamespace(family="open")],
    )
    assert needs_artifacts(plan) == ["models.a.inject", "corpus=planted"]
    plan.cells = [SimpleNamespace(family="closed")]
    assert needs_artifacts(plan) == ["models.a.inject"]
