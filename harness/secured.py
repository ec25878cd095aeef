"""A real Kafka 4.0 broker secured as production clusters are: a SASL_SSL listener
(SCRAM-SHA-512), an SSL listener that requires a client certificate, and StandardAuthorizer
denying whatever no ACL allows. Certificates are made with openssl at test time and SCRAM
users at format time; the jars and the process are harness.kafka's.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest

from harness.jvm import LOG4J, free_ports
from harness.kafka import READY_TIMEOUT, Broker, Node, run_sync, wait_ready

ADMIN = "admin"
ASSEMBLER = "assembler"
MTLS_CN = "assembler-mtls"
# Kafka's protocol codes (org.apache.kafka.common.acl / resource).
RESOURCE_TYPES = {"TOPIC": 2, "GROUP": 3, "TRANSACTIONAL_ID": 5}
PATTERN_TYPES = {"LITERAL": 3, "PREFIXED": 4}
OPERATIONS = {"READ": 3, "WRITE": 4, "DESCRIBE": 8, "DESCRIBE_CONFIGS": 10}
ALLOW = 3


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@dataclass(frozen=True)
class Certificates:
    ca: Path
    broker_store: Path  # the broker's key, certificate and CA, for ssl.keystore.type=PEM
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: a client trusting only it refuses the broker

    @classmethod
    def make(cls, directory: Path) -> Certificates:
        directory.mkdir(parents=True, exist_ok=True)
        paths = {name: directory / name for name in (
            "ca.key", "ca.pem", "other-ca.key", "other-ca.pem", "broker.key", "broker.csr",
            "broker.pem", "broker.ext", "client.key", "client.csr", "client.pem", "store.pem")}
        for name in ("ca", "other-ca"):
            _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                     "-keyout", paths[f"{name}.key"], "-out", paths[f"{name}.pem"],
                     "-subj", f"/CN=test {name}")
        paths["broker.ext"].write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for name, subject in (("broker", "/CN=localhost"), ("client", f"/CN={MTLS_CN}")):
            _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", paths[f"{name}.key"],
                     "-out", paths[f"{name}.csr"], "-subj", subject)
            extensions: list[str | Path] = (["-extfile", paths["broker.ext"]]
                                            if name == "broker" else [])
            _openssl("x509", "-req", "-in", paths[f"{name}.csr"], "-CA", paths["ca.pem"],
                     "-CAkey", paths["ca.key"], "-CAcreateserial", "-days", "2",
                     "-out", paths[f"{name}.pem"], *extensions)
        paths["store.pem"].write_bytes(paths["broker.key"].read_bytes()
                                       + paths["broker.pem"].read_bytes()
                                       + paths["ca.pem"].read_bytes())
        return cls(paths["ca.pem"], paths["store.pem"], paths["client.pem"],
                   paths["client.key"], paths["other-ca.pem"])


def unsigned_token(subject: str, lifetime_seconds: int = 3600) -> str:
    """An OAUTHBEARER token Kafka's unsecured validator accepts: an unsigned JWT."""
    def part(claims: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")

    now = int(time.time())
    claims = {"sub": subject, "iat": now, "exp": now + lifetime_seconds}
    return f"{part({'alg': 'none'})}.{part(claims)}."


class SecuredBroker(Broker):
    """One secured single-node broker in `workdir`; `start` returns once the admin
    principal can describe the cluster over SASL_SSL. The tests' own clients are the admin's."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.certs = Certificates.make(workdir / "tls")
        self.admin_password = secrets.token_urlsafe(16)
        self.assembler_password = secrets.token_urlsafe(16)
        self.sasl_port, self.ssl_port, self._controller_port = free_ports(3)
        self.node = Node(workdir)

    @property
    def bootstrap_servers(self) -> str:
        return self.sasl_servers

    def client_args(self) -> dict[str, Any]:
        return self.admin_args()

    def restart(self) -> None:
        raise NotImplementedError("the secured broker is not restarted by any test")

    @property
    def sasl_servers(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def ssl_servers(self) -> str:
        return f"127.0.0.1:{self.ssl_port}"

    def _config(self) -> str:
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required"
        plain = "org.apache.kafka.common.security.plain.PlainLoginModule required"
        admin = f'username="{ADMIN}" password="{self.admin_password}"'
        return "\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self._controller_port}",
            f"listeners=SASL_SSL://127.0.0.1:{self.sasl_port},SSL://127.0.0.1:{self.ssl_port},"
            f"CONTROLLER://127.0.0.1:{self._controller_port}",
            f"advertised.listeners=SASL_SSL://127.0.0.1:{self.sasl_port},"
            f"SSL://127.0.0.1:{self.ssl_port}",
            "listener.security.protocol.map=SASL_SSL:SASL_SSL,SSL:SSL,"
            "CONTROLLER:SASL_PLAINTEXT",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_SSL",
            "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
            "sasl.mechanism.controller.protocol=PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
            f'listener.name.controller.plain.sasl.jaas.config={plain} {admin} '
            f'user_{ADMIN}="{self.admin_password}";',
            "listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512,OAUTHBEARER",
            f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram} {admin};",
            # Unsigned tokens (Kafka's unsecured validator): the principal is the `sub` claim.
            "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config=org.apache.kafka.common."
            "security.oauthbearer.OAuthBearerLoginModule required;",
            "listener.name.ssl.ssl.client.auth=required",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={self.certs.broker_store}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={self.certs.ca}",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found=false",
            f"super.users=User:{ADMIN}",
            f"log.dirs={self.workdir}/data",
            "auto.create.topics.enable=false",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=1",
            "group.initial.rebalance.delay.ms=0",
            "",
        ])

    def start(self) -> None:
        self.node.properties.write_text(self._config())
        (self.workdir / "log4j2.properties").write_text(LOG4J)
        self.node.format(
            "c2VjdXJlZC1icm9rZXIx",
            "--add-scram", f"SCRAM-SHA-512=[name={ADMIN},password={self.admin_password}]",
            "--add-scram", f"SCRAM-SHA-512=[name={ASSEMBLER},password={self.assembler_password}]")
        self.node.launch()
        try:
            run_sync(wait_ready(self.admin_args(), [self.node.jvm], 1, READY_TIMEOUT))
        except Exception:
            self.stop()
            raise

    def admin_args(self) -> dict[str, Any]:
        """aiokafka arguments of the super user, over SASL_SSL."""
        return {"bootstrap_servers": self.sasl_servers, "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": ADMIN,
                "sasl_plain_password": self.admin_password,
                "ssl_context": ssl.create_default_context(cafile=str(self.certs.ca))}

    async def set_acls(self, principal: str, bindings: list[tuple[str, str, str, str]],
                       *, grant: bool = True) -> None:
        """Grant (or revoke) each (resource type, name, pattern type, operation) to
        `principal` from any host, as the admin principal."""
        admin = AIOKafkaAdminClient(**self.admin_args())
        await admin.start()
        try:
            for resource, name, pattern, operation in bindings:
                args = (RESOURCE_TYPES[resource], name, PATTERN_TYPES[pattern], principal, "*",
                        OPERATIONS[operation], ALLOW)
                request = CreateAclsRequest(*args) if grant else DeleteAclsRequest(*args)
                response = await admin._send_request(request)
                results = response.to_object()
                codes = [r["error_code"] for r in results.get("creation_responses",
                                                              results.get("filter_responses", []))]
                if any(codes):
                    raise RuntimeError(f"ACL {resource} {name} {operation}: {results}")
        finally:
            await admin.close()

    def stop(self) -> None:
        self.node.jvm.stop()
