#!/usr/bin/env bash
# Submit a Hydra multirun sweep (a grid) as one Ray job, follow it, and pull the merged report back.
#
#   RAY_ADDRESS=http://<head>:8265 [CLUSTER_YAML=cluster.yaml] \
#     jobs/sweep.sh [--name NAME] [--correction holm|bh|none] [--alpha A] [--no-pull] \
#                   +exp=llama2_openllm 'model=[llama2_7b],[llama2_70b]' run.seed=0,1 [more overrides...]
#
# The overrides are Hydra's: comma-separated values make the grid (`-m` is added here). Every grid
# point is a run in $CONTAMRAY_OUTPUT_ROOT/NAME/<job number>/ on the head; when the sweep ends (or
# fails part-way) `contamray report` merges whatever finished into NAME/report/, which is pulled into
# ./reports/NAME. Quote overrides holding brackets or commas inside one value, as above.
# Environment knobs (output root, resources, runtime env, dry run): jobs/common.sh.
set -euo pipefail
source "$(dirname "$0")/common.sh"

name="sweep-$(date -u +%Y%m%d-%H%M%S)" correction=holm alpha=0.05 pull=1
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
[ $# -gt 0 ] || cr_die "give the sweep's Hydra overrides, e.g. +exp=llama2_openllm 'model=[llama2_7b],[mistral_7b]'"
cr_require_cluster
out="$CR_OUTPUT_ROOT/$name"
sweep="$(cr_quote python -m contamray.run -m "hydra.sweep.dir=$out" "$@")"
report="$(cr_quote python -m contamray.cli report "$out" --out "$out/report" --correction "$correction" --alpha "$alpha")"
id="$(cr_submission_id "$name")"
# the report covers the finished grid points even when one failed; the job's status is the sweep's
cr_submit "$id" "$sweep; rc=\$?; $report; exit \$rc"
echo "submitted $id: $out"
ok=1
cr_follow "$id" || ok=0
if [ "$pull" = 1 ]; then cr_pull "$out/report" "$name" || ok=0; fi
[ "$ok" = 1 ]
