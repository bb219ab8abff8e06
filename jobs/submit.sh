#!/usr/bin/env bash
# Submit one contamray run to a Ray cluster and follow it.
#   RAY_ADDRESS=http://<head>:8265 jobs/submit.sh +exp=llama2_openllm [overrides...]
# The working directory (this checkout) is uploaded; the job's driver runs on the head node, and the
# engine actors land where the config's num_gpus asks for them.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${RAY_ADDRESS:?set RAY_ADDRESS to the cluster's dashboard address, e.g. http://head:8265}"
exec ray job submit --working-dir . \
  --runtime-env-json '{"excludes": ["outputs", "multirun", ".git"]}' \
  --entrypoint-num-cpus 1 \
  -- python -m contamray.run "$@"
