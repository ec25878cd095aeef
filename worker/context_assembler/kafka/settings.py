"""Every knob of the worker, read once from the environment (prefix ASSEMBLER_).

Invalid settings fail at start with one message naming each bad variable.
"""

from __future__ import annotations

from copy import copy
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.intake.codec import Limits
from context_assembler.kafka.codecs import check_available

# The producer's default max.request.size (the broker's max.message.bytes is 12 bytes more),
# and the least the worker accepts: a dead letter cut to its bones (Connect's headers with a
# capped message, no key, no value) fits in that much.
DEFAULT_MAX_MESSAGE_BYTES = 1_048_576
MIN_MESSAGE_BYTES = 16_384


class SettingsError(ContextAssemblerError, ValueError):
    """Invalid ASSEMBLER_* variables, each named."""


def _limit(name: str) -> Any:
    """Limits' field `name` (its default and constraints, declared there once), to be read
    from the flat variable ASSEMBLER_<NAME>."""
    return copy(Limits.model_fields[name])


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ASSEMBLER_", frozen=True, extra="ignore")

    bootstrap_servers: str = Field(default="127.0.0.1:9092", min_length=1)
    input_topic: str = "retrieval.results"
    prompts_topic: str = "prompts.assembled"
    audit_topic: str = "context.audit"
    dlq_topic: str = "retrieval.results.dlq"
    policies_topic: str = Field(
        default="assembler.policies",
        description="Compacted: each policy the worker assembles under, keyed by its hash, "
        "published before any event is consumed (replay --policy recorded reads it).",
    )
    group_id: str = "context-assembler"
    policy_file: str | None = Field(default=None, description="TOML file or preset name.")
    allowed_policies: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Policies (preset names or TOML files) a request may name, comma-separated. "
        "Default: none, so a request naming any policy other than the service's is rejected.",
    )
    processing_guarantee: Literal["at_least_once", "exactly_once"] = "at_least_once"
    transactional_id: str | None = Field(
        default=None,
        description="exactly_once only: the prefix of the transactional ids, one per input "
        "partition (<prefix>-<topic>-<partition>), the same on every replica, so that a "
        "partition's next owner fences its previous one. Default: the group id.",
    )
    http_host: str = Field(
        default="127.0.0.1",
        description="Where /metrics, /health and /ready listen: this machine only by default; "
        "0.0.0.0 in a container, for probes and scrapes from outside it.",
    )
    http_port: int = Field(default=8080, ge=0, le=65535)
    max_event_bytes: int = _limit("max_event_bytes")
    max_chunks: int = _limit("max_chunks")
    max_chunk_chars: int = _limit("max_chunk_chars")
    max_question_chars: int = _limit("max_question_chars")
    max_chunk_id_chars: int = _limit("max_chunk_id_chars")
    retry_backoff_max_seconds: float = Field(default=5.0, gt=0)
    max_message_bytes: int = Field(
        default=DEFAULT_MAX_MESSAGE_BYTES, ge=MIN_MESSAGE_BYTES,
        description="Largest record the worker publishes (key, value, headers and overhead), "
        "and the producers' max_request_size; at most the topics' max.message.bytes. An "
        "output over it goes to the DLQ as output_too_large; a dead letter over it is cut.",
    )
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        default="zstd",
        description="The codec of every record batch the worker and the CLI's producers "
        "publish (bench/README.md has each one's bytes and CPU). Input is decoded whatever "
        "its codec.",
    )
    shutdown_grace_seconds: float = Field(
        default=20.0, gt=0,
        description="SIGTERM to exit, at most: in-flight events get half of it to be delivered. "
        "Keep it under Kubernetes' terminationGracePeriodSeconds (30).",
    )
    session_timeout_seconds: float = Field(
        default=10.0, ge=6, le=300, description="How long a silent replica keeps its partitions."
    )
    group_instance_id: str | None = Field(
        default=None,
        description="Static group membership (KIP-345), unique and stable per replica (a "
        "StatefulSet pod's name): restarted within the session timeout, the replica gets its "
        "partitions back without a group-wide rebalance; killed, it holds them that long; "
        "stopped (SIGTERM) it leaves the group at once. Default (or empty): none, a dynamic "
        "member.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Connecting to a secured cluster (docs/secured-cluster.md): every Kafka client of the
    # worker and of the CLI is built from these (context_assembler.kafka.connection).
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    sasl_oauthbearer_token_file: Path | None = Field(
        default=None, description="Read again whenever the client authenticates, so a token "
        "rotated in place (a projected service-account token, a sidecar) is picked up.")
    ssl_ca_file: Path | None = Field(
        default=None, description="PEM CA bundle; default: the system's trusted CAs.")
    ssl_cert_file: Path | None = None
    ssl_key_file: Path | None = None
    ssl_key_password_file: Path | None = None
    ssl_check_hostname: bool = True

    @field_validator("allowed_policies", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("compression_type")
    @classmethod
    def _codec_installed(cls, value: str) -> str:
        check_available(value)  # fail at start, not at the first send
        return value

    @field_validator("group_instance_id", "sasl_mechanism", "sasl_username", "sasl_password",
                     "sasl_password_file", "sasl_oauthbearer_token_file", "ssl_ca_file",
                     "ssl_cert_file", "ssl_key_file", "ssl_key_password_file", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return value.strip() or None if isinstance(value, str) else value

    @field_validator("sasl_password_file", "sasl_oauthbearer_token_file", "ssl_ca_file",
                     "ssl_cert_file", "ssl_key_file", "ssl_key_password_file")
    @classmethod
    def _readable_file(cls, path: Path | None) -> Path | None:
        if path is not None:
            try:
                with path.open("rb") as stream:
                    stream.read(1)
            except OSError as error:
                raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
        return path

    @model_validator(mode="after")
    def _coherent_security(self) -> Settings:
        """Fail closed: a credential or certificate the protocol would ignore is an error,
        not a connection quietly made without it."""
        problems = security_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _distinct_topics(self) -> Settings:
        topics = [self.input_topic, self.prompts_topic, self.audit_topic, self.dlq_topic,
                  self.policies_topic]
        if len(set(topics)) != len(topics):
            raise ValueError(
                f"input, prompts, audit, dlq and policies topics must differ: {topics}")
        return self

    @property
    def producer_compression(self) -> str | None:
        """compression_type as aiokafka's producers take it (None: uncompressed)."""
        return None if self.compression_type == "none" else self.compression_type

    @property
    def limits(self) -> Limits:
        return Limits.model_validate({name: getattr(self, name) for name in Limits.model_fields})

    @property
    def transactional_id_prefix(self) -> str:
        """What every transactional id of the worker starts with (its ACL is PREFIXED)."""
        return f"{self.transactional_id or self.group_id}-"

    def transactional_id_for(self, topic: str, partition: int) -> str:
        """The transactional id of whichever replica holds input partition `partition`."""
        return f"{self.transactional_id_prefix}{topic}-{partition}"


def security_problems(settings: Settings) -> list[str]:
    """What contradicts itself in the security settings, as variable names an operator sets."""
    protocol = settings.security_protocol
    sasl = protocol.startswith("SASL_")
    tls = protocol.endswith("SSL")
    mechanism = settings.sasl_mechanism
    problems = []
    if sasl and mechanism is None:
        problems.append(f"ASSEMBLER_SECURITY_PROTOCOL={protocol} needs ASSEMBLER_SASL_MECHANISM")
    sasl_given = [name for name in ("sasl_mechanism", "sasl_username", "sasl_password",
                                    "sasl_password_file", "sasl_oauthbearer_token_file")
                  if getattr(settings, name) is not None]
    if not sasl and sasl_given:
        problems.append(f"ASSEMBLER_{sasl_given[0].upper()} needs ASSEMBLER_SECURITY_PROTOCOL "
                        f"SASL_SSL or SASL_PLAINTEXT (it is {protocol})")
    tls_given = [name for name in ("ssl_ca_file", "ssl_cert_file", "ssl_key_file",
                                   "ssl_key_password_file")
                 if getattr(settings, name) is not None]
    if not settings.ssl_check_hostname:
        tls_given.append("ssl_check_hostname")
    if not tls and tls_given:
        problems.append(f"ASSEMBLER_{tls_given[0].upper()} needs ASSEMBLER_SECURITY_PROTOCOL "
                        f"SSL or SASL_SSL (it is {protocol})")
    if (settings.ssl_cert_file is None) != (settings.ssl_key_file is None):
        problems.append("ASSEMBLER_SSL_CERT_FILE and ASSEMBLER_SSL_KEY_FILE go together")
    if settings.ssl_key_password_file is not None and settings.ssl_key_file is None:
        problems.append("ASSEMBLER_SSL_KEY_PASSWORD_FILE needs ASSEMBLER_SSL_KEY_FILE")
    if sasl and mechanism == "OAUTHBEARER":
        if settings.sasl_oauthbearer_token_file is None:
            problems.append("ASSEMBLER_SASL_MECHANISM=OAUTHBEARER needs "
                            "ASSEMBLER_SASL_OAUTHBEARER_TOKEN_FILE")
        if settings.sasl_username or settings.sasl_password or settings.sasl_password_file:
            problems.append("ASSEMBLER_SASL_MECHANISM=OAUTHBEARER takes a token file, not "
                            "ASSEMBLER_SASL_USERNAME or a password")
    elif sasl and mechanism is not None:
        if not settings.sasl_username:
            problems.append(f"ASSEMBLER_SASL_MECHANISM={mechanism} needs ASSEMBLER_SASL_USERNAME")
        if (settings.sasl_password is None) == (settings.sasl_password_file is None):
            problems.append(f"ASSEMBLER_SASL_MECHANISM={mechanism} needs one of "
                            "ASSEMBLER_SASL_PASSWORD or ASSEMBLER_SASL_PASSWORD_FILE")
        if settings.sasl_oauthbearer_token_file is not None:
            problems.append("ASSEMBLER_SASL_OAUTHBEARER_TOKEN_FILE needs "
                            "ASSEMBLER_SASL_MECHANISM=OAUTHBEARER")
    return problems


def load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as error:
        problems = "; ".join(
            f"ASSEMBLER_{'_'.join(str(p) for p in e['loc']).upper() or '(settings)'}: {e['msg']}"
            for e in error.errors()
        )
        raise SettingsError(f"invalid settings: {problems}") from None
