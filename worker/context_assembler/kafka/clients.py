"""The one place Kafka clients are built: security, compression, timeouts and batch sizes.

Every aiokafka client of the package (the exactly_once consumer and producers, the admin
clients, the CLI's readers and producers) is made by `KafkaClients`, and faust, which builds
its own, gets its arguments from `faust_client_config`; so a cluster that needs TLS or SASL
is reached the same way by all of them. Secrets stay in SecretStr until the client needs
them; the password file is read at start, the OAUTHBEARER token file each time a connection
authenticates (or, for Amazon MSK's IAM login, a token is signed:
context_assembler.kafka.msk_iam).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.abc import AbstractTokenProvider
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.conn import create_conn
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.metadata import MetadataRequest
from pydantic import SecretStr

from context_assembler.kafka.errors import answered
from context_assembler.kafka.tuning import (
    ADMIN_REQUEST_TIMEOUT_MS,
    HEARTBEAT_INTERVAL_SECONDS,
    PRODUCER_LINGER_MS,
    PRODUCER_REQUEST_TIMEOUT_SECONDS,
)
from context_assembler.settings import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Settings,
    SettingsError,
    read_security_file,
    variable_of,
)


class TokenFile(AbstractTokenProvider):  # type: ignore[misc]
    """An OAUTHBEARER token read from a file at each authentication, so a token that a
    sidecar or a projected service-account volume rotates in place is the one sent."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def token(self) -> str:
        return await asyncio.to_thread(self.read)

    def read(self) -> str:
        """Each time as at start (`read_security_file`): rotated into a FIFO or a device,
        the file stops the client with a line naming it, never hangs it or fills memory."""
        token = _text(read_security_file(self.path, "sasl_oauthbearer_token_file"),
                      "ASSEMBLER_SASL_OAUTHBEARER_TOKEN_FILE", self.path).strip()
        if not token:
            raise SettingsError(f"ASSEMBLER_SASL_OAUTHBEARER_TOKEN_FILE {self.path} is empty")
        return token

    def __repr__(self) -> str:
        return f"TokenFile({str(self.path)!r})"


@dataclass(frozen=True)
class KafkaSecurity:
    """How the clients authenticate and encrypt; PLAINTEXT by default."""

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: SecretStr | None = None
    token_provider: AbstractTokenProvider | None = None  # OAUTHBEARER
    ssl_context: ssl.SSLContext | None = None

    def client_args(self) -> dict[str, Any]:
        """Keyword arguments for AIOKafkaConsumer, AIOKafkaProducer and AIOKafkaAdminClient."""
        args: dict[str, Any] = {"security_protocol": self.protocol}
        if self.ssl_context is not None:
            args["ssl_context"] = self.ssl_context
        if self.mechanism is not None:
            args["sasl_mechanism"] = self.mechanism
        if self.username is not None:
            args["sasl_plain_username"] = self.username
        if self.password is not None:
            args["sasl_plain_password"] = self.password.get_secret_value()
        if self.token_provider is not None:
            args["sasl_oauth_token_provider"] = self.token_provider
        return args

    def faust_credentials(self) -> Any:
        """faust's broker_credentials for the same connection (None: plaintext)."""
        import faust

        if self.token_provider is not None:
            return faust.OAuthCredentials(oauth_cb=self.token_provider,
                                          ssl_context=self.ssl_context)
        if self.mechanism is not None:
            password = self.password.get_secret_value() if self.password else None
            return faust.SASLCredentials(username=self.username, password=password,
                                         ssl_context=self.ssl_context, mechanism=self.mechanism)
        if self.ssl_context is not None:
            return faust.SSLCredentials(self.ssl_context)
        return None

    def describe(self) -> str:
        """The connection, for log lines and errors: never a secret."""
        described = self.protocol
        if self.mechanism:
            described += f" {self.mechanism}"
        if self.username:
            described += f" as {self.username}"
        if self.token_provider is not None:
            described += f" with {self.token_provider!r}"
        return described


PLAINTEXT = KafkaSecurity()


