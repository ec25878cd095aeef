#!/usr/bin/env bash
# Runs the README's worker quick start word for word: the fenced block under "## The Kafka
# worker", line by line in one bash, so the README stays true. Before the line that stops
# the worker (`kill %1`) it waits until the worker has published every example event.
#
#   scripts/quickstart.sh WORKDIR     the broker runs from WORKDIR/kafka (KAFKA_DIR), the
#                                     output goes to WORKDIR/quickstart.log
#
# Run from the repository root, with the venv installed (make broker-start's prerequisite).
# Exit 0 when every line succeeded, the worker published one prompt per example event,
# stopped with status 0, printed no terminal escape codes and left no temp dir behind.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORKDIR=$(mkdir -p "${1:?usage: $0 WORKDIR}" && cd "$1" && pwd)
cd "$REPO_ROOT"

die() {
    echo "quickstart.sh: $*" >&2
    exit 1
}

# The block, and the events it sends (one prompt each).
block=$(awk '/^## The Kafka worker/ {s=1; next} s && /^```/ {if (f) exit; f=1; next} f' README.md)
[[ -n $block ]] || die "no fenced block under '## The Kafka worker' in README.md"
expected=$(grep -c . examples/events.jsonl)

export KAFKA_DIR=$WORKDIR/kafka  # the Makefile's broker directory
export TMPDIR=$WORKDIR/tmp       # where the worker's temp dir would be left
export ASSEMBLER_HTTP_PORT
ASSEMBLER_HTTP_PORT=$("$REPO_ROOT/.venv/bin/python" -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$TMPDIR"

# The worker's events_total on its /metrics; bash's /dev/tcp, so no curl is needed.
wait_for_outputs='
quickstart_wait() {
    local deadline=$((SECONDS + 120)) seen=0
    while ((SECONDS < deadline)); do
        seen=$("'"$REPO_ROOT"'/.venv/bin/python" - "$ASSEMBLER_HTTP_PORT" <<"PY" 2>/dev/null || echo 0
import sys, urllib.request
page = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=2).read()
print(int(sum(float(line.rsplit(" ", 1)[1]) for line in page.decode().splitlines()
              if line.startswith("context_assembler_events_total{"))))
PY
        )
        ((seen >= '"$expected"')) && { echo "quickstart: the worker assembled $seen events"; return 0; }
        sleep 1
    done
    echo "quickstart: the worker assembled $seen of '"$expected"' events in 120 s" >&2
    return 1
}
'
script=$WORKDIR/quickstart.bash
{
    echo 'set -euo pipefail'
    echo 'trap '"'"'kill $(jobs -p) 2>/dev/null || true'"'"' EXIT'  # a worker left by a failed line
    echo "$wait_for_outputs"
    while IFS= read -r line; do
        if [[ $line == "kill %1"* ]]; then
            echo 'quickstart_wait'
            echo "$line"
            echo 'wait %1'  # its exit status: 0 after SIGTERM
        else
            echo "$line"
        fi
    done <<<"$block"
} >"$script"

log=$WORKDIR/quickstart.log
status=0
bash "$script" >"$log" 2>&1 || status=$?
bash scripts/kafka.sh stop "$KAFKA_DIR" >/dev/null 2>&1 || true  # should a line have failed
cat "$log"
((status == 0)) || die "the quick start failed (exit $status)"
! grep -q $'\x1b' "$log" || die "terminal escape codes in the output"
! compgen -G "$TMPDIR/context-assembler-faust-*" >/dev/null || die "the worker left its temp dir"
echo "quickstart.sh: the README's worker quick start works"
