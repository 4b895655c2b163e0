#!/usr/bin/env bash
# Build felixpy's node image without Docker Hub (`make image`):
#   1. a Debian bookworm root filesystem from Debian's own packages (mmdebstrap),
#      runtime packages only: python3, the kernel tools felixpy drives, bcc's runtime;
#   2. felixpy and its pinned dependencies (pyproject dependencies, pinned by
#      requirements.txt) as wheels built on the spot, installed into /opt/felixpy;
#   3. the static driver shim (shim/) at /usr/local/bin/felixpy-driver-shim;
#   4. committed with buildah from `scratch` and saved as an OCI archive.
# Output: build/image/felixpy-image.tar (oci-archive, tag felixpy:$VERSION) and its size.
# Needs root (mmdebstrap's root mode); installs mmdebstrap and buildah if missing.
# Nothing here runs a container or touches the network configuration of this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${IMAGE_OUT:-$ROOT/build/image}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
VENV_PY=${PYTHON:-$ROOT/.venv/bin/python}
VERSION=$("$VENV_PY" -c 'import felixpy; print(felixpy.__version__)')
TAG=${IMAGE_TAG:-felixpy:$VERSION}
# bcc (python3-bpfcc) brings LLVM/clang's runtime libraries (~120 MB): IMAGE_BPF=0 leaves it out
# for iptables/nftables-only nodes.
IMAGE_BPF=${IMAGE_BPF:-1}

# Runtime packages only (the list, with why each is there: deploy/image/runtime-packages.txt).
mapfile -t PKGS < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' -e 's/[[:space:]]*$//' deploy/image/runtime-packages.txt)
if [ "$IMAGE_BPF" != 1 ]; then
  mapfile -t PKGS < <(printf '%s\n' "${PKGS[@]}" | grep -vx python3-bpfcc)
fi

host_pkgs=(mmdebstrap buildah)
missing=()
for p in "${host_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

rm -rf "$OUT/rootfs" "$OUT/wheels" "$OUT/storage"
mkdir -p "$OUT/wheels"

echo "== driver shim (static)"
make -s -C shim OUT="$OUT/felixpy-driver-shim"

echo "== wheels: felixpy + pinned runtime dependencies"
make -s proto PYTHON="$VENV_PY"
"$VENV_PY" -m pip wheel -q --wheel-dir "$OUT/wheels" -c requirements.txt .
pipver=$("$VENV_PY" -m pip --version | awk '{print $2}')
"$VENV_PY" -m pip download -q --no-deps --dest "$OUT/wheels" "pip==$pipver"
pipwhl=$(cd "$OUT/wheels" && ls pip-*.whl)
ls "$OUT/wheels"

echo "== rootfs: mmdebstrap bookworm (${#PKGS[@]} packages + dependencies)"
inc=$(IFS=,; echo "${PKGS[*]}")
# merged-usr hook: /usr merged by usr-is-merged instead of the usrmerge package (which drags perl in).
mmdebstrap --mode=root --variant=essential --include="$inc" \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --customize-hook="mkdir -p \"\$1/tmp/wheels\" && cp -a '$OUT/wheels/.' \"\$1/tmp/wheels/\"" \
  --customize-hook='chroot "$1" python3 -m venv --without-pip --system-site-packages /opt/felixpy' \
  --customize-hook="chroot \"\$1\" /opt/felixpy/bin/python /tmp/wheels/$pipwhl/pip install -q --no-index --no-cache-dir --find-links /tmp/wheels felixpy" \
  --customize-hook='rm -rf "$1/tmp/wheels"' \
  --customize-hook="install -m 0755 '$OUT/felixpy-driver-shim' \"\$1/usr/local/bin/felixpy-driver-shim\"" \
  --customize-hook='ln -sf /opt/felixpy/bin/felixpy "$1/usr/local/bin/felixpy"' \
  --customize-hook='mkdir -p "$1/var/run/calico" "$1/lib/modules" "$1/usr/src" "$1/sys/fs/bpf"' \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*.log "$1"/var/cache/debconf/*-old' \
  bookworm "$OUT/rootfs" \
  "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $SECURITY bookworm-security main"

# Sanity: runtime only (no test tools, no compilers) and the daemon imports.
for tool in pytest mypy hypothesis; do
  if [ -e "$OUT/rootfs/opt/felixpy/bin/$tool" ]; then echo "build-image: $tool leaked into the image" >&2; exit 1; fi
done
for cc in gcc cc clang; do
  if [ -e "$OUT/rootfs/usr/bin/$cc" ]; then echo "build-image: compiler $cc in the image" >&2; exit 1; fi
done
chroot "$OUT/rootfs" /opt/felixpy/bin/felixpy version

echo "== OCI image: buildah commit from scratch"
B=(buildah --root "$OUT/storage/root" --runroot "$OUT/storage/run" --storage-driver vfs)
ctr=$("${B[@]}" from scratch)
"${B[@]}" copy "$ctr" "$OUT/rootfs" / >/dev/null
"${B[@]}" config \
  --env PATH=/opt/felixpy/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env FELIX_HEALTHENABLED=true \
  --env FELIXPY_SOCKET=/var/run/calico/felixpy.sock \
  --entrypoint '["felixpy", "run"]' --cmd '--listen unix:/var/run/calico/felixpy.sock' \
  --label org.opencontainers.image.title=felixpy \
  --label org.opencontainers.image.version="$VERSION" \
  --label org.opencontainers.image.description="felixpy node daemon + Felix driver shim" \
  "$ctr"
"${B[@]}" commit -q --format oci "$ctr" "$TAG" >/dev/null
rm -f "$OUT/felixpy-image.tar"
"${B[@]}" push -q "$TAG" "oci-archive:$OUT/felixpy-image.tar:$TAG"
"${B[@]}" rm "$ctr" >/dev/null
"${B[@]}" rmi -a -f >/dev/null 2>&1 || true
rm -rf "$OUT/storage"

archive=$(du -m "$OUT/felixpy-image.tar" | cut -f1)
rootfs=$(du -sm "$OUT/rootfs" | cut -f1)
echo "== built $TAG"
echo "oci-archive: $OUT/felixpy-image.tar  ${archive} MiB (layer gzip-compressed); rootfs ${rootfs} MiB unpacked"
echo "load it: podman load -i $OUT/felixpy-image.tar   |   skopeo copy oci-archive:$OUT/felixpy-image.tar docker://REGISTRY/felixpy:$VERSION"
