#!/usr/bin/env bash
# Certificates and bearer tokens for compose/tls.yaml (a test CA for one workstation; use your own PKI
# elsewhere). Writes into $1 (default compose/certs, git-ignored):
#   ca.pem                          the CA every service and client trusts
#   NAME.pem, NAME-key.pem          server certificates for verifier-a, verifier-b, verifier-gpu (profile gpu),
#                                   drafter, coordinator:
#                                   SAN = the compose service name, localhost, 127.0.0.1 (the health probe);
#                                   serverAuth + clientAuth (under mutual TLS the probe presents it)
#   coordinator-client.pem/-key.pem the coordinator's client certificate towards drafter and verifiers (mTLS)
#   upstream.tokens, coordinator.token   drafter/verifier --auth-tokens ('IDENTITY TOKEN') and the token the
#                                   coordinator sends them
#   edge.tokens, edge-client.token  coordinator --auth-tokens and the edge client's token
# Keys and tokens are made readable by uid 10001 (the images' user): owned by it when run as root, else
# world-readable (a development machine only). Existing files are kept; delete the folder to renew.
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-certs}
mkdir -p "$out"; cd "$out"
days=825
if [ ! -f ca.pem ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
    -subj "/CN=edgespec compose test CA" -keyout ca-key.pem -out ca.pem 2>/dev/null
fi
issue() {  # issue NAME SAN... : a certificate for NAME signed by the CA
  local name=$1; shift
  [ -f "$name.pem" ] && return 0
  local san; san=$(printf ',%s' "$@"); san=${san:1}
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
    -keyout "$name-key.pem" -out "$name.csr" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days "$days" -out "$name.pem" \
    -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature\n' "$san") \
    2>/dev/null
  rm -f "$name.csr"
}
for svc in verifier-a verifier-b verifier-gpu drafter coordinator; do
  issue "$svc" "DNS:$svc" DNS:localhost IP:127.0.0.1
done
issue coordinator-client DNS:coordinator
token() { openssl rand -hex 24; }
if [ ! -f coordinator.token ]; then
  t=$(token); echo "$t" > coordinator.token; echo "coordinator $t" > upstream.tokens
fi
if [ ! -f edge-client.token ]; then
  t=$(token); echo "$t" > edge-client.token; echo "edge-client $t" > edge.tokens
fi
rm -f ca.srl
if [ "$(id -u)" = 0 ]; then
  chmod 0444 ./*.pem; chmod 0400 ./*-key.pem ./*.token ./*.tokens
  for f in ./*; do [ "$f" = ./ca-key.pem ] || chown 10001:10001 "$f"; done
else
  chmod 0644 ./*; echo "make-certs.sh: not root, so keys and tokens are world-readable (uid 10001 must read them)" >&2
fi
chmod 0600 ca-key.pem   # the CA key stays with whoever ran this: no service needs it
echo "wrote $(pwd): $(ls | tr '\n' ' ')"
