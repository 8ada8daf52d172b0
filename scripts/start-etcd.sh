#!/usr/bin/env bash
# Start a throwaway single-node etcd on 127.0.0.1:2379 for coord's tests and benches.
#
# Idempotent: when something already answers on 127.0.0.1:2379 it only prints
# the endpoints. Otherwise it installs etcd when missing (Debian/Ubuntu package
# `etcd-server`), starts it in the background on a fresh temporary data
# directory, waits until it is healthy and prints the endpoints.
#
#   scripts/start-etcd.sh
#   export COORD_TEST_ETCD_ENDPOINTS=127.0.0.1:2379
#
# Environment: ETCD_LOG (log file, default <data-dir>/etcd.log),
# ETCD_WAIT_SECS (how long to wait for health, default 30).
set -euo pipefail

ENDPOINT=127.0.0.1:2379
PEER=127.0.0.1:2380
WAIT_SECS=${ETCD_WAIT_SECS:-30}

healthy() {
    if command -v etcdctl >/dev/null 2>&1; then
        ETCDCTL_API=3 etcdctl --endpoints "$ENDPOINT" --dial-timeout=1s --command-timeout=2s \
            endpoint health >/dev/null 2>&1
    else
        curl -fsS --max-time 2 "http://$ENDPOINT/health" 2>/dev/null | grep -q '"health":"true"'
    fi
}

if healthy; then
    echo "etcd already answers on $ENDPOINT"
    echo "COORD_TEST_ETCD_ENDPOINTS=$ENDPOINT"
    exit 0
fi

if ! command -v etcd >/dev/null 2>&1; then
    echo "etcd not found; installing etcd-server" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get install -y etcd-server >&2 || {
        $SUDO apt-get update >&2 && $SUDO apt-get install -y etcd-server >&2
    }
fi

DATA_DIR=$(mktemp -d -t coord-etcd.XXXXXX)
LOG=${ETCD_LOG:-$DATA_DIR/etcd.log}

# setsid + nohup: etcd outlives this script and the shell that ran it.
setsid nohup etcd \
    --name default \
    --data-dir "$DATA_DIR" \
    --listen-client-urls "http://$ENDPOINT" \
    --advertise-client-urls "http://$ENDPOINT" \
    --listen-peer-urls "http://$PEER" \
    --initial-advertise-peer-urls "http://$PEER" \
    --initial-cluster "default=http://$PEER" \
    >"$LOG" 2>&1 </dev/null &
PID=$!
echo "$PID" >"$DATA_DIR/etcd.pid"

for _ in $(seq 1 $((WAIT_SECS * 4))); do
    if healthy; then
        echo "etcd started (pid $PID, data $DATA_DIR, log $LOG)"
        echo "COORD_TEST_ETCD_ENDPOINTS=$ENDPOINT"
        exit 0
    fi
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "etcd exited during startup; last log lines:" >&2
        tail -n 20 "$LOG" >&2 || true
        exit 1
    fi
    sleep 0.25
done
echo "etcd did not become healthy within ${WAIT_SECS}s; log: $LOG" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
