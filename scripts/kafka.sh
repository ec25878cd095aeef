#!/usr/bin/env bash
# Runs a real single-node Apache Kafka broker (KRaft, broker+controller in one JVM) from
# Maven Central jars, so tests, make targets and CI need neither Docker nor a Kafka tarball.
#
#   scripts/kafka.sh fetch            download the broker jars once into the cache dir
#   scripts/kafka.sh start DIR        fresh broker in DIR (wipes DIR/data); prints host:port last
#   scripts/kafka.sh stop DIR         SIGTERM, SIGKILL after 30 s; no-op if not running
#   scripts/kafka.sh restart DIR      stop, then start again on the same ports and data
#   scripts/kafka.sh bootstrap DIR    print host:port of the running broker
#
# Environment: KAFKA_CACHE_DIR (jar cache), KAFKA_READY_TIMEOUT (seconds, default 90),
# PYTHON (interpreter with aiokafka; default .venv/bin/python, else python3).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
POM="$REPO_ROOT/deploy/kafka/pom.xml"
# The one place the version is set: .env, which docker compose reads for the broker image too.
KAFKA_VERSION=$(sed -n 's/^KAFKA_VERSION=\([0-9][0-9.]*\)$/\1/p' "$REPO_ROOT/.env")
[[ -n $KAFKA_VERSION ]] || { echo "kafka.sh: error: no KAFKA_VERSION=X.Y.Z line in $REPO_ROOT/.env" >&2; exit 1; }
CACHE_DIR=${KAFKA_CACHE_DIR:-$HOME/.cache/context-assembler/kafka-$KAFKA_VERSION}
CACHE_MARKER="$CACHE_DIR/.complete"
READY_TIMEOUT=${KAFKA_READY_TIMEOUT:-90}
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x $REPO_ROOT/.venv/bin/python ]]; then PYTHON=$REPO_ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
STOP_TIMEOUT=30

die() {
    echo "kafka.sh: error: $*" >&2
    exit 1
}

info() {
    echo "kafka.sh: $*" >&2
}

require() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || die "'$tool' not found on PATH (Kafka $KAFKA_VERSION needs Java 17+ and Maven)"
    done
}

fetch() {
    [[ -f $CACHE_MARKER ]] && return 0
    require mvn
    info "downloading Kafka $KAFKA_VERSION jars into $CACHE_DIR"
    mkdir -p "$CACHE_DIR"
    local log
    log=$(mktemp)
    if ! mvn -q -B -f "$POM" dependency:copy-dependencies -Dkafka.version="$KAFKA_VERSION" \
        -DincludeScope=runtime -DoutputDirectory="$CACHE_DIR" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rm -f "$log"
        die "could not download the Kafka $KAFKA_VERSION jars: is Maven Central reachable?" \
            "(proxies and mirrors go in ~/.m2/settings.xml)"
    fi
    rm -f "$log"
    touch "$CACHE_MARKER"
}

# Absolute path of the broker directory given on the command line.
broker_dir() {
    [[ -n ${1:-} ]] || die "missing DIR argument"
    [[ -d $1 ]] || die "$1 is not a directory"
    cd "$1" && pwd
}

# True when DIR/broker.pid names a live (non-zombie) Kafka JVM; guards against pid reuse.
running() {
    local pidfile=$1/broker.pid state
    [[ -f $pidfile ]] || return 1
    state=$(ps -o stat=,args= -p "$(cat "$pidfile")" 2>/dev/null) || return 1
    [[ $state != Z* && $state == *kafka.Kafka* ]]
}

write_config() {
    local dir=$1 port=$2 controller_port=$3
    cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
# After a restart Kafka 4.0.1 refuses the broker's new registration until the old one's session
# expires (see KAFKA-19130): a 3 s session instead of the default 9 s keeps restart quick.
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
EOF
    # Without a configuration Log4j 2 prints errors only; broker.log should show the whole story.
    cat >"$dir/log4j2.properties" <<'EOF'
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
EOF
    echo "127.0.0.1:$port" >"$dir/bootstrap"
}

