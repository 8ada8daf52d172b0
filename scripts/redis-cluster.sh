#!/usr/bin/env bash
# A throwaway 3-master Redis Cluster on loopback for coord's tests and benches.
#
#   scripts/redis-cluster.sh [start]   # idempotent: start what is missing, form the cluster once
#   scripts/redis-cluster.sh stop      # shut the three nodes down and forget the cluster
#
# Nodes listen on 127.0.0.1:7001-7003 (no replicas, no persistence). Their
# cluster config files live in $COORD_REDIS_CLUSTER_DIR (default
# /tmp/coord-redis-cluster), so nodes that were stopped by something else
# rejoin the same cluster when started again. `stop` deletes that directory.
# Prints the URL for COORD_TEST_REDIS_CLUSTER_URL on success.
#
# Environment: COORD_REDIS_CLUSTER_DIR, REDIS_CLUSTER_WAIT_SECS (default 30).
set -euo pipefail

PORTS=(7001 7002 7003)
DIR=${COORD_REDIS_CLUSTER_DIR:-/tmp/coord-redis-cluster}
WAIT_SECS=${REDIS_CLUSTER_WAIT_SECS:-30}
URL="redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"

log() { printf '[redis-cluster] %s\n' "$*" >&2; }
cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }
answers() { [ "$(cli "$1" ping 2>/dev/null)" = "PONG" ]; }
state_ok() { cli "${PORTS[0]}" cluster info 2>/dev/null | tr -d '\r' | grep -qx 'cluster_state:ok'; }
info_field() { cli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"; }

stop() {
    for port in "${PORTS[@]}"; do
        if answers "$port"; then
            log "stopping node on 127.0.0.1:$port"
            cli "$port" shutdown nosave >/dev/null 2>&1 || true
        fi
    done
    rm -rf "$DIR"
}

start() {
    command -v redis-server >/dev/null || { log "redis-server is not installed"; exit 1; }
    mkdir -p "$DIR"
    for port in "${PORTS[@]}"; do
        answers "$port" && continue
        log "starting node on 127.0.0.1:$port (dir $DIR)"
        redis-server --port "$port" --bind 127.0.0.1 \
            --cluster-enabled yes --cluster-config-file "nodes-$port.conf" \
            --cluster-node-timeout 5000 \
            --dir "$DIR" --logfile "$DIR/redis-$port.log" \
            --daemonize yes --save "" --appendonly no
    done
    for port in "${PORTS[@]}"; do
        for _ in $(seq 1 $((WAIT_SECS * 10))); do answers "$port" && break; sleep 0.1; done
        answers "$port" || { log "node 127.0.0.1:$port did not start; see $DIR/redis-$port.log"; exit 1; }
    done

    # Formed = every slot assigned and every node known; otherwise create it.
    # (Nodes restarted from their config files are already formed.)
    if [ "$(info_field "${PORTS[0]}" cluster_slots_assigned)" != "16384" ] \
        || [ "$(info_field "${PORTS[0]}" cluster_known_nodes)" != "${#PORTS[@]}" ]; then
        log "creating the cluster"
        local nodes=()
        for port in "${PORTS[@]}"; do nodes+=("127.0.0.1:$port"); done
        redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >&2
    fi

    for _ in $(seq 1 $((WAIT_SECS * 10))); do
        if state_ok; then
            log "cluster_state:ok"
            echo "COORD_TEST_REDIS_CLUSTER_URL=$URL"
            return 0
        fi
        sleep 0.1
    done
    log "cluster did not reach cluster_state:ok within ${WAIT_SECS}s"
    cli "${PORTS[0]}" cluster info >&2 || true
    exit 1
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
esac
