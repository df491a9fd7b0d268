#!/usr/bin/env bash
# Run AMWA's nmos-testing (IS-04-01, IS-05-01, IS-05-02) against a real mp-edge, offline.
#
# Everything runs inside a network namespace this script creates (a veth pair with both ends in
# the namespace, 10.213.250.1/24 on one end, a default route on it), so the mock registries'
# mDNS adverts, the edge's mDNS browse and all HTTP stay inside it. Needs root (ip netns).
#
# Inputs (local snapshots, no network but PyPI for the venv):
#   NMOS_MIRROR   dir holding AMWA-TV+<repo>/repo git dirs (default /work/.mirror): nmos-testing,
#                 is-04, is-05, bcp-002-01, bcp-002-02, bcp-004-01, nmos-parameter-registers
#   WORK          scratch dir (default /tmp/nmos-conformance): tool export, venv, configs, results
#   SUITES        default "IS-04-01 IS-05-01 IS-05-02"
#   EDGE_BIN      default <repo>/.venv/bin/mp-edge
# Usage: sudo bash tools/nmos_conformance.sh   (results: $WORK/results/<suite>.json and .log, edge logs)
# Each suite gets a fresh edge from the same config (IS-05 activations persist into config.json).
# Offline patches to nmos-testing (no test logic changed): spec repos are cloned into cache/ from
# the local snapshots with a far-future cache/last_pull (so no git pull), and a UserConfig.py sets
# repo=None for the specs not needed by these suites and BIND_INTERFACE to the namespace's veth.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
NMOS_MIRROR=${NMOS_MIRROR:-/work/.mirror}
WORK=${WORK:-/tmp/nmos-conformance}
SUITES=${SUITES:-"IS-04-01 IS-05-01 IS-05-02"}
EDGE_BIN=${EDGE_BIN:-$REPO/.venv/bin/mp-edge}
NS=${NS:-mpconf$$}
IF0=nmc0$$ IF1=nmc1$$
IF0=${IF0:0:15} IF1=${IF1:0:15}
ADDR=10.213.250.1
PORT=8080
TOOL=$WORK/nmos-testing
VENV=$WORK/venv
SPECS="is-04 is-05 bcp-002-01 bcp-002-02 bcp-004-01 nmos-parameter-registers"
EDGE_PID=

log() { printf '== %s\n' "$*" >&2; }