# Runs the broker detached from this shell; nohup so closing a terminal does not stop it.
# Log4j's own shutdown hook would silence the broker's shutdown messages halfway.
launch() {
    local dir=$1
    nohup java -Xms256m -Xmx512m -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$dir/log4j2.properties" -Dlog4j2.shutdownHookEnabled=false \
        -cp "$CACHE_DIR/*" kafka.Kafka "$dir/server.properties" \
        </dev/null >>"$dir/broker.log" 2>&1 &
    echo $! >"$dir/broker.pid"
}

# Polls with a real metadata request until the broker answers, the JVM exits or time runs out.
wait_ready() {
    local dir=$1 bootstrap
    bootstrap=$(cat "$dir/bootstrap")
    if ! "$PYTHON" - "$bootstrap" "$(cat "$dir/broker.pid")" "$READY_TIMEOUT" <<'PY'; then
import asyncio
import logging
import os
import sys
import time

try:
    from aiokafka.admin import AIOKafkaAdminClient
except ImportError:
    sys.exit(f"{sys.executable} cannot import aiokafka; point PYTHON at the project venv")

logging.disable(logging.CRITICAL)  # refused connections while the JVM starts are expected


async def main(bootstrap: str, pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            sys.exit("broker process exited")
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        try:
            await admin.start()
            await admin.describe_cluster()
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                sys.exit(f"no metadata answer within {timeout:.0f} s: {exc!r}")
        finally:
            await admin.close()
        await asyncio.sleep(0.25)


asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
PY
        echo "----- first errors in $dir/broker.log -----" >&2
        grep -m 5 -E '^\[[^]]*\] (ERROR|FATAL) ' "$dir/broker.log" >&2 || true
        echo "----- tail of $dir/broker.log -----" >&2
        tail -n 30 "$dir/broker.log" >&2
        stop "$dir"
        die "broker in $dir did not become ready"
    fi
    info "broker ready on $bootstrap (pid $(cat "$dir/broker.pid"))"
    echo "$bootstrap"
}

start() {
    local dir
    [[ -n ${1:-} ]] || die "missing DIR argument"
    mkdir -p "$1"
    dir=$(broker_dir "$1")
    running "$dir" && die "a broker is already running from $dir (use restart or stop)"
    require java
    fetch
    local ports port controller_port cluster_id
    # Free loopback ports chosen by the kernel, and a Kafka-style base64 UUID as cluster id.
    ports=$("$PYTHON" - <<'PY'
import base64
import socket
import uuid

socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
cluster_id = "-"
while cluster_id.startswith("-"):  # Kafka rejects ids that look like command-line flags
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
print(*(s.getsockname()[1] for s in socks), cluster_id)
PY
    )
    read -r port controller_port cluster_id <<<"$ports"
    rm -rf "$dir/data" "$dir/broker.log"
    write_config "$dir" "$port" "$controller_port"
    # A short-lived tool: the optimizing JIT and a parallel GC only slow its start.
    java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp "$CACHE_DIR/*" kafka.tools.StorageTool \
        format -t "$cluster_id" -c "$dir/server.properties" >>"$dir/broker.log" 2>&1 ||
        { tail -n 20 "$dir/broker.log" >&2; die "formatting $dir/data failed"; }
    launch "$dir"
    wait_ready "$dir"
}

# True once the broker of DIR has exited; false if it still runs after $2 seconds.
exited_within() {
    local dir=$1 tenths=$(($2 * 10))
    while running "$dir"; do
        ((tenths-- > 0)) || return 1
        sleep 0.1
    done
}

stop() {
    local dir pid
    [[ -n ${1:-} ]] || die "missing DIR argument"
    [[ -d $1 ]] || return 0
    dir=$(broker_dir "$1")
    if running "$dir"; then
        pid=$(cat "$dir/broker.pid")
        kill -TERM "$pid"
        if ! exited_within "$dir" "$STOP_TIMEOUT"; then
            info "broker $pid ignored SIGTERM for ${STOP_TIMEOUT} s; killing it"
            kill -KILL "$pid"
            exited_within "$dir" 10 || die "broker $pid survived SIGKILL"
        fi
    fi
    rm -f "$dir/broker.pid"
}

restart() {
    local dir
    dir=$(broker_dir "${1:-}")
    [[ -f $dir/server.properties && -d $dir/data ]] || die "no broker was started in $dir"
    require java
    fetch
    stop "$dir"
    launch "$dir"
    wait_ready "$dir"
}

bootstrap() {
    local dir
    dir=$(broker_dir "${1:-}")
    [[ -f $dir/bootstrap ]] || die "no broker was started in $dir"
    running "$dir" || die "the broker of $dir is not running (stopped, or it exited)"
    cat "$dir/bootstrap"
}

case ${1:-} in
fetch) fetch ;;
start | stop | restart | bootstrap) "$1" "${2:-}" ;;
*) die "usage: $0 {fetch|start DIR|stop DIR|restart DIR|bootstrap DIR}" ;;
esac
