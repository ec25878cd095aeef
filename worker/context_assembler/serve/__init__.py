"""The HTTP endpoint: `POST /v1/assemble` for chat backends that do not speak Kafka."""
