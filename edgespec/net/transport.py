"""Client channels: plaintext, TLS or mutual TLS, with an optional bearer token.

Imports only grpc, so the edge client can use it on a device.

A bearer token travels as call credentials, which grpc sends only over TLS or
over a connection it can see is local (loopback): a token is never sent in
clear text across a network.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import grpc

AUTHORIZATION = "authorization"


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    tls_ca: str | None = None        # PEM file: use TLS, trusting this CA (None = plaintext)
    tls_cert: str | None = None      # PEM file: our certificate, for mutual TLS
    tls_key: str | None = None       # PEM file: its private key
    token: str | None = None         # bearer token sent on every call
    server_name: str | None = None   # expect this name in the server's certificate (default: the host)

    def __post_init__(self):
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("a client certificate needs both tls_cert and tls_key")
        if self.tls_cert and not self.tls_ca:
            raise ValueError("a client certificate (mutual TLS) needs tls_ca too")
        if self.token is not None and (not self.token or any(c.isspace() for c in self.token)):
            raise ValueError("the bearer token must be non-empty and hold no whitespace")


PLAINTEXT = ClientSecurity()


def read_token(path: str | None) -> str | None:
    """The token in a file (first line, stripped), or None without a path."""
    if not path:
        return None
    text = Path(path).read_text().strip()
    if not text:
        raise ValueError(f"{path}: no token in the file")
    return text.splitlines()[0].strip()


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token: str):
        self._metadata = ((AUTHORIZATION, f"Bearer {token}"),)

    def __call__(self, context, callback):
        callback(self._metadata, None)


def open_channel(address: str, security: ClientSecurity = PLAINTEXT,
                 options: Sequence[tuple[str, object]] = ()) -> grpc.aio.Channel:
    """An asyncio channel to ``address`` secured as ``security`` says."""
    options = list(options)
    if security.server_name:
        options.append(("grpc.ssl_target_name_override", security.server_name))
    if security.tls_ca:
        channel_credentials = grpc.ssl_channel_credentials(
            root_certificates=Path(security.tls_ca).read_bytes(),
            private_key=Path(security.tls_key).read_bytes() if security.tls_key else None,
            certificate_chain=Path(security.tls_cert).read_bytes() if security.tls_cert else None)
    elif security.token:
        if not is_loopback(address):
            raise ValueError(f"{address}: a bearer token is sent only over TLS or to a loopback address; "
                             "give a CA (--tls-ca) to use TLS")
        channel_credentials = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    else:
        return grpc.aio.insecure_channel(address, options=options)
    if security.token:
        channel_credentials = grpc.composite_channel_credentials(
            channel_credentials, grpc.metadata_call_credentials(_BearerToken(security.token)))
    return grpc.aio.secure_channel(address, channel_credentials, options=options)
