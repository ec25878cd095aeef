"""The worker on a secured broker: SASL_SSL with SCRAM-SHA-512 and mutual TLS, with
StandardAuthorizer denying all but the ACLs `context-assembler acls` prints; and the
failures an operator must be able to act on."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from context_assembler.kafka.tools.acls import Acl, worker_acls
from context_assembler.settings import Settings
from harness.secured import ASSEMBLER, MTLS_CN, SecuredBroker, unsigned_token
from harness.worker import (
    StartWorker,
    Topics,
    events,
    file_mode,
    keyed,
    produce,
    read_topic,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]
SCRAM_PRINCIPAL = f"User:{ASSEMBLER}"
OAUTH_SUBJECT = "assembler-oauth"
MTLS_PRINCIPAL = f"User:CN={MTLS_CN}"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    broker = SecuredBroker(tmp_path_factory.mktemp("secured-kafka"))
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


def scram_env(broker: SecuredBroker, tmp_path: Path, password: str | None = None,
              **overrides: str) -> dict[str, str]:
    password_file = tmp_path / "sasl-password"
    password_file.write_text((password or broker.assembler_password) + "\n")
    return {"ASSEMBLER_SECURITY_PROTOCOL": "SASL_SSL",
            "ASSEMBLER_SASL_MECHANISM": "SCRAM-SHA-512",
            "ASSEMBLER_SASL_USERNAME": ASSEMBLER,
            "ASSEMBLER_SASL_PASSWORD_FILE": str(password_file),
            "ASSEMBLER_SSL_CA_FILE": str(broker.certs.ca),
            **overrides}


def mtls_env(broker: SecuredBroker) -> dict[str, str]:
    return {"ASSEMBLER_BOOTSTRAP_SERVERS": broker.ssl_servers,
            "ASSEMBLER_SECURITY_PROTOCOL": "SSL",
            "ASSEMBLER_SSL_CA_FILE": str(broker.certs.ca),
            "ASSEMBLER_SSL_CERT_FILE": str(broker.certs.client_cert),
            "ASSEMBLER_SSL_KEY_FILE": str(broker.certs.client_key)}


def acls_of(topics: Topics, guarantee: str) -> list[Acl]:
    return worker_acls(Settings(
        input_topic=topics.input, prompts_topic=topics.prompts, audit_topic=topics.audit,
        dlq_topic=topics.dlq, policies_topic=topics.policies, group_id=topics.group,
        processing_guarantee=guarantee))


async def grant(broker: SecuredBroker, principal: str, acls: list[Acl]) -> None:
    await broker.set_acls(principal, [b for acl in acls for b in acl.bindings()])


def assert_no_secret(broker: SecuredBroker, log: Path) -> None:
    text = log.read_text("utf-8", "replace")
    assert broker.assembler_password not in text
    assert broker.admin_password not in text


def oauth_env(broker: SecuredBroker, tmp_path: Path) -> dict[str, str]:
    token_file = tmp_path / "token"
    token_file.write_text(unsigned_token(OAUTH_SUBJECT) + "\n")
    return {"ASSEMBLER_SECURITY_PROTOCOL": "SASL_SSL",
            "ASSEMBLER_SASL_MECHANISM": "OAUTHBEARER",
            "ASSEMBLER_SASL_OAUTHBEARER_TOKEN_FILE": str(token_file),
            "ASSEMBLER_SSL_CA_FILE": str(broker.certs.ca)}


@pytest.mark.parametrize(("guarantee", "transport"), [
    ("at_least_once", "scram"), ("exactly_once", "scram"), ("at_least_once", "mtls"),
    ("exactly_once", "mtls"), ("at_least_once", "oauthbearer")])
async def test_the_worker_answers_with_only_the_documented_acls_byte_equal_to_file_mode(
    secured: SecuredBroker, tmp_path: Path, guarantee: str, transport: str,
    running_worker: StartWorker,
) -> None:
    topics = Topics.fresh()
    await topics.create(secured)
    principal, env = {
        "scram": lambda: (SCRAM_PRINCIPAL, scram_env(secured, tmp_path)),
        "mtls": lambda: (MTLS_PRINCIPAL, mtls_env(secured)),
        "oauthbearer": lambda: (f"User:{OAUTH_SUBJECT}", oauth_env(secured, tmp_path)),
    }[transport]()
    await grant(secured, principal, acls_of(topics, guarantee))
    lines = events(24)
    worker = running_worker(topics, guarantee, env=env, broker=secured)
    try:
        await produce(secured, topics.input, keyed(lines))
        committed = guarantee == "exactly_once"
        prompts = await read_topic(secured, topics.prompts, until=24, committed_only=committed,
                                   settle=1)
        audits = await read_topic(secured, topics.audit, until=24, committed_only=committed,
                                  settle=1)
        expected_prompts, expected_audits = file_mode(lines)
        assert {r.key.decode(): r.value for r in prompts} == expected_prompts
        assert {r.key.decode(): r.value for r in audits} == expected_audits
        assert len(prompts) == len(audits) == 24
        assert worker.get("/ready")[0] == 200
    finally:
        assert worker.stop() == 0
    assert_no_secret(secured, worker.log_path)


def failed_start(secured: SecuredBroker, running_worker: StartWorker, env: dict[str, str]) -> str:
    """The worker's log, once it has exited non-zero on its own (before joining its group)."""
    worker = running_worker(Topics.fresh(), env=env, broker=secured, ready=False)
    assert worker.process is not None
    try:
        status = worker.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker kept running; log:\n{worker.log_tail()}")
    assert status == 2, worker.log_tail()
    assert_no_secret(secured, worker.log_path)
    text = worker.log_path.read_text("utf-8", "replace")
    assert "Traceback" not in text
    return text


