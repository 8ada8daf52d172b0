#!/usr/bin/env bash
# Helpers that make sure the servers the tests need are running on loopback.
# Sourced by scripts/test; each function is idempotent.

log() { printf '[services] %s\n' "$*" >&2; }

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    log "need root to apt-get install $*; install them yourself"; return 1
  fi
  if [ -z "${COORD_APT_UPDATED:-}" ]; then apt-get update -qq >&2; COORD_APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  local port=$1 tries=${2:-100}
  for _ in $(seq "$tries"); do port_open "$port" && return 0; sleep 0.1; done
  log "nothing answers on 127.0.0.1:$port"; return 1
}

ensure_build_tools() {
  # etcd-client's protoc comes from a crates.io package (scripts/protoc,
  # named by .cargo/config.toml): only a C compiler is needed here.
  command -v cc >/dev/null || apt_install build-essential
}

ensure_redis() {
  port_open 6379 && return 0
  command -v redis-server >/dev/null || apt_install redis-server
  log "starting redis-server on 127.0.0.1:6379"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /tmp --logfile /tmp/coord-redis-6379.log
  wait_port 6379
}

ensure_redis_cluster() {
  command -v redis-server >/dev/null || apt_install redis-server
  bash scripts/redis-cluster.sh start >&2
}

ensure_postgres() {
  port_open 5432 && return 0
  if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then apt_install postgresql; fi
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ] && [ -n "$(ls /etc/postgresql 2>/dev/null)" ]; then
    local version; version=$(ls /etc/postgresql | sort -V | tail -n1)
    log "starting PostgreSQL $version cluster main"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    if wait_port 5432 50; then
      # The tests connect as postgres without a password over TCP.
      local hba; hba=$(ls /etc/postgresql/"$version"/main/pg_hba.conf)
      if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
        sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
        pg_ctlcluster --skip-systemctl-redirect "$version" main reload
      fi
      return 0
    fi
  fi
  log "could not start PostgreSQL; set COORD_TEST_POSTGRES_URL to a running server"; return 1
}

ensure_etcd() {
  bash scripts/start-etcd.sh >&2
}

ensure_chromium() {
  # The web console test (crates/coordctl/tests/console.rs) loads each page in headless Chromium.
  command -v chromium >/dev/null || apt_install chromium
}
