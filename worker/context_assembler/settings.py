"""Every setting of every command, in one model: the environment (prefix ASSEMBLER_) and flags.

A setting is declared once, here: its type, default, constraints, description and, unless it
is a secret or a deployment knob only the environment sets, its command-line flag (the topics'
defaults come from the contract's catalogue). The command line says which settings each
command reads (`cli.settings_flags`) and offers those settings' flags. A flag given wins over
the environment, which wins over the default, for every command alike. Invalid settings fail
at start with one message naming each bad one by variable and flag.
"""

from __future__ import annotations

import difflib
import importlib.util
import ipaddress
from collections.abc import Mapping
from copy import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from context_assembler.contract.catalogue import (
    TOPIC_RULE,
    TOPIC_SETTINGS,
    topic_named_by,
    topic_problem,
)
from context_assembler.engine import caches
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.engine.operator_files import OperatorFileError, read_operator_file
from context_assembler.intake.codec import Limits

ENV_PREFIX: Final = "ASSEMBLER_"
# The producer's default max.request.size (the broker's max.message.bytes is 12 bytes more),
# and the least the worker accepts: a dead letter cut to its bones (Connect's headers with a
# capped message, no key, no value) fits in that much.
DEFAULT_MAX_MESSAGE_BYTES = 1_048_576
MIN_MESSAGE_BYTES = 16_384
# aiokafka compresses and decodes snappy, lz4 and zstd with cramjam, its codec extras.
CODEC_PACKAGE = "cramjam"
INSTALL = "pip install 'aiokafka[snappy,lz4,zstd]'"
# Amazon MSK's IAM login: AWS's signer, the msk-iam extra (it pulls in boto3).
MSK_IAM_PACKAGE = "aws_msk_iam_sasl_signer"
MSK_IAM_INSTALL = "pip install 'context-assembler[msk-iam]'"
# Most bytes one compressed record batch of input may decompress to, and the most bytes of
# records read ahead (kafka.batches): far above what producers batch by default, while three
# times it (a batch being decoded, the read-ahead, a fetch call's last record) stays well
# under the deployments' memory limit (bench/README.md has the sizes).
DEFAULT_MAX_BATCH_BYTES = 32 * 1024 * 1024
# The worker's commit interval when unset, per guarantee (docs/delivery.md has the trade-off,
# bench/README.md the figures): exactly_once, less CPU than back-to-back rounds for little
# latency; at_least_once, it bounds what a kill -9 redoes.
DEFAULT_COMMIT_INTERVAL_MS: Final[Mapping[str, int]] = {"exactly_once": 50,
                                                        "at_least_once": 30}
# Below the least session timeout: a revoked partition's hand-over waits for the next round.
MAX_COMMIT_INTERVAL_MS = 5_000


class SettingsError(ContextAssemblerError, ValueError):
    """Invalid settings, each named by its ASSEMBLER_* variable (and its flag, if it has one)."""


# The most a security file may hold: a password or a token (a Kubernetes service-account
# token is about 1 KB), and a PEM certificate, key or CA bundle (the system's is ~220 KB).
SECRET_FILE_BYTES: Final = 64 * 1024
PEM_FILE_BYTES: Final = 4 * 2**20
_SECRETS: Final = ("sasl_password_file", "sasl_oauthbearer_token_file", "ssl_key_password_file")


def read_security_file(path: Path, name: str) -> bytes:
    """The bytes of the file setting `name` names, read as the operator files are (a
    regular file, opened without waiting, at most its kind's size); SettingsError naming
    the variable otherwise."""
    limit = SECRET_FILE_BYTES if name in _SECRETS else PEM_FILE_BYTES
    try:
        return read_operator_file(path, variable_of(name), limit)
    except OperatorFileError as error:
        raise SettingsError(str(error)) from None


@dataclass(frozen=True)
class Flag:
    """The command-line option of a setting; `repeatable`: given once per value."""

    option: str
    repeatable: bool = False


