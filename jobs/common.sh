# Shared helpers of the jobs/ scripts (sourced, not run). Each script documents its own usage.
#
# Environment (all optional except RAY_ADDRESS):
#   RAY_ADDRESS                      the cluster's dashboard, e.g. http://head:8265 (`ray job submit` reads it)
#   CONTAMRAY_OUTPUT_ROOT            absolute directory on the head node that receives run outputs
#                                    (default /home/ubuntu/contamray-outputs, the cluster.yaml user's home)
#   CLUSTER_YAML                     the launcher file of the cluster (cluster.yaml, cluster-onprem.yaml):
#                                    reports are pulled with `ray rsync-down $CLUSTER_YAML ...`
#   CONTAMRAY_PULL_DIR               local directory that receives pulled reports (default ./reports)
#   CONTAMRAY_ENTRYPOINT_NUM_CPUS    CPUs reserved for the job's driver (default 1)
#   CONTAMRAY_ENTRYPOINT_RESOURCES   custom resources reserved for the driver (default {"contamray_driver": 1}:
#                                    cluster.yaml and cluster-onprem.yaml give the head node that resource, so
#                                    drivers — and the outputs they write — stay on the head; set it to {}
#                                    on a cluster without it, with a shared CONTAMRAY_OUTPUT_ROOT)
#   CONTAMRAY_RUNTIME_ENV_JSON       the job's runtime_env (default: the checkout as working_dir without
#                                    outputs/.git, plus CONTAMRAY_LOG=INFO); add env_vars such as HF_HOME here
#   CONTAMRAY_JOBS_DRY_RUN=1         print the ray commands instead of running them
#   CONTAMRAY_SUBMIT_WAIT_S          how long a submission waits for a just-started head's job agent (120)

CR_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CR_OUTPUT_ROOT="${CONTAMRAY_OUTPUT_ROOT:-/home/ubuntu/contamray-outputs}"
CR_PULL_DIR="${CONTAMRAY_PULL_DIR:-./reports}"
CR_NUM_CPUS="${CONTAMRAY_ENTRYPOINT_NUM_CPUS:-1}"
CR_DEFAULT_RESOURCES='{"contamray_driver": 1}'
CR_DEFAULT_RUNTIME_ENV='{"excludes": ["outputs", "multirun", "reports", ".git", "*.egg-info"], "env_vars": {"CONTAMRAY_LOG": "INFO"}}'
CR_RESOURCES="${CONTAMRAY_ENTRYPOINT_RESOURCES:-$CR_DEFAULT_RESOURCES}"
CR_RUNTIME_ENV="${CONTAMRAY_RUNTIME_ENV_JSON:-$CR_DEFAULT_RUNTIME_ENV}"
CR_DRY_RUN="${CONTAMRAY_JOBS_DRY_RUN:-0}"

cr_die() { echo "$(basename "$0"): $*" >&2; exit 2; }

