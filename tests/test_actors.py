"""Engine answers are matched to requests by position: cells may share request keys in one batch."""

from __future__ import annotations

from contamray.engines import EngineSpec, build_engine
from contamray.methods.base import Request, Sampling
from contamray.pipeline.actors import answer_requests, byte_bounded


def test_same_key_requests_with_different_options_get_their_own_answers():
    engine = build_engine(EngineSpec(source="smollm2-135m", backend="hf", dtype="float32"))
    text = "The capital of France is Paris."
    requests = [
        Request(key="r1|text", record_ids=("r1",), kind="score", text=text, vocab_stats=True),
        Request(key="r1|text", record_ids=("r1",), kind="score", text=text, vocab_stats=False),
        Request(key="r1|gen", record_ids=("r1",), kind="generate", text=text, sampling=Sampling(max_tokens=4)),
    ]
    with_stats, without_stats, generated = answer_requests(engine, requests)
    assert len(with_stats.token_mean) == with_stats.num_tokens > 0
    assert without_stats.token_mean == [] and without_stats.num_tokens == with_stats.num_tokens
    assert with_stats.token_logprobs == without_stats.token_logprobs
    assert generated.text and not generated.error


def test_match_batches_are_cut_into_pieces_bounded_by_bytes():
    """A corpus batch is matched in pieces of about ``max_bytes`` of UTF-8 text: a book-length document
    alone, short ones together, none cut or lost, in order."""
    docs = [{"doc_id": str(i), "text": ("x" * 50) if i % 7 else ("é" * 3000)} for i in range(60)]
    pieces = list(byte_bounded(docs, 1000))
    assert [d for piece in pieces for d in piece] == docs
    for piece in pieces:
        sizes = [len(d["text"].encode()) for d in piece]
        assert sum(sizes[:-1]) < 1000  # only the piece's last document may cross the bound
    assert [len(p) for p in pieces if len(p[-1]["text"]) == 3000 and len(p) == 1]  # a "book" alone


def test_files_go_to_match_actors_in_groups_of_about_a_task_of_bytes():
    from contamray.pipeline.corpus_scan import TASK_BYTES, TASKS_PER_ACTOR, file_tasks

    paths = [f"f{i}" for i in range(10)]
    assert file_tasks(paths, None, 2) == [[p] for p in paths]  # sizes unknown: a file a task
    mb = 1 << 20
    # a small pass: at least TASKS_PER_ACTOR tasks per actor (10 MB over 2 actors x 4: groups of >= 1.25 MB)
    small = file_tasks(paths, [mb] * 10, 2)
    assert small == [paths[i : i + 2] for i in range(0, 10, 2)] and len(small) >= TASKS_PER_ACTOR
    # a large pass: groups of about TASK_BYTES, consecutive, every file once; a larger file is a task alone
    sizes = [TASK_BYTES // 4] * 8 + [3 * TASK_BYTES, TASK_BYTES // 4]
    big = file_tasks(paths, sizes, 1)
    assert [p for group in big for p in group] == paths
    assert big == [paths[0:4], paths[4:8], ["f8"], ["f9"]]


def test_a_task_of_files_is_folded_in_the_actor_and_the_driver_fold_gives_the_scan_of_the_whole(tmp_path):
    """``scan_files`` (what a ``FileMatchWorker`` runs on a task's files) folds the matches of every file of its
    task together: one output per task, however many files; cut into several outputs by ``emit_bytes``, or
    scanned file by file, the driver's fold (``fold_stream``) gives the same rows - those of one scan of all
    documents - and each bad row is reported once."""
    import json

    from contamray.methods.base import get_method
    from contamray.pipeline.actors import Scanner, match_output, scan_files
    from contamray.pipeline.corpus_scan import fold_stream
    from contamray.records import Record

    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()
    records = [
        Record(id=f"q{i}", partition="t/test", input=" ".join(words[i:] + words[:i]), label="", reference="",
               task="question_answering", order=i)
        for i in range(3)
    ]
    method = get_method("ngram_overlap")
    cfg = method.make_config({"n": 8, "max_evidence": 2})
    index = method.build_index(records, cfg)
    paths, docs = [], []
    for f in range(3):
        path = tmp_path / f"part{f}.jsonl"
        rows = [{"id": f"d{f}-{i}", "text": f"filler {f} {i} " + (records[(f + i) % 3].input if i % 2 else "")}
                for i in range(4)]  # fmt: skip
        docs += [{"doc_id": r["id"], "text": r["text"]} for r in rows]
        path.write_text("\n".join(json.dumps(r) for r in rows) + ("\n{not json\n" if f == 1 else "\n"))
        paths.append(str(path))
    read = {"format": "jsonl", "text_field": "text", "id_field": "id"}

    def scanned(groups: list[list[str]], emit_bytes: int) -> tuple[int, list, list]:
        scanner = Scanner([("c", method, cfg, index)], 1 << 20)
        outputs = [match_output(bad, res) for g in groups for bad, res in scan_files(scanner, g, read, 2, emit_bytes)]
        folded = fold_stream(outputs, {"c": (method, cfg)})
        return len(outputs), folded.folds["c"].rows(), folded.errors

    whole = method.fold(method.match(docs, index, cfg), cfg)
    assert whole and {r["record_id"] for r in whole} == {"q0", "q1", "q2"}
    one_task = scanned([paths], 1 << 30)
    assert one_task[0] == 1 and one_task[1] == whole and len(one_task[2]) == 1  # one output for three files
    assert one_task[2][0]["error"] and "part1.jsonl" in json.dumps(one_task[2][0])
    by_file = scanned([[p] for p in paths], 1 << 30)
    small_emits = scanned([paths], 1)
    assert by_file[0] == 3 and small_emits[0] > 3
    assert by_file[1:] == small_emits[1:] == one_task[1:]
