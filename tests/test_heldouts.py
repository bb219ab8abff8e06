"""``benchmarks.<key>.heldout``: one key names a benchmark's held-out for every held-out test of a run
(``contamray/pipeline/heldouts.py``)."""

from __future__ import annotations

import pytest

from contamray.pipeline.heldouts import resolve_heldouts
from contamray.pipeline.plan import ConfigError, build_plan
from contamray.validate.truth import reference_keys

HELDOUT = "+benchmarks.arc_late={adapter:arc_challenge,split:test,offset:20,limit:20,sample:first}"
METHODS = "method=[min_k,perplexity,cdd,sharded_likelihood]"


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from contamray.experiments import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = hydra_compose(
            config_name="config",
            overrides=["+exp=base", "model=[smollm2_135m]", "benchmark=[arc_challenge,gsm8k]", "run.sample=first",
                       METHODS, "corpus=none", *overrides],
        )  # fmt: skip
    cfg.run.output_dir = "unused"
    return cfg


def plan_of(*overrides: str):
    return build_plan(compose(*overrides))


def test_a_benchmarks_heldout_is_every_heldout_methods_reference_and_plans_the_same_cells_as_naming_it_in_each():
    by_benchmark = plan_of(HELDOUT, "+benchmarks.arc_challenge.heldout=arc_late")
    by_method = plan_of(HELDOUT, "methods.min_k.reference={arc_challenge:arc_late}",
                        "methods.perplexity.reference={arc_challenge:arc_late}",
                        "methods.cdd.reference={arc_challenge:arc_late}")  # fmt: skip
    for plan in (by_benchmark, by_method):
        deps = {(c.method, c.benchmark): [d.benchmark for d in plan.dependencies(c)] for c in plan.cells}
        for method in ("min_k", "perplexity", "cdd"):
            assert deps[(method, "arc_challenge")] == ["arc_late"]
            assert deps[(method, "gsm8k")] == [] and deps[(method, "arc_late")] == []
        assert deps[("sharded_likelihood", "arc_challenge")] == []  # no reference: the key does not touch it
    assert by_benchmark.cells == by_method.cells
    # the same cells, stored and reused alike: the key leaves the benchmark's spec for the methods' references
    assert [by_benchmark.cell_hash(c) for c in by_benchmark.cells] == [by_method.cell_hash(c) for c in by_method.cells]
    assert by_benchmark.heldouts == {"arc_challenge": "arc_late"} and by_method.heldouts == {}
    # GSM8K has no held-out: the plan says which key would give it one
    assert any("set benchmarks.gsm8k.heldout: <key of a held-out gsm8k partition" in w for w in by_benchmark.warnings)


def test_a_methods_own_reference_wins_for_the_benchmarks_it_names():
    other = "+benchmarks.arc_other={adapter:arc_challenge,split:test,offset:40,limit:20,sample:first}"
    plan = plan_of(HELDOUT, other, "+benchmarks.arc_challenge.heldout=arc_late",
                   "methods.min_k.reference={arc_challenge:arc_other}")  # fmt: skip
    deps = {(c.method, c.benchmark): [d.benchmark for d in plan.dependencies(c)] for c in plan.cells}
    assert deps[("min_k", "arc_challenge")] == ["arc_other"]  # its own mapping
    assert deps[("perplexity", "arc_challenge")] == ["arc_late"]  # the benchmark's
    # one reference key for every benchmark (a method's own choice) is kept whole
    config, _ = resolve_heldouts({
        "benchmarks": {"a": {"adapter": "arc_challenge", "heldout": "b"}, "b": {"adapter": "arc_challenge"}},
        "methods": {"m": {"method": "min_k", "reference": "b"}, "s": {"method": "sharded_likelihood"}},
    })  # fmt: skip
    assert config["methods"]["m"]["reference"] == "b" and "reference" not in config["methods"]["s"]
    assert "heldout" not in config["benchmarks"]["a"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("+benchmarks.arc_challenge.heldout=arc_challenge",), r"benchmarks\.arc_challenge\.heldout: a partition is "
         r"not held out from itself"),
        (("+benchmarks.arc_challenge.heldout=arc_later",), r"benchmarks\.arc_challenge\.heldout: 'arc_later' is not a "
         r"benchmark of this run; add it under benchmarks: .* choose one of gsm8k"),
        (("+benchmarks.arc_challenge.heldout=gsm8k",), r"benchmarks\.arc_challenge\.heldout: gsm8k is gsm8k, not "
         r"arc_challenge: a held-out is a partition of the same benchmark"),
        # rows that may overlap the tested ones: the method's check, naming both keys
        (("+benchmarks.arc_over={adapter:arc_challenge,split:test,offset:10,limit:20,sample:first}",
          "+benchmarks.arc_challenge.heldout=arc_over"),
         r"methods\.min_k\.reference \(benchmarks\.arc_challenge\.heldout\): arc_over reads the same partition"),
    ],
)  # fmt: skip
def test_a_heldout_that_cannot_serve_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        plan_of(HELDOUT, *overrides)


def test_a_heldout_left_for_a_deselected_benchmark_is_ignored_and_the_truth_reads_the_heldouts():
    from omegaconf import OmegaConf

    plan = plan_of(HELDOUT, "+benchmarks.arc_challenge.heldout=arc_late", "+benchmarks.winogrande={heldout:wg}")
    assert "winogrande" not in plan.benchmarks  # only a held-out named for it: not a benchmark of the run
    # validate's truth files a held-out as the reference of every held-out method (never tested by them)
    config = OmegaConf.to_container(compose(HELDOUT, "+benchmarks.arc_challenge.heldout=arc_late"), resolve=True)
    refs = reference_keys(config)
    assert refs["min_k"] == {"arc_late"} and refs["cdd"] == {"arc_late"} and "sharded_likelihood" not in refs


def test_a_deselected_benchmarks_heldout_goes_with_it_unless_the_run_reads_it_and_corpus_clean_forgets_both():
    """The canary with ``benchmark=[...]`` leaving Winogrande out: its held-out block would otherwise be tested
    alone (every held-out method "inconclusive, no reference") and ``corpus.clean: [winogrande]`` would stop the
    run at planting."""
    wg_late = "+benchmarks.wg_late={adapter:winogrande,split:validation,offset:20,limit:20,sample:first}"
    stub = "+benchmarks.winogrande={heldout:wg_late}"
    plan = plan_of(HELDOUT, wg_late, stub, "corpus=planted", "corpus.clean=[winogrande,wg_late,gsm8k]")
    assert set(plan.benchmarks) == {"arc_challenge", "gsm8k", "arc_late"}
    assert plan.corpus["clean"] == ["gsm8k"]
    # a held-out another selected benchmark still names stays (here ARC's, through its own heldout key)
    plan = plan_of(HELDOUT, "+benchmarks.arc_challenge.heldout=arc_late", "+benchmarks.winogrande={heldout:arc_late}")
    assert "arc_late" in plan.benchmarks and plan.heldouts == {"arc_challenge": "arc_late"}
    # ... and one a method's own reference names
    plan = plan_of(wg_late, stub, "methods.min_k.reference=wg_late", "methods.min_k.mode=distribution")
    assert "wg_late" in plan.benchmarks


def test_corpus_clean_naming_no_benchmark_of_the_run_is_refused_at_plan_time():
    with pytest.raises(ConfigError, match=r"corpus\.clean: winogrnade is not a benchmark of this run; choices: "
                                          r"arc_challenge, gsm8k"):  # fmt: skip
        plan_of("corpus=planted", "corpus.clean=[winogrnade]")