def kafka_security(settings: Settings) -> KafkaSecurity:
    """The settings' connection; raises SettingsError naming the variable when a file does
    not hold what it should (a key that does not match its certificate, a bad CA bundle)."""
    protocol = settings.security_protocol
    sasl = protocol.startswith("SASL_")
    return KafkaSecurity(
        protocol=protocol,
        mechanism=settings.sasl_mechanism if sasl else None,
        username=settings.sasl_username if sasl else None,
        password=_password(settings) if sasl else None,
        token_provider=_token_provider(settings) if sasl else None,
        ssl_context=_ssl_context(settings) if protocol.endswith("SSL") else None,
    )


@dataclass(frozen=True)
class KafkaClients:
    """Builds every aiokafka client of the package, each from the same connection: the
    bootstrap servers and security, and for producers the compression and largest request
    (the worker's MAX_MESSAGE_BYTES). A call's own arguments (a group, a transactional id,
    a batch size) come on top."""

    servers: str
    security: KafkaSecurity = PLAINTEXT
    compression: str | None = None  # producers' compression_type (None: uncompressed)
    max_request_size: int = DEFAULT_MAX_MESSAGE_BYTES

    @classmethod
    def of(cls, settings: Settings, security: KafkaSecurity | None = None) -> KafkaClients:
        """The settings' clients; `security` when the caller has read the settings' already
        (reading it again reads the secret files again)."""
        return cls(settings.bootstrap_servers,
                   kafka_security(settings) if security is None else security,
                   settings.producer_compression, settings.max_message_bytes)

    def producer(self, **args: Any) -> AIOKafkaProducer:
        """Acknowledged by every in-sync replica (acks=all) and idempotent unless `args` say
        otherwise: a record retried by the producer is never written twice."""
        return AIOKafkaProducer(**{
            "bootstrap_servers": self.servers, "acks": "all", "enable_idempotence": True,
            "max_request_size": self.max_request_size, "compression_type": self.compression,
            **self.security.client_args(), **args})

    def consumer(self, **args: Any) -> AIOKafkaConsumer:
        """Committing only where the caller commits, and reading only committed
        transactions (never an aborted transaction's records)."""
        return AIOKafkaConsumer(**{
            "bootstrap_servers": self.servers, "enable_auto_commit": False,
            "isolation_level": "read_committed", **self.security.client_args(), **args})

    def admin(self, **args: Any) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**{
            "bootstrap_servers": self.servers, "request_timeout_ms": ADMIN_REQUEST_TIMEOUT_MS,
            **self.security.client_args(), **args})


def group_consumer(settings: Settings, security: KafkaSecurity | None = None) -> AIOKafkaConsumer:
    """The exactly_once worker's consumer of its group: static membership if
    ASSEMBLER_GROUP_INSTANCE_ID is set, the settings' session timeout, a heartbeat a second
    (a rebalance heard within one), from the earliest offset where the group has none.
    `faust_client_config` gives faust's consumer the same."""
    return KafkaClients.of(settings, security).consumer(
        group_id=settings.group_id,
        group_instance_id=settings.group_instance_id,
        auto_offset_reset="earliest",
        session_timeout_ms=int(settings.session_timeout_seconds * 1000),
        heartbeat_interval_ms=int(HEARTBEAT_INTERVAL_SECONDS * 1000),
    )


def faust_client_config(settings: Settings, batch_bytes: int) -> dict[str, Any]:
    """faust's settings for the clients it builds, as `KafkaClients` and `group_consumer`
    build ours: the same servers, security, group membership, acks, request size,
    compression, batching and request timeout (aiokafka's, where faust's 20 minutes would
    leave a send to a missing topic hanging silently)."""
    return dict(
        broker=[f"kafka://{server.strip()}" for server in settings.bootstrap_servers.split(",")],
        broker_credentials=kafka_security(settings).faust_credentials(),
        consumer_auto_offset_reset="earliest",
        # A killed replica holds its partitions until this runs out (faust's default: 60 s).
        broker_session_timeout=settings.session_timeout_seconds,
        broker_heartbeat_interval=HEARTBEAT_INTERVAL_SECONDS,
        consumer_group_instance_id=settings.group_instance_id,  # static membership if set
        producer_acks=-1,
        producer_max_request_size=settings.max_message_bytes,
        producer_request_timeout=PRODUCER_REQUEST_TIMEOUT_SECONDS,
        producer_max_batch_size=batch_bytes,
        producer_linger=PRODUCER_LINGER_MS / 1000,
        producer_compression_type=settings.producer_compression,
    )


