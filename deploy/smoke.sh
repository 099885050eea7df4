#!/usr/bin/env bash
# Smoke-test the image `make image` built: the unprivileged user, `evident demo` inside, the data volume,
# a restart that keeps the index, and `evident serve` answering /healthz and /readyz.
#
#   make image-smoke                # or: bash deploy/smoke.sh [TAG]
#
# Runs the image with buildah (chroot isolation, the host's network); prints each check and exits 1 at the
# first that fails.
set -euo pipefail
tag="${1:-localhost/evident:latest}"
store=(--storage-driver vfs)
data=$(mktemp -d)
chown 10001:10001 "$data"
port="${SMOKE_PORT:-3999}"
ctr=$(buildah "${store[@]}" from "$tag")
cleanup() {
  [ -n "${serve_pid:-}" ] && kill "$serve_pid" 2>/dev/null || true
  buildah "${store[@]}" rm "$ctr" >/dev/null
  rm -rf "$data"
}
trap cleanup EXIT
# The host folder stands in for the /data volume. `buildah run` gives an image's VOLUME paths a scratch copy
# of their own (a bind mount onto /data is not the one written to), so it is mounted beside /data and
# EVIDENT_DATA_DIR points there; with docker or podman, `-v DIR:/data` is the same thing.
run() {
  buildah "${store[@]}" run --isolation chroot --network host --user 10001:10001 \
    --env EVIDENT_HTTP_PORT="$port" --env EVIDENT_DATA_DIR=/srv/evident-data \
    -v "$data:/srv/evident-data" "$ctr" -- "$@"
}
fail() { echo "FAIL: $*"; exit 1; }

echo "== the user: $(run id -u) (want 10001)"
[ "$(run id -u)" = 10001 ] || fail "runs as $(run id -u)"
[ "$(run stat -c %U /data)" = evident ] || fail "/data is not the evident user's"
echo "== evident demo"
run evident demo | tee /tmp/evident-smoke-demo.txt
grep -q "\[1\]" /tmp/evident-smoke-demo.txt || fail "the demo's answer cites nothing"
[ -d "$data/index" ] || fail "nothing written to the data volume"
echo "== a new container on the same volume keeps the index"
buildah "${store[@]}" rm "$ctr" >/dev/null
ctr=$(buildah "${store[@]}" from "$tag")
run evident index stats | tee /tmp/evident-smoke-stats.txt
grep -Eq "\"points\": [1-9]" /tmp/evident-smoke-stats.txt || fail "the index is empty after a restart"
echo "== evident serve: /healthz and /readyz"
# a Teams registration needs no call out at start-up (Slack's would check its token)
run env TEAMS_APP_ID=11111111-2222-3333-4444-555555555555 TEAMS_APP_PASSWORD=smoke \
  TEAMS_TENANT_ID=11111111-2222-3333-4444-666666666666 EVIDENT_TEAMS_PORT=$((port + 1)) \
  evident serve >/tmp/evident-smoke-serve.txt 2>&1 &
serve_pid=$!
for _ in $(seq 60); do
  curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 1
done
curl -fsS "http://127.0.0.1:$port/healthz" || fail "no /healthz: $(tail -5 /tmp/evident-smoke-serve.txt)"
echo
curl -fsS "http://127.0.0.1:$port/readyz" || fail "not ready: $(tail -5 /tmp/evident-smoke-serve.txt)"
echo
echo "smoke: passed"
