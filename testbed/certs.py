"""Certificates made for the test run (``trustme``): a CA, a server certificate for
127.0.0.1/localhost, a client certificate from the same CA (CN ``test-client``) and one
from a CA the server does not trust. Keys live in the test's temporary directory only."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass
class Certs:
    ca_file: str
    server_cert: str
    server_key: str
    client_pem: str  # key + chain, signed by the CA
    stranger_pem: str  # key + chain, signed by an unknown CA

    @classmethod
    def make(cls, where: Path) -> Certs:
        ca, other = trustme.CA(), trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert("test-client@example.com", common_name="test-client")
        stranger = other.issue_cert("stranger@example.com", common_name="stranger")
        paths = {name: str(where / f"{name}.pem") for name in ("ca", "cert", "key", "client", "stranger")}
        ca.cert_pem.write_to_path(paths["ca"])
        server.cert_chain_pems[0].write_to_path(paths["cert"])
        server.private_key_pem.write_to_path(paths["key"])
        client.private_key_and_cert_chain_pem.write_to_path(paths["client"])
        stranger.private_key_and_cert_chain_pem.write_to_path(paths["stranger"])
        return cls(paths["ca"], paths["cert"], paths["key"], paths["client"], paths["stranger"])

    def server_args(self, *extra: str) -> list[str]:
        return [f"--tls-cert={self.server_cert}", f"--tls-key={self.server_key}", "--https-address=127.0.0.1:0",
                *extra]

    def client_context(self, cert: str = "") -> ssl.SSLContext:
        """A client context trusting the CA; ``cert`` is ``""``, ``"client"`` or ``"stranger"``."""
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if cert:
            ctx.load_cert_chain(self.client_pem if cert == "client" else self.stranger_pem)
        return ctx