def _limit(name: str, description: str) -> Any:
    """Limits' field `name` (its default and constraints, declared there once), to be read
    from the flat variable ASSEMBLER_<NAME>."""
    field = copy(Limits.model_fields[name])
    field.description = description
    return field


def _cache(name: str, description: str) -> Any:
    """The byte cap of the engine cache `name`, its default the registry's."""
    return Field(default=caches.CACHES[name].max_bytes, ge=1, description=description)


def _topic(setting: str) -> Any:
    """A topic's setting: its default name and what goes through it, from the catalogue."""
    topic = topic_named_by(setting)
    return Field(default=topic.default, min_length=1,
                 description=f"{topic.usage} A topic name as Kafka takes it: {TOPIC_RULE}.")


_WILDCARD: Final = "*"


def name_problem(name: str, what: str) -> str | None:
    """Why `name` cannot name a group or a transactional id: blank, the ACL wildcard `*`,
    or holding a control, format or line-break character. None if it can."""
    if not name.strip():
        return f"a {what} may not be blank"
    if name == _WILDCARD:
        return f"{name!r} is the ACL wildcard (every {what}), not a {what}"
    if not name.isprintable():
        return f"{name!r}: a {what} may not hold control or line-break characters"
    return None


def bootstrap_problem(servers: str) -> str | None:
    """Why `servers` is not a list of host[:port] pairs the Kafka client can read."""
    for entry in servers.split(","):
        address = entry.strip()
        if address.startswith("["):  # [IPv6]:port
            host, closed, rest = address[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else None
            valid = bool(closed) and _ipv6(host) and (not rest or port is not None)
        elif address.count(":") > 1 and _ipv6(address):  # a bare IPv6 address
            host, port, valid = address, None, True
        else:
            host, colon, given = address.rpartition(":") if ":" in address else (address, "", "")
            port = given if colon else None
            valid = bool(host) and not any(c.isspace() or c in "/@[]" for c in host)
        if valid and port is not None:
            valid = port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
        if not valid:
            return (f"{entry!r} is not a broker address: expected host:port (port 1 to 65535) "
                    "or [IPv6]:port, comma-separated")
    return None


def _ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _codec_available(codec_name: str) -> bool:
    """Whether aiokafka can compress and decode `codec_name` here: the standard library has
    gzip, cramjam the others. Checked without importing the Kafka client."""
    if codec_name in ("none", "gzip"):
        return True
    try:
        import cramjam  # noqa: F401
    except ImportError:
        return False
    return True


class Settings(BaseSettings):
    """Every setting of every command; each command reads those `cli.settings_flags` names."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    # Kafka: where, and which topics and group.
    bootstrap_servers: Annotated[str, Flag("--bootstrap-servers")] = Field(
        default="127.0.0.1:9092", min_length=1,
        description="The Kafka brokers to connect to, comma-separated host:port pairs "
        "([IPv6]:port for an IPv6 address; port 1 to 65535).")
    input_topic: Annotated[str, Flag("--input-topic")] = _topic("input_topic")
    prompts_topic: Annotated[str, Flag("--prompts-topic")] = _topic("prompts_topic")
    audit_topic: Annotated[str, Flag("--audit-topic")] = _topic("audit_topic")
    dlq_topic: Annotated[str, Flag("--dlq-topic")] = _topic("dlq_topic")
    policies_topic: Annotated[str, Flag("--policies-topic")] = _topic("policies_topic")
    group_id: Annotated[str, Flag("--group-id")] = Field(
        default="context-assembler", min_length=1,
        description="The consumer group: workers of one group split the input partitions. "
        "Not blank, not `*` (the ACL wildcard), no control characters.")
    # Policies and the limits on events: every command that assembles reads them.
    policy_file: Annotated[str | None, Flag("--policy")] = Field(
        default=None, description="The service policy: a TOML file or a preset name; unset: "
        "the default preset.")
    allowed_policies: Annotated[
        tuple[str, ...], NoDecode, Flag("--allow-policy", repeatable=True)
    ] = Field(
        default=(),
        description="Policies (preset names or TOML files) a request may name: comma-separated "
        "in the variable, one per flag. Unset: none, so a request naming any policy other "
        "than the service's is rejected.",
    )
    max_event_bytes: Annotated[int, Flag("--max-event-bytes")] = _limit(
        "max_event_bytes", "Largest event accepted, in bytes; a larger one is rejected unread.")
    max_batch_bytes: Annotated[int, Flag("--max-batch-bytes")] = Field(
        default=DEFAULT_MAX_BATCH_BYTES, ge=1024 * 1024,
        description="Most bytes a compressed record batch read from Kafka may decompress to, "
        "at least max_event_bytes; a batch that would decompress to more is skipped unread "
        "and dead-lettered (limits). Also the most bytes of records read ahead: the worker "
        "fetches no more while those it holds reach it.")
    max_chunks: Annotated[int, Flag("--max-chunks")] = _limit(
        "max_chunks", "Most chunks one event may carry.")
    max_chunk_chars: Annotated[int, Flag("--max-chunk-chars")] = _limit(
        "max_chunk_chars", "Longest chunk text accepted, in characters.")
    max_question_chars: Annotated[int, Flag("--max-question-chars")] = _limit(
        "max_question_chars", "Longest question accepted, in characters.")
    max_chunk_id_chars: Annotated[int, Flag("--max-chunk-id-chars")] = _limit(
        "max_chunk_id_chars", "Longest chunk id accepted, in characters: an id is copied into "
        "the outputs, so it bounds what one event costs per input byte.")
    # The engine's caches (engine/caches.py): what it remembers of popular texts.
    cache_facts_bytes: Annotated[int, Flag("--cache-facts-bytes")] = _cache(
        "facts", "Bytes the engine keeps of per-text facts (word sketches, passage costs, word "
        "forms).")
    cache_words_bytes: Annotated[int, Flag("--cache-words-bytes")] = _cache(
        "words", "Bytes the engine keeps of word sets, for the near-copy test.")
    cache_tokens_bytes: Annotated[int, Flag("--cache-tokens-bytes")] = _cache(
        "tokens", "Bytes the engine keeps of token counts by text, per tokenizer.")
    cache_sentences_bytes: Annotated[int, Flag("--cache-sentences-bytes")] = _cache(
        "sentences", "Bytes the engine keeps of passages cut into sentences, for focused "
        "compression.")
    # The worker's runtime.
    processing_guarantee: Annotated[
        Literal["at_least_once", "exactly_once"], Flag("--processing-guarantee")
    ] = Field(default="at_least_once", description="at_least_once (faust) or exactly_once "
              "(each event's outputs and its offset in one transaction).")
    transactional_id: Annotated[str | None, Flag("--transactional-id")] = Field(
        default=None,
        description="exactly_once only: the prefix of the transactional ids, one per input "
        "partition (<prefix>-<topic>-<partition>), the same on every replica, so that a "
        "partition's next owner fences its previous one. Unset: the group id; never blank or `*`.",
    )
    commit_interval_ms: Annotated[int | None, Flag("--commit-interval-ms")] = Field(
        default=None, ge=0, le=MAX_COMMIT_INTERVAL_MS,
        description="The least time between the starts of two commits, in milliseconds: "
        "exactly_once, of two rounds of transactions (events assembled in between share one); "
        "at_least_once, of two offset commits (a kill -9 redoes about that long's deliveries). "
        "A commit that took longer is followed at once. Unset: 50 under exactly_once, 30 "
        "under at_least_once.",
    )
    http_host: Annotated[str, Flag("--http-host")] = Field(
        default="127.0.0.1",
        description="Where the worker's /metrics, /health and /ready listen: this machine only "
        "by default; 0.0.0.0 in a container, for probes and scrapes from outside it.",
    )
    http_port: Annotated[int, Flag("--http-port")] = Field(
        default=8080, ge=0, le=65535, description="The port of the worker's /metrics, /health "
        "and /ready.")
    retry_backoff_max_seconds: Annotated[float, Flag("--retry-backoff-max-seconds")] = Field(
        default=5.0, gt=0, allow_inf_nan=False,
        description="Longest wait between two attempts to publish or commit.")
    max_message_bytes: Annotated[int, Flag("--max-message-bytes")] = Field(
        default=DEFAULT_MAX_MESSAGE_BYTES, ge=MIN_MESSAGE_BYTES,
        description="Largest record the worker publishes (key, value, headers and overhead), "
        "and the producers' max_request_size; at most the topics' max.message.bytes. An "
        "output over it goes to the DLQ as output_too_large; a dead letter over it is cut.",
    )
    compression_type: Annotated[
        Literal["none", "gzip", "snappy", "lz4", "zstd"], Flag("--compression-type")
    ] = Field(
        default="zstd",
        description="The codec of every record batch the worker and the CLI's producers "
        "publish (bench/README.md has each one's bytes and CPU). Input is decoded whatever "
        "its codec.",
    )
    shutdown_grace_seconds: Annotated[float, Flag("--shutdown-grace-seconds")] = Field(
        default=20.0, gt=0, allow_inf_nan=False,
        description="SIGTERM to exit, at most: in-flight events get half of it to be delivered. "
        "Keep it under Kubernetes' terminationGracePeriodSeconds (30).",
    )
    session_timeout_seconds: Annotated[float, Flag("--session-timeout-seconds")] = Field(
        default=10.0, ge=6, le=300, description="How long a silent replica keeps its partitions."
    )
    group_instance_id: Annotated[str | None, Flag("--group-instance-id")] = Field(
        default=None,
        description="Static group membership: an id unique and stable per replica (a "
        "StatefulSet pod's name): restarted within the session timeout, the replica gets its "
        "partitions back without a group-wide rebalance; killed, it holds them that long; "
        "stopped (SIGTERM) it leaves the group at once. Unset (or empty): a dynamic member.",
    )
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], Flag("--log-level")] = Field(
        default="INFO", description="JSON log lines on stderr at this level and above.")
    # The HTTP endpoint (`serve`).
    serve_host: Annotated[str, Flag("--host")] = Field(
        default="127.0.0.1", min_length=1,
        description="Where serve listens: this machine only by default; 0.0.0.0 to listen "
        "beyond it.")
    serve_port: Annotated[int, Flag("--port")] = Field(
        default=8000, ge=0, le=65535, description="serve's port (0: any free port).")
    max_pending: Annotated[int, Flag("--max-pending")] = Field(
        default=64, ge=1,
        description="Requests waiting for the engine at once, and bodies held of this many "
        "times max_event_bytes; more get 503.")
    body_timeout_seconds: Annotated[float, Flag("--body-timeout")] = Field(
        default=10.0, gt=0, allow_inf_nan=False,
        description="Seconds a request body may take to arrive after its head (a slower client "
        "gets 408), and its answer to be read.")
    idle_timeout_seconds: Annotated[float, Flag("--idle-timeout")] = Field(
        default=75.0, gt=0, allow_inf_nan=False,
        description="Seconds a connection may wait for a complete request head, idle or slow, "
        "before it is closed; behind a load balancer, set it above the balancer's idle timeout.")
    # Connecting to a secured cluster (docs/secured-cluster.md): every Kafka client of the
    # worker and of the CLI is built from these (context_assembler.kafka.clients). No
    # flags: a secret on a command line is visible to every user of the machine.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="How the Kafka clients connect.")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = (
        Field(default=None, description="SASL_* protocols: how the client authenticates."))
    sasl_username: str | None = Field(
        default=None, description="PLAIN and SCRAM: the client's user name.")
    sasl_password: SecretStr | None = Field(
        default=None, description="PLAIN and SCRAM: the password (never logged); or "
        "sasl_password_file.")
    sasl_password_file: Path | None = Field(
        default=None, description="PLAIN and SCRAM: a file holding the password.")
    sasl_oauthbearer_token_file: Path | None = Field(
        default=None, description="OAUTHBEARER: the token's file, read again whenever the "
        "client authenticates, so a token rotated in place (a projected service-account "
        "token, a sidecar) is picked up.")
    sasl_oauth_provider: Literal["aws_msk_iam"] | None = Field(
        default=None, description="OAUTHBEARER without a token file: aws_msk_iam signs Amazon "
        "MSK's IAM tokens with the AWS credentials the process finds (its IAM role, AWS_* "
        "variables); needs the msk-iam extra and aws_region.")
    aws_region: str | None = Field(
        default=None, description="aws_msk_iam: the AWS region of the MSK cluster, e.g. "
        "eu-west-1.")
    ssl_ca_file: Path | None = Field(
        default=None, description="PEM CA bundle; default: the system's trusted CAs.")
    ssl_cert_file: Path | None = Field(
        default=None, description="Mutual TLS: the client's PEM certificate.")
    ssl_key_file: Path | None = Field(
        default=None, description="Mutual TLS: the client certificate's PEM key.")
    ssl_key_password_file: Path | None = Field(
        default=None, description="Mutual TLS: a file holding the key's password.")
    ssl_check_hostname: bool = Field(
        default=True, description="Whether the broker's certificate must name the host.")

    # A schema registry (docs/schema-registry.md): records framed in the Confluent wire format.
    schema_registry_url: str | None = Field(
        default=None,
        description="A Confluent-compatible schema registry's base URL (Apicurio's ends in "
        "/apis/ccompat/v7). Set: input framed with a schema id is checked against that JSON "
        "Schema, plain JSON still read; prompts, audits and policy records are framed with "
        "their registered ids. Unset: plain JSON only.")
    schema_registry_user: str | None = Field(
        default=None, description="Basic auth: the registry's user (Confluent Cloud: the "
        "registry API key).")
    schema_registry_password_file: Path | None = Field(
        default=None, description="Basic auth: a file holding the password (Confluent "
        "Cloud: the registry API secret).")
    schema_registry_ca_file: Path | None = Field(
        default=None, description="PEM CA bundle for an https registry; default: the "
        "system's trusted CAs.")
    schema_registry_subject_strategy: Literal["topic", "record", "topic_record"] = Field(
        default="topic",
        description="The subject a record's schema is under: topic (<topic>-value), record "
        "(the schema's title, e.g. AssembledPrompt) or topic_record (<topic>-<title>).")
    schema_registry_auto_register: bool = Field(
        default=False,
        description="Whether the worker registers the output schemas it does not find "
        "under their subjects; off: `context-assembler schemas register` does it, in a "
        "deploy step, and the worker only looks their ids up.")

    @field_validator("allowed_policies", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("compression_type")
    @classmethod
    def _codec_installed(cls, value: str) -> str:
        if not _codec_available(value):  # fail at start, not at the first send
            raise ValueError(f"{value} needs the {CODEC_PACKAGE} package ({INSTALL})")
        return value

    @field_validator("commit_interval_ms", "group_instance_id", "sasl_mechanism",
                     "sasl_username", "sasl_password", "sasl_password_file",
                     "sasl_oauthbearer_token_file", "sasl_oauth_provider", "aws_region",
                     "ssl_ca_file", "ssl_cert_file", "ssl_key_file", "ssl_key_password_file",
                     "schema_registry_url", "schema_registry_user",
                     "schema_registry_password_file", "schema_registry_ca_file", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return value.strip() or None if isinstance(value, str) else value

    @field_validator("sasl_oauth_provider")
    @classmethod
    def _signer_installed(cls, value: str | None) -> str | None:
        if value == "aws_msk_iam" and importlib.util.find_spec(MSK_IAM_PACKAGE) is None:
            raise ValueError(f"aws_msk_iam needs AWS's signer ({MSK_IAM_INSTALL})")
        return value

    @field_validator("sasl_password_file", "sasl_oauthbearer_token_file", "ssl_ca_file",
                     "ssl_cert_file", "ssl_key_file", "ssl_key_password_file",
                     "schema_registry_password_file", "schema_registry_ca_file")
    @classmethod
    def _readable_file(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        """Read as every operator file is: a FIFO must not hang the start, nor a device
        such as /dev/zero be read without end."""
        if path is not None:
            assert info.field_name is not None
            read_security_file(path, info.field_name)
        return path

    @field_validator(*TOPIC_SETTINGS)
    @classmethod
    def _topic_name(cls, value: str) -> str:
        problem = topic_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("group_id", "transactional_id")
    @classmethod
    def _group_or_transactional_id(cls, value: str | None, info: ValidationInfo) -> str | None:
        what = "group id" if info.field_name == "group_id" else "transactional id"
        problem = None if value is None else name_problem(value, what)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("bootstrap_servers")
    @classmethod
    def _broker_addresses(cls, value: str) -> str:
        problem = bootstrap_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _coherent_security(self) -> Settings:
        """Fail closed: a credential or certificate the protocol would ignore is an error,
        not a connection quietly made without it."""
        problems = security_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @field_validator("schema_registry_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url

    @model_validator(mode="after")
    def _coherent_registry(self) -> Settings:
        """Fail closed: registry credentials or a CA with no registry to use them on."""
        if self.schema_registry_url is None:
            given = [name for name in ("schema_registry_user", "schema_registry_password_file",
                                       "schema_registry_ca_file")
                     if getattr(self, name) is not None]
            if given or self.schema_registry_auto_register:
                name = given[0] if given else "schema_registry_auto_register"
                raise ValueError(f"ASSEMBLER_{name.upper()} needs ASSEMBLER_SCHEMA_REGISTRY_URL")
        elif (self.schema_registry_user is None) != (self.schema_registry_password_file is None):
            raise ValueError("ASSEMBLER_SCHEMA_REGISTRY_USER and "
                             "ASSEMBLER_SCHEMA_REGISTRY_PASSWORD_FILE go together")
        return self

    @model_validator(mode="after")
    def _batch_holds_an_event(self) -> Settings:
        if self.max_batch_bytes < self.max_event_bytes:
            raise ValueError(f"ASSEMBLER_MAX_BATCH_BYTES={self.max_batch_bytes} is below "
                             f"ASSEMBLER_MAX_EVENT_BYTES={self.max_event_bytes}: a batch of "
                             "one event of the largest size accepted would be skipped")
        return self

    @model_validator(mode="after")
    def _distinct_topics(self) -> Settings:
        topics = [getattr(self, setting) for setting in TOPIC_SETTINGS]
        if len(set(topics)) != len(topics):
            raise ValueError(
                f"input, prompts, audit, dlq and policies topics must differ: {topics}")
        return self

    @property
    def producer_compression(self) -> str | None:
        """compression_type as aiokafka's producers take it (None: uncompressed)."""
        return None if self.compression_type == "none" else self.compression_type

    def size_engine_caches(self) -> None:
        """Give the engine's caches the byte caps these settings name."""
        caches.configure(facts=self.cache_facts_bytes, words=self.cache_words_bytes,
                         tokens=self.cache_tokens_bytes, sentences=self.cache_sentences_bytes)

    @property
    def commit_interval_seconds(self) -> float:
        """commit_interval_ms, or the guarantee's default when unset, in seconds."""
        interval_ms = self.commit_interval_ms
        if interval_ms is None:
            interval_ms = DEFAULT_COMMIT_INTERVAL_MS[self.processing_guarantee]
        return interval_ms / 1000

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
                                    "sasl_password_file", "sasl_oauthbearer_token_file",
                                    "sasl_oauth_provider")
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
        if (settings.sasl_oauthbearer_token_file is None) == (settings.sasl_oauth_provider
                                                              is None):
            problems.append("ASSEMBLER_SASL_MECHANISM=OAUTHBEARER needs one of "
                            "ASSEMBLER_SASL_OAUTHBEARER_TOKEN_FILE or "
                            "ASSEMBLER_SASL_OAUTH_PROVIDER")
        if settings.sasl_username or settings.sasl_password or settings.sasl_password_file:
            problems.append("ASSEMBLER_SASL_MECHANISM=OAUTHBEARER takes a token file, not "
                            "ASSEMBLER_SASL_USERNAME or a password")
        if settings.sasl_oauth_provider == "aws_msk_iam":
            if not settings.aws_region:
                problems.append("ASSEMBLER_SASL_OAUTH_PROVIDER=aws_msk_iam needs "
                                "ASSEMBLER_AWS_REGION")
            if protocol != "SASL_SSL":  # MSK's IAM listener is TLS only
                problems.append("ASSEMBLER_SASL_OAUTH_PROVIDER=aws_msk_iam needs "
                                f"ASSEMBLER_SECURITY_PROTOCOL=SASL_SSL (it is {protocol})")
    elif sasl and mechanism is not None:
        if not settings.sasl_username:
            problems.append(f"ASSEMBLER_SASL_MECHANISM={mechanism} needs ASSEMBLER_SASL_USERNAME")
        if (settings.sasl_password is None) == (settings.sasl_password_file is None):
            problems.append(f"ASSEMBLER_SASL_MECHANISM={mechanism} needs one of "
                            "ASSEMBLER_SASL_PASSWORD or ASSEMBLER_SASL_PASSWORD_FILE")
        for name in ("sasl_oauthbearer_token_file", "sasl_oauth_provider"):
            if getattr(settings, name) is not None:
                problems.append(f"ASSEMBLER_{name.upper()} needs "
                                "ASSEMBLER_SASL_MECHANISM=OAUTHBEARER")
    if settings.aws_region and settings.sasl_oauth_provider != "aws_msk_iam":
        problems.append("ASSEMBLER_AWS_REGION needs ASSEMBLER_SASL_OAUTH_PROVIDER=aws_msk_iam")
    return problems


