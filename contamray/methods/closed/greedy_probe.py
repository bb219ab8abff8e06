"""Held-out test methods that ask the target one greedy question per record (TS-Guessing, name cloze).

A subclass builds the record's probe (``probe``: raises ``Filtered`` when the method's protocol leaves the
record out, ``ValueError`` when the record is unusable) and its prompt (``prompt``); this base sends one
greedy ``generate`` request per probed record (stage 0 only), and gives ``_score_one`` the two steps every
such row starts with: the probe or the row's ``filtered`` / ``error`` (``built``), then the reply or the
row's ``error`` (``reply``). The partition decision is ``HeldoutTest``'s on ``exact_match``, its rate the verdict's;
``reduce`` adds the share of replies holding the answer (``in_reply``) on both sides and the filtered count.
"""

from __future__ import annotations

from typing import Any, ClassVar

from contamray.methods.base import Output, Request, Sampling, Verdict
from contamray.methods.closed.cell_rows import Filtered, column_mean, rows_of
from contamray.methods.closed.heldout_test import HeldoutTest, split_sides
from contamray.records import Record


class GreedyProbe(HeldoutTest):
    """One greedy generate request per probed record, keyed ``<record id>|<key_suffix>``."""

    key_suffix: ClassVar[str] = ""
    rate_column: ClassVar[str | None] = "exact_match"

    def reduce(self, table: Any, cfg: Any) -> Verdict:
        """``HeldoutTest``'s, with the in-reply shares of both sides and the filtered count in ``details``."""
        rows = rows_of(table)
        verdict = super().reduce(rows, cfg)
        own, ref = split_sides(rows)
        verdict.details.update(
            in_reply_rate=column_mean(own, "in_reply")[0], reference_in_reply_rate=column_mean(ref, "in_reply")[0],
            n_filtered=sum(bool(r.get("filtered")) for r in own),
        )  # fmt: skip
        return verdict

    def probe(self, record: Record, cfg: Any) -> Any:
        """The record's probe; ``Filtered`` to leave it out, ``ValueError`` for an unusable record."""
        raise NotImplementedError

    def prompt(self, probe: Any, cfg: Any) -> str:
        raise NotImplementedError

    def key(self, record_id: str) -> str:
        return f"{record_id}|{self.key_suffix or self.name}"

    def _probe(self, record: Record, cfg: Any) -> Any:
        """``probe``, its errors naming the method, record and partition."""
        try:
            return self.probe(record, cfg)
        except Filtered:
            raise
        except ValueError as err:
            raise ValueError(f"{self.name}: record {record.id!r} of {record.partition!r}: {err}") from None

    def requests(self, records: list[Record], cfg: Any, stage: int, outputs: dict[str, Output]) -> list[Request]:
        if stage > 0:
            return []
        sampling = Sampling(max_tokens=cfg.max_tokens, temperature=0.0, top_p=1.0, seed=cfg.seed)
        out = []
        for record in records:
            try:
                probe = self._probe(record, cfg)
            except ValueError:
                continue  # filtered, or an error row from score()
            out.append(Request(self.key(record.id), (record.id,), "generate", self.prompt(probe, cfg), sampling,
                               chat=cfg.chat))  # fmt: skip
        return out

    def reply(self, record: Record, got: dict[str, Output], row: dict[str, Any]) -> Output | None:
        """The record's answered request, or None with ``row["error"]`` naming the failed request."""
        key = self.key(record.id)
        output = got.get(key)
        if output is None or output.error:
            row["error"] = f"request {key!r} failed: {output.error if output is not None else 'no output'}"
            return None
        return output
