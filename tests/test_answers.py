"""pipeline/answers.py: the answered batches a stopped stage keeps for its re-run (the run itself:
test_resume.py, Ctrl-C mid-stage then a re-run that does not ask them again and ends byte for byte as an
uninterrupted run)."""

from __future__ import annotations

import json

from contamray.engines.wire import Output, Request
from contamray.pipeline.answers import AnswerJournal, batch_digest
from contamray.pipeline.plan import ModelPlan
from contamray.serve.hosting import answers_key, app_name


def _batch(*texts: str) -> list[tuple[str, Request]]:
    return [(f"cell{i}", Request(key=f"k{i}", record_ids=(f"r{i}",), kind="score", text=text))
            for i, text in enumerate(texts)]  # fmt: skip


def test_a_kept_batch_is_found_whole_by_its_requests_and_nothing_else(tmp_path):
    journal = AnswerJournal(str(tmp_path / "answers"))
    batch = _batch("one", "two")
    rows = [json.dumps(Output(key=f"k{i}", token_logprobs=[-0.1 * i, -1e-17], num_tokens=2).to_row()) for i in (0, 1)]
    digest = batch_digest(batch)
    assert journal.get("m", digest, 2) is None
    journal.put("m", digest, rows)
    assert journal.get("m", digest, 2) == rows and journal.count() == 1 and journal.digests("m") == {digest}
    assert journal.digests("other-model") == set()
    # the cells asking do not matter, the requests and their order do; another model's answers are its own
    assert batch_digest([("other", r) for _, r in batch]) == digest
    assert batch_digest(batch[::-1]) != digest and batch_digest(_batch("one", "two!")) != digest
    assert journal.get("other-model", digest, 2) is None
    # a file that is not a whole answer is asked again, never read as one
    assert journal.get("m", digest, 3) is None
    path = tmp_path / "answers" / "m" / f"{digest}.json"
    path.write_text(path.read_text()[:-5])
    assert journal.get("m", digest, 2) is None
    assert not list((tmp_path / "answers").glob("*/*.tmp-*"))
    journal.clear()
    assert journal.count() == 0 and not (tmp_path / "answers").exists()


def test_answers_key_follows_what_decides_answers_not_the_replica_count():
    one = ModelPlan(name="m", engine={"backend": "hf", "model_path": "x"}, num_cpus=1.0, concurrency=1)
    two = ModelPlan(name="m", engine={"backend": "hf", "model_path": "x"}, num_cpus=1.0, concurrency=2)
    other = ModelPlan(name="m", engine={"backend": "hf", "model_path": "y"}, num_cpus=1.0)
    assert app_name(one) != app_name(two) and answers_key(one) == answers_key(two) != answers_key(other)
