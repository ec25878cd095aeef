#!/usr/bin/env bash
# A replicated Apache Kafka cluster on loopback, from the same Maven jars as scripts/kafka.sh:
# N nodes, each broker and controller (an N-voter KRaft quorum), replication factor 3 (or N if
# less), min.insync.replicas=2, unclean leader election off. For the chaos run (bench/chaos).
#
#   scripts/kafka-cluster.sh start DIR [N]     fresh cluster of N nodes (default 3) in DIR/nodeK;
#                                              prints the bootstrap servers last
#   scripts/kafka-cluster.sh stop DIR          SIGTERM every node (SIGCONT first), SIGKILL after 30 s
#   scripts/kafka-cluster.sh bootstrap DIR     host:port,host:port,...
#   scripts/kafka-cluster.sh pid DIR K         the JVM pid of node K (its node.id)
#   scripts/kafka-cluster.sh kill DIR K        kill -9 node K
#   scripts/kafka-cluster.sh pause DIR K       SIGSTOP node K (a GC pause, a partitioned host)
#   scripts/kafka-cluster.sh resume DIR K      SIGCONT node K
#   scripts/kafka-cluster.sh restart DIR K     start node K again on its ports and data (after kill)
#
# Topics: `context-assembler topics create --bootstrap-servers "$(... bootstrap DIR)"
# --replication-factor 3`. Environment: as scripts/kafka.sh (KAFKA_CACHE_DIR, PYTHON,
# KAFKA_READY_TIMEOUT), and KAFKA_HEAP (default 384m: three JVMs on two cores).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KAFKA_SH="$REPO_ROOT/scripts/kafka.sh"
# As scripts/kafka.sh: the version set in .env names the jar cache.
KAFKA_VERSION=$(sed -n 's/^KAFKA_VERSION=\([0-9][0-9.]*\)$/\1/p' "$REPO_ROOT/.env" 2>/dev/null || true)
[[ -n $KAFKA_VERSION ]] || { echo "kafka-cluster.sh: error: no KAFKA_VERSION in $REPO_ROOT/.env" >&2; exit 1; }
CACHE_DIR=${KAFKA_CACHE_DIR:-$HOME/.cache/context-assembler/kafka-$KAFKA_VERSION}
READY_TIMEOUT=${KAFKA_READY_TIMEOUT:-120}
HEAP=${KAFKA_HEAP:-384m}
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x $REPO_ROOT/.venv/bin/python ]]; then PYTHON=$REPO_ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
STOP_TIMEOUT=30

die() {
    echo "kafka-cluster.sh: error: $*" >&2
    exit 1
}

info() {
    echo "kafka-cluster.sh: $*" >&2
}

cluster_dir() {
    [[ -n ${1:-} ]] || die "missing DIR argument"
    [[ -d $1 ]] || die "$1 is not a directory"
    cd "$1" && pwd
}

node_dir() {
    local dir=$1 node=${2:-}
    [[ $node =~ ^[0-9]+$ ]] || die "missing or bad node number: '$node'"
    [[ -f $dir/node$node/server.properties ]] || die "no node $node in $dir"
    echo "$dir/node$node"
}

# True when NODE_DIR/broker.pid names a live (non-zombie) Kafka JVM; a stopped one counts.
running() {
    local pidfile=$1/broker.pid state
    [[ -f $pidfile ]] || return 1
    state=$(ps -o stat=,args= -p "$(cat "$pidfile")" 2>/dev/null) || return 1
    [[ $state != Z* && $state == *kafka.Kafka* ]]
}

nodes() {
    local dir=$1 node
    for node in "$dir"/node*/server.properties; do
        [[ -f $node ]] || continue
        node=${node%/server.properties}
        echo "${node##*/node}"
    done | sort -n
}

