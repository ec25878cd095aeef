#!/usr/bin/env bash
# Runs a real schema registry with a Confluent-compatible API: Apicurio Registry (a Quarkus
# app) from Maven Central, on loopback, for tests and make targets. Needs Java 21 or newer.
#
#   scripts/registry.sh fetch            download and unpack the registry once into the cache dir
#   scripts/registry.sh start DIR        fresh registry in DIR (empty storage); prints its URL last
#   scripts/registry.sh stop DIR         SIGTERM, SIGKILL after 30 s; no-op if not running
#   scripts/registry.sh restart DIR      stop, then start again on the same port and storage
#   scripts/registry.sh url DIR          print the running registry's Confluent-compatible URL
#   scripts/registry.sh java             print the Java 21+ it runs with
#
# Storage is H2 in DIR/data, emptied by `start` and kept by `restart` (a registry that went
# down comes back with its schemas). Environment: REGISTRY_CACHE_DIR (the unpacked app),
# REGISTRY_READY_TIMEOUT (seconds, default 180), REGISTRY_JAVA (a java to use; otherwise
# the first of JAVA_HOME's, the JVM folders' and PATH's whose version is 21 or newer).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
POM="$REPO_ROOT/deploy/registry/pom.xml"
APICURIO_VERSION=3.3.3
CACHE_DIR=${REGISTRY_CACHE_DIR:-$HOME/.cache/context-assembler/apicurio-registry-$APICURIO_VERSION}
CACHE_MARKER="$CACHE_DIR/.complete"
READY_TIMEOUT=${REGISTRY_READY_TIMEOUT:-180}
STOP_TIMEOUT=30
MIN_JAVA=21
API=/apis/ccompat/v7

die() {
    echo "registry.sh: error: $*" >&2
    exit 1
}

info() {
    echo "registry.sh: $*" >&2
}

# The major version a java prints (1.8 -> 8), or nothing.
java_major() {
    "$1" -version 2>&1 | sed -n 's/.* version "\(1\.\)\{0,1\}\([0-9][0-9]*\).*/\2/p' | head -n 1
}

