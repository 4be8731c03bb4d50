"""nsqd's ``--tls-*`` flags as a server ``ssl.SSLContext``: the supervisor builds it once at
start to refuse bad files with one line; each shard builds its own from the same files, for
the TCP upgrade after IDENTIFY and the HTTPS listener."""

from __future__ import annotations

import ssl

from pynsqd.node.config import NsqdOptions

_MIN_VERSIONS = {
    "": ssl.TLSVersion.TLSv1, "tls1.0": ssl.TLSVersion.TLSv1, "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2, "tls1.3": ssl.TLSVersion.TLSv1_3,
}


def build_server_context(opts: NsqdOptions) -> ssl.SSLContext | None:
    """The server TLS context for ``--tls-cert``/``--tls-key``, or ``None`` without them.

    ``--tls-client-auth-policy``: ``require-verify`` needs a client certificate signed by
    ``--tls-root-ca-file`` (or the system CAs); ``require`` needs a client certificate too.
    Python's ``ssl`` cannot accept a certificate it cannot verify, so ``require`` also checks
    the chain (nsqd's ``RequireAnyClientCert`` would take a self-signed one). Raises
    ``OSError``/``ssl.SSLError`` for unreadable or mismatched files.
    """
    if not (opts.tls_cert and opts.tls_key):
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
    # The system's OpenSSL policy still applies on top (OpenSSL 3 refuses TLS < 1.2 at its
    # default security level even when --tls-min-version allows it); we do not weaken it.
    ctx.minimum_version = _MIN_VERSIONS[opts.tls_min_version]
    if opts.tls_client_auth_policy:
        ctx.verify_mode = ssl.CERT_REQUIRED
        if opts.tls_root_ca_file:
            ctx.load_verify_locations(opts.tls_root_ca_file)
        else:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    elif opts.tls_root_ca_file:
        ctx.verify_mode = ssl.CERT_OPTIONAL
        ctx.load_verify_locations(opts.tls_root_ca_file)
    return ctx
