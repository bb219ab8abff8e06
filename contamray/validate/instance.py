"""Each method's instance-level membership score (higher = more likely seen), for instance ROC AUC.

Instance-level ROC AUC needs one number per example. Each method declares which of its per-example
columns ranks examples by its own paper's logic (``Method.outputs.membership``,
``contamray.methods.base.Outputs``): the likelihood scores (already oriented, higher = member), guided
prompting's ROUGE-L guided - general, the open-data matchers' graded quantity (share of n-grams or
tokens matched, METEOR recall, embedding similarity, substrings found, judge's "true" count), a
``contaminated`` flag where a method has nothing graded (a single ROC point). Methods that decide per
partition only (sharded likelihood, clean-vs-dirty accuracy) declare none: their AUC is not defined.
"""

from __future__ import annotations

import pandas as pd

from contamray.report.scores import ScoreSpec, declared_outputs


def instance_scores(table: pd.DataFrame, method_name: str) -> pd.Series | None:
    """The membership score of each row of ``table`` (one method's examples), or None if undefined."""
    outputs = declared_outputs(method_name)
    if outputs is None or outputs.membership is None or outputs.membership not in table.columns:
        return None
    return ScoreSpec(outputs.membership, outputs.membership, outputs.missing_as).compute(table)