@pytest.mark.parametrize(("case", "expected"), [
    ("wrong password", "SASL authentication failed"),
    ("wrong mechanism", "does not accept ASSEMBLER_SASL_MECHANISM=SCRAM-SHA-256"),
    ("untrusted certificate", "is not trusted: self-signed certificate in certificate chain"),
    ("no client certificate", "closed the connection"),
    ("refused oauthbearer token", "did not accept the OAUTHBEARER token"),
    # AWS's signer, the worker's real handshake: the broker (no MSK) refuses the signed token.
    ("msk iam token", "check the IAM policy of the process's AWS identity"),
])
async def test_a_refused_connection_stops_the_worker_at_start_with_one_line_naming_the_fix(
    secured: SecuredBroker, tmp_path: Path, case: str, expected: str,
    running_worker: StartWorker,
) -> None:
    if case == "wrong password":
        env = scram_env(secured, tmp_path, password="not-the-password")
    elif case == "wrong mechanism":
        env = scram_env(secured, tmp_path, ASSEMBLER_SASL_MECHANISM="SCRAM-SHA-256")
    elif case == "untrusted certificate":
        env = scram_env(secured, tmp_path, ASSEMBLER_SSL_CA_FILE=str(secured.certs.other_ca))
    elif case == "refused oauthbearer token":
        env = oauth_env(secured, tmp_path)
        Path(env["ASSEMBLER_SASL_OAUTHBEARER_TOKEN_FILE"]).write_text("not-a-jwt\n")
    elif case == "msk iam token":
        env = msk_iam_env(secured, tmp_path)
    else:
        env = {**mtls_env(secured), "ASSEMBLER_SSL_CERT_FILE": "", "ASSEMBLER_SSL_KEY_FILE": ""}
    text = failed_start(secured, running_worker, env)
    problems = [line for line in text.splitlines() if "cannot start" in line]
    assert len(problems) == 1, text
    assert expected in problems[0]
    assert "not-the-password" not in text
    assert FAKE_AWS_SECRET not in text


FAKE_AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example


