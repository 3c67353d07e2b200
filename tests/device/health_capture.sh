#!/bin/bash
# shellcheck disable=SC2034  # the query sets are read through ${!v}
# GPU health capture (issue 30): run on a lent GPU machine from the repository root as
#     OUT=/some/dir bash tests/device/health_capture.sh
# Everything nvidia-smi, NVML, sysfs and the kernel log say about ECC, row remapping, page
# retirement, the GPU recovery action, PCIe link and replays, MIG, clock event reasons and
# per-process utilisation, idle and under a small torch load; each command's output with its
# exit status, in ONE file $OUT/health.tgz, and a short $OUT/summary.txt.
#
# READ-ONLY: it changes no GPU setting (no -pm, -pl, -lgc, -ac, -mig, -e, -r, reset, no NVML
# setter). Every command is bounded (timeout) and may fail without stopping the rest; the
# whole takes well under 2 minutes.
set -u
OUT=${OUT:?set OUT to the output folder}
REPO=$(pwd)
HERE=$REPO/tests/device
PY=$(command -v python3 || echo python3)
WORK=$(mktemp -d /tmp/gwhealth.XXXX)
D=$WORK/health
mkdir -p "$D" "$OUT"
STARTED=$(date +%s)
EXITS=$D/exits.tsv
printf 'name\texit\tseconds\tcommand\n' > "$EXITS"

# cap NAME CMD...: stdout and stderr of CMD (bounded to 20 s) into $D/NAME.txt, exit status
# and time into exits.tsv. Never fails.
cap() {
    local name=$1; shift
    local t0 t1 rc
    if [ $(( $(date +%s) - STARTED )) -gt 100 ]; then  # keep the whole under 2 minutes
        printf '%s\tskipped\t0\t%s\n' "$name" "$*" >> "$EXITS"
        return 0
    fi
    t0=$(date +%s.%N)
    case $name in *.csv) ;; *) name=$name.txt ;; esac
    timeout -k 2 20 "$@" > "$D/$name" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    printf '%s\t%s\t%.2f\t%s\n' "$name" "$rc" "$(awk "BEGIN { print $t1 - $t0 }")" "$*" >> "$EXITS"
    return 0
}
# capsh NAME 'shell text': the same for a pipeline.
capsh() { local name=$1; shift; cap "$name" bash -c "$1"; }

# ------------------------------------------------------------------ versions, help
capsh versions "nvidia-smi --version; $PY --version; cat /proc/driver/nvidia/version; uname -a; \
$PY -c 'import pynvml; print(\"pynvml\", pynvml.__file__)'; \
$PY -c 'import torch; print(\"torch\", torch.__version__, torch.version.cuda)'"
cap smi-h nvidia-smi -h
cap help-query-gpu nvidia-smi --help-query-gpu
cap help-query-compute-apps nvidia-smi --help-query-compute-apps
cap L nvidia-smi -L
cap q nvidia-smi -q
# ------------------------------------------------------------------ --query-gpu field sets
ID="index,uuid,pci.bus_id"
ECC="ecc.mode.current,ecc.mode.pending"
for kind in corrected uncorrected; do
    for span in volatile aggregate; do
        for where in total device_memory dram sram l1_cache l2_cache register_file texture_memory cbu; do
            ECC="$ECC,ecc.errors.$kind.$span.$where"
        done
    done
