#!/usr/bin/env bash
# Create the TLS material for a Flower SuperLink, and optionally SuperNode key pairs.
#
#   deploy/make_certs.sh [--supernode-keys N] [DIR] [HOST_OR_IP ...]
#
#   DIR                 output folder (default: certificates)
#   HOST_OR_IP ...      extra names for the server certificate, e.g. the SuperLink's LAN
#                       IP (192.168.1.20) or DNS name (server.lab); localhost and 127.0.0.1
#                       are always included (the SuperLink's own SuperExec connects there)
#   --supernode-keys N  also create N EC (NIST P-384) key pairs for SuperNode
#                       authentication: DIR/supernode-keys/supernode-<i> (private key,
#                       OpenSSH format, what `flower-supernode --auth-supernode-private-key`
#                       reads) and supernode-<i>.pub (OpenSSH public key, what
#                       `flwr supernode register` reads), i = 0 .. N-1
#
# Files written to DIR:
#   ca.crt, ca.key          a self-signed certificate authority (keep ca.key on the server)
#   server.pem, server.key  the SuperLink certificate, signed by the CA
# Devices only need ca.crt (flower-supernode --root-certificates ca.crt).
#
# The script is idempotent: what exists and is still valid is kept. The server
# certificate is re-issued (with the existing CA) only when it is missing, does not cover
# the requested names, does not match its key or the CA, or expires within 30 days.
# Existing SuperNode keys are never overwritten. Delete a file to force its renewal.
#
# Environment: CA_DAYS (default 3650), SERVER_DAYS (default 825), CA_SUBJECT,
# SERVER_CN, PYTHON (interpreter with `cryptography`, used only when ssh-keygen is absent).
set -euo pipefail

CA_DAYS="${CA_DAYS:-3650}"
SERVER_DAYS="${SERVER_DAYS:-825}"
CA_SUBJECT="${CA_SUBJECT:-/O=FedReG deployment/CN=FedReG SuperLink CA}"
SERVER_CN="${SERVER_CN:-flower-superlink}"

usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
}

die() {
    echo "make_certs.sh: $*" >&2
    exit 1
}

# ------------------------------------------------------------------ arguments
num_keys=0
positional=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        -h | --help)
            usage
            exit 0
            ;;
        --supernode-keys)
            [ "$#" -ge 2 ] || die "--supernode-keys needs a number"
            num_keys="$2"
            shift 2
            ;;
        --supernode-keys=*)
            num_keys="${1#*=}"
            shift
            ;;
        --)
            shift
            positional+=("$@")
            break
            ;;
        -*)
            die "unknown option: $1 (see --help)"
            ;;
        *)
            positional+=("$1")
            shift
            ;;
    esac
done
case "$num_keys" in
    '' | *[!0-9]*) die "--supernode-keys expects a non-negative integer, got '$num_keys'" ;;
esac

out_dir="${positional[0]:-certificates}"
extra_names=()
if [ "${#positional[@]}" -gt 1 ]; then
    extra_names=("${positional[@]:1}")
fi

command -v openssl >/dev/null 2>&1 || die "openssl not found"

# ---------------------------------------------------------- subjectAltName list
is_ip() {
    # IPv4 dotted quad, or anything with a colon (IPv6)
    case "$1" in
        *:*) return 0 ;;
    esac
    printf '%s\n' "$1" | grep -Eq '^[0-9]{1,3}(\.[0-9]{1,3}){3}$'
}

# Requested names, deduplicated, as "DNS:x" / "IP:y"
san_entries=()
add_san() {
    local entry existing
    if is_ip "$1"; then entry="IP:$1"; else entry="DNS:$1"; fi
    for existing in "${san_entries[@]+"${san_entries[@]}"}"; do
        [ "$existing" = "$entry" ] && return 0
    done
    san_entries+=("$entry")
}
add_san localhost
add_san 127.0.0.1
for name in "${extra_names[@]+"${extra_names[@]}"}"; do
    [ -n "$name" ] || continue
    add_san "$name"
done
san_line="$(IFS=,; printf '%s' "${san_entries[*]}")"

mkdir -p "$out_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

created=()
kept=()

# ------------------------------------------------------------------------- CA
ca_crt="$out_dir/ca.crt"
ca_key="$out_dir/ca.key"
if [ -s "$ca_crt" ] && [ -s "$ca_key" ]; then
    kept+=("$ca_crt" "$ca_key")
else
    [ -e "$ca_crt" ] || [ -e "$ca_key" ] \
        && die "only one of $ca_crt / $ca_key exists; remove it (and every certificate it signed) to start over"
    cat >"$work/ca.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
