"""Benchmark adapters: every row of a registered benchmark partition becomes a ``contamray.records.Record``.

Registered names (``adapter_names()``): the Open LLM Leaderboard v1 datasets (arc_challenge, hellaswag,
mmlu, truthfulqa_gen, truthfulqa_mc, winogrande, gsm8k) and the seven of Golchin & Surdeanu's "Time
Travel in LLMs" (imdb, ag_news, yelp, rte, wnli, samsum, xsum). ``load_records`` reads a partition from
the hub or from a local mirror of hub rows and returns Records plus the rows that failed.
"""

from contamray.benchmarks.base import Adapter, BenchmarkRowError, LoadResult, RowContext, RowFailure
from contamray.benchmarks.loading import load_records, mirror_path, sample_indices
from contamray.benchmarks.registry import ADAPTERS, adapter_names, describe_all, get_adapter, partition_ids

__all__ = [
    "ADAPTERS",
    "Adapter",
    "BenchmarkRowError",
    "LoadResult",
    "RowContext",
    "RowFailure",
    "adapter_names",
    "describe_all",
    "get_adapter",
    "load_records",
    "mirror_path",
    "partition_ids",
    "sample_indices",
]
