#!/bin/bash
# `make test-real`: start the real NSQ servers, run every real-server test against them, stop
# them (always, via trap).
#
#   stock nsqd + nsqlookupd   (REALNSQ_STOCK_BASE, default 4150)
#   youzan: etcd + nsqlookupd + 3 nsqd   (REALNSQ_YOUZAN_BASE, default 4150)
#   data/logs/pids under REALNSQ_STATE (default /tmp/realnsq-state)
#
# The servers and their start/stop scripts come from REALNSQ_DIR (default ../shared/realnsq
# beside this checkout). youzan needs etcd: when it is missing and apt-get can run (root), it
# installs Debian's etcd-server; otherwise it stops with a message saying what to install.
# Exported for the tests (tests/real_servers.py): SMARTNSQ_REAL_NSQD, SMARTNSQ_REAL_NSQD_HTTP,
# SMARTNSQ_REAL_LOOKUPD, SMARTNSQ_REAL_YOUZAN_LOOKUPD, and SMARTNSQ_SPARK_CLUSTER=1 (unless set).
# Extra arguments go to pytest.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
REALNSQ_DIR=${REALNSQ_DIR:-$HERE/../shared/realnsq}
PYTHON=${PYTHON:-$HERE/.venv/bin/python}
YZ_NODES=${YZ_NODES:-3}

if [ ! -x "$REALNSQ_DIR/start-stock.sh" ] || [ ! -x "$REALNSQ_DIR/start-youzan.sh" ]; then
  echo "test-real: no real NSQ servers at $REALNSQ_DIR (set REALNSQ_DIR to the realnsq folder)" >&2
  exit 2
fi

if ! command -v etcd >/dev/null && [ ! -x /usr/bin/etcd ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "test-real: etcd is missing; installing Debian's etcd-server" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server >&2 || {
      apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server >&2; } || {
      echo "test-real: could not install etcd-server; install it (apt-get install -y etcd-server)" \
           "and run again" >&2
      exit 2
    }
  else
    echo "test-real: the youzan cluster needs etcd, which is not installed and cannot be" \
         "installed from here (needs root and apt-get): apt-get install -y etcd-server" >&2
    exit 2
  fi
fi

stop_servers() {
  "$REALNSQ_DIR/stop-youzan.sh" >/dev/null 2>&1 || true
  "$REALNSQ_DIR/stop-stock.sh" >/dev/null 2>&1 || true
}
trap stop_servers EXIT
trap 'exit 130' INT TERM

# "name host:port" lines → the first address of a name
addr() { awk -v n="$1" '$1 == n { print $2; exit }'; }

echo "test-real: starting stock nsqd + nsqlookupd" >&2
stock=$("$REALNSQ_DIR/start-stock.sh")
echo "test-real: starting youzan etcd + nsqlookupd + $YZ_NODES nsqd" >&2
youzan=$("$REALNSQ_DIR/start-youzan.sh" "$YZ_NODES")

SMARTNSQ_REAL_NSQD=$(addr nsqd_tcp <<<"$stock")
SMARTNSQ_REAL_NSQD_HTTP=$(addr nsqd_http <<<"$stock")
SMARTNSQ_REAL_LOOKUPD=$(addr lookupd_http <<<"$stock")
SMARTNSQ_REAL_YOUZAN_LOOKUPD=$(addr lookupd_http <<<"$youzan")
export SMARTNSQ_REAL_NSQD SMARTNSQ_REAL_NSQD_HTTP SMARTNSQ_REAL_LOOKUPD SMARTNSQ_REAL_YOUZAN_LOOKUPD
for v in SMARTNSQ_REAL_NSQD SMARTNSQ_REAL_NSQD_HTTP SMARTNSQ_REAL_LOOKUPD \
         SMARTNSQ_REAL_YOUZAN_LOOKUPD; do
  if [ -z "${!v}" ]; then
    echo "test-real: the start scripts did not report $v" >&2
    exit 2
  fi
  echo "test-real: $v=${!v}" >&2
done

cd "$HERE"
# every real-server test in tests/, whoever wrote it (their double variants run too: cheap),
# and the Spark standalone cluster tests (a few minutes; SMARTNSQ_SPARK_CLUSTER=0 leaves them out)
export SMARTNSQ_SPARK_CLUSTER=${SMARTNSQ_SPARK_CLUSTER:-1}
"$PYTHON" -m pytest -q -m "real_nsqd or real_youzan or spark_cluster" tests/ "$@"
