#!/usr/bin/env bash
# What the MLflow UI shows of harness runs, in a real headless browser (issue 27 item 8; docs/reliability.md):
# two tiny runs into a fresh sqlite store, `mlflow ui` on it, Chromium screenshots of the experiment page as MLflow
# opens it and with ?workflowType=machine_learning (its "Model training" view). Needs Chromium (Debian's
# `apt-get install chromium`); the screenshots are PNGs to look at.
#   bash scripts/mlflow_ui_check.sh [OUT_DIR]    (PYTHON: the project's python, default .venv/bin/python; PORT: 5079)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out" && out=$(cd "$out" && pwd)
py=${PYTHON:-$root/.venv/bin/python}
port=${PORT:-5079}
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "error: no chromium on PATH: apt-get install chromium" >&2
  exit 2
fi
db="$out/mlruns.db"
tiny=(trainer.prompts_per_step=4 trainer.group_size=4 trainer.num_minibatches=2 diagnostics.noise_sequences=4
      trainer.steps=3 "tracking.uri=sqlite:///$db" tracking.experiment=ui_check)
cd "$root"
"$py" -m harness.run "${tiny[@]}" "out_dir=$out/runs/a" 2>/dev/null | tail -1
"$py" -m harness.run "${tiny[@]}" estimator=mean_n estimator.n=2 seed=1 "out_dir=$out/runs/b" 2>/dev/null | tail -1
setsid "$py" -m mlflow ui --backend-store-uri "sqlite:///$db" --port "$port" >"$out/ui.log" 2>&1 &
ui=$!  # setsid without a fork: the server's process group is $ui (its uvicorn workers and job consumers too)
stop() { kill -- "-$ui" 2>/dev/null || true; for _ in $(seq 30); do kill -0 "$ui" 2>/dev/null || return 0; sleep 1; done; }
trap stop EXIT
for _ in $(seq 90); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
exp=$("$py" -c "from mlflow.tracking import MlflowClient as C; e = C('sqlite:///$db').get_experiment_by_name('ui_check')
print(e.experiment_id, e.tags.get('mlflow.experimentKind'))")
echo "experiment ${exp% *}, mlflow.experimentKind=${exp#* }"
shot() { timeout 120 "$browser" --headless --no-sandbox --disable-gpu --window-size=1400,900 \
           --virtual-time-budget=20000 --screenshot="$1" "$2" >/dev/null 2>&1; }
shot "$out/experiment.png" "http://127.0.0.1:$port/#/experiments/${exp% *}"
shot "$out/experiment_runs.png" "http://127.0.0.1:$port/#/experiments/${exp% *}?workflowType=machine_learning"
echo "screenshots: $out/experiment.png (as MLflow opens it), $out/experiment_runs.png (workflowType=machine_learning)"
