#!/usr/bin/env bash
# Runs the documentation's worker quick start, then its debugging walkthrough and its
# re-drive example, word for word, as a new user pastes them: the first fenced block under
# "## Quick start" in docs/worker.md, in one bash with `set -e`, then every fenced block under
# "## Debug an answer" and "## Re-drive dead letters" in docs/debugging.md, each command
# with its exit status reported (some exit non-zero on purpose, as the page says).
#
#   scripts/quickstart.sh WORKDIR     the broker runs from WORKDIR/kafka (KAFKA_DIR), the
#                                     output goes to WORKDIR/quickstart.log
#
# Run from the repository root, with the venv installed (make broker-start's prerequisite).
# Exit 0 when every line of the worker block succeeded (the worker stopped with status 0),
# each walkthrough command ran (its status printed as "quickstart: exit N: COMMAND"), no
# terminal escape codes were printed and the worker left no temp dir behind.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORKDIR=$(mkdir -p "${1:?usage: $0 WORKDIR}" && cd "$1" && pwd)
cd "$REPO_ROOT"

die() {
    echo "quickstart.sh: $*" >&2
    exit 1
}

# The fenced blocks of the section of page $1 under heading $2, its subsections included (up
# to the next heading of the same level or higher), or only its first block with $3 = first.
# Lines starting with # inside a fence are comments, not headings.
blocks() {
    awk -v heading="$2" -v only_first="${3:-}" '
        !fenced && $0 == heading {inside = 1; level = index($0, " "); next}
        !fenced && inside && /^#+ / && index($0, " ") <= level {exit}
        inside && /^```/ {
            if (fenced && only_first) exit
            fenced = !fenced
            next
        }
        inside && fenced' "$1"
}

worker_block=$(blocks docs/worker.md '## Quick start' first)
[[ -n $worker_block ]] || die "no fenced block under '## Quick start' in docs/worker.md"
walkthrough=$(blocks docs/debugging.md '## Debug an answer')
[[ -n $walkthrough ]] || die "no fenced block under '## Debug an answer' in docs/debugging.md"
redrive=$(blocks docs/debugging.md '## Re-drive dead letters')
[[ -n $redrive ]] || die "no fenced block under '## Re-drive dead letters' in docs/debugging.md"

export KAFKA_DIR=$WORKDIR/kafka  # the Makefile's broker directory
export TMPDIR=$WORKDIR/tmp       # where the worker's temp dir would be left
export ASSEMBLER_HTTP_PORT       # 8080 may be taken on a shared machine
ASSEMBLER_HTTP_PORT=$("$REPO_ROOT/.venv/bin/python" -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$TMPDIR"

script=$WORKDIR/quickstart.bash
{
    echo 'set -euo pipefail'
    echo 'trap '"'"'kill $(jobs -p) 2>/dev/null || true'"'"' EXIT'  # a worker left by a failed line
    echo "$worker_block"
    echo 'set +e'
    # One command a line: continuation lines joined, comments and blank lines left out.
    sed -e ':join' -e '/\\$/{N;s/\\\n//;b join' -e '}' <<<"$walkthrough"$'\n'"$redrive" |
        grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' |
        while IFS= read -r command; do
            printf '%s\n' "$command"
            printf 'echo "quickstart: exit $?: "%q\n' "$command"
        done
} >"$script"

log=$WORKDIR/quickstart.log
status=0
bash "$script" >"$log" 2>&1 || status=$?
bash scripts/kafka.sh stop "$KAFKA_DIR" >/dev/null 2>&1 || true
cat "$log"
((status == 0)) || die "the quick start failed (exit $status)"
! grep -q $'\x1b' "$log" || die "terminal escape codes in the output"
! compgen -G "$TMPDIR/context-assembler-faust-*" >/dev/null || die "the worker left its temp dir"
echo "quickstart.sh: the worker quick start, the debugging walkthrough and the re-drive ran"
