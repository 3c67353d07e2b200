#!/bin/bash
# gpuwatch against a real GPU box: run on the lent GPU machine from the repository root, with
# a wheel of gpuwatch in dist/ (built here: `pip wheel --no-deps -w dist .`). Everything it
# sees goes to $OUT: raw nvidia-smi output in the probe's exact query formats (idle and under
# a real PyTorch load), the probe's own documents (NVML and nvidia-smi paths), and
# `gpuwatch --once --json` through a run's life: training, SIGKILL, relaunch, an orphaned
# rank holding VRAM, reap; then torchrun's two ranks left behind by a SIGKILLed torchrun, as
# seen by a gpuwatch that watched it die and by one started after. It changes no GPU setting
# (power, clocks, MIG, persistence).
set -u
OUT=${OUT:?}
REPO=$(pwd)
PY=$(command -v python3)
WORK=$(mktemp -d /tmp/gwdev.XXXX)
export XDG_STATE_HOME=$WORK/state XDG_CACHE_HOME=$WORK/cache XDG_CONFIG_HOME=$WORK/config
mkdir -p "$OUT/smi" "$OUT/once" "$OUT/probe" "$WORK/run"
log() { echo "== $(date +%T) $*"; }

log setup
"$PY" -m venv --system-site-packages "$WORK/venv" >/dev/null
"$WORK/venv/bin/pip" install -q --no-deps --no-index "$REPO"/dist/gpuwatch-*.whl || exit 1
GW="$WORK/venv/bin/gpuwatch"
{ nvidia-smi --version; "$PY" --version; "$PY" -c "import pynvml, torch; print('nvidia-ml-py', pynvml.__file__, 'torch', torch.__version__)"; uname -r; } > "$OUT/versions.txt" 2>&1
cat > "$WORK/config.toml" <<TOML
interval = 2
[hosts.box]
ssh = "local"
python = "$PY"
disks = ["/", "/tmp"]
[hosts.box.runs.mlp]
process = "train_gpu.py"
workdir = "$WORK/run"
log = "train.log"
events = "runs"
checkpoints = "outputs/checkpoint-*"
relaunch = "$PY train_gpu.py --resume {latest_checkpoint}"
detach = "setsid"
TOML
cp "$REPO/tests/device/train_gpu.py" "$REPO/tests/device/orphan_gpu.py" "$WORK/run/"

# The probe's own queries, from box/gpus_smi.py, in both formats nvidia-smi has (header and
# units on, as `nvidia-smi --format=csv` prints; off, as the probe asks).
QUERIES=$("$PY" - "$REPO/remote/box/gpus_smi.py" <<'PYEOF'
import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
consts = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
          for t in n.targets if isinstance(t, ast.Name) and t.id in ("SMI_GPU_QUERY", "SMI_APP_QUERY")}
for fam in ("clocks_event_reasons", "clocks_throttle_reasons"):
    print(",".join(f.format(reasons=fam) for f in consts["SMI_GPU_QUERY"]))
print(",".join(consts["SMI_APP_QUERY"]))
PYEOF
)
Q_EVENT=$(sed -n 1p <<<"$QUERIES"); Q_THROTTLE=$(sed -n 2p <<<"$QUERIES"); Q_APPS=$(sed -n 3p <<<"$QUERIES")
echo "$QUERIES" > "$OUT/smi/queries.txt"
smi_set() {  # $1: label
    nvidia-smi --query-gpu="$Q_EVENT" --format=csv > "$OUT/smi/$1.gpu-event.csv" 2>&1
    nvidia-smi --query-gpu="$Q_EVENT" --format=csv,noheader,nounits > "$OUT/smi/$1.gpu-event.noheader-nounits.csv" 2>&1
    nvidia-smi --query-gpu="$Q_THROTTLE" --format=csv > "$OUT/smi/$1.gpu-throttle.csv" 2>&1
    nvidia-smi --query-compute-apps="$Q_APPS" --format=csv > "$OUT/smi/$1.apps.csv" 2>&1
    nvidia-smi --query-compute-apps="$Q_APPS" --format=csv,noheader,nounits > "$OUT/smi/$1.apps.noheader-nounits.csv" 2>&1
    nvidia-smi -q -d MEMORY > "$OUT/smi/$1.q-memory.txt" 2>&1
}
once() {  # $1: label; the rest: gpuwatch arguments
    local label=$1; shift
    "$GW" --once --json --config "$WORK/config.toml" "$@" > "$OUT/once/$label.json" 2> "$OUT/once/$label.err"
    echo "$label: exit $?" | tee -a "$OUT/once/exits.txt"
}
probe_docs() {  # $1: label. The probe run by hand on both GPU paths, documents kept.
    for path in nvml smi; do
        "$PY" - "$REPO" "$path" "$OUT/probe/$1.$path.json" <<'PYEOF'
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from remote.wire import bundle as probe_bundle  # stdlib only
request = {"v": 1, "disks": ["/"], "runs": [], "want": {"discover": False}, "compress": False}
if sys.argv[2] == "smi":
    request["want"]["nvml"] = False
doc = subprocess.run(probe_bundle.build_command(sys.executable), shell=True,
                     input=probe_bundle.build_stdin(request), capture_output=True, check=True).stdout
json.dump(json.loads(doc), open(sys.argv[3], "w"), indent=1)
PYEOF
    done
}

