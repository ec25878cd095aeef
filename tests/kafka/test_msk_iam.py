"""Amazon MSK's IAM login (the msk-iam extra): the token AWS's signer makes, checked here
against an independent SigV4 computation, with fake credentials and a fixed clock, never the
network; kept and renewed before it expires; no secret in a log line or an error. No MSK
cluster is reachable from the tests: that a real cluster accepts the token is not tested."""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import hmac
import logging
import threading
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlsplit

import faust
import pytest

from context_assembler.kafka.clients import connection_problem, kafka_security
from context_assembler.kafka.msk_iam import (
    REFRESH_BEFORE_EXPIRY_SECONDS,
    MskIamError,
    MskIamTokenProvider,
    aws_signer,
)
from context_assembler.settings import Settings, SettingsError, load_settings

REGION = "eu-west-1"
ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"  # AWS's documented example key pair: not a real account
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SESSION_TOKEN = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN+/="
SIGNED_AT = datetime.datetime(2026, 3, 4, 5, 6, 7)
LIFETIME_SECONDS = 900  # the signer's: X-Amz-Expires


@pytest.fixture
def aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials in the environment, nothing else botocore could find or ask."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance metadata call
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's signing time (the one clock the signer reads)."""
    import botocore.auth

    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *_: SIGNED_AT)


def _url(token: str) -> str:
    assert "=" not in token and "+" not in token and "/" not in token  # base64url, unpadded
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("ascii")


def _sigv4(secret: str, amz_date: str, scope: str, canonical_request: str) -> str:
    """AWS Signature Version 4, from its specification."""
    date, region, service, _ = scope.split("/")
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical_request.encode()).hexdigest()])
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


@pytest.mark.usefixtures("aws_environment", "fixed_clock")
def test_the_token_is_a_presigned_connect_url_signed_with_the_credentials() -> None:
    token, expires_ms = aws_signer()(REGION)
    url = urlsplit(_url(token))
    assert (url.scheme, url.netloc, url.path) == ("https", f"kafka.{REGION}.amazonaws.com", "/")
    query = dict(parse_qsl(url.query, strict_parsing=True))
    assert query.pop("User-Agent").startswith("aws-msk-iam-sasl-signer-python/")
    scope = f"{SIGNED_AT:%Y%m%d}/{REGION}/kafka-cluster/aws4_request"
    signature = query.pop("X-Amz-Signature")
    assert query == {
        "Action": "kafka-cluster:Connect",
        "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
        "X-Amz-Credential": f"{ACCESS_KEY}/{scope}",
        "X-Amz-Date": f"{SIGNED_AT:%Y%m%dT%H%M%SZ}",
        "X-Amz-Expires": str(LIFETIME_SECONDS),
        "X-Amz-SignedHeaders": "host",
        "X-Amz-Security-Token": SESSION_TOKEN,
    }
    canonical_query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                               for k, v in sorted(query.items()))
    empty_body = hashlib.sha256(b"").hexdigest()
    canonical_request = "\n".join(["GET", "/", canonical_query,
                                   f"host:{url.netloc}", "", "host", empty_body])
    assert signature == _sigv4(SECRET_KEY, query["X-Amz-Date"], scope, canonical_request)
    assert SECRET_KEY not in _url(token)
    signed_at = SIGNED_AT.replace(tzinfo=datetime.UTC).timestamp()
    assert expires_ms == (signed_at + LIFETIME_SECONDS) * 1000
    assert aws_signer()(REGION) == (token, expires_ms)  # same credentials and time: same token


