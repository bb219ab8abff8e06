#!/usr/bin/env bash
# Submit one contamray run to a Ray cluster, follow it, and pull its report back.
#
#   RAY_ADDRESS=http://<head>:8265 [CLUSTER_YAML=cluster.yaml] \
#     jobs/submit.sh [--name NAME] [--correction holm|bh|none] [--alpha A] [--no-pull] \
#                    +exp=llama2_openllm [hydra overrides...]
#
# The checkout is uploaded as the job's working dir; the driver runs on the head node (entrypoint
# resources, see jobs/common.sh) and writes the run to $CONTAMRAY_OUTPUT_ROOT/NAME on the head, then
# `contamray report` writes NAME/report/ (report.html, tables.md, cells.csv, plots/), which is pulled
# into ./reports/NAME. Engine actors land where the config's num_gpus asks (GPU workers).
# Re-submitting with the same --name reuses the finished cells of an interrupted run.
# Environment knobs (output root, resources, runtime env, dry run): jobs/common.sh.
set -euo pipefail
source "$(dirname "$0")/common.sh"

name="run-$(date -u +%Y%m%d-%H%M%S)" correction=holm alpha=0.05 pull=1
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
cr_require_cluster
out="$CR_OUTPUT_ROOT/$name"
run="$(cr_quote python -m contamray.run "hydra.run.dir=$out" "$@")"
report="$(cr_quote python -m contamray.cli report "$out" --out "$out/report" --correction "$correction" --alpha "$alpha")"
id="$(cr_submission_id "$name")"
cr_submit "$id" "$run && $report"
echo "submitted $id: $out"
cr_follow "$id"
if [ "$pull" = 1 ]; then cr_pull "$out/report" "$name"; fi
