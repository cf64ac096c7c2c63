"""Development certificates and tokens: a CA, one server certificate, client certificates, bearer tokens.

    python -m edgespec.ops.devcerts OUT_DIR [--hosts verifier-a,verifier-b,coordinator] [--clients coordinator,edge]

Writes (PEM, keys readable by the owner only):
    ca.pem, ca-key.pem                  the development CA
    server.pem, server-key.pem          for every service; names: localhost, 127.0.0.1, ::1 and --hosts
    client-NAME.pem, client-NAME-key.pem  one per --clients name (common name NAME, for mutual TLS)
    token-NAME.txt                      a bearer token per client
    tokens.txt                          the server side: "NAME TOKEN" lines, for --auth-tokens

For development and tests only: production certificates come from a real CA (cert-manager, ...).
"""
from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("verifier", "verifier-a", "verifier-b", "drafter", "coordinator")
DEFAULT_CLIENTS = ("coordinator", "edge")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "edgespec dev"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, key, issuer: x509.Name, issuer_key, days: int, ca: bool,
                 names: list[x509.GeneralName] = (), usage=None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                      content_commitment=False, key_encipherment=False,
                                                      data_encipherment=False, key_agreement=False,
                                                      encipher_only=False, decipher_only=False), critical=True)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_dev_certs(out: Path, hosts=DEFAULT_HOSTS, clients=DEFAULT_CLIENTS, days: int = 365) -> dict[str, str]:
    """Write the files into ``out``; return {client name: token}."""
    out.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("edgespec dev CA", ca_key, _name("edgespec dev CA"), ca_key, days, ca=True)
    _write(out / "ca.pem", _pem(ca))
    _write(out / "ca-key.pem", _key_pem(ca_key), private=True)

    names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                     x509.IPAddress(ipaddress.ip_address("::1"))]
    names += [x509.DNSName(h) for h in hosts if h and h != "localhost"]
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate("edgespec server", server_key, ca.subject, ca_key, days, ca=False, names=names,
                          usage=ExtendedKeyUsageOID.SERVER_AUTH)
    _write(out / "server.pem", _pem(server))
    _write(out / "server-key.pem", _key_pem(server_key), private=True)

    tokens: dict[str, str] = {}
    for client in clients:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(client, key, ca.subject, ca_key, days, ca=False, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
        _write(out / f"client-{client}.pem", _pem(cert))
        _write(out / f"client-{client}-key.pem", _key_pem(key), private=True)
        tokens[client] = secrets.token_urlsafe(32)
        _write(out / f"token-{client}.txt", (tokens[client] + "\n").encode(), private=True)
    lines = ["# edgespec --auth-tokens file: IDENTITY TOKEN per line"] + [f"{c} {t}" for c, t in tokens.items()]
    _write(out / "tokens.txt", ("\n".join(lines) + "\n").encode(), private=True)
    return tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m edgespec.ops.devcerts", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="directory to write")
    parser.add_argument("--hosts", default=",".join(DEFAULT_HOSTS),
                        help="extra DNS names in the server certificate (default %(default)s)")
    parser.add_argument("--clients", default=",".join(DEFAULT_CLIENTS),
                        help="client identities to issue certificates and tokens for (default %(default)s)")
    parser.add_argument("--days", type=int, default=365, help="validity (default %(default)s)")
    args = parser.parse_args(argv)
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if not clients or not all(c.replace("-", "_").isidentifier() for c in clients):
        parser.error("--clients: names of letters, digits, '-' and '_'")
    make_dev_certs(args.out, [h.strip() for h in args.hosts.split(",") if h.strip()], clients, args.days)
    print(f"wrote a dev CA, a server certificate, {len(clients)} client certificates and tokens to {args.out}")


if __name__ == "__main__":
    main()
