"""What a corpus scan could not read, and what it does to an open-data verdict (``contamray.corpus.coverage``).

Known answers: a scan's bad-row reports against a listing of known sizes give the rows skipped, the files lost and
their bytes; a "clean" stands while what may be unread is at most ``corpus.max_unread`` of the corpus' bytes and is
inconclusive above it or when the share cannot be bounded; a "contaminated" always stands. The same through a real
run: ``tests/test_corpus_run.py``.
"""

from __future__ import annotations

import pytest

from contamray.corpus.coverage import CorpusCoverage, check_max_unread, coverage_of, with_coverage
from contamray.corpus.readers import FILE_SKIPPED, REST_SKIPPED

SIZES = {"/c/a.jsonl": 600, "/c/b.jsonl.gz": 300, "/c/c.parquet": 100}
ERRORS = [
    {"where": "/c/a.jsonl:3", "error": "not a JSON line (Expecting value)"},
    {"where": "/c/a.jsonl:9", "error": "no field 'text' (fields: body)"},
    {"where": "/c/b.jsonl.gz:41", "error": f"truncated or corrupt after line 40 (OSError: x); {REST_SKIPPED}"},
    {"where": "/c/c.parquet", "error": f"not a readable parquet file (ArrowInvalid: x); {FILE_SKIPPED}"},
]


def verdict(decision: str) -> dict:
    return {"decision": decision, "contaminated": decision == "contaminated", "reason": "", "rate": 0.0,
            "details": {"summary": "0 of 12 examples found"}}  # fmt: skip


def test_a_scans_reports_give_rows_files_and_an_upper_bound_of_the_bytes_unread():
    cov = coverage_of(ERRORS, SIZES)
    assert (cov.rows_skipped, cov.files_unread) == (2, ["/c/b.jsonl.gz", "/c/c.parquet"])
    assert (cov.unread_bytes, cov.total_bytes, cov.share) == (400, 1000, 0.4)
    assert CorpusCoverage.from_json(cov.to_json()) == cov
    assert coverage_of([], SIZES).share == 0.0 and not coverage_of([], SIZES).lost
    # a lost file whose size the listing does not give (a hub dataset's): the share cannot be bounded
    assert coverage_of(ERRORS[3:], {"/c/a.jsonl": 600}).share is None


@pytest.mark.parametrize(
    ("max_unread", "decision"),
    [(0.5, "clean"), (0.4, "clean"), (0.39, "inconclusive"), (0.0, "inconclusive")],
)
def test_a_clean_verdict_stands_only_while_what_may_be_unread_is_within_max_unread(max_unread, decision):
    out = with_coverage(verdict("clean"), coverage_of(ERRORS, SIZES), max_unread)
    assert out["decision"] == decision and out["contaminated"] is False
    d = out["details"]
    assert (d["corpus_rows_skipped"], d["n_corpus_files_unread"], d["corpus_unread_share"]) == (2, 2, 0.4)
    assert d["summary"] == ("0 of 12 examples found; 2 corpus row(s) skipped, 2 file(s) read in part or not at all "
                            "(up to 40 % of the corpus' bytes) (corpus_errors.jsonl)")  # fmt: skip
    if decision == "inconclusive":
        assert f"up to 40 % of the corpus' bytes, more than corpus.max_unread = {max_unread:g}" in out["reason"]
        assert "restore the files listed in corpus_errors.jsonl" in out["reason"]


def test_found_is_found_and_rows_skipped_alone_never_decide():
    lost = coverage_of(ERRORS, SIZES)
    assert with_coverage(verdict("contaminated"), lost, 0.0)["decision"] == "contaminated"
    assert with_coverage(verdict("inconclusive"), lost, 0.0)["reason"] == ""  # its own reason is kept
    rows_only = with_coverage(verdict("clean"), coverage_of(ERRORS[:2], SIZES), 0.0)
    assert rows_only["decision"] == "clean" and rows_only["details"]["corpus_rows_skipped"] == 2
    unknown = with_coverage(verdict("clean"), coverage_of(ERRORS[3:], {}), 1.0)
    assert unknown["decision"] == "inconclusive" and "a share of unknown size" in unknown["reason"]
    # a closed-data verdict whose rows the scan labelled (clean-vs-dirty): the losses are stated, not decided on
    stated = with_coverage(verdict("clean"), lost, None)
    assert stated["decision"] == "clean" and stated["details"]["corpus_unread_share"] == 0.4
    untouched = verdict("clean")
    assert with_coverage(untouched, coverage_of([], SIZES), 0.0) is untouched  # nothing lost: nothing added
    assert with_coverage(untouched, None, 0.0) is untouched  # a cell stored before coverage was


@pytest.mark.parametrize("bad", [-0.1, 1.01, "half", None, True])
def test_max_unread_is_a_share(bad):
    with pytest.raises(ValueError, match="corpus.max_unread: .* is not a share between 0 and 1"):
        check_max_unread(bad)
    assert check_max_unread("0.1") == 0.1 and check_max_unread(0) == 0.0
