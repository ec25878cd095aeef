"""The security settings: validated at load, turned into client arguments in one place,
secrets kept out of every string an operator sees."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path
from typing import Any

import faust
import pytest

from context_assembler.cli.main import main
from context_assembler.kafka import clients
from context_assembler.kafka.clients import (
    KafkaClients,
    TokenFile,
    faust_client_config,
    group_consumer,
    kafka_security,
)
from context_assembler.kafka.tuning import (
    ADMIN_REQUEST_TIMEOUT_MS,
    HEARTBEAT_INTERVAL_SECONDS,
    PRODUCER_LINGER_MS,
)
from context_assembler.settings import Settings, SettingsError, load_settings
from harness.secured import Certificates

PASSWORD = "s3cret-Pa55"


def load(monkeypatch: pytest.MonkeyPatch, **variables: str) -> Settings:
    for name, value in variables.items():
        monkeypatch.setenv(f"ASSEMBLER_{name.upper()}", value)
    return load_settings()


def refused(monkeypatch: pytest.MonkeyPatch, **variables: str) -> str:
    with pytest.raises(SettingsError) as caught:
        load(monkeypatch, **variables)
    return str(caught.value)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates.make(tmp_path_factory.mktemp("tls"))


def test_the_default_is_plaintext_with_no_security_arguments() -> None:
    security = kafka_security(Settings())
    assert security.client_args() == {"security_protocol": "PLAINTEXT"}
    assert security.faust_credentials() is None


def test_scram_over_tls_reads_the_password_file_without_its_newline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, certs: Certificates,
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")
    settings = load(monkeypatch, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                    sasl_username="assembler", sasl_password_file=str(password_file),
                    ssl_ca_file=str(certs.ca))
    args = kafka_security(settings).client_args()
    assert args["security_protocol"] == "SASL_SSL"
    assert args["sasl_mechanism"] == "SCRAM-SHA-512"
    assert args["sasl_plain_username"] == "assembler"
    assert args["sasl_plain_password"] == PASSWORD
    context = args["ssl_context"]
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    credentials = kafka_security(settings).faust_credentials()
    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.protocol.value == "SASL_SSL" and credentials.password == PASSWORD


def test_mutual_tls_loads_the_client_certificate(
    monkeypatch: pytest.MonkeyPatch, certs: Certificates,
) -> None:
    settings = load(monkeypatch, security_protocol="SSL", ssl_ca_file=str(certs.ca),
                    ssl_cert_file=str(certs.client_cert), ssl_key_file=str(certs.client_key),
                    ssl_check_hostname="false")
    security = kafka_security(settings)
    assert security.client_args()["security_protocol"] == "SSL"
    assert security.client_args()["ssl_context"].check_hostname is False
    assert isinstance(security.faust_credentials(), faust.SSLCredentials)


def test_a_key_that_is_not_the_certificates_is_refused_at_load(
    monkeypatch: pytest.MonkeyPatch, certs: Certificates,
) -> None:
    settings = load(monkeypatch, security_protocol="SSL", ssl_cert_file=str(certs.client_cert),
                    ssl_key_file=str(certs.ca))  # a certificate where the key should be
    with pytest.raises(SettingsError, match=r"ASSEMBLER_SSL_CERT_FILE .* ASSEMBLER_SSL_KEY_FILE"):
        kafka_security(settings)


@pytest.mark.parametrize(("variables", "named"), [
    ({"security_protocol": "SASL_SSL"}, "needs ASSEMBLER_SASL_MECHANISM"),
    ({"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": PASSWORD},
     "ASSEMBLER_SASL_MECHANISM needs ASSEMBLER_SECURITY_PROTOCOL SASL_SSL or SASL_PLAINTEXT"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256",
      "sasl_password": PASSWORD}, "needs ASSEMBLER_SASL_USERNAME"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256", "sasl_username": "u"},
     "needs one of ASSEMBLER_SASL_PASSWORD or ASSEMBLER_SASL_PASSWORD_FILE"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"},
     "needs one of ASSEMBLER_SASL_OAUTHBEARER_TOKEN_FILE or ASSEMBLER_SASL_OAUTH_PROVIDER"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u",
      "sasl_password": PASSWORD, "ssl_check_hostname": "false"},
     "ASSEMBLER_SSL_CHECK_HOSTNAME needs ASSEMBLER_SECURITY_PROTOCOL SSL or SASL_SSL"),
    ({"security_protocol": "SSL", "sasl_password_file": "/nonexistent/password"},
     "ASSEMBLER_SASL_PASSWORD_FILE: Value error, ASSEMBLER_SASL_PASSWORD_FILE "
         "/nonexistent/password: cannot read it"),
    ({"security_protocol": "KERBEROS"}, "ASSEMBLER_SECURITY_PROTOCOL"),
])
def test_contradictory_or_missing_security_settings_fail_at_load_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], named: str,
) -> None:
    message = refused(monkeypatch, **variables)
    assert named in message
    assert PASSWORD not in message


def test_a_certificate_without_its_key_fails_at_load(
    monkeypatch: pytest.MonkeyPatch, certs: Certificates,
) -> None:
    message = refused(monkeypatch, security_protocol="SSL", ssl_cert_file=str(certs.client_cert))
    assert "ASSEMBLER_SSL_CERT_FILE and ASSEMBLER_SSL_KEY_FILE go together" in message


def test_the_password_is_in_no_representation_of_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = load(monkeypatch, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                    sasl_username="assembler", sasl_password=PASSWORD)
    security = kafka_security(settings)
    for text in (repr(settings), str(settings), settings.model_dump_json(), repr(security),
                 security.describe()):
        assert PASSWORD not in text


def test_the_oauthbearer_token_file_is_read_again_when_it_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    settings = load(monkeypatch, security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                    sasl_oauthbearer_token_file=str(token_file))
    provider = kafka_security(settings).client_args()["sasl_oauth_token_provider"]
    assert isinstance(provider, TokenFile)
    assert asyncio.run(provider.token()) == "first-token"
    token_file.write_text("rotated-token\n")
    assert asyncio.run(provider.token()) == "rotated-token"
    assert isinstance(kafka_security(settings).faust_credentials(), faust.OAuthCredentials)


# Each security file setting, and the other settings that make it one the protocol reads.
SECURITY_FILES = {
    "sasl_password_file": {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                           "sasl_username": "u"},
    "sasl_oauthbearer_token_file": {"security_protocol": "SASL_PLAINTEXT",
                                    "sasl_mechanism": "OAUTHBEARER"},
    "ssl_ca_file": {"security_protocol": "SSL"},
    "ssl_cert_file": {"security_protocol": "SSL"},
    "ssl_key_file": {"security_protocol": "SSL"},
    "ssl_key_password_file": {"security_protocol": "SSL"},
}


def _not_a_file(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A path of `kind` and what the refusal says of it."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "fifo")  # no writer: a blocking open would wait forever
        return tmp_path / "fifo", "is a FIFO, not a regular file"
    if kind == "device":
        return Path("/dev/zero"), "is a character device, not a regular file"
    big = tmp_path / "big"
    big.write_bytes(b"x" * (4 * 2**20 + 1))  # over every security file's limit
    return big, "larger than its limit of"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "device", "too large"])
@pytest.mark.parametrize("name", SECURITY_FILES)
def test_a_security_file_that_is_not_a_small_regular_file_exits_2_naming_it(
    name: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, problem = _not_a_file(tmp_path, kind)
    for setting, value in {**SECURITY_FILES[name], name: str(path)}.items():
        monkeypatch.setenv(f"ASSEMBLER_{setting.upper()}", value)
    assert main(["tail", "prompts"]) == 2
    err = capsys.readouterr().err
    variable = f"ASSEMBLER_{name.upper()}"
    assert err.startswith(f"context-assembler: invalid settings: {variable}: ")
    assert f"{variable} {path}: {problem}" in err and err.count("\n") == 1


def test_a_password_file_of_more_than_64_kib_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    password = tmp_path / "password"
    password.write_text("p" * 65_536 + "\n")
    message = refused(monkeypatch, **SECURITY_FILES["sasl_password_file"],
                      sasl_password_file=str(password))
    assert "ASSEMBLER_SASL_PASSWORD_FILE" in message and "larger than its limit of 64 KiB" \
        in message.replace("65,536 bytes", "64 KiB")


@pytest.mark.timeout(30)
def test_the_token_file_is_read_as_at_start_on_every_re_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    settings = load(monkeypatch, **SECURITY_FILES["sasl_oauthbearer_token_file"],
                    sasl_oauthbearer_token_file=str(token_file))
    provider = kafka_security(settings).client_args()["sasl_oauth_token_provider"]
    assert asyncio.run(provider.token()) == "first-token"
    token_file.unlink()
    os.mkfifo(token_file)  # rotated into a FIFO: the next authentication must not hang
    with pytest.raises(SettingsError, match=f"ASSEMBLER_SASL_OAUTHBEARER_TOKEN_FILE "
                       f"{token_file}: is a FIFO"):
        asyncio.run(provider.token())
    token_file.unlink()
    token_file.symlink_to("/dev/zero")  # nor be read until memory runs out
    with pytest.raises(SettingsError, match="is a character device"):
        asyncio.run(provider.token())


def built(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """The arguments each aiokafka client class is called with, by class name."""
    seen: dict[str, dict[str, Any]] = {}
    for name in ("AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"):
        monkeypatch.setattr(clients, name, lambda _name=name, **args: seen.setdefault(_name, args))
    return seen


def test_every_client_is_built_from_the_settings_connection(
    monkeypatch: pytest.MonkeyPatch, certs: Certificates,
) -> None:
    settings = load(monkeypatch, bootstrap_servers="b1:9093,b2:9093", security_protocol="SSL",
                    ssl_ca_file=str(certs.ca), compression_type="zstd",
                    max_message_bytes="500000")
    seen = built(monkeypatch)
    factory = KafkaClients.of(settings)
    factory.producer(linger_ms=PRODUCER_LINGER_MS)
    factory.consumer(group_id=None)
    factory.admin()
    for args in seen.values():
        assert args["bootstrap_servers"] == "b1:9093,b2:9093"
        assert args["security_protocol"] == "SSL" and "ssl_context" in args
    assert seen["AIOKafkaProducer"]["acks"] == "all"
    assert seen["AIOKafkaProducer"]["enable_idempotence"] is True
    assert seen["AIOKafkaProducer"]["compression_type"] == "zstd"
    assert seen["AIOKafkaProducer"]["max_request_size"] == 500_000
    assert seen["AIOKafkaProducer"]["linger_ms"] == PRODUCER_LINGER_MS
    assert seen["AIOKafkaConsumer"]["enable_auto_commit"] is False
    assert seen["AIOKafkaConsumer"]["isolation_level"] == "read_committed"
    assert seen["AIOKafkaConsumer"]["group_id"] is None
    assert seen["AIOKafkaAdminClient"]["request_timeout_ms"] == ADMIN_REQUEST_TIMEOUT_MS


def test_a_call_s_own_arguments_override_the_factory_s(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = built(monkeypatch)
    KafkaClients("b:9092").producer(enable_idempotence=False, max_batch_size=1)
    assert seen["AIOKafkaProducer"]["enable_idempotence"] is False
    assert seen["AIOKafkaProducer"]["max_batch_size"] == 1
    assert seen["AIOKafkaProducer"]["compression_type"] is None  # uncompressed by default


def test_faust_and_the_group_consumer_join_the_group_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = load(monkeypatch, group_instance_id="replica-1", session_timeout_seconds="12",
                    compression_type="lz4")
    seen = built(monkeypatch)
    group_consumer(settings)
    consumer = seen["AIOKafkaConsumer"]
    config = faust_client_config(settings, batch_bytes=4096)
    assert config["broker"] == [f"kafka://{settings.bootstrap_servers}"]
    assert consumer["group_instance_id"] == config["consumer_group_instance_id"] == "replica-1"
    assert consumer["session_timeout_ms"] == config["broker_session_timeout"] * 1000 == 12_000
    assert consumer["heartbeat_interval_ms"] == HEARTBEAT_INTERVAL_SECONDS * 1000
    assert config["broker_heartbeat_interval"] == HEARTBEAT_INTERVAL_SECONDS
    assert consumer["auto_offset_reset"] == config["consumer_auto_offset_reset"] == "earliest"
    assert config["producer_compression_type"] == "lz4"
    assert config["producer_max_batch_size"] == 4096
    assert config["producer_linger"] == PRODUCER_LINGER_MS / 1000