write_config() {
    local node_dir=$1 id=$2 port=$3 controller_port=$4 voters=$5 replicas=$6
    local isr=$((replicas > 1 ? 2 : 1))
    cat >"$node_dir/server.properties" <<EOF
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$node_dir/data
auto.create.topics.enable=false
default.replication.factor=$replicas
min.insync.replicas=$isr
unclean.leader.election.enable=false
offsets.topic.replication.factor=$replicas
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=3
group.initial.rebalance.delay.ms=0
# A stopped or dead broker is fenced, and its partitions led elsewhere, after 3 s (default 9 s;
# also keeps a restart quick, see KAFKA-19130 in scripts/kafka.sh).
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
# A stopped follower leaves the ISR after 6 s (default 30 s), so acks=all sends stall that long.
replica.lag.time.max.ms=6000
# Two cores for three JVMs: fewer threads than the defaults.
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
background.threads=2
log.cleaner.threads=1
EOF
    cat >"$node_dir/log4j2.properties" <<'EOF'
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
EOF
    echo "127.0.0.1:$port" >"$node_dir/bootstrap"
}

launch() {
    local node_dir=$1
    nohup java "-Xms$HEAP" "-Xmx$HEAP" -XX:+UseSerialGC -XX:CICompilerCount=2 \
        -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$node_dir/log4j2.properties" -Dlog4j2.shutdownHookEnabled=false \
        -cp "$CACHE_DIR/*" kafka.Kafka "$node_dir/server.properties" \
        </dev/null >>"$node_dir/broker.log" 2>&1 &
    echo $! >"$node_dir/broker.pid"
}

# Polls until the cluster's metadata lists `want` brokers, or a JVM exits, or time runs out.
wait_ready() {
    local dir=$1 want=$2 pids=() node
    for node in $(nodes "$dir"); do
        running "$dir/node$node" && pids+=("$(cat "$dir/node$node/broker.pid")")
    done
    if ! "$PYTHON" - "$(bootstrap "$dir")" "$want" "$READY_TIMEOUT" "${pids[@]}" <<'PY'; then
import asyncio
import logging
import os
import sys
import time

from aiokafka.admin import AIOKafkaAdminClient

logging.disable(logging.CRITICAL)  # refused connections while the JVMs start are expected


async def main(bootstrap: str, want: int, timeout: float, pids: list[int]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                sys.exit(f"broker process {pid} exited")
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        found = "none"
        try:
            await admin.start()
            cluster = await admin.describe_cluster()
            found = str(len(cluster["brokers"]))
            if len(cluster["brokers"]) >= want and cluster["controller_id"] >= 0:
                return
        except Exception as exc:
            found = repr(exc)
        finally:
            await admin.close()
        if time.monotonic() > deadline:
            sys.exit(f"{want} brokers not registered within {timeout:.0f} s (found: {found})")
        await asyncio.sleep(0.5)


asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), [int(p) for p in sys.argv[4:]]))
PY
        for node in $(nodes "$dir"); do
            echo "----- first errors in $dir/node$node/broker.log -----" >&2
            grep -m 5 -E '^\[[^]]*\] (ERROR|FATAL) ' "$dir/node$node/broker.log" >&2 || true
        done
        return 1
    fi
}

start() {
    local dir count=${2:-3}
    [[ -n ${1:-} ]] || die "missing DIR argument"
    [[ $count =~ ^[1-9][0-9]*$ ]] || die "bad node count: $count"
    mkdir -p "$1"
    dir=$(cluster_dir "$1")
    local node
    for node in $(nodes "$dir" 2>/dev/null); do
        running "$dir/node$node" && die "node $node of $dir is running (use stop first)"
    done
    command -v java >/dev/null || die "'java' not found on PATH (Kafka needs Java 17+)"
    bash "$KAFKA_SH" fetch
    local ports cluster_id
    ports=$("$PYTHON" - "$count" <<'PY'
import base64
import socket
import sys
import uuid

socks = [socket.socket() for _ in range(2 * int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
cluster_id = "-"
while cluster_id.startswith("-"):  # Kafka rejects ids that look like command-line flags
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
print(cluster_id, *(s.getsockname()[1] for s in socks))
PY
    )
    local parts port_list
    read -r -a parts <<<"$ports"
    cluster_id=${parts[0]}
    port_list=("${parts[@]:1}")
    local voters="" id replicas=$((count < 3 ? count : 3))
    for ((id = 1; id <= count; id++)); do
        voters+="${voters:+,}$id@127.0.0.1:${port_list[$((2 * id - 1))]}"
    done
    rm -rf "$dir"/node*
    for ((id = 1; id <= count; id++)); do
        mkdir -p "$dir/node$id"
        write_config "$dir/node$id" "$id" "${port_list[$((2 * id - 2))]}" \
            "${port_list[$((2 * id - 1))]}" "$voters" "$replicas"
        java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp "$CACHE_DIR/*" kafka.tools.StorageTool \
            format -t "$cluster_id" -c "$dir/node$id/server.properties" >>"$dir/node$id/broker.log" 2>&1 ||
            { tail -n 20 "$dir/node$id/broker.log" >&2; die "formatting $dir/node$id/data failed"; }
    done
    for ((id = 1; id <= count; id++)); do launch "$dir/node$id"; done
    if ! wait_ready "$dir" "$count"; then
        stop "$dir"
        die "the cluster in $dir did not become ready"
    fi
    info "$count nodes ready (pids $(cat "$dir"/node*/broker.pid | tr '\n' ' '))"
    bootstrap "$dir"
}