def msk_iam_env(broker: SecuredBroker, tmp_path: Path) -> dict[str, str]:
    """Amazon MSK's IAM login with AWS's example credentials, at DEBUG, nothing else for
    botocore to find or ask."""
    return {"ASSEMBLER_SECURITY_PROTOCOL": "SASL_SSL",
            "ASSEMBLER_SASL_MECHANISM": "OAUTHBEARER",
            "ASSEMBLER_SASL_OAUTH_PROVIDER": "aws_msk_iam",
            "ASSEMBLER_AWS_REGION": "eu-west-1",
            "ASSEMBLER_SSL_CA_FILE": str(broker.certs.ca),
            "ASSEMBLER_LOG_LEVEL": "DEBUG",
            "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
            "AWS_SECRET_ACCESS_KEY": FAKE_AWS_SECRET,
            "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.mark.parametrize("missing", ["audit topic", "group"])
async def test_a_missing_acl_at_start_names_the_resource_and_the_acls_command(
    secured: SecuredBroker, tmp_path: Path, missing: str, running_worker: StartWorker,
) -> None:
    """A topic the worker may not DESCRIBE, or a group it may not READ (where faust would
    wait silently), stops it before it joins the group."""
    topics = Topics.fresh()
    await topics.create(secured)
    withheld = topics.audit if missing == "audit topic" else topics.group
    acls = [acl for acl in acls_of(topics, "at_least_once") if acl.name != withheld]
    await grant(secured, SCRAM_PRINCIPAL, acls)
    worker = running_worker(topics, env=scram_env(secured, tmp_path), broker=secured,
                            ready=False)
    assert worker.process is not None
    assert worker.process.wait(timeout=60) == 2, worker.log_tail()
    (problem,) = [line for line in worker.log_path.read_text().splitlines()
                  if "cannot start" in line]
    expected = {"audit topic": f"not authorized to DESCRIBE topics {topics.audit}",
                "group": f"not authorized to READ group {topics.group}"}[missing]
    assert expected in problem
    assert "context-assembler acls --principal" in problem


def test_the_cli_reads_the_same_settings(secured: SecuredBroker, tmp_path: Path) -> None:
    """`topics create`, `produce`, `replay` and `redrive` as the admin principal over
    SASL_SSL; with a wrong password, refused with the reason."""
    admin_password = tmp_path / "admin-password"
    admin_password.write_text(secured.admin_password)
    topics = Topics.fresh()
    base = {"ASSEMBLER_BOOTSTRAP_SERVERS": secured.sasl_servers,
            "ASSEMBLER_INPUT_TOPIC": topics.input, "ASSEMBLER_PROMPTS_TOPIC": topics.prompts,
            "ASSEMBLER_AUDIT_TOPIC": topics.audit, "ASSEMBLER_DLQ_TOPIC": topics.dlq,
            "ASSEMBLER_POLICIES_TOPIC": topics.policies}
    as_admin = {**scram_env(secured, tmp_path), **base, "ASSEMBLER_SASL_USERNAME": "admin",
                "ASSEMBLER_SASL_PASSWORD_FILE": str(admin_password)}
    created = subprocess.run([sys.executable, "-m", "context_assembler.cli", "topics", "create",
                              "--partitions", "1"], env={**os.environ, **as_admin}, capture_output=True, text=True,
                             check=False, timeout=120)
    assert created.returncode == 0, created.stderr
    assert created.stdout.count("created") == 5
    lines = b"\n".join(events(3)).decode()
    for command, stdin, expected in [
        (["produce", "-"], lines, "sent 3 events"),
        (["replay", "--count", "3"], "", "replayed 3 events (0 rejected)"),
        (["redrive", "--dry-run"], "", f"would re-drive 0 dead letters to {topics.input}"),
    ]:
        ran = subprocess.run([sys.executable, "-m", "context_assembler.cli", *command],
                             env={**os.environ, **as_admin}, input=stdin, capture_output=True,
                             text=True, check=False, timeout=120)
        assert ran.returncode == 0, (command, ran.stderr)
        assert expected in ran.stdout + ran.stderr, (command, ran.stdout, ran.stderr)
    wrong = {**as_admin, "ASSEMBLER_SASL_PASSWORD": "nope", "ASSEMBLER_SASL_PASSWORD_FILE": ""}
    refused = subprocess.run([sys.executable, "-m", "context_assembler.cli", "produce", "-"], env={**os.environ, **wrong},
                             input="{}\n", capture_output=True, text=True, check=False,
                             timeout=120)
    assert refused.returncode == 2
    assert "SASL authentication failed" in refused.stderr
    assert secured.admin_password not in refused.stderr + refused.stdout


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_write_revoked_on_the_audit_topic_then_granted_again_loses_nothing(
    secured: SecuredBroker, tmp_path: Path, guarantee: str, running_worker: StartWorker,
) -> None:
    """The events wait, uncommitted, with /ready false saying why; once WRITE is back each
    is published once, and nothing is dead-lettered."""
    topics = Topics.fresh()
    await topics.create(secured)
    await grant(secured, SCRAM_PRINCIPAL, acls_of(topics, guarantee))
    audit_write = [("TOPIC", topics.audit, "LITERAL", "WRITE")]
    lines = events(12)
    worker = running_worker(topics, guarantee, env=scram_env(secured, tmp_path), broker=secured)
    committed = guarantee == "exactly_once"
    try:
        await produce(secured, topics.input, keyed(lines[:6]))
        await read_topic(secured, topics.audit, until=6, committed_only=committed)
        await secured.set_acls(SCRAM_PRINCIPAL, audit_write, grant=False)
        await produce(secured, topics.input, keyed(lines[6:]))
        await wait_for(lambda: worker.get("/ready")[0] == 503, timeout=60)
        _, reason = worker.get("/ready")
        assert b"TopicAuthorizationFailed" in reason, reason
        assert b"context-assembler acls --principal" in reason
        assert worker.alive()
        await secured.set_acls(SCRAM_PRINCIPAL, audit_write)
        audits = await read_topic(secured, topics.audit, until=12, settle=2,
                                  committed_only=committed)
        prompts = await read_topic(secured, topics.prompts, until=12, settle=1,
                                   committed_only=committed)
        expected_prompts, expected_audits = file_mode(lines)
        assert sorted(r.key.decode() for r in audits) == sorted(expected_audits)  # each once
        assert {r.key.decode(): r.value for r in audits} == expected_audits
        assert {r.key.decode(): r.value for r in prompts} == expected_prompts
        await wait_for(lambda: worker.get("/ready")[0] == 200, timeout=60)
        assert await read_topic(secured, topics.dlq, until=1, timeout=2) == []
    finally:
        assert worker.stop() == 0
    assert_no_secret(secured, worker.log_path)
