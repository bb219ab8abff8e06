#!/usr/bin/env bash
# Run a model zoo: one Ray job per model (at most $CONTAMRAY_ZOO_PARALLEL at once), then one report.
#
#   RAY_ADDRESS=http://<head>:8265 [CLUSTER_YAML=cluster.yaml] \
#     jobs/zoo.sh [--name NAME] [--correction holm|bh|none] [--alpha A] [--no-pull] \
#                 MODELS_FILE +exp=llama2_openllm [hydra overrides for every model...]
#
# MODELS_FILE has one model per line ('#' starts a comment):
#   llama2_7b                                          a model of conf/model/ (model=[llama2_7b])
#   mistral_7b mistralai/Mistral-7B-v0.1 num_gpus=1    NAME SOURCE [key=value...]: a model defined here
#                                                      (model=[] +models.NAME.source=SOURCE +models.NAME.key=value)
# Each model's run goes to $CONTAMRAY_OUTPUT_ROOT/NAME/<model>/ on the head; all runs share one cell
# store (run.cells_uri=$CONTAMRAY_CELLS_URI, default $CONTAMRAY_OUTPUT_ROOT/cells), so when a model
# joins the zoo, re-running the whole list computes only the new model's cells. The models' jobs run
# concurrently on the cluster (each with its own engine actors); when all have ended, `contamray report`
# merges the finished runs into NAME/report/, pulled into ./reports/NAME. Exit status: non-zero if a
# model's job failed (the report still shows the others).
# Environment knobs (output root, resources, runtime env, dry run): jobs/common.sh.
set -euo pipefail
source "$(dirname "$0")/common.sh"

name="zoo-$(date -u +%Y%m%d-%H%M%S)" correction=holm alpha=0.05 pull=1
parallel="${CONTAMRAY_ZOO_PARALLEL:-4}"
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --correction) correction="$2"; shift 2 ;;
    --alpha) alpha="$2"; shift 2 ;;
    --no-pull) pull=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || cr_die "give a models file (one model per line), then the Hydra overrides for every model"
models_file="$1"; shift
[ -f "$models_file" ] || cr_die "models file '$models_file' not found"
cr_require_cluster
out="$CR_OUTPUT_ROOT/$name"
cells="${CONTAMRAY_CELLS_URI:-$CR_OUTPUT_ROOT/cells}"

# model name -> its Hydra overrides (one quoted string per model)
models=() overrides=() lineno=0
while IFS= read -r line || [ -n "$line" ]; do
  lineno=$((lineno + 1))
  line="${line%%#*}"
  read -r -a words <<< "$line" || true
  [ "${#words[@]}" -gt 0 ] || continue
  model="${words[0]}"
  [[ "$model" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] ||
    cr_die "$models_file:$lineno: model name '$model' must be a config key (letters, digits, _)"
  if [ "${#words[@]}" -eq 1 ]; then
    args=("model=[$model]")
  else
    args=("model=[]" "+models.$model.source=${words[1]}")
    for kv in "${words[@]:2}"; do
      [[ "$kv" == *=* ]] || cr_die "$models_file:$lineno: '$kv' is not key=value (e.g. num_gpus=1)"
      args+=("+models.$model.$kv")
    done
  fi
  models+=("$model")
  overrides+=("$(cr_quote "${args[@]}")")
done < "$models_file"
[ "${#models[@]}" -gt 0 ] || cr_die "$models_file lists no model"
case " ${models[*]} " in *" report "*) cr_die "$models_file: 'report' is reserved (the report's directory)" ;; esac

ids=() running=() failed=0
finish_one() {  # wait until one running job ends; drop it from `running`
  local id status
  while :; do
    for id in "${running[@]}"; do
      status="$(cr_status "$id")"
      if cr_ended "$status"; then
        echo "job $id: $status"
        [ "$status" = SUCCEEDED ] || failed=$((failed + 1))
        local keep=() r
        for r in "${running[@]}"; do [ "$r" = "$id" ] || keep+=("$r"); done
        running=(${keep[@]+"${keep[@]}"})
        return
      fi
    done
    sleep 10
  done
}
for i in "${!models[@]}"; do
  model="${models[$i]}"
  if [ "$CR_DRY_RUN" != 1 ]; then
    while [ "${#running[@]}" -ge "$parallel" ]; do finish_one; done
  fi
  id="$(cr_submission_id "$name-$model")"
  entry="$(cr_quote python -m contamray.run "hydra.run.dir=$out/$model" "run.cells_uri=$cells") ${overrides[$i]}"
  [ $# -gt 0 ] && entry+=" $(cr_quote "$@")"
  cr_submit "$id" "$entry"
  echo "submitted $id: $model -> $out/$model"
  ids+=("$id"); running+=("$id")
done
if [ "$CR_DRY_RUN" != 1 ]; then
  while [ "${#running[@]}" -gt 0 ]; do finish_one; done
fi

id="$(cr_submission_id "$name-report")"
cr_submit "$id" "$(cr_quote python -m contamray.cli report "$out" --out "$out/report" --correction "$correction" --alpha "$alpha")"
ok=1
cr_follow "$id" || ok=0
if [ "$pull" = 1 ]; then cr_pull "$out/report" "$name" || ok=0; fi
[ "$failed" -eq 0 ] || echo "$failed of ${#models[@]} model job(s) failed; see \`ray job logs <id>\`" >&2
[ "$ok" = 1 ] && [ "$failed" -eq 0 ]
