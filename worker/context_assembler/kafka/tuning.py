"""The Kafka clients' and the worker's tuning numbers, each named once with why it is that.

The measurements behind them are in bench/README.md ("Tuning history", "Lore moved from the
code"); `make bench-kafka` is what a change to one of them is judged by.
"""

from __future__ import annotations

from typing import Final

from context_assembler.settings import DEFAULT_MAX_MESSAGE_BYTES

# Clients (kafka.clients builds every one with these).
# An admin request the broker does not answer is one line for the operator after this long,
# not aiokafka's 40 s of silent retries.
ADMIN_REQUEST_TIMEOUT_MS: Final = 10_000
# aiokafka's default: a send to a missing topic fails (and is logged) after this long, where
# faust's default (20 minutes) would hang silently.
PRODUCER_REQUEST_TIMEOUT_SECONDS: Final = 40.0
# Producer batches up to 1 MiB (or max_message_bytes, if less): the clients' 16 KB default
# sent almost every output in a request of its own.
PRODUCER_BATCH_BYTES: Final = DEFAULT_MAX_MESSAGE_BYTES
# A producer batch leaves at most this long after its first record (the default, none, made
# batches of one record).
PRODUCER_LINGER_MS: Final = 5
# A member hears of a rebalance at its next heartbeat: at the clients' usual third of the
# session timeout that alone held a partition's events for seconds.
HEARTBEAT_INTERVAL_SECONDS: Final = 1.0
# How long a consumer's getmany waits for records when none are there: short enough that
# the loop notices stopping and fenced partitions promptly.
POLL_TIMEOUT_MS: Final = 500
# The tools read ranges that end at offsets known in advance: a fetch at a partition's end
# need not wait out the broker's long poll (500 ms) for records that may come.
FETCH_WAIT_MS: Final = 50
# A replay to a topic is one transaction, however long it reads: the broker's largest
# (transaction.max.timeout.ms, 15 minutes by default).
REPLAY_TRANSACTION_TIMEOUT_MS: Final = 900_000

# The worker's delivery.
# Events handed to the engine thread in one call, at most.
ENGINE_BATCH: Final = 64
# Input bytes handed to the engine in one call, at most: 64 events of 1 MiB would hold the
# event loop's deliveries back for the whole call.
ENGINE_BATCH_BYTES: Final = 4 * 1024 * 1024
# exactly_once: records read in one getmany call.
BATCH_RECORDS: Final = 200
# exactly_once reads ahead of its commits by this much at most (~20 MB of 50 KB events):
# enough to keep the engine busy while a round commits, small enough that a round's
# transactions stay small.
MAX_EVENTS_IN_FLIGHT: Final = 2 * BATCH_RECORDS
# at_least_once: events read and not yet acknowledged, at most.
MAX_IN_FLIGHT: Final = 200
# at_least_once: events faust reads ahead of the agent, eight engine batches (faust's default,
# 4,096, read a backlog of large events whole before the first was assembled).
STREAM_BUFFER_EVENTS: Final = 8 * ENGINE_BATCH
# at_least_once: how long faust's consumer thread waits before it asks again while the
# read-ahead is full.
READ_AHEAD_WAIT_SECONDS: Final = 0.005
# at_least_once: faust's timer commit, only a backstop: commits follow deliveries at the
# commit interval.
TIMER_COMMIT_SECONDS: Final = 1.0
# The first wait before a failed delivery is retried; it doubles up to
# ASSEMBLER_RETRY_BACKOFF_MAX_SECONDS.
FIRST_RETRY_SECONDS: Final = 0.1
# The first wait before the policies are published again at start; it doubles likewise.
FIRST_PUBLISH_RETRY_SECONDS: Final = 0.5
