#!/usr/bin/env bash
# Build the container image with buildah (no Docker daemon, no container registry needed):
#
#   make image                      # -> localhost/evident:latest, then its size
#   bash deploy/image.sh TAG
#
# PYTHON_IMAGE names the base (default python:3.11-slim-bookworm from the registry). Where no registry is
# reachable, a local stand-in is made once with ../shared/tools/container-base.sh (debootstrap). A folder
# WHEELS (default /opt/wheels, where it exists) is mounted into the build and searched before the indexes,
# with PyTorch's CPU index off: torch's CPU wheel then comes from that folder. Needs root (or rootless
# buildah), PyPI and a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-localhost/evident:latest}"
store=(--storage-driver vfs)
base="${PYTHON_IMAGE:-}"
if [ -z "$base" ]; then
  base=localhost/python:3.11-slim-bookworm
  if ! buildah "${store[@]}" inspect --type image "$base" >/dev/null 2>&1; then
    bash ../shared/tools/container-base.sh "$base"
  fi
fi
wheels="${WHEELS:-/opt/wheels}"
extra=()
if [ -d "$wheels" ]; then
  extra=(-v "$wheels:$wheels:ro" --build-arg "WHEELS=$wheels" --build-arg TORCH_INDEX=)
fi
buildah "${store[@]}" bud --isolation chroot --network host \
  -v /etc/ssl/certs:/etc/ssl/certs:ro -v /etc/resolv.conf:/etc/resolv.conf:ro \
  --build-arg "PYTHON_IMAGE=$base" "${extra[@]}" -f deploy/Dockerfile -t "$tag" .
buildah "${store[@]}" images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$tag"
