#!/bin/bash
# A `nohup python ... &` job of a shell with job control, left running when the shell exits
# (a logout), idle on its GPU: gpuwatch must not call it a VRAM zombie. Run on the lent GPU
# machine from the repository root with a wheel in dist/; prints the --once verdicts. Written
# 2026-11-24 when the session's device time had run out: not yet run on a real GPU (the rule it
# checks is tested on the simulator: test_a_shell_job_left_running_at_logout_is_no_zombie).
set -u
PY=$(command -v python3)
WORK=$(mktemp -d /tmp/gwjob.XXXX)
export XDG_STATE_HOME=$WORK/state XDG_CACHE_HOME=$WORK/cache XDG_CONFIG_HOME=$WORK/config
"$PY" -m venv --system-site-packages "$WORK/venv" >/dev/null
"$WORK/venv/bin/pip" install -q --no-deps --no-index dist/gpuwatch-*.whl || exit 1
cp tests/device/orphan_gpu.py "$WORK/"
# set -m: job control, as an interactive shell has: the job gets a process group of its own.
bash -c "set -m; cd $WORK && nohup $PY orphan_gpu.py rank 2 > job.log 2>&1 < /dev/null & echo job \$!"
for i in $(seq 60); do grep -q "rank holds" "$WORK/job.log" 2>/dev/null && break; sleep 1; done
ps -eo pid,ppid,pgid,sid,stat,cmd | grep '[o]rphan_gpu'
for i in 1 2 3 4; do
    "$WORK/venv/bin/gpuwatch" --once --json local > "$WORK/once$i.json"
    "$PY" -c "import json,sys; h=json.load(open(sys.argv[1]))['hosts'][0]; print('poll $i:', [f['code'] for f in h['findings']], [(p['pid'], p['ppid'], p['zombie']) for p in h['processes'] if p['gpu_index'] is not None], h['gpus'][0]['util_pct'])" "$WORK/once$i.json"
    sleep 2
done
pkill -KILL -f "orphan_gpu.py rank"
