#!/usr/bin/env bash
# `make image-test`: the image smoke test against build/image/felixpy-image.tar (or $FELIXPY_IMAGE).
# Runs tests/deploy/test_image.py: the image's rootfs runs the daemon under chroot inside a
# throwaway network namespace, fed through the image's own driver shim.
set -euo pipefail
cd "$(dirname "$0")/.."
export FELIXPY_IMAGE=${FELIXPY_IMAGE:-$(pwd)/build/image/felixpy-image.tar}
if [ ! -f "$FELIXPY_IMAGE" ]; then
  echo "image-test: no image at $FELIXPY_IMAGE; run 'make image' first" >&2
  exit 1
fi
export FELIXPY_IMAGE_REQUIRED=1
exec "${PYTEST:-.venv/bin/pytest}" -q -p no:cacheprovider tests/deploy/test_image.py "$@"
