"""Building contaminated models on purpose, so detectors can be tested against a known truth.

- ``spec.validate_inject_spec``: check a model's ``inject:`` mapping (errors name the config key);
- ``prepare.prepare_injected_model``: the stream (``stream``: injected partitions mixed into
  ``background`` filler, optionally ``paraphrase``-d), the fine-tune (``TrainJob``, run here by
  ``train_injected`` or as a Ray task in a run: ``contamray.pipeline.injections``), the manifest, cached by
  content;
- ``finetune.finetune_causal_lm``: continue training a causal LM on chosen texts (full weights).
"""

from contamray.inject.finetune import finetune_causal_lm
from contamray.inject.prepare import (
    InjectedModel,
    TrainJob,
    default_cache_dir,
    prepare_injected_model,
    train_injected,
)
from contamray.inject.spec import BackgroundSpec, InjectSpec, PartitionSpec, validate_inject_spec

__all__ = [
    "BackgroundSpec",
    "InjectSpec",
    "InjectedModel",
    "PartitionSpec",
    "TrainJob",
    "default_cache_dir",
    "finetune_causal_lm",
    "prepare_injected_model",
    "train_injected",
    "validate_inject_spec",
]
