"""The smallest faust app with our topology, under faust's own exactly_once guarantee.

Run by tests/integration/test_faust_exactly_once.py as a process that gets SIGKILLed.
Settings come from the environment: FAUST_EOS_BROKER, FAUST_EOS_IN, FAUST_EOS_OUT, FAUST_EOS_GROUP.
"""

from __future__ import annotations

import asyncio
import os
import tempfile

import faust

app = faust.App(
    os.environ["FAUST_EOS_GROUP"],
    broker=f"kafka://{os.environ['FAUST_EOS_BROKER']}",
    key_serializer="raw",
    value_serializer="raw",
    processing_guarantee="exactly_once",
    consumer_auto_offset_reset="earliest",
    topic_disable_leader=True,
    topic_allow_declare=False,
    web_enabled=False,
    autodiscover=False,
    datadir=tempfile.mkdtemp(),
    broker_session_timeout=10.0,
)
source = app.topic(os.environ["FAUST_EOS_IN"], key_type=bytes, value_type=bytes)
sink = app.topic(os.environ["FAUST_EOS_OUT"], key_type=bytes, value_type=bytes)


@app.agent(source)
async def copy(stream: faust.StreamT[bytes]) -> None:
    async for event in stream.events():
        await asyncio.sleep(0.002)  # stands in for the engine's work
        await sink.send(key=event.key, value=event.value)


if __name__ == "__main__":
    faust.Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()
