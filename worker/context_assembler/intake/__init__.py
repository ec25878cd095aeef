"""Bytes in, an Assembly or a RejectedInput out: decoding, policies and the one handler that
every shell (file mode, Kafka worker, replay) shares."""