cleanup() {
    if [[ -n "$EDGE_PID" ]] && kill -0 "$EDGE_PID" 2>/dev/null; then
        kill -TERM "$EDGE_PID" 2>/dev/null || true
        for _ in $(seq 1 60); do kill -0 "$EDGE_PID" 2>/dev/null || break; sleep 0.25; done
        kill -KILL "$EDGE_PID" 2>/dev/null || true
    fi
    if ip netns list 2>/dev/null | grep -qw "$NS"; then
        for pid in $(ip netns pids "$NS" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns del "$NS" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# ---------------------------------------------------------------- the tool, its specs, its venv
if [[ ! -f $TOOL/nmos-test.py ]]; then
    log "exporting nmos-testing from $NMOS_MIRROR/AMWA-TV+nmos-testing/repo"
    mkdir -p "$TOOL"
    git --git-dir="$NMOS_MIRROR/AMWA-TV+nmos-testing/repo" archive HEAD | tar -x -C "$TOOL"
fi
mkdir -p "$TOOL/cache"
for spec in $SPECS; do
    [[ -d $TOOL/cache/$spec/.git ]] || git clone -q "$NMOS_MIRROR/AMWA-TV+$spec/repo" "$TOOL/cache/$spec"
done
python3 - "$TOOL/cache/last_pull" <<'EOF'
import datetime, pickle, sys
with open(sys.argv[1], "wb") as f:
    pickle.dump(datetime.datetime.now() + datetime.timedelta(days=3650), f)  # never git pull
EOF
cat > "$TOOL/nmostesting/UserConfig.py" <<EOF
from . import Config as CONFIG
_HAVE = {$(printf '"%s", ' $SPECS)"testing-facade"}
for _k in list(CONFIG.SPECIFICATIONS):
    if _k not in _HAVE:
        CONFIG.SPECIFICATIONS[_k]["repo"] = None  # not cloned: offline, and not used by these suites
CONFIG.BIND_INTERFACE = "$IF0"
CONFIG.ENABLE_DNS_SD = True
CONFIG.DNS_SD_MODE = "multicast"
EOF
if [[ ! -x $VENV/bin/python ]]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -r "$TOOL/requirements.txt" >"$WORK/pip.log" 2>&1 \
        || { cat "$WORK/pip.log" >&2; exit 1; }
fi

# ---------------------------------------------------------------- the namespace
log "network namespace $NS ($IF0 $ADDR/24)"
ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link add "$IF0" type veth peer name "$IF1"
ip -n "$NS" addr add "$ADDR/24" dev "$IF0"
ip -n "$NS" link set "$IF0" up
ip -n "$NS" link set "$IF1" up
ip -n "$NS" route add default dev "$IF0"
in_ns() { ip netns exec "$NS" "$@"; }

write_config() {
    local dir=$1
    rm -rf "$dir"
    mkdir -p "$dir"
    chmod 700 "$dir"
    cat > "$dir/config.json" <<EOF
{
  "version": 1,
  "node_id": "5d1f9b6e-3a2c-4c1b-9f5e-0a1b2c3d4e5f",
  "device_name": "Conformance edge",
  "setup_enabled": false,
  "server": {"listen_addr": "$ADDR", "listen_port": $PORT},
  "nmos": {"enabled": true, "label": "mediaplane conformance edge"},
  "flows": [
    {"id": "cam1", "name": "Camera 1", "enabled": true,
     "input": {"type": "rtp", "bind_addr": "127.0.0.1:15000"},
     "outputs": [
       {"id": "o-rtp", "name": "RTP out", "type": "rtp", "dest_addr": "127.0.0.1:15100"},
       {"id": "o-srt", "name": "SRT out", "type": "srt", "mode": "caller",
        "local_addr": "0.0.0.0:0", "remote_addr": "127.0.0.1:15200"},
       {"id": "o-udp", "name": "UDP out", "type": "udp", "dest_addr": "127.0.0.1:15300"}
     ]},
    {"id": "cam3", "name": "Camera 3 (UDP in)", "enabled": true,
     "input": {"type": "udp", "bind_addr": "127.0.0.1:15400"},
     "outputs": []},
    {"id": "cam2", "name": "Camera 2 (2022-7)", "enabled": true,
     "input": {"type": "rtp", "bind_addr": "127.0.0.1:15010", "redundancy": {"bind_addr": "127.0.0.1:15012"}},
     "outputs": [
       {"id": "o-rtp7", "name": "RTP 2022-7 out", "type": "rtp", "dest_addr": "127.0.0.1:15110",
        "redundancy": {"dest_addr": "127.0.0.1:15112"}}
     ]}
  ]
}
EOF
    chmod 600 "$dir/config.json"
}

start_edge() {
    local dir=$1 logf=$2
    in_ns "$EDGE_BIN" --config-dir "$dir" --log-level info >"$logf" 2>&1 &
    EDGE_PID=$!
    for _ in $(seq 1 120); do
        if in_ns curl -sf -o /dev/null "http://$ADDR:$PORT/x-nmos/node/v1.3/self"; then return 0; fi
        kill -0 "$EDGE_PID" 2>/dev/null || { cat "$logf" >&2; return 1; }
        sleep 0.5
    done
    log "edge did not answer in 60 s"; cat "$logf" >&2; return 1
}

stop_edge() {
    [[ -n "$EDGE_PID" ]] || return 0
    kill -TERM "$EDGE_PID" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$EDGE_PID" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$EDGE_PID" 2>/dev/null || true
    wait "$EDGE_PID" 2>/dev/null || true
    EDGE_PID=
}

summarise() {
    python3 - "$@" <<'EOF'
import collections, json, sys
for path in sys.argv[1:]:
    try:
        data = json.load(open(path))
    except (OSError, ValueError) as exc:
        print(f"{path}: no results ({exc})")
        continue
    results = data["results"]
    counts = collections.Counter(r["state"] for r in results)
    print(f"\n## {data['suite']}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for r in results:
        if r["state"] in ("Fail", "Warning", "Could Not Test", "Manual", "Not Implemented"):
            print(f"  {r['state']:16} {r['name']:12} {r.get('detail', '')}")
EOF
}

# ---------------------------------------------------------------- the suites
mkdir -p "$WORK/results"
outputs=()
for suite in $SUITES; do
    case $suite in
        IS-04-01) args=(--host "$ADDR" --port "$PORT" --version v1.3) ;;
        IS-05-01) args=(--host "$ADDR" --port "$PORT" --version v1.1) ;;
        IS-05-02) args=(--host "$ADDR" "$ADDR" --port "$PORT" "$PORT" --version v1.3 v1.1) ;;
        *) log "unknown suite $suite"; continue ;;
    esac
    write_config "$WORK/edge-$suite"
    start_edge "$WORK/edge-$suite" "$WORK/results/edge-$suite.log"
    out=$WORK/results/$suite.json
    rm -f "$out"
    log "running $suite (${args[*]})"
    (cd "$TOOL" && timeout 1200 ip netns exec "$NS" "$VENV/bin/python" nmos-test.py suite "$suite" "${args[@]}" \
        --output "$out" >"$WORK/results/$suite.log" 2>&1) || true  # exit 2 when any test fails
    stop_edge
    outputs+=("$out")
done
summarise "${outputs[@]}"