cr_require_cluster() {
  if [ "$CR_DRY_RUN" != 1 ] && [ -z "${RAY_ADDRESS:-}" ]; then
    cr_die "set RAY_ADDRESS to the cluster's dashboard address, e.g. RAY_ADDRESS=http://head:8265"
  fi
  case "$CR_OUTPUT_ROOT" in
    /*) ;;
    *) cr_die "CONTAMRAY_OUTPUT_ROOT must be an absolute path on the head node, got '$CR_OUTPUT_ROOT'" ;;
  esac
}

# A submission id that names the sweep and is unique: contamray-<name>-<utc time>.
cr_submission_id() { echo "contamray-$1-$(date -u +%Y%m%d-%H%M%S)-$$-${RANDOM}"; }

# The quoted shell command line of its arguments (the job's entrypoint runs in a shell on the cluster).
cr_quote() { local out="" a; for a in "$@"; do out+="$(printf '%q' "$a") "; done; echo "${out% }"; }

cr_run() {
  if [ "$CR_DRY_RUN" = 1 ]; then echo "+ $(cr_quote "$@")"; else "$@"; fi
}

# cr_submit ID SCRIPT: submit without waiting (the checkout is uploaded as the working dir). SCRIPT is a
# shell command line; `ray job submit` quotes each entrypoint word, so it is passed as `sh -c SCRIPT`.
# A head that has just started may not have its job agent yet: Ray refuses the submission ("No available agent to
# submit job, please try again later"; no job is created) and it is tried again every 5 s for up to
# CONTAMRAY_SUBMIT_WAIT_S seconds (default 120). Any other refusal is final.
cr_submit() {
  local id="$1" script="$2" out waited=0
  local cmd=(ray job submit --no-wait --submission-id "$id" --working-dir "$CR_REPO"
             --runtime-env-json "$CR_RUNTIME_ENV"
             --entrypoint-num-cpus "$CR_NUM_CPUS" --entrypoint-resources "$CR_RESOURCES" -- sh -c "$script")
  [ "$CR_DRY_RUN" = 1 ] && { cr_run "${cmd[@]}"; return; }
  until out="$("${cmd[@]}" 2>&1)"; do
    if [[ "$out" != *"No available agent to submit job"* ]] || [ "$waited" -ge "${CONTAMRAY_SUBMIT_WAIT_S:-120}" ]; then
      printf '%s\n' "$out" >&2
      return 1
    fi
    echo "job $id: the head has no job agent yet (Ray: no available agent); submitting again in 5 s" >&2
    sleep 5
    waited=$((waited + 5))
  done
  printf '%s\n' "$out"
}

# cr_status ID: PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED (the Jobs SDK; the CLI's text is for people).
cr_status() {
  python -c 'import sys
from ray.job_submission import JobSubmissionClient
print(JobSubmissionClient().get_job_status(sys.argv[1]).value)' "$1" 2>/dev/null || echo UNKNOWN
}

cr_ended() { case "$1" in SUCCEEDED|FAILED|STOPPED) return 0 ;; *) return 1 ;; esac; }

# cr_follow ID: stream the job's logs until it ends; returns 0 only if it SUCCEEDED.
cr_follow() {
  local id="$1" status waited=0
  [ "$CR_DRY_RUN" = 1 ] && { cr_run ray job logs --follow "$id"; return 0; }
  status="$(cr_status "$id")"
  while [ "$status" = PENDING ] || [ "$status" = UNKNOWN ]; do
    sleep 5; waited=$((waited + 5)); status="$(cr_status "$id")"
    if [ "$waited" -eq 60 ] && [ "$status" = PENDING ]; then
      echo "job $id is still PENDING after 60 s: no node offers entrypoint resources $CR_RESOURCES with" \
           "$CR_NUM_CPUS CPU(s). Start the head with --resources='{\"contamray_driver\": 8}' (cluster.yaml does)" \
           "or set CONTAMRAY_ENTRYPOINT_RESOURCES='{}'." >&2
    fi
  done
  ray job logs --follow "$id" || true
  until cr_ended "$status"; do sleep 2; status="$(cr_status "$id")"; done
  echo "job $id: $status"
  [ "$status" = SUCCEEDED ]
}

# cr_pull REMOTE_DIR NAME: copy a report directory from the head into $CR_PULL_DIR/NAME.
#   - the directory is visible here (a local cluster, or a filesystem shared at the same path): copied;
#   - CLUSTER_YAML is set: `ray rsync-down` over the launcher's SSH;
#   - otherwise: say where the report is and how to fetch it.
cr_pull() {
  local remote="$1" local_dir="$CR_PULL_DIR/$2"
  if [ "$CR_DRY_RUN" = 1 ]; then
    echo "+ pull $remote -> $local_dir"
    return 0
  fi
  mkdir -p "$local_dir"
  if [ -d "$remote" ]; then
    cp -R "$remote/." "$local_dir/"
  elif [ -n "${CLUSTER_YAML:-}" ]; then
    ray rsync-down "$CLUSTER_YAML" "$remote/" "$local_dir/"
  else
    echo "the report is on the head node at $remote; fetch it with" \
         "ray rsync-down <cluster yaml> $remote/ $local_dir/ (or set CLUSTER_YAML and re-run jobs/report.sh)" >&2
    return 1
  fi
  echo "report: $local_dir/report.html"
}
