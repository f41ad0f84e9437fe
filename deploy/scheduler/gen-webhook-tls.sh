#!/usr/bin/env bash
# Makes the TLS material of tessera-scheduler's admission webhook: a CA and a serving certificate for
# tessera-scheduler.tessera-system.svc signed by it. Writes
#   DIR/ca.crt, DIR/ca.key, DIR/tls.crt, DIR/tls.key   (DIR: deploy/scheduler/tls by default; git-ignored)
#   DIR/webhook-tls-secret.yaml                        the Secret tessera-scheduler-webhook-tls (kubectl apply)
# and puts the CA (base64) into the caBundle fields of deploy/scheduler/50-webhooks.yaml.
#
#   deploy/scheduler/gen-webhook-tls.sh                 # make (or reuse) the certificates, fill the manifests
#   deploy/scheduler/gen-webhook-tls.sh --print         # also print the kubectl commands for a running cluster
#   deploy/scheduler/gen-webhook-tls.sh --force         # new CA and certificate even when valid ones exist
#   deploy/scheduler/gen-webhook-tls.sh --dir DIR --namespace NS --service NAME --days N --no-manifests
#
# Safe to rerun: an existing CA and certificate are reused while they are valid for 30 more days and match the
# service name, so the caBundle does not change under a running cluster; the manifests are rewritten in place
# (only their caBundle lines).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="$here/tls"
namespace=tessera-system
service=tessera-scheduler
secret=tessera-scheduler-webhook-tls
days=3650
force=0
print=0
manifests=1

usage() { sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --namespace) namespace="$2"; shift 2 ;;
    --service) service="$2"; shift 2 ;;
    --secret) secret="$2"; shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --force) force=1; shift ;;
    --print) print=1; shift ;;
    --no-manifests) manifests=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gen-webhook-tls.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
command -v openssl >/dev/null || { echo "gen-webhook-tls.sh: openssl not found; apt-get install openssl" >&2; exit 1; }

host="$service.$namespace.svc"
mkdir -p "$dir"
chmod 700 "$dir"

valid() {  # $1 certificate: exists, valid for 30 more days
  [[ -s "$1" ]] && openssl x509 -in "$1" -noout -checkend $((30 * 24 * 3600)) >/dev/null 2>&1
}

if [[ $force == 1 ]] || ! valid "$dir/ca.crt" || [[ ! -s "$dir/ca.key" ]]; then
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" -subj "/CN=tessera-webhook-ca" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  rm -f "$dir/tls.crt"  # a new CA needs a new serving certificate
  echo "gen-webhook-tls.sh: new CA in $dir/ca.crt"
fi

if [[ $force == 1 ]] || ! valid "$dir/tls.crt" || [[ ! -s "$dir/tls.key" ]] ||
   ! openssl x509 -in "$dir/tls.crt" -noout -ext subjectAltName 2>/dev/null | grep -q "DNS:$host\b" ||
   ! openssl verify -CAfile "$dir/ca.crt" "$dir/tls.crt" >/dev/null 2>&1; then
  ext="$(mktemp)"
  trap 'rm -f "$ext" "$dir/tls.csr"' EXIT
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature" \
    "extendedKeyUsage=serverAuth" \
    "subjectAltName=DNS:$service,DNS:$service.$namespace,DNS:$host,DNS:$host.cluster.local" >"$ext"
  # An ECDSA P-256 serving key: the API server opens a TLS connection to the webhook for many pod creations,
  # and signing a handshake with it costs a fraction of RSA 2048's (bench/cluster_scale.py).
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -subj "/CN=$host" \
    -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
  openssl x509 -req -sha256 -days "$days" -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -extfile "$ext" -out "$dir/tls.crt" 2>/dev/null
  echo "gen-webhook-tls.sh: new serving certificate for $host in $dir/tls.crt"
fi
chmod 600 "$dir/ca.key" "$dir/tls.key"

b64() { base64 <"$1" | tr -d '\n'; }
ca_bundle="$(b64 "$dir/ca.crt")"

cat >"$dir/webhook-tls-secret.yaml" <<YAML
# The serving certificate of tessera-scheduler's webhook; made by deploy/scheduler/gen-webhook-tls.sh.
apiVersion: v1
kind: Secret
metadata:
  name: $secret
  namespace: $namespace
  labels:
    app.kubernetes.io/name: tessera-scheduler
    app.kubernetes.io/part-of: tessera
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$dir/tls.crt")
  tls.key: $(b64 "$dir/tls.key")
  ca.crt: $ca_bundle
YAML
chmod 600 "$dir/webhook-tls-secret.yaml"
echo "gen-webhook-tls.sh: wrote $dir/webhook-tls-secret.yaml"

if [[ $manifests == 1 ]]; then
  webhooks="$here/50-webhooks.yaml"
  sed -i -E "s|^([[:space:]]*caBundle:).*$|\\1 \"$ca_bundle\"|" "$webhooks"
  echo "gen-webhook-tls.sh: caBundle set in $webhooks"
fi
printf "%s" "$ca_bundle" >"$dir/ca-bundle.b64"

if [[ $print == 1 ]]; then
  cat <<CMDS
# On a running cluster:
kubectl apply -f $dir/webhook-tls-secret.yaml
kubectl patch mutatingwebhookconfiguration tessera-scheduler --type=json \\
  -p '[{"op":"replace","path":"/webhooks/0/clientConfig/caBundle","value":"'"\$(cat $dir/ca-bundle.b64)"'"},
       {"op":"replace","path":"/webhooks/1/clientConfig/caBundle","value":"'"\$(cat $dir/ca-bundle.b64)"'"}]'
kubectl -n $namespace rollout restart deployment tessera-scheduler   # picks up a new certificate
# With Helm: --set-file webhook.caBundle=$dir/ca-bundle.b64 (and apply the Secret first)
CMDS
fi