done
ECC_SRAM="ecc.errors.uncorrected.volatile.sram.parity,ecc.errors.uncorrected.volatile.sram.secded,ecc.errors.uncorrected.aggregate.sram.parity,ecc.errors.uncorrected.aggregate.sram.secded,ecc.errors.uncorrected.aggregate.sram.thresholdExceeded"
RETIRED="retired_pages.single_bit_ecc.count,retired_pages.double_bit.count,retired_pages.pending,retired_pages.sbe,retired_pages.dbe"
REMAP="remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure,remapped_rows.correctable_inactive,remapped_rows.uncorrectable_inactive"
HIST="remapped_rows.histogram.max,remapped_rows.histogram.high,remapped_rows.histogram.partial,remapped_rows.histogram.low,remapped_rows.histogram.none"
PCIE="pcie.link.gen.current,pcie.link.gen.gpucurrent,pcie.link.gen.max,pcie.link.gen.gpumax,pcie.link.gen.hostmax,pcie.link.width.current,pcie.link.width.max"
MIG="mig.mode.current,mig.mode.pending"
REASONS="clocks_event_reasons.supported,clocks_event_reasons.active,clocks_event_reasons.gpu_idle,clocks_event_reasons.applications_clocks_setting,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,clocks_event_reasons.hw_thermal_slowdown,clocks_event_reasons.hw_power_brake_slowdown,clocks_event_reasons.sw_thermal_slowdown,clocks_event_reasons.sync_boost"
COUNTERS="clocks_event_reasons_counters.sw_power_cap,clocks_event_reasons_counters.sync_boost,clocks_event_reasons_counters.sw_thermal_slowdown,clocks_event_reasons_counters.hw_thermal_slowdown,clocks_event_reasons_counters.hw_power_brake_slowdown"
RECOVERY="gpu_recovery_action"
BASEQ="index,uuid,name,utilization.gpu,memory.used,memory.total,clocks.sm,clocks.max.sm,power.draw,enforced.power.limit,temperature.gpu,clocks_event_reasons.active,mig.mode.current,pci.bus_id,persistence_mode"
HEALTHQ="ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.aggregate.total,ecc.errors.uncorrected.aggregate.total,retired_pages.pending,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure,gpu_recovery_action,pcie.link.gen.gpucurrent,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,mig.mode.pending"
{
    for v in ID ECC ECC_SRAM RETIRED REMAP HIST PCIE MIG REASONS COUNTERS RECOVERY BASEQ HEALTHQ; do
        printf '%s=%s\n' "$v" "${!v}"
    done
} > "$D/queries.txt"

query_sets() {  # $1: label; the rest: the sets
    local v label=$1; shift
    for v in "$@"; do
        cap "$label.gpu-$v.csv" nvidia-smi --query-gpu="$ID,${!v}" --format=csv
        cap "$label.gpu-$v.noheader-nounits.csv" nvidia-smi --query-gpu="$ID,${!v}" --format=csv,noheader,nounits
    done
    cap "$label.gpu-base+health.csv" nvidia-smi --query-gpu="$BASEQ,$HEALTHQ" --format=csv
    cap "$label.gpu-base+health.noheader-nounits.csv" nvidia-smi --query-gpu="$BASEQ,$HEALTHQ" --format=csv,noheader,nounits
    cap "$label.apps.csv" nvidia-smi --query-compute-apps=gpu_uuid,pid,used_gpu_memory,process_name --format=csv
    cap "$label.apps.noheader-nounits.csv" nvidia-smi --query-compute-apps=gpu_uuid,pid,used_gpu_memory,process_name,gpu_instance_id,compute_instance_id --format=csv,noheader,nounits
}
query_sets idle ECC ECC_SRAM RETIRED REMAP HIST PCIE MIG REASONS COUNTERS RECOVERY HEALTHQ
# one invalid field among valid ones, at the start, middle and end: the exact error text and
# exit status (the probe must detect it and retry without that field)
cap invalid-middle nvidia-smi --query-gpu=index,not.a.field,uuid --format=csv,noheader,nounits
cap invalid-first nvidia-smi --query-gpu=bogus_field,index --format=csv
cap invalid-two nvidia-smi --query-gpu=index,bogus.one,uuid,bogus.two --format=csv,noheader,nounits
cap invalid-apps nvidia-smi --query-compute-apps=pid,bogus_app_field --format=csv
# the throttle family of names, still accepted?
cap old-throttle-names nvidia-smi --query-gpu=index,clocks_throttle_reasons.active,clocks_throttle_reasons.hw_slowdown --format=csv
# ------------------------------------------------------------------ MIG, topology (read only)
cap mig-lgi nvidia-smi mig -lgi
cap mig-lci nvidia-smi mig -lci
cap mig-lgip nvidia-smi mig -lgip
cap topo-m nvidia-smi topo -m

# ------------------------------------------------------------------ NVML, idle
cap nvml-idle-run "$PY" "$HERE/health_nvml.py" dump "$D/nvml-idle.json"

# ------------------------------------------------------------------ sysfs PCIe, kernel log
capsh sysfs-pcie 'for dev in /sys/bus/pci/devices/*; do [ "$(cat "$dev/vendor" 2>/dev/null)" = 0x10de ] || continue; echo "== $dev class=$(cat "$dev/class")"; for f in current_link_speed current_link_width max_link_speed max_link_width aer_dev_correctable aer_dev_fatal aer_dev_nonfatal numa_node; do printf "%s: " "$f"; tr "\n" " " < "$dev/$f" 2>/dev/null; echo; done; done'
cap lspci-nvidia lspci -vvv -d 10de:
capsh dmesg-xid 'dmesg | grep -i -E "xid|nvrm" | tail -400'
capsh dmesg-xid-iso 'dmesg --time-format iso | grep -i -E "xid|nvrm" | tail -400'
capsh journal-xid 'journalctl -k --no-pager -o short-iso 2>/dev/null | grep -i xid | tail -200'
capsh proc-driver-gpus 'for f in /proc/driver/nvidia/gpus/*/information; do echo "== $f"; cat "$f"; done'