[v3_ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
EOF
    (umask 077 && openssl genrsa -out "$ca_key" 4096 2>/dev/null)
    openssl req -new -x509 -sha256 -days "$CA_DAYS" -key "$ca_key" \
        -subj "$CA_SUBJECT" -config "$work/ca.cnf" -extensions v3_ca -out "$ca_crt"
    created+=("$ca_crt" "$ca_key")
fi

# ------------------------------------------------------------ server certificate
server_crt="$out_dir/server.pem"
server_key="$out_dir/server.key"

cat >"$work/server.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = $SERVER_CN
[v3_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
subjectAltName = $san_line
[san_only]
subjectAltName = $san_line
EOF

san_list() {  # reads `openssl ... -text`, prints one subjectAltName entry per line
    sed -n '/Subject Alternative Name/{n;p;}' | tr ',' '\n' | sed 's/^ *//; s/ *$//' | sed '/^$/d'
}

server_cert_ok() {
    [ -s "$server_crt" ] && [ -s "$server_key" ] || return 1
    # signed by this CA
    openssl verify -CAfile "$ca_crt" "$server_crt" >/dev/null 2>&1 || return 1
    # valid for at least 30 more days
    openssl x509 -in "$server_crt" -noout -checkend $((30 * 86400)) >/dev/null 2>&1 || return 1
    # certificate and key belong together
    [ "$(openssl x509 -in "$server_crt" -noout -pubkey | openssl sha256)" \
        = "$(openssl pkey -in "$server_key" -pubout | openssl sha256)" ] || return 1
    # covers every requested name: openssl prints the wanted names (from a throwaway
    # request) and the certificate's names the same way, IPv6 included
    local have want
    have="$(openssl x509 -in "$server_crt" -noout -text | san_list)"
    want="$(openssl req -new -key "$server_key" -config "$work/server.cnf" -reqexts san_only \
        | openssl req -noout -text | san_list)"
    [ -n "$want" ] || return 1
    [ -z "$(printf '%s\n' "$want" | grep -vxF -f <(printf '%s\n' "$have"))" ] || return 1
    return 0
}

if server_cert_ok; then
    kept+=("$server_crt" "$server_key")
else
    if [ -s "$server_key" ] && openssl pkey -in "$server_key" -noout >/dev/null 2>&1; then
        kept+=("$server_key")
    else
        (umask 077 && openssl genrsa -out "$server_key" 4096 2>/dev/null)
        created+=("$server_key")
    fi
    openssl req -new -sha256 -key "$server_key" -config "$work/server.cnf" -out "$work/server.csr"
    openssl x509 -req -sha256 -days "$SERVER_DAYS" -in "$work/server.csr" \
        -CA "$ca_crt" -CAkey "$ca_key" -set_serial "0x$(openssl rand -hex 16)" \
        -extfile "$work/server.cnf" -extensions v3_server -out "$work/server.pem" 2>/dev/null
    mv "$work/server.pem" "$server_crt"
    openssl verify -CAfile "$ca_crt" "$server_crt" >/dev/null
    created+=("$server_crt")
fi
chmod 600 "$ca_key" "$server_key"
chmod 644 "$ca_crt" "$server_crt"

# ------------------------------------------------------------- SuperNode keys
make_key_pair() {  # $1 = private key path, $2 = comment; writes $1 and $1.pub
    if command -v ssh-keygen >/dev/null 2>&1; then
        ssh-keygen -q -t ecdsa -b 384 -N "" -C "$2" -f "$1"
    else
        local py="${PYTHON:-}"
        if [ -z "$py" ]; then
            for candidate in python3 python; do
                if command -v "$candidate" >/dev/null 2>&1 \
                    && "$candidate" -c 'import cryptography' >/dev/null 2>&1; then
                    py="$candidate"
                    break
                fi
            done
        fi
        [ -n "$py" ] || die "neither ssh-keygen nor a Python with 'cryptography' is available (set PYTHON=...)"
        (umask 077 && "$py" - "$1" "$2" <<'EOF'
import sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

path, comment = sys.argv[1], sys.argv[2]
key = ec.generate_private_key(ec.SECP384R1())
with open(path, "wb") as f:
    f.write(key.private_bytes(serialization.Encoding.PEM,
                              serialization.PrivateFormat.OpenSSH,
                              serialization.NoEncryption()))
public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                       serialization.PublicFormat.OpenSSH)
with open(path + ".pub", "wb") as f:
    f.write(public + b" " + comment.encode() + b"\n")
EOF
        )
    fi
    chmod 600 "$1"
    chmod 644 "$1.pub"
}

if [ "$num_keys" -gt 0 ]; then
    key_dir="$out_dir/supernode-keys"
    mkdir -p "$key_dir"
    i=0
    while [ "$i" -lt "$num_keys" ]; do
        private="$key_dir/supernode-$i"
        if [ -s "$private" ] && [ -s "$private.pub" ]; then
            kept+=("$private" "$private.pub")
        else
            [ -e "$private" ] || [ -e "$private.pub" ] \
                && die "incomplete key pair $private(.pub); remove it to create a new one"
            make_key_pair "$private" "supernode-$i"
            created+=("$private" "$private.pub")
        fi
        i=$((i + 1))
    done
fi

# --------------------------------------------------------------------- report
if [ "${#created[@]}" -gt 0 ]; then
    echo "Created:"
    printf '  %s\n' "${created[@]}"
fi
if [ "${#kept[@]}" -gt 0 ]; then
    echo "Kept (already present and valid):"
    printf '  %s\n' "${kept[@]}"
fi
echo "Server certificate names: $san_line"
echo "Server certificate expires: $(openssl x509 -in "$server_crt" -noout -enddate | cut -d= -f2)"
echo "Give devices only $ca_crt (and, with SuperNode authentication, their own private key)."