# The first java of version MIN_JAVA or newer: REGISTRY_JAVA, JAVA_HOME's, the JVM folders'
# (Debian's /usr/lib/jvm, Red Hat's, macOS's), then PATH's.
find_java() {
    local candidate major
    for candidate in ${REGISTRY_JAVA:-} ${JAVA_HOME:+$JAVA_HOME/bin/java} \
        /usr/lib/jvm/*/bin/java /usr/java/*/bin/java \
        /Library/Java/JavaVirtualMachines/*/Contents/Home/bin/java "$(command -v java || true)"; do
        [[ -n $candidate && -x $candidate ]] || continue
        major=$(java_major "$candidate")
        if [[ -n $major ]] && ((major >= MIN_JAVA)); then
            echo "$candidate"
            return 0
        fi
    done
    die "no Java $MIN_JAVA or newer found (Apicurio Registry $APICURIO_VERSION needs one):" \
        "install one (e.g. Temurin 21+) or point REGISTRY_JAVA at its bin/java"
}

fetch() {
    [[ -f $CACHE_MARKER ]] && return 0
    command -v mvn >/dev/null || die "'mvn' not found on PATH (the registry is fetched from Maven Central)"
    info "downloading Apicurio Registry $APICURIO_VERSION into $CACHE_DIR"
    rm -rf "$CACHE_DIR"
    mkdir -p "$CACHE_DIR"
    local log
    log=$(mktemp)
    if ! mvn -q -B -f "$POM" dependency:unpack -Dapicurio.version="$APICURIO_VERSION" \
        -Dregistry.dir="$CACHE_DIR" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rm -f "$log"
        die "could not download Apicurio Registry $APICURIO_VERSION: is Maven Central reachable?" \
            "(proxies and mirrors go in ~/.m2/settings.xml)"
    fi
    rm -f "$log"
    [[ -f $CACHE_DIR/quarkus-run.jar ]] || die "no quarkus-run.jar in $CACHE_DIR"
    touch "$CACHE_MARKER"
}

registry_dir() {
    [[ -n ${1:-} ]] || die "missing DIR argument"
    [[ -d $1 ]] || die "$1 is not a directory"
    cd "$1" && pwd
}

# True when DIR/registry.pid names a live (non-zombie) registry JVM; guards against pid reuse.
running() {
    local pidfile=$1/registry.pid state
    [[ -f $pidfile ]] || return 1
    state=$(ps -ww -o stat=,args= -p "$(cat "$pidfile")" 2>/dev/null) || return 1
    [[ $state != Z* && $state == *quarkus-run.jar* ]]
}

# Detached from this shell; the API and the management interface (health and metrics, on
# every interface by default, and fixed on at build time) on loopback ports only.
launch() {
    local dir=$1 java
    java=$(find_java)
    (
        cd "$CACHE_DIR"
        nohup "$java" -Xms64m -Xmx384m -Djava.awt.headless=true \
        -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$(cat "$dir/port")" \
        -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$(cat "$dir/management-port")" \
        -Dapicurio.datasource.url="jdbc:h2:file:$dir/data/registry" \
        -jar quarkus-run.jar </dev/null >>"$dir/registry.log" 2>&1 &
        echo $! >"$dir/registry.pid"
    )
}

url() {
    echo "http://127.0.0.1:$(cat "$1/port")$API"
}

# Polls the Confluent-compatible API until it answers, the JVM exits or time runs out.
wait_ready() {
    local dir=$1 deadline
    deadline=$((SECONDS + READY_TIMEOUT))
    until curl -sf -o /dev/null --max-time 5 "$(url "$dir")/subjects"; do
        # Not `running`: until nohup has exec'd java, the pid's command line is a shell's.
        if ! kill -0 "$(cat "$dir/registry.pid")" 2>/dev/null; then
            tail -n 30 "$dir/registry.log" >&2
            die "the registry of $dir exited"
        fi
        if ((SECONDS > deadline)); then
            tail -n 30 "$dir/registry.log" >&2
            stop "$dir"
            die "the registry of $dir did not answer within $READY_TIMEOUT s"
        fi
        sleep 0.5
    done
    info "registry ready on $(url "$dir") (pid $(cat "$dir/registry.pid"))"
    url "$dir"
}

start() {
    local dir
    [[ -n ${1:-} ]] || die "missing DIR argument"
    mkdir -p "$1"
    dir=$(registry_dir "$1")
    running "$dir" && die "a registry is already running from $dir (use restart or stop)"
    fetch
    rm -rf "$dir/data" "$dir/registry.log"
    # Free loopback ports chosen by the kernel: the API's, the management interface's.
    python3 - "$dir" <<'PY'
import socket
import sys

socks = [socket.socket() for _ in range(2)]
for name, sock in zip(("port", "management-port"), socks):
    sock.bind(("127.0.0.1", 0))
    with open(f"{sys.argv[1]}/{name}", "w") as out:
        print(sock.getsockname()[1], file=out)
PY
    launch "$dir"
    wait_ready "$dir"
}

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
    dir=$(registry_dir "$1")
    if running "$dir"; then
        pid=$(cat "$dir/registry.pid")
        kill -TERM "$pid"
        if ! exited_within "$dir" "$STOP_TIMEOUT"; then
            info "registry $pid ignored SIGTERM for ${STOP_TIMEOUT} s; killing it"
            kill -KILL "$pid"
            exited_within "$dir" 10 || die "registry $pid survived SIGKILL"
        fi
    fi
    rm -f "$dir/registry.pid"
}

restart() {
    local dir
    dir=$(registry_dir "${1:-}")
    [[ -f $dir/port ]] || die "no registry was started in $dir"
    stop "$dir"
    launch "$dir"
    wait_ready "$dir"
}

case ${1:-} in
fetch) fetch ;;
java) find_java ;;
start | stop | restart) "$1" "${2:-}" ;;
url)
    dir=$(registry_dir "${2:-}")
    running "$dir" || die "the registry of $dir is not running"
    url "$dir"
    ;;
*) die "usage: $0 {fetch|java|start DIR|stop DIR|restart DIR|url DIR}" ;;
esac
