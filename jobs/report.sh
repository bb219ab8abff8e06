#!/usr/bin/env bash
# Build the cross-model report of run directories that live on the cluster, and pull it back.
#
#   RAY_ADDRESS=http://<head>:8265 [CLUSTER_YAML=cluster.yaml] \
#     jobs/report.sh [--name NAME] [--correction holm|bh|none] [--alpha A] RUN_OR_SWEEP_DIR...
#
# The directories are paths on the head node (e.g. $CONTAMRAY_OUTPUT_ROOT/zoo-2026-11-01 and an older
# sweep): a sweep directory stands for its runs. The job runs `contamray report` into
# $CONTAMRAY_OUTPUT_ROOT/reports/NAME, which is pulled into ./reports/NAME. Use it to merge sweeps run
# at different times, or to re-draw a report with another correction without recomputing anything.
# Environment knobs (output root, resources, runtime env, dry run): jobs/common.sh.
set -euo pipefail
source "$(dirname "$0")/common.sh"

name="report-$(date -u +%Y%m%d-%H%M%S)" correction=holm alpha=0.05
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --correction) correction="$2"; shift 2 ;;
    --alpha) alpha="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || cr_die "give one or more run or sweep directories on the head node"
cr_require_cluster
out="$CR_OUTPUT_ROOT/reports/$name"
id="$(cr_submission_id "$name")"
cr_submit "$id" "$(cr_quote python -m contamray.cli report "$@" --out "$out" --correction "$correction" --alpha "$alpha")"
echo "submitted $id: $out"
cr_follow "$id"
cr_pull "$out" "$name"
