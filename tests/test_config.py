"""The Hydra config tree: composition, experiments, and errors that name the key before any work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from contamray.experiments import CONF_DIR
from contamray.pipeline.plan import ConfigError, build_plan

REPO = Path(__file__).resolve().parents[1]


def composed(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=False)


def plan_of(*overrides: str):
    cfg = composed(*overrides)
    cfg.run.output_dir = "unused"
    return build_plan(cfg)


def test_defaults_plan_both_families_on_the_embedded_model():
    plan = plan_of()
    assert list(plan.models) == ["smollm2_135m"]
    assert plan.models["smollm2_135m"].backend == "hf"  # auto without a GPU -> transformers
    assert {c.family for c in plan.cells} == {"closed", "open"}
    assert len(plan.cells) == 4  # 2 benchmarks x (1 closed method x 1 model + 1 open method)


def test_smoke_experiment():
    cfg = composed("+exp=smoke")
    assert cfg.run.name == "smoke" and cfg.run.limit == 20
    assert set(cfg.benchmarks) == {"arc_challenge", "gsm8k"}
    assert cfg.benchmarks.gsm8k.limit == 20
    assert set(cfg.methods) == {"guided_prompting", "ngram13"}


def test_llama2_openllm_plans_vllm_gpu_pools_on_six_datasets():
    plan = plan_of("+exp=llama2_openllm")
    assert set(plan.benchmarks) == {"arc_challenge", "hellaswag", "mmlu", "truthfulqa_gen", "winogrande", "gsm8k"}
    assert all(b.limit == 100 and b.sample == "first" for b in plan.benchmarks.values())
    assert {c.method for c in plan.cells} == {"guided_prompting", "sharded_likelihood_oren", "sharded_likelihood"}
    for label, permute in (("sharded_likelihood_oren", "rows"), ("sharded_likelihood", "groups")):
        p = plan.methods[label].params
        assert (p["num_shards"], p["permutations_per_shard"], p["context_len"], p["stride"], p["permute"]) == (
            15, 25, 1024, 512, permute)
    (pool,) = plan.engine_pools()
    assert pool.engine["source"] == "meta-llama/Llama-2-7b-hf"
    assert pool.backend == "vllm" and pool.num_gpus == 1


def test_plain_overrides_change_anything():
    plan = plan_of("run.limit=5", "run.seed=7", "model=[smollm2_135m]", "benchmark=[winogrande]", "method=[ngram8]")
    assert plan.seed == 7 and plan.benchmarks["winogrande"].limit == 5
    assert [c.method for c in plan.cells] == ["ngram8"]


def test_engine_group_overrides_every_model_backend():
    plan = plan_of("engine=vllm")
    assert plan.models["smollm2_135m"].backend == "vllm"


def test_cell_hash_changes_with_what_decides_the_result():
    a = plan_of()
    b = plan_of("run.seed=1")
    c = plan_of("run.limit=7")
    cell = a.cells[0]
    assert a.cell_hash(cell) == plan_of().cell_hash(cell)
    assert a.cell_hash(cell) != b.cell_hash(cell) != c.cell_hash(cell)


def test_open_cell_hash_follows_the_corpus_content_closed_cells_do_not():
    plan = plan_of()
    open_cell = next(c for c in plan.cells if c.family == "open")
    closed_cell = next(c for c in plan.cells if c.family == "closed")
    before = plan.cell_hash(open_cell), plan.cell_hash(closed_cell)
    plan.corpus_digest = "files-changed"
    assert plan.cell_hash(open_cell) != before[0]
    assert plan.cell_hash(closed_cell) == before[1]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("+methods.guided_prompting.bogus_param=1", "methods.guided_prompting"),
        ("+benchmarks.extra.adapter=no_such_benchmark", "benchmarks.extra.adapter"),
        ("models.smollm2_135m.backend=tpu", "models.smollm2_135m.backend"),
        ("+models.smollm2_135m.colour=red", "models.smollm2_135m"),
        ("benchmarks.gsm8k.split=dev", "benchmarks.gsm8k.split"),
        ("methods.ngram13.method=no_such_method", "methods.ngram13.method"),
        ("report.correction=bonferonni", "report.correction"),
        ("+models.smollm2_135m.resources={trainer:0}", "models.smollm2_135m.resources.trainer"),
        ("+models.smollm2_135m.resources={GPU:1}", "models.smollm2_135m.resources.GPU"),
        ("+models.smollm2_135m.resources=4", "models.smollm2_135m.resources"),
        ("corpus.max_unread=1.5", "corpus.max_unread: 1.5 is not a share between 0 and 1"),
        ("corpus.max_unread=all", "corpus.max_unread: 'all' is not a share"),
        # run-wide settings by type and range (pipeline/settings.py): "maybe" read as true before, 0 failed mid-run
        ("run.force=maybe", "run.force: expected true or false, got 'maybe'"),
        ("data.strict=maybe", "data.strict: expected true or false, got 'maybe'"),
        ("ray.request_batch_size=0", "ray.request_batch_size: expected an integer >= 1, got 0"),
        ("ray.num_cpus=abc", "ray.num_cpus: expected an integer >= 1, or null, got 'abc'"),
        ("ray.match_gpu_share=2", "ray.match_gpu_share: expected a number in [0, 1], got 2"),
        ("serve.deploy_timeout_s=soon", "serve.deploy_timeout_s: expected a number >= 1, got 'soon'"),
        ("run.seed=abc", "run.seed: expected an integer >= 0"),
        ("run.seed=-1", "run.seed: expected an integer >= 0"),
        ("corpus.kind=file", "corpus.kind: 'file' is not one of none, files"),
        ("corpus.filler=xsumm", "corpus.filler: 'xsumm' is not a benchmark adapter; choices: "),
        ("corpus.clean=[gsm8kk]", "corpus.clean: gsm8kk is not a benchmark of this run; choices: arc_challenge, gsm8k"),
        ("corpus=files", "corpus.paths: no corpus files given; set corpus.paths="),
        # a value of the wrong type, named with what the parameter takes (methods/param_types.py)
        ("methods.ngram13.min_words=eight", "methods.ngram13.min_words: expected an integer, got 'eight'"),
        ("methods.ngram13.min_fraction=[0.7]", "methods.ngram13.min_fraction: expected a number or null, got [0.7]"),
        ("methods.guided_prompting.chat=maybe", "methods.guided_prompting.chat: expected true or false, got 'maybe'"),
        ("methods.ngram13.input_fields=[1,2]", "methods.ngram13.input_fields: expected a list of strings, got [1, 2]"),
    ],
)
def test_bad_values_fail_in_the_plan_naming_the_key(override, named):
    with pytest.raises(ConfigError) as err:
        plan_of(override)
    assert named in str(err.value)


def test_open_method_without_corpus_is_refused():
    with pytest.raises(ConfigError, match="corpus"):
        plan_of("corpus=none")


def test_corpus_paths_that_resolve_to_no_file_are_refused_at_plan_time(tmp_path):
    """Before the benchmarks load and Ray starts (the scan found it only then, as a traceback)."""
    for missing, said in ((tmp_path / "*.jsonl", "matches no file"), (tmp_path / "x.jsonl", "does not exist"),
                          (tmp_path, "holds no readable file")):  # fmt: skip
        with pytest.raises(ConfigError, match=f"corpus.paths: .*{said}; point corpus.paths at existing files"):
            plan_of("corpus=files", f"corpus.paths=[{missing}]")
    (tmp_path / "a.jsonl").write_text('{"text": "a document"}\n')
    assert plan_of("corpus=files", f"corpus.paths=[{tmp_path}/*.jsonl]").open_methods()
    # closed-data methods alone never read the corpus: its paths are not asked for
    assert plan_of("corpus=files", "method=[guided_prompting]").cells


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "contamray.run", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_cfg_job_prints_the_composed_llama2_config():
    out = _run_cli("+exp=llama2_openllm", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert "meta-llama/Llama-2-7b-hf" in out.stdout and "backend: vllm" in out.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["no_such_key=1"], "no_such_key"),
        (["model=[no_such_model]"], "no_such_model"),
        (["benchmark=[no_such_benchmark]"], "no_such_benchmark"),
        (["method=[no_such_method]"], "no_such_method"),
        (["+methods.gpt3_13gram.bogus=2"], "bogus"),  # the canary (the default) runs gpt3_13gram
        # a model key of a model the run does not hold (the canary's models: [canary]) names the fix
        (["models.smollm2_135m.source=/x"], "smollm2_135m is not a model of this run (its models: canary"),
    ],
)
def test_cli_refuses_unknown_names_before_any_work(args, named, tmp_path):
    out = _run_cli(*args, f"hydra.run.dir={tmp_path}/run")
    assert out.returncode != 0
    assert named in out.stderr
    assert not (tmp_path / "run" / "examples.parquet").exists()


def test_a_model_key_of_a_model_not_in_the_run_names_the_runs_models_and_the_fix():
    from contamray.experiments import key_not_in_run, with_experiment

    error = key_not_in_run(with_experiment(["models.smollm2_135m.source=/x"]))
    assert error == ("models.smollm2_135m.source: smollm2_135m is not a model of this run (its models: canary); add "
                     "model=[smollm2_135m] to run conf/model/smollm2_135m.yaml (the list replaces the run's models)")
    assert "+models.mine={source: ...}" in key_not_in_run(with_experiment(["models.mine.source=/x"]))
    assert key_not_in_run(with_experiment(["model=[smollm2_135m]", "models.smollm2_135m.source=/x"])) is None
    assert key_not_in_run(with_experiment(["models.canary.threads=1"])) is None
    assert key_not_in_run(with_experiment(["+models.mine={source: /x}", "run.limit=3"])) is None
    # both kinds on one command line: one compose without either, each checked (a bad method key no longer hides
    # the model error behind a config that does not compose)
    both = ["models.smollm2_135m.source=/x", "methods.guided_prompting.n_instances=3"]
    assert key_not_in_run(with_experiment(both)).startswith("models.smollm2_135m.source: smollm2_135m is not a model")
    assert key_not_in_run(with_experiment(["model=[smollm2_135m]", *both])).startswith(
        "methods.guided_prompting.n_instances: n_instances is not a parameter of method guided_prompting"
    )


def test_a_method_key_the_run_lacks_names_the_runs_methods_or_the_methods_parameters():
    from contamray.experiments import key_not_in_run, with_experiment

    error = key_not_in_run(with_experiment(["methods.dcq.alpha=0.1"]))
    assert error.startswith("methods.dcq.alpha: dcq is not a method of this run (its methods: cdd, clean_dirty_eval,")
    assert error.endswith("add method=[dcq] to run conf/method/dcq.yaml (the list replaces the run's methods)")
    error = key_not_in_run(with_experiment(["methods.guided_prompting.n_instances=3"]))
    assert error.startswith("methods.guided_prompting.n_instances: n_instances is not a parameter of method "
                            "guided_prompting (methods.guided_prompting); its parameters: algorithm1_test, alpha,")
    assert key_not_in_run(with_experiment(["methods.guided_prompting.judge_instances=3"])) is None
    assert key_not_in_run(with_experiment(["methods.min_k.reference.winogrande=wg"])) is None  # a sub-key
    assert key_not_in_run(with_experiment(["method=[dcq]", "methods.dcq.alpha=0.1"])) is None
    # a block of the user's own leaves parameters to their defaults: each still checked, in order
    own = ["+methods.mine={method: ngram_overlap}"]
    assert key_not_in_run(with_experiment([*own, "methods.mine.n=8"])) is None
    assert "methods.mine.colour: colour is not a parameter of method ngram_overlap" in key_not_in_run(
        with_experiment([*own, "methods.mine.n=8", "methods.mine.colour=red"])
    )


def test_every_method_yaml_declares_every_parameter_of_its_method():
    """A method is one module plus one YAML that declares everything about it: every Config field is in the
    YAML (overridable without Hydra's "+", shown by --cfg job), and nothing else is."""
    import dataclasses

    import yaml

    from contamray.methods.base import get_method

    for file in sorted(Path(CONF_DIR, "method").glob("*.yaml")):
        spec = yaml.safe_load(file.read_text())
        fields = {f.name for f in dataclasses.fields(get_method(spec["method"]).Config)}
        assert set(spec) - {"method"} == fields, (file.name, sorted(fields - set(spec)), sorted(set(spec) - fields))


def test_contamray_methods_lists_every_preset_a_run_takes_with_the_values_it_starts_from(capsys):
    """``contamray methods`` is what ``method=[...]`` takes: every ``conf/method`` preset, named as a run names it
    (ngram13, not the registered ngram_overlap behind it), with the preset's values - a run of ``min_k`` asks both
    prompt forms (``chat: both``) where the method's ``Config`` default, a library caller's, is the paper's alone."""
    from contamray.cli import main
    from contamray.methods.base import get_method

    main(["methods"])
    out = capsys.readouterr().out
    blocks = {line.split(" [", 1)[0]: line for line in out.split("\n") if line and not line.startswith(" ")}
    assert sorted(blocks) == sorted(p.stem for p in Path(CONF_DIR, "method").glob("*.yaml"))
    assert "ngram_overlap" not in blocks and "(method ngram_overlap)" in blocks["ngram13"]
    names = ("min_k", "ngram13", "gpt2_8gram", "sharded_likelihood_oren")
    params = {name: out.split(f"\n{name} [", 1)[1].splitlines()[1] for name in names}
    assert get_method("min_k").Config().chat is False and "chat='both'" in params["min_k"]
    assert "n=13" in params["ngram13"] and "n=8" in params["gpt2_8gram"]
    assert "test='t'" in params["sharded_likelihood_oren"]


def test_a_parameter_written_at_its_default_hashes_as_left_out():
    """A cell's hash reads every parameter's value (``MethodPlan.resolved``): spelling a default out reuses the
    stored cell, and only a different value is a new cell."""
    from contamray.pipeline.plan import MethodPlan

    bare = MethodPlan("x", "ngram_overlap", {"n": 13})
    spelt = MethodPlan("x", "ngram_overlap", {"n": 13, "min_words": 8})
    assert bare.resolved() == spelt.resolved() and bare.resolved()["min_words"] == 8
    base = plan_of("+exp=smoke")
    same = plan_of("+exp=smoke", "methods.ngram13.min_words=8")  # the YAML's own value
    other = plan_of("+exp=smoke", "methods.ngram13.min_words=9")
    cells = [c for c in base.cells if c.method == "ngram13"]
    assert [base.cell_hash(c) for c in cells] == [same.cell_hash(c) for c in cells]
    assert all(base.cell_hash(c) != other.cell_hash(c) for c in cells)


def test_no_experiment_named_means_the_canary_and_exp_needs_no_plus():
    from contamray.experiments import with_experiment

    assert with_experiment([]) == ["+exp=canary"]
    assert with_experiment(["run.limit=3"]) == ["run.limit=3", "+exp=canary"]
    assert with_experiment(["exp=smoke", "run.limit=3"]) == ["+exp=smoke", "run.limit=3"]
    assert with_experiment(["+exp=smoke"]) == ["+exp=smoke"]
    assert with_experiment(["--help"]) == ["--help"]
    plan = plan_of(*with_experiment([]))
    (model,) = plan.models.values()
    assert model.name == "canary" and {p["benchmark"] for p in model.inject["partitions"]} == {
        "synthetic_facts", "arc_challenge"}
    methods = {c.method for c in plan.cells}
    assert {"sharded_likelihood", "min_k_plus_plus", "guided_prompting", "gpt3_13gram"} <= methods


def test_sample_first_takes_a_contiguous_block_and_bad_values_name_the_key(mirror_dir):
    from contamray.benchmarks import load_records

    plan = plan_of("+exp=smoke", "run.sample=first", "run.limit=7")
    assert {b.sample for b in plan.benchmarks.values()} == {"first"}
    first = load_records("arc_challenge", n=7, mirror_dir=mirror_dir, sample=plan.benchmarks["arc_challenge"].sample)
    whole = load_records("arc_challenge", mirror_dir=mirror_dir)
    assert [r.id for r in first.records] == [r.id for r in whole.records[:7]]
    with pytest.raises(ConfigError, match=r"benchmarks.gsm8k.sample.*random, first"):
        plan_of("+exp=smoke", "benchmarks.gsm8k.sample=last")


def test_offset_takes_the_rows_after_the_first_ones_and_bad_values_name_the_key(mirror_dir):
    """``benchmarks.<key>.offset`` skips a split's leading rows: rows 7-13 are a held-out disjoint from rows 0-6."""
    from contamray.benchmarks import load_records, sample_indices

    plan = plan_of("+exp=smoke", "run.sample=first", "run.limit=7", "+benchmarks.arc_challenge.offset=7")
    bench = plan.benchmarks["arc_challenge"]
    assert (bench.offset, plan.facts("arc_challenge").rows) == (7, (7, 14))
    after = load_records("arc_challenge", n=7, mirror_dir=mirror_dir, sample="first", offset=bench.offset)
    whole = load_records("arc_challenge", mirror_dir=mirror_dir)
    assert [r.id for r in after.records] == [r.id for r in whole.records[7:14]]
    drawn = sample_indices(100, 10, seed=3, what="x", how="random", offset=90)
    assert drawn == list(range(90, 100))
    assert set(sample_indices(100, 5, seed=3, what="x", how="random", offset=50)) <= set(range(50, 100))
    with pytest.raises(ValueError, match=r"offset=100 for x: the split has only 100 rows"):
        sample_indices(100, 5, seed=3, what="x", offset=100)
    with pytest.raises(ConfigError, match=r"benchmarks.gsm8k.offset: .*integer >= 0"):
        plan_of("+exp=smoke", "+benchmarks.gsm8k.offset=-1")


def test_an_unknown_corpus_reader_is_refused_naming_the_key_and_the_choices():
    with pytest.raises(ConfigError, match=r"ray.corpus_read: 'driver' is not one of actors .* tasks"):
        plan_of("+exp=smoke", "ray.corpus_read=driver")


def test_min_k_plus_plus_on_a_vllm_model_is_refused_naming_the_backend_key():
    with pytest.raises(ConfigError, match=r"models.smollm2_135m.backend=hf"):
        plan_of("method=[min_k_plus_plus]", "models.smollm2_135m.backend=vllm",
                "methods.min_k_plus_plus.reference=gsm8k", "methods.min_k_plus_plus.mode=distribution")
    plan_of("method=[min_k_plus_plus]", "methods.min_k_plus_plus.reference=gsm8k",
            "methods.min_k_plus_plus.mode=distribution")


def test_a_vllm_model_needs_a_gpu_per_tensor_parallel_shard():
    """A Serve replica hosts every shard of its model: num_gpus below tensor_parallel_size cannot run."""
    with pytest.raises(ConfigError, match=r"models.smollm2_135m.tensor_parallel_size: 2 GPUs.*num_gpus to 2"):
        plan_of("models.smollm2_135m.backend=vllm", "models.smollm2_135m.num_gpus=1",
                "models.smollm2_135m.tensor_parallel_size=2")  # fmt: skip
    plan = plan_of("models.smollm2_135m.backend=vllm", "models.smollm2_135m.num_gpus=2",
                   "models.smollm2_135m.tensor_parallel_size=2")  # fmt: skip
    assert plan.models["smollm2_135m"].num_gpus == 2


def test_a_models_custom_resources_reach_its_replicas_its_reservation_and_its_fine_tune():
    """``models.<name>.resources`` (custom Ray resources) go with each replica (Serve actor options, the dry
    run's placement bundles) and with an injected model's fine-tune task; a CPU fine-tune asks for every CPU of
    the largest node that has them, capped by what the cluster has free, never fewer than a replica's."""
    from contamray.pipeline.injections import finetune_options
    from contamray.pipeline.placement import pool_bundles
    from contamray.serve.hosting import app_name, replica_options

    plain = plan_of("+exp=canary").models["canary"]
    pool = plan_of("+exp=canary", "+models.canary.resources={trainer:1}").models["canary"]
    assert pool.resources == {"trainer": 1.0} and plain.resources == {}
    assert replica_options(pool) == {"num_cpus": 1.0, "num_gpus": 0.0, "resources": {"trainer": 1.0}}
    assert "resources" not in replica_options(plain)
    assert pool_bundles(pool) == [{"CPU": 1.0, "trainer": 1.0}]
    assert app_name(pool) != app_name(plain)
    nodes = [
        {"Alive": True, "Resources": {"CPU": 16.0}},
        {"Alive": True, "Resources": {"CPU": 4.0, "trainer": 2.0}},
        {"Alive": False, "Resources": {"CPU": 64.0, "trainer": 2.0}},
    ]
    assert finetune_options(pool, nodes=nodes)["num_cpus"] == 4.0  # the trainer node, all of it
    assert finetune_options(plain, nodes=nodes)["num_cpus"] == 16.0
    assert finetune_options(pool, available_cpus=3.0, nodes=nodes)["num_cpus"] == 3.0
    assert finetune_options(pool, available_cpus=0.0, nodes=nodes)["num_cpus"] == 1.0
    gpu = plan_of("+exp=canary", "models.canary.num_gpus=1", "models.canary.backend=hf").models["canary"]
    assert finetune_options(gpu, nodes=nodes) == {"num_cpus": 1.0, "num_gpus": 1.0}  # the replica's own


def test_a_models_threads_key_is_checked_and_sets_its_replicas_compute_threads():
    """``models.<name>.threads``: the replica's engine computes on that many torch threads instead of the one
    Ray gives a 1-CPU actor (``OMP_NUM_THREADS=1``); a bad value names the key; a host with other threads is
    another Serve application (it is not interchangeable with one computing on fewer)."""
    from contamray.serve.hosting import app_name

    two = plan_of("+exp=canary").models["canary"]  # the canary's target: 2 threads on its 1 reserved CPU
    plain = plan_of("+exp=canary", "models.canary.threads=null").models["canary"]
    assert plain.threads is None and two.threads == 2 and app_name(two) != app_name(plain)
    assert plan_of("+exp=smoke").models["smollm2_135m"].threads is None  # the shipped models: their num_cpus
    # the setting lives with the canary's model, not the experiment: `python -m contamray.run` (the canary's
    # settings) with another model list plans that list (an experiment-level `models.canary` once made it
    # "models.canary.source: missing")
    assert list(plan_of("+exp=canary", "model=[smollm2_135m]").models) == ["smollm2_135m"]
    for bad in ("0", "1.5", "true", "many"):
        with pytest.raises(ConfigError, match=r"models\.canary\.threads: expected an integer >= 1"):
            plan_of("+exp=canary", f"models.canary.threads={bad}")
    probe = (
        "import sys, torch; from contamray.serve.hosting import EngineReplica; "
        "spec = {'source': 'smollm2-135m', 'backend': 'hf', 'dtype': 'float32'}; "
        "EngineReplica(spec, 'm', threads=int(sys.argv[1]) or None); print(torch.get_num_threads())"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # what Ray sets in a 1-CPU replica
    threads = [
        subprocess.run([sys.executable, "-c", probe, n], capture_output=True, text=True, env=env, check=True).stdout
        for n in ("0", "2")
    ]
    assert [t.strip() for t in threads] == ["1", "2"]


def test_a_local_checkpoint_trained_again_in_place_is_another_model(tmp_path: Path):
    """Cells and Serve applications of a local checkpoint key on its files (names, sizes, modification times):
    the same config over weights written again is not served from the old model's cells or replicas."""
    import json

    from contamray.serve.hosting import app_name
    from tests.test_checkpoint_files import write_weights

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    (ckpt / "tokenizer.json").write_text("{}")
    write_weights(ckpt, seed=1)
    run = ["+exp=base", "benchmark=[arc_challenge]", "method=[min_k]", "corpus=none"]

    def hashes(target: str):
        plan = plan_of(*run, f"models.smollm2_135m.source={target}", f"+reference_model={{source: {ckpt}}}",
                       "+methods.ratio={method: reference_ratio}")  # fmt: skip
        return {c.method: plan.cell_hash(c) for c in plan.cells}, app_name(plan.models["smollm2_135m"])

    first, first_embedded = hashes(str(ckpt)), hashes("smollm2-135m")
    assert hashes(str(ckpt)) == first  # unchanged files: the same cells, the same application
    write_weights(ckpt, rows=65, seed=2)  # trained again: other weights (a size of its own, whatever the clock)
    again, again_embedded = hashes(str(ckpt)), hashes("smollm2-135m")
    assert again[1] != first[1] and not set(again[0].values()) & set(first[0].values())
    # the checkpoint as the reference model only: the ratio's cell changes, the embedded target's own cells do not
    assert again_embedded[0]["ratio"] != first_embedded[0]["ratio"]
    assert again_embedded[0]["min_k"] == first_embedded[0]["min_k"] and again_embedded[1] == first_embedded[1]
    assert plan_of(*run).models["smollm2_135m"].files is None  # an embedded model (or a hub id) keys on its name


def test_share_prefixes_is_checked_kept_only_when_false_and_reaches_the_engine():
    """``models.<name>.share_prefixes``: the default (true) leaves specs, cell hashes and application names as they
    were before the key; false is another computation (the last bits of a float may differ), so its cells are other
    cells, and the transformers engine built from the plan's spec reads every prompt whole."""
    from contamray.engines import EngineSpec, build_engine
    from contamray.serve.hosting import app_name

    run = ["+exp=base", "benchmark=[arc_challenge]", "method=[min_k]", "corpus=none", "models.smollm2_135m.backend=hf"]
    default, explicit = plan_of(*run), plan_of(*run, "models.smollm2_135m.share_prefixes=true")
    whole = plan_of(*run, "models.smollm2_135m.share_prefixes=false")
    assert "share_prefixes" not in default.models["smollm2_135m"].engine
    assert [default.cell_hash(c) for c in default.cells] == [explicit.cell_hash(c) for c in explicit.cells]
    assert app_name(default.models["smollm2_135m"]) == app_name(explicit.models["smollm2_135m"])
    assert not {default.cell_hash(c) for c in default.cells} & {whole.cell_hash(c) for c in whole.cells}
    engines = [build_engine(EngineSpec(**{**p.models["smollm2_135m"].engine, "name": "m"})) for p in (default, whole)]
    assert [e._share_prefixes for e in engines] == [True, False]
    with pytest.raises(ConfigError, match=r"models\.smollm2_135m\.share_prefixes: expected true or false, got 'no'"):
        plan_of(*run, "models.smollm2_135m.share_prefixes=no")