class FakeSigner:
    """Signs `token-N` valid LIFETIME_SECONDS from the clock's time, counting its calls."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.calls = 0

    def __call__(self, region: str) -> tuple[str, int]:
        self.calls += 1
        return f"token-{self.calls}", int((self.clock[0] + LIFETIME_SECONDS) * 1000)


def test_the_token_is_kept_and_renewed_before_it_expires() -> None:
    now = [1_000.0]
    signer = FakeSigner(now)
    provider = MskIamTokenProvider(REGION, sign=signer, clock=lambda: now[0])
    assert asyncio.run(provider.token()) == "token-1"
    renew_at = 1_000.0 + LIFETIME_SECONDS - REFRESH_BEFORE_EXPIRY_SECONDS
    now[0] = renew_at - 1
    assert provider.current() == "token-1" and signer.calls == 1
    now[0] = renew_at  # REFRESH_BEFORE_EXPIRY_SECONDS left: a new connection gets a new one
    assert provider.current() == "token-2" and signer.calls == 2
    now[0] = renew_at + 10
    assert provider.current() == "token-2" and signer.calls == 2


def test_connections_authenticating_at_once_share_one_signature() -> None:
    now = [0.0]
    signer = FakeSigner(now)
    provider = MskIamTokenProvider(REGION, sign=signer, clock=lambda: now[0])
    tokens: list[str] = []
    threads = [threading.Thread(target=lambda: tokens.append(provider.current()))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tokens == ["token-1"] * 8 and signer.calls == 1


@pytest.mark.usefixtures("aws_environment", "fixed_clock")
def test_no_secret_reaches_a_log_line_even_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    provider = MskIamTokenProvider(REGION)
    token = provider.current()
    logged = caplog.text + "".join(str(record.args) for record in caplog.records)
    for secret in (SECRET_KEY, SESSION_TOKEN, quote(SESSION_TOKEN, safe="-_.~"), token):
        assert secret not in logged
    assert SECRET_KEY not in repr(provider) and token not in repr(provider)


@pytest.mark.usefixtures("aws_environment")
def test_no_credentials_is_one_line_naming_what_to_give(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    with pytest.raises(MskIamError) as caught:
        MskIamTokenProvider(REGION).current()
    assert str(caught.value) == (
        f"cannot sign an Amazon MSK IAM token in {REGION}: no AWS credentials found: give the "
        "process AWS credentials allowed kafka-cluster:Connect (an IAM role through EKS Pod "
        "Identity or IRSA, or AWS_* variables)")


def test_a_signer_failure_names_its_class_and_keeps_the_credentials_out() -> None:
    def failing(region: str) -> tuple[str, int]:
        credentials = {"secret": SECRET_KEY}  # in the failing frame, as botocore's would be
        raise RuntimeError(f"STS refused in {region}") from KeyError(str(credentials))

    with pytest.raises(MskIamError) as caught:
        MskIamTokenProvider(REGION, sign=failing).current()
    assert "RuntimeError: STS refused in eu-west-1" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert SECRET_KEY not in str(caught.value)


def _msk(monkeypatch: pytest.MonkeyPatch, **variables: str) -> Settings:
    variables = {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                 "sasl_oauth_provider": "aws_msk_iam", "aws_region": REGION, **variables}
    for name, value in variables.items():
        monkeypatch.setenv(f"ASSEMBLER_{name.upper()}", value)
    return load_settings()


def test_the_settings_select_the_provider_for_every_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    security = kafka_security(_msk(monkeypatch))
    args = security.client_args()
    assert args["sasl_mechanism"] == "OAUTHBEARER" and args["security_protocol"] == "SASL_SSL"
    provider = args["sasl_oauth_token_provider"]
    assert isinstance(provider, MskIamTokenProvider) and provider.region == REGION
    credentials = security.faust_credentials()
    assert isinstance(credentials, faust.OAuthCredentials)
    assert "MskIamTokenProvider(region='eu-west-1')" in security.describe()


@pytest.mark.parametrize(("variables", "named"), [
    ({"aws_region": ""}, "aws_msk_iam needs ASSEMBLER_AWS_REGION"),
    ({"security_protocol": "SASL_PLAINTEXT"}, "aws_msk_iam needs ASSEMBLER_SECURITY_PROTOCOL=SASL_SSL"),
    ({"sasl_oauthbearer_token_file": __file__},
     "needs one of ASSEMBLER_SASL_OAUTHBEARER_TOKEN_FILE or ASSEMBLER_SASL_OAUTH_PROVIDER"),
    ({"sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "u", "sasl_password": "p"},
     "ASSEMBLER_SASL_OAUTH_PROVIDER needs ASSEMBLER_SASL_MECHANISM=OAUTHBEARER"),
    ({"sasl_oauth_provider": ""}, "ASSEMBLER_AWS_REGION needs ASSEMBLER_SASL_OAUTH_PROVIDER"),
    ({"sasl_oauth_provider": "gcp"}, "ASSEMBLER_SASL_OAUTH_PROVIDER"),
], ids=["no-region", "no-tls", "token-file-too", "not-oauthbearer", "region-alone", "unknown"])
def test_contradictory_msk_settings_stop_at_load(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], named: str,
) -> None:
    with pytest.raises(SettingsError) as caught:
        _msk(monkeypatch, **variables)
    assert named in str(caught.value)


def test_without_the_extra_the_setting_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "aws_msk_iam_sasl_signer" else real(name, *a))
    with pytest.raises(SettingsError) as caught:
        _msk(monkeypatch)
    assert "pip install 'context-assembler[msk-iam]'" in str(caught.value)


def test_a_refused_token_points_at_the_iam_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    from aiokafka.errors import SaslAuthenticationFailed

    import context_assembler.kafka.clients as connection

    async def refuse(*_: object, **__: object) -> None:
        raise SaslAuthenticationFailed("denied")

    monkeypatch.setattr(connection, "create_conn", refuse)
    security = kafka_security(_msk(monkeypatch))
    problem = asyncio.run(connection_problem("b-1.msk.example:9098", security))
    assert problem is not None and "kafka-cluster:Connect" in problem
    assert "ASSEMBLER_SASL_PASSWORD" not in problem
