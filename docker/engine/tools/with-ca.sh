#!/bin/bash
# Runs one command with the build's CA bundle (build args APPLIANCE_CA_PEM_0..3, joined in
# order: one bundle split under the kernel's size limit for one variable) visible to pip,
# git, curl, requests and apt, then deletes the bundle: it never lands in an image layer.
set -euo pipefail
if [ -z "${APPLIANCE_CA_PEM_0:-}" ]; then
  exec "$@"
fi
ca="$(mktemp /tmp/appliance-ca.XXXXXX.pem)"
trap 'rm -f "$ca"' EXIT
printf '%s%s%s%s\n' "$APPLIANCE_CA_PEM_0" "${APPLIANCE_CA_PEM_1:-}" "${APPLIANCE_CA_PEM_2:-}" \
  "${APPLIANCE_CA_PEM_3:-}" > "$ca"
# Append to the system roots so that hosts reached without the proxy still verify.
if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
  cat /etc/ssl/certs/ca-certificates.crt >> "$ca"
fi
export PIP_CERT="$ca" REQUESTS_CA_BUNDLE="$ca" SSL_CERT_FILE="$ca" CURL_CA_BUNDLE="$ca" \
  GIT_SSL_CAINFO="$ca" APPLIANCE_APT_CA="$ca"
echo "appliance: CA bundle in use for this step (temporary file, removed afterwards)"
"$@"