def flag_of(name: str) -> Flag | None:
    """The flag of setting `name`, None if only the environment sets it."""
    return next((m for m in Settings.model_fields[name].metadata if isinstance(m, Flag)), None)


def variable_of(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def _named(location: tuple[int | str, ...], options: Mapping[str, str | None]) -> str:
    """The variable and the flag of the setting an error is about."""
    if not location:
        return "(settings)"
    name = str(location[0])
    if name in options:
        option = options[name]
    else:
        flag = flag_of(name) if name in Settings.model_fields else None
        option = flag.option if flag is not None else None
    return variable_of(name) + (f" ({option})" if option is not None else "")


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each ASSEMBLER_ variable of `environ` that names no setting (read, as
    the settings are, whatever its case), with the closest one it may have meant. A warning,
    not an error: the default it leaves in place is a safe one, and a variable of a newer or
    older version must not stop a deployment."""
    known = [name.upper() for name in Settings.model_fields]
    warnings = []
    for variable in sorted(environ):
        shown = variable.upper()
        if not shown.startswith(ENV_PREFIX) or shown.removeprefix(ENV_PREFIX) in known:
            continue
        closest = difflib.get_close_matches(shown.removeprefix(ENV_PREFIX), known, n=1)
        hint = (f"did you mean {ENV_PREFIX}{closest[0]}?" if closest
                else "docs/settings.md lists the settings")
        warnings.append(f"{variable} is not a setting and is ignored; {hint}")
    return warnings


def load_settings(flags: Mapping[str, Any] | None = None,
                  options: Mapping[str, str | None] | None = None) -> Settings:
    """The settings: each of `flags` (setting name -> the value given on the command line)
    over its ASSEMBLER_ variable, over its default. An error names a setting's variable and
    its flag, or the option `options` says the command names it by (None: none)."""
    try:
        return Settings(**(flags or {}))
    except ValidationError as error:
        problems = "; ".join(f"{_named(e['loc'], options or {})}: {e['msg']}"
                             for e in error.errors())
        raise SettingsError(f"invalid settings: {problems}") from None
