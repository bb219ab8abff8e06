"""An injected model's training stream as an open-data corpus, with the truth beside it.

Open-data methods answer "is this partition in the training corpus?". For an injected model the
corpus is known exactly - the stream it was fine-tuned on (``corpus/train.jsonl`` in the model's
directory) - so open- and closed-data methods can be checked against one and the same truth: a
partition the model was trained on is in its corpus, a clean partition is in neither.

``injected_corpus`` returns the corpus config (``kind: files``) for the runner to scan and writes
``<output_dir>/corpus/manifest.json`` in the planted corpus's format (record id -> ``partition``,
``how``, ``doc_id``; plus ``member`` and ``duplication``), which ``contamray.validate`` reads for the
truth of open-data cells: a row is a member when it is in the stream (``how`` names its form),
partitions with no member row are clean.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contamray.inject.prepare import InjectedModel


def corpus_manifest(injected: InjectedModel) -> dict[str, dict[str, Any]]:
    """Record id -> where and how it is in the training stream (members) or that it is not."""
    first_unit: dict[str, str] = {}
    for unit in injected.manifest["stream"]:
        for rid in unit.get("record_ids", []):
            first_unit.setdefault(rid, unit["id"])
    out: dict[str, dict[str, Any]] = {}
    for rid, row in injected.manifest["rows"].items():
        if row.get("member"):
            how = f"{row['form']}/{row['content']}/{row['order']}"
            out[rid] = {"partition": row["partition"], "how": how, "doc_id": first_unit.get(rid, ""),
                        "member": True, "duplication": row["copies"]}
        else:
            out[rid] = {"partition": row["partition"], "how": "not_injected", "doc_id": "", "member": False,
                        "duplication": 0}
    return out


def injected_corpus(injected: InjectedModel, output_dir: str | Path) -> dict[str, Any]:
    """The corpus config of ``injected``'s training stream; writes the truth to ``corpus/manifest.json``."""
    folder = Path(output_dir) / "corpus"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(corpus_manifest(injected), indent=1))
    (folder / "injected_model.json").write_text(json.dumps({"path": injected.path, "key": injected.manifest["key"]}))
    return injected.corpus