stop_node() {
    local node_dir=$1 pid
    running "$node_dir" || { rm -f "$node_dir/broker.pid"; return 0; }
    pid=$(cat "$node_dir/broker.pid")
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    echo "$pid"
}

stop() {
    local dir node pids=() pid tenths=$((STOP_TIMEOUT * 10))
    [[ -n ${1:-} ]] || die "missing DIR argument"
    [[ -d $1 ]] || return 0
    dir=$(cluster_dir "$1")
    # All at once: a node waiting for its peers' quorum to shut down cleanly waits in parallel.
    for node in $(nodes "$dir"); do
        pid=$(stop_node "$dir/node$node")
        [[ -n $pid ]] && pids+=("$pid")
    done
    for node in $(nodes "$dir"); do
        while running "$dir/node$node"; do
            if ((tenths-- <= 0)); then
                info "node $node ignored SIGTERM for ${STOP_TIMEOUT} s; killing it"
                kill -KILL "$(cat "$dir/node$node/broker.pid")" 2>/dev/null || true
                sleep 0.5
                break
            fi
            sleep 0.1
        done
        rm -f "$dir/node$node/broker.pid"
    done
}

bootstrap() {
    local dir node servers=""
    dir=$(cluster_dir "${1:-}")
    for node in $(nodes "$dir"); do
        servers+="${servers:+,}$(cat "$dir/node$node/bootstrap")"
    done
    [[ -n $servers ]] || die "no cluster was started in $dir"
    echo "$servers"
}

signal_node() {
    local sig=$1 dir node_dir
    dir=$(cluster_dir "${2:-}")
    node_dir=$(node_dir "$dir" "${3:-}")
    running "$node_dir" || die "node $3 of $dir is not running"
    kill "-$sig" "$(cat "$node_dir/broker.pid")"
}

restart_node() {
    local dir node_dir
    dir=$(cluster_dir "${1:-}")
    node_dir=$(node_dir "$dir" "${2:-}")
    running "$node_dir" && die "node $2 of $dir is running"
    launch "$node_dir"
    wait_ready "$dir" "$(nodes "$dir" | wc -l)" || die "node $2 of $dir did not rejoin"
    info "node $2 back (pid $(cat "$node_dir/broker.pid"))"
}

case ${1:-} in
start) start "${2:-}" "${3:-3}" ;;
stop) stop "${2:-}" ;;
bootstrap) bootstrap "${2:-}" ;;
pid) cat "$(node_dir "$(cluster_dir "${2:-}")" "${3:-}")/broker.pid" ;;
kill) signal_node KILL "${2:-}" "${3:-}" ;;
pause) signal_node STOP "${2:-}" "${3:-}" ;;
resume) signal_node CONT "${2:-}" "${3:-}" ;;
restart) restart_node "${2:-}" "${3:-}" ;;
*) die "usage: $0 {start DIR [N]|stop DIR|bootstrap DIR|pid DIR K|kill DIR K|pause DIR K|resume DIR K|restart DIR K}" ;;
esac
