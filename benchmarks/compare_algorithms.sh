#!/usr/bin/env bash
# Every algorithm on the same partition and the same sampled clients, one after another,
# through `flwr run` in Flower's simulation; then a Markdown table of the results.
#
#   DATASET_PATH=../shared/data/fashion_mnist benchmarks/compare_algorithms.sh [algo ...]
#
# Settings: 20 clients, alpha 0.1, fraction-train 0.25, local-epochs 1,
# 10 rounds, seed 0. Override with ROUNDS, CLIENTS, EXTRA (more --run-config pairs).
set -euo pipefail
cd "$(dirname "$0")/.."
DATASET_PATH=$(realpath "${DATASET_PATH:?set DATASET_PATH to a folder with train/test.parquet}")
OUT=$(realpath -m "${OUT:-benchmarks/out/compare}")
ROUNDS=${ROUNDS:-10}
CLIENTS=${CLIENTS:-20}
ALGOS=${*:-fedreg fedavg fedprox feddyn ditto fedper fedrep fedbabu gpfl fedrod}
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export FLWR_DISABLE_UPDATE_CHECK=1 FLWR_TELEMETRY_ENABLED=0 RAY_DEDUP_LOGS=0
mkdir -p "$OUT"
for algo in $ALGOS; do
  echo "== $algo"
  flwr run . --stream \
    --run-config "algo='$algo' dataset-path='$DATASET_PATH' alpha=0.1 fraction-train=0.25 local-epochs=1 num-server-rounds=$ROUNDS seed=0 results-dir='$OUT/$algo' ${EXTRA:-}" \
    --federation-config "num-supernodes=$CLIENTS client-resources-num-cpus=1" \
    > "$OUT/$algo.log" 2>&1
  grep -E "^\S*INFO.*(round|best)" "$OUT/$algo.log" | tail -2 || true
done
python benchmarks/summarize.py $(for a in $ALGOS; do echo "$OUT/$a"; done)
