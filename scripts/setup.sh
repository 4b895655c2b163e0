#!/usr/bin/env bash
# Idempotent machine + venv setup for felixpy (Debian 12 / bookworm).
# Installs the apt packages the dataplane drives, a venv with pinned Python
# dependencies, links Debian's bcc and nftables bindings into the venv, and
# builds the merged kernel-header tree bcc needs (BCC_KERNEL_SOURCE).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}

# gcc, libc6-dev, make: the static driver shim (tests/deploy/test_shim.py builds it);
# gcc + libbpf-dev: tests/bpf/test_syscall.py compiles a probe against libbpf's headers.
# python3-dev + libssl-dev: the C rule hasher, felixpy/_rulehash.c (OpenSSL's SHA-224).
APT_PKGS=(python3-bpfcc libbpfcc linux-headers-amd64 bpftool nftables libnftables1
          python3-nftables iptables ipset iproute2 iputils-ping conntrack ncat procps
          gcc libc6-dev make libbpf-dev python3-dev libssl-dev)

need_apt=0
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || { need_apt=1; break; }
done
if [ "$need_apt" = 1 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${APT_PKGS[@]}" >/dev/null
fi

stamp="$VENV/.felixpy-deps-$(sha1sum requirements.txt | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -r requirements.txt
  touch "$stamp"
fi
# Editable install of the package itself (console scripts).
if [ ! -f "$VENV/.felixpy-editable" ] || [ pyproject.toml -nt "$VENV/.felixpy-editable" ] ||
   [ setup.py -nt "$VENV/.felixpy-editable" ]; then
  "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e . && touch "$VENV/.felixpy-editable"
fi
# The C rule hasher, built in place (and rebuilt when its source changes).  It is optional for the
# package (hashing falls back to Python), so a failed build is only a warning here; the tests fail on it.
so=$(ls felixpy/_rulehash.*.so 2>/dev/null | head -1 || true)
if [ -z "$so" ] || [ felixpy/_rulehash.c -nt "$so" ] || [ setup.py -nt "$so" ]; then
  if ! "$VENV/bin/python" setup.py -q build_ext --inplace >"$VENV/.rulehash-build.log" 2>&1 ||
     ! "$VENV/bin/python" -c 'import felixpy._rulehash' 2>/dev/null; then
    echo "setup: WARNING: felixpy/_rulehash.c did not build (see $VENV/.rulehash-build.log): rule hashes in Python" >&2
  fi
fi

SP=$("$VENV/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
ln -sfn /usr/lib/python3/dist-packages/bcc "$SP/bcc"
ln -sfn /usr/lib/python3/dist-packages/nftables "$SP/nftables"

# Merged kernel header tree for bcc (Debian splits -amd64 and -common).
"$ROOT/scripts/bcc-headers.sh" >/dev/null

# Generated protobuf code.
make -s proto PYTHON="$VENV/bin/python"

# Bytecode for the package, as an installed package has it (pip compiles on install; this editable
# tree, under PYTHONDONTWRITEBYTECODE=1, would otherwise compile every module at every daemon start:
# ~2 s of CPU per start on a loaded machine, in every FV test and benchmark).  A source edited later
# is recompiled in memory, never run stale.
"$VENV/bin/python" -m compileall -q -j 0 felixpy >/dev/null
