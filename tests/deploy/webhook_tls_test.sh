#!/usr/bin/env bash
# deploy/scheduler/gen-webhook-tls.sh end to end: makes the CA and serving certificate in a copy of
# deploy/scheduler, fills the caBundle, is safe to rerun (same CA, same caBundle), writes a valid Secret, and the
# real tessera-scheduler serves its webhook with that certificate to a client that trusts only the caBundle and
# checks the service's DNS name.
#   webhook_tls_test.sh SOURCE_DIR TESSERA_SCHEDULER_BINARY PYTHON3
set -euo pipefail
src="$1"; bin="$2"; py="$3"
tmp="$(mktemp -d)"
pid=""
cleanup() { [[ -n "$pid" ]] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cp -r "$src/deploy/scheduler" "$tmp/scheduler"
rm -rf "$tmp/scheduler/tls"
"$tmp/scheduler/gen-webhook-tls.sh" >/dev/null
ca1="$(cat "$tmp/scheduler/tls/ca-bundle.b64")"
[[ "$ca1" == "$(base64 <"$tmp/scheduler/tls/ca.crt" | tr -d '\n')" ]] || fail "ca-bundle.b64 is not base64 of ca.crt"
# Both webhooks (mutate.tessera.dev and dra.tessera.dev) get it.
[[ "$(grep -c "caBundle: \"$ca1\"" "$tmp/scheduler/50-webhooks.yaml")" == 2 ]] || fail "caBundle not set in both webhooks"

# Rerun: nothing changes.
cp "$tmp/scheduler/tls/tls.crt" "$tmp/tls.crt.first"
"$tmp/scheduler/gen-webhook-tls.sh" >/dev/null
[[ "$(cat "$tmp/scheduler/tls/ca-bundle.b64")" == "$ca1" ]] || fail "a rerun changed the CA"
cmp -s "$tmp/tls.crt.first" "$tmp/scheduler/tls/tls.crt" || fail "a rerun changed the serving certificate"
[[ "$(grep -c "caBundle: \"$ca1\"" "$tmp/scheduler/50-webhooks.yaml")" == 2 ]] || fail "a rerun broke the caBundle"

# The filled manifests and the Secret still parse (the cluster tier applies them to the real API server).
"$py" -c 'import sys, yaml; [list(yaml.safe_load_all(open(f))) for f in sys.argv[1:]]' \
  "$tmp/scheduler/50-webhooks.yaml" "$tmp/scheduler/tls/webhook-tls-secret.yaml" \
  || fail "the manifests with the caBundle do not parse"

# A --force rerun makes a new CA, and the manifests follow it.
"$tmp/scheduler/gen-webhook-tls.sh" --force >/dev/null
ca2="$(cat "$tmp/scheduler/tls/ca-bundle.b64")"
[[ "$ca2" != "$ca1" ]] || fail "--force kept the old CA"
[[ "$(grep -c "caBundle: \"$ca2\"" "$tmp/scheduler/50-webhooks.yaml")" == 2 ]] || fail "--force did not update caBundle"

# The real webhook server with this certificate, verified against the caBundle and the service name.
port="$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$bin" --cluster-file "$src/examples/cluster-small.yaml" --listen 127.0.0.1:0 --webhook-listen "127.0.0.1:$port" \
  --tls-cert "$tmp/scheduler/tls/tls.crt" --tls-key "$tmp/scheduler/tls/tls.key" >"$tmp/log" 2>&1 &
pid=$!
"$py" - "$tmp/scheduler/tls/ca-bundle.b64" "$port" <<'PY'
import base64, http.client, socket, ssl, sys, time
ca = base64.b64decode(open(sys.argv[1]).read()).decode()
port = int(sys.argv[2])
ctx = ssl.create_default_context(cadata=ca)
for host, ok in (("tessera-scheduler.tessera-system.svc", True), ("other.tessera-system.svc", False)):
    for attempt in range(100):
        try:
            raw = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("FAIL: the webhook server never listened")
    try:
        conn = ctx.wrap_socket(raw, server_hostname=host)
    except ssl.SSLCertVerificationError as e:
        if ok:
            sys.exit(f"FAIL: the certificate does not verify for {host}: {e}")
        continue
    if not ok:
        sys.exit(f"FAIL: the certificate verified for {host}, a name it must not cover")
    c = http.client.HTTPConnection("unused")
    c.sock = conn
    c.request("GET", "/healthz", headers={"Host": host})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"FAIL: GET /healthz over the webhook's TLS: {r.status}")
print("webhook TLS verified against the caBundle for tessera-scheduler.tessera-system.svc")
PY