log idle captures
nvidia-smi -q > "$OUT/smi/idle.q.txt" 2>&1
nvidia-smi --help-query-gpu > "$OUT/smi/help-query-gpu.txt" 2>&1
smi_set idle; probe_docs idle
once idle

log start training
cd "$WORK/run" && setsid nohup "$PY" train_gpu.py > train.log 2>&1 < /dev/null &
cd "$REPO"
for i in $(seq 60); do grep -q "^step 100 " "$WORK/run/train.log" 2>/dev/null && break; sleep 1; done
tail -2 "$WORK/run/train.log"
for i in 1 2 3; do smi_set "load$i"; sleep 1; done
nvidia-smi -q -d PERFORMANCE,CLOCK,POWER > "$OUT/smi/load.q-perf-clock-power.txt" 2>&1
probe_docs load
for i in 1 2 3; do once "train$i"; sleep 2; done
XDG_CONFIG_HOME=$WORK/empty XDG_STATE_HOME=$WORK/state-discover "$GW" --once --json local > "$OUT/once/discover.json" 2> "$OUT/once/discover.err"; echo "discover: exit $?" >> "$OUT/once/exits.txt"
for i in $(seq 40); do ls -d "$WORK"/run/outputs/checkpoint-* >/dev/null 2>&1 && break; sleep 1; done

log kill the run
pkill -KILL -f train_gpu.py; sleep 3
once dead
"$GW" relaunch --config "$WORK/config.toml" box mlp --yes > "$OUT/once/relaunch.txt" 2>&1; echo "relaunch: exit $?" >> "$OUT/once/exits.txt"
for i in $(seq 60); do grep -q "resumed from" "$WORK/run/train.log" && grep -q "^step .*" <(sed -n '/resumed from/,$p' "$WORK/run/train.log" | tail -1) && break; sleep 1; done
sleep 10; once relaunched
pkill -TERM -f train_gpu.py; sleep 5

log orphaned rank
cd "$WORK/run" && setsid "$PY" orphan_gpu.py --gib 6 > orphan.log 2>&1 < /dev/null
cd "$REPO"; cat "$WORK/run/orphan.log"
ps -eo pid,ppid,sid,stat,cmd | grep '[o]rphan_gpu' > "$OUT/once/orphan-ps.txt"
for i in 1 2 3 4; do once "orphan$i"; sleep 2; done
smi_set orphan
"$GW" reap --config "$WORK/config.toml" box --yes > "$OUT/once/reap.txt" 2>&1; echo "reap: exit $?" >> "$OUT/once/exits.txt"
sleep 2; smi_set after-reap; once after-reap
pkill -KILL -f orphan_gpu.py

log torchrun ranks orphaned  # its ranks lead sessions of their own (torch 2.11)
TORCHRUN=$(dirname "$PY")/torchrun
cd "$WORK/run" && setsid nohup "$TORCHRUN" --nproc_per_node=2 orphan_gpu.py rank 2 > torchrun.log 2>&1 < /dev/null &
cd "$REPO"
for i in $(seq 60); do [ "$(grep -c 'rank holds' "$WORK/run/torchrun.log" 2>/dev/null)" = 2 ] && break; sleep 1; done
TR=$(pgrep -f 'torchrun --nproc_per_node=2 orphan_gpu')
ps -eo pid,ppid,pgid,sid,stat,cmd | grep '[o]rphan_gpu' > "$OUT/once/torchrun-ps.txt"
once torchrun-alive
kill -KILL "$TR"; sleep 2
ps -eo pid,ppid,pgid,sid,stat,cmd | grep '[o]rphan_gpu' >> "$OUT/once/torchrun-ps.txt"
for i in 1 2 3; do once "torchrun-orphans$i"; sleep 2; done
# A gpuwatch that never saw torchrun alive: a store of its own.
for i in 1 2 3; do XDG_STATE_HOME=$WORK/state-late "$GW" --once --json --config "$WORK/config.toml" > "$OUT/once/torchrun-late$i.json" 2>&1; echo "torchrun-late$i: exit $?" >> "$OUT/once/exits.txt"; sleep 2; done
"$GW" reap --config "$WORK/config.toml" box --yes > "$OUT/once/torchrun-reap.txt" 2>&1; echo "torchrun-reap: exit $?" >> "$OUT/once/exits.txt"
pkill -KILL -f orphan_gpu.py
cp "$WORK/run/train.log" "$OUT/train.log"
ls -la "$WORK/state/gpuwatch/" > "$OUT/state-ls.txt" 2>&1
log done