def _token_provider(settings: Settings) -> AbstractTokenProvider | None:
    if settings.sasl_oauthbearer_token_file is not None:
        return TokenFile(settings.sasl_oauthbearer_token_file)
    if settings.sasl_oauth_provider == "aws_msk_iam" and settings.aws_region:
        from context_assembler.kafka.msk_iam import MskIamTokenProvider

        return MskIamTokenProvider(settings.aws_region)
    return None


def _password(settings: Settings) -> SecretStr | None:
    if settings.sasl_password_file is None:
        return settings.sasl_password
    return SecretStr(_read_secret(settings.sasl_password_file, "sasl_password_file"))


def _read_secret(path: Path, name: str) -> str:
    """A secret file's text without its final newline (as `echo` and Kubernetes write it)."""
    return _text(read_security_file(path, name), variable_of(name), path).rstrip("\r\n")


def _text(data: bytes, variable: str, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SettingsError(f"{variable}: cannot read {path}: {error}") from None


def _ssl_context(settings: Settings) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(
            cafile=str(settings.ssl_ca_file) if settings.ssl_ca_file else None)
    except (ssl.SSLError, OSError) as error:
        raise SettingsError(f"ASSEMBLER_SSL_CA_FILE {settings.ssl_ca_file}: no CA "
                            f"certificate could be loaded ({error})") from None
    context.check_hostname = settings.ssl_check_hostname
    if settings.ssl_cert_file is not None and settings.ssl_key_file is not None:
        key_password = (_read_secret(settings.ssl_key_password_file, "ssl_key_password_file")
                        if settings.ssl_key_password_file else None)
        try:
            context.load_cert_chain(settings.ssl_cert_file, settings.ssl_key_file, key_password)
        except (ssl.SSLError, OSError) as error:
            raise SettingsError(
                f"ASSEMBLER_SSL_CERT_FILE {settings.ssl_cert_file} and ASSEMBLER_SSL_KEY_FILE "
                f"{settings.ssl_key_file}: not a certificate and its key, or a wrong "
                f"ASSEMBLER_SSL_KEY_PASSWORD_FILE ({error.__class__.__name__})") from None
    return context


# What a client's start raises when the broker will not have this connection: it cannot be
# reached or closes it, or (a SASL client at a listener without SASL) answers the SASL
# handshake with ILLEGAL_SASL_STATE. `connection_problem` says which.
REFUSED_CONNECTION = (KafkaConnectionError, IllegalSaslStateError)

ACLS_HINT = "grant the ACLs `context-assembler acls --principal User:NAME` prints"
_AUTHORIZATION_ERRORS = (TopicAuthorizationFailedError, GroupAuthorizationFailedError,
                         TransactionalIdAuthorizationFailed)


def acl_hint(error: BaseException | None) -> str:
    """What to add to a refusal that an ACL would lift ('' for any other error)."""
    return f" (a missing ACL: {ACLS_HINT})" if isinstance(error, _AUTHORIZATION_ERRORS) else ""


async def connection_problem(servers: str, security: KafkaSecurity) -> str | None:
    """Why the first bootstrap server refuses this connection, as one line naming the
    setting to fix; None when it connects (or cannot be reached at all, which callers
    report as they always have). aiokafka itself only logs the cause and retries."""
    host, _, port = servers.split(",")[0].strip().rpartition(":")
    settings = "ASSEMBLER_SASL_USERNAME and ASSEMBLER_SASL_PASSWORD or _PASSWORD_FILE"
    if isinstance(security.token_provider, TokenFile):
        settings = "the token in ASSEMBLER_SASL_OAUTHBEARER_TOKEN_FILE"
    elif security.token_provider is not None:  # Amazon MSK's IAM login
        settings = ("the IAM policy of the process's AWS identity (kafka-cluster:Connect on "
                    "this cluster), ASSEMBLER_AWS_REGION")
    try:
        connection = await create_conn(host, int(port),
                                       request_timeout_ms=ADMIN_REQUEST_TIMEOUT_MS,
                                       **security.client_args())
    except SaslAuthenticationFailed:
        return (f"SASL authentication failed at {servers} ({security.describe()}): check "
                f"{settings} and ASSEMBLER_SASL_MECHANISM")
    except IllegalSaslStateError:
        return (f"the broker at {servers} does not take SASL on this listener "
                f"({security.describe()}): set ASSEMBLER_SECURITY_PROTOCOL to the listener's "
                "(PLAINTEXT or SSL where it has no SASL)")
    except UnsupportedSaslMechanismError:
        return (f"the broker at {servers} does not accept ASSEMBLER_SASL_MECHANISM="
                f"{security.mechanism} on this listener: set the mechanism it enables")
    except ssl.SSLCertVerificationError as error:
        return (f"the broker's TLS certificate at {servers} is not trusted: "
                f"{error.verify_message}: check ASSEMBLER_SSL_CA_FILE (the CA that signed it) "
                "and ASSEMBLER_SSL_CHECK_HOSTNAME")
    except ssl.SSLError as error:
        return (f"TLS handshake with {servers} failed ({error.reason or error}): check "
                "ASSEMBLER_SECURITY_PROTOCOL and ASSEMBLER_SSL_CERT_FILE/ASSEMBLER_SSL_KEY_FILE")
    except KafkaConnectionError as error:
        if "closed" not in str(error):
            return None
        return (f"the broker at {servers} closed the connection ({security.describe()}): "
                "check ASSEMBLER_SECURITY_PROTOCOL against the listener's (TLS or not, SASL "
                "or not), and ASSEMBLER_SSL_CERT_FILE/ASSEMBLER_SSL_KEY_FILE if it requires a "
                "client certificate")
    except (OSError, TimeoutError, ValueError):
        return None
    try:
        if security.token_provider is not None and not await _lists_brokers(connection):
            return (f"the broker at {servers} did not accept the OAUTHBEARER token "
                    f"({security.describe()}): check {settings}")
    finally:
        connection.close()
    return None


async def _lists_brokers(connection: Any) -> bool:
    """Whether the broker answers this connection's metadata request with its brokers.
    aiokafka does not read a broker's refusal of an OAUTHBEARER token (the error challenge
    it answers in place of a success): the connection seems open, but a broker that refused
    the token lists no broker, which no authenticated client ever sees."""
    try:
        response = await connection.send(MetadataRequest([]))
    except (KafkaError, OSError, TimeoutError):
        return True  # another problem, which the callers report as they always have
    return bool(response.brokers)


async def start_up_problem(servers: str, security: KafkaSecurity, topics: list[str],
                           group: str) -> str | None:
    """What keeps the worker from working with these credentials, checked before it joins
    its group: the broker refusing them, a topic it may not even DESCRIBE, or a group it may
    not READ (faust would wait for the group silently). A broker that does not answer, or a
    topic not created yet, is not a problem here: the worker waits for those, saying so on
    /ready."""
    problem = await connection_problem(servers, security)
    if problem:
        return problem
    admin = KafkaClients(servers, security).admin()
    try:
        await admin.start()
        described = await admin.describe_topics(topics)
        denied = sorted(t["topic"] for t in described
                        if answered(t, TopicAuthorizationFailedError))
        if denied:
            return (f"{security.describe()} is not authorized to DESCRIBE topics "
                    f"{', '.join(denied)}: {ACLS_HINT}")
        await admin.list_consumer_group_offsets(group)  # needs the group's READ
    except GroupAuthorizationFailedError:
        return f"{security.describe()} is not authorized to READ group {group}: {ACLS_HINT}"
    except (KafkaError, TimeoutError):
        return None
    finally:
        await admin.close()
    return None
