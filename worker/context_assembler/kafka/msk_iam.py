"""Amazon MSK's IAM login: OAUTHBEARER tokens signed by AWS's own signer.

MSK's IAM listener takes as token a SigV4-presigned `kafka-cluster:Connect` URL, base64url
encoded, valid 15 minutes, which `aws-msk-iam-sasl-signer-python` (the msk-iam extra) makes
from the AWS credentials the process finds: AWS_* variables, a web-identity token (EKS Pod
Identity, IRSA), an instance profile. The token is kept and handed to every connection that
authenticates until REFRESH_BEFORE_EXPIRY_SECONDS before it expires, so a burst of connections
costs one signature (and one credentials look-up, which may be a call to STS), and no
connection starts with a token about to expire.

The credentials and the tokens are secrets: neither is logged nor put in an error message, and
botocore's DEBUG lines (which print what is signed, session token included) are held to INFO.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from aiokafka.abc import AbstractTokenProvider

from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.settings import MSK_IAM_INSTALL

#: A new token is signed once the kept one has less than this left of its 15 minutes.
REFRESH_BEFORE_EXPIRY_SECONDS = 300.0
#: What signs: (region) -> (token, its expiry in epoch milliseconds), as AWS's signer returns.
Signer = Callable[[str], tuple[str, int]]
_QUIET_LOGGERS = ("botocore", "boto3", "aws_msk_iam_sasl_signer")
_GIVE_CREDENTIALS = ("give the process AWS credentials allowed kafka-cluster:Connect (an IAM "
                     "role through EKS Pod Identity or IRSA, or AWS_* variables)")


class MskIamError(ContextAssemblerError):
    """No token could be signed: no AWS credentials found, or STS refused them."""


def aws_signer() -> Signer:
    """AWS's signer over the default credentials chain of one botocore session, which keeps
    the credentials and renews temporary ones (a web identity's) itself before they expire;
    MskIamError if the signer is not installed."""
    try:
        import botocore.credentials
        import botocore.session
        from aws_msk_iam_sasl_signer import MSKAuthTokenProvider
    except ImportError:
        raise MskIamError(f"ASSEMBLER_SASL_OAUTH_PROVIDER=aws_msk_iam needs AWS's signer "
                          f"({MSK_IAM_INSTALL})") from None
    for name in _QUIET_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.getEffectiveLevel(), logging.INFO))
    session = botocore.session.Session()

    class Found(botocore.credentials.CredentialProvider):  # type: ignore[misc]
        """The credentials the session found, as the signer takes them."""

        METHOD = "context-assembler"

        def __init__(self, credentials: object) -> None:
            super().__init__()
            self.credentials = credentials

        def load(self) -> object:
            return self.credentials

    def sign(region: str) -> tuple[str, int]:
        credentials = session.get_credentials()
        if credentials is None:
            raise MskIamError("no AWS credentials found")
        token, expires_ms = MSKAuthTokenProvider.generate_auth_token_from_credentials_provider(
            region, Found(credentials))
        return str(token), int(expires_ms)

    return sign


class MskIamTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """aiokafka's token provider for MSK's IAM listener (SASL_SSL, OAUTHBEARER)."""

    def __init__(self, region: str, sign: Signer | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.region = region
        self._sign = sign or aws_signer()
        self._clock = clock
        self._lock = threading.Lock()  # clients on other threads or loops share the token
        self._token: str | None = None
        self._expires_at = 0.0

    async def token(self) -> str:
        return await asyncio.to_thread(self.current)

    def current(self) -> str:
        """The kept token, or a newly signed one when it has less than
        REFRESH_BEFORE_EXPIRY_SECONDS left."""
        with self._lock:
            if self._token is None or (self._clock()
                                       >= self._expires_at - REFRESH_BEFORE_EXPIRY_SECONDS):
                self._token, self._expires_at = self._signed()
            return self._token

    def _signed(self) -> tuple[str, float]:
        try:
            token, expires_ms = self._sign(self.region)
        except MskIamError as error:
            raise MskIamError(f"cannot sign an Amazon MSK IAM token in {self.region}: {error}: "
                              f"{_GIVE_CREDENTIALS}") from None
        except Exception as error:  # botocore's errors have no common base; none is a bug here
            # The error's class and message only: botocore's name no secret, and its
            # traceback's frames would hold the credentials.
            raise MskIamError(
                f"cannot sign an Amazon MSK IAM token in {self.region}: "
                f"{type(error).__name__}: {error}: {_GIVE_CREDENTIALS}") from None
        return token, expires_ms / 1000

    def __repr__(self) -> str:
        return f"MskIamTokenProvider(region={self.region!r})"