# ------------------------------------------------------------------ under a torch load
STOP=$WORK/stop
"$PY" "$HERE/health_nvml.py" load "$STOP" 40 > "$D/load.txt" 2>&1 &
LOAD=$!
for _ in $(seq 1 30); do  # up to 15 s for the load's CUDA context to show
    nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -qw "$LOAD" && break
    kill -0 "$LOAD" 2>/dev/null || break
    sleep 0.5
done
sleep 3  # a few seconds of samples for utilisation and pmon
capsh load-proc-status "cat /proc/$LOAD/status; echo; cat /proc/$LOAD/stat; echo; cat /proc/$LOAD/wchan; echo"
cap pmon nvidia-smi pmon -c 2 -s um
query_sets load REASONS COUNTERS HEALTHQ
cap load-q-d-PIDS nvidia-smi -q -d PIDS
cap load-q-d-PERFORMANCE nvidia-smi -q -d PERFORMANCE
cap nvml-load-run "$PY" "$HERE/health_nvml.py" dump "$D/nvml-load.json"
touch "$STOP"
for _ in $(seq 1 20); do kill -0 "$LOAD" 2>/dev/null || break; sleep 0.5; done
kill "$LOAD" 2>/dev/null
wait "$LOAD" 2>/dev/null
echo "load exit $?" >> "$D/load.txt"
cap q-xml nvidia-smi -q -x
# each -d alone: a name this driver does not know fails only its own file (PCIE is expected
# to be unknown: its replay counter sits in the full -q under "PCI")
for d in ECC ROW_REMAPPER PAGE_RETIREMENT RESET_STATUS PERFORMANCE CLOCK POWER MEMORY \
         UTILIZATION COMPUTE PIDS PCIE; do
    cap "q-d-$d" nvidia-smi -q -d "$d"
done

# what one steady-poll query costs, base vs base+health (5 each)
capsh timing "for q in '$BASEQ' '$BASEQ,$HEALTHQ'; do s=\$(date +%s.%N); for i in 1 2 3 4 5; do nvidia-smi --query-gpu=\"\$q\" --format=csv,noheader,nounits >/dev/null 2>&1; done; e=\$(date +%s.%N); echo \"\$(awk \"BEGIN { print (\$e - \$s) / 5 }\") s per call, \$(nvidia-smi --query-gpu=\"\$q\" --format=csv,noheader,nounits | wc -c) bytes: \$q\"; done"

cap after.gpu-REASONS nvidia-smi --query-gpu="$ID,$REASONS,$COUNTERS" --format=csv

# ------------------------------------------------------------------ pack, summary
ENDED=$(date +%s)
tar czf "$OUT/health.tgz" -C "$WORK" health
{
    echo "health_capture: $((ENDED - STARTED)) s, $(wc -l < "$EXITS") commands, files in health.tgz (tar xzf health.tgz)"
    head -3 "$D/versions.txt"
    echo "-- non-zero exits:"
    awk -F'\t' 'NR > 1 && $2 != 0 { print $2 "\t" $1 }' "$EXITS"
    echo "-- recovery action, remap, ECC totals, PCIe (idle):"
    cat "$D/idle.gpu-HEALTHQ.csv" 2>/dev/null | head -9
    echo "-- invalid field text:"
    head -3 "$D/invalid-middle.txt"
    echo "-- MIG:"
    head -2 "$D/mig-lgi.txt"
    echo "-- load:"
    head -2 "$D/load.txt"
    echo "-- Xid lines in dmesg: $(grep -ci xid "$D/dmesg-xid.txt")"
    echo "-- timing:"
    cat "$D/timing.txt"
    echo "-- nvml recovery action field:"
    "$PY" - "$D/nvml-idle.json" <<'PYEOF' 2>&1 | head -20
import json, sys
doc = json.load(open(sys.argv[1]))
print(doc.get("import_error") or "pynvml %s" % doc.get("pynvml_file"))
for gpu in doc.get("gpus", []):
    for call in gpu["calls"]:
        if call["call"].startswith(("nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY",
                                    "nvmlDeviceGetRemappedRows", "nvmlDeviceGetPcieReplay")):
            print(gpu["index"], call["call"], call.get("result", call.get("error")))
PYEOF
} > "$OUT/summary.txt" 2>&1
rm -rf "$WORK"
cat "$OUT/summary.txt"
