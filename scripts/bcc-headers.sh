#!/usr/bin/env bash
# Build (idempotently) a merged kernel-header tree usable as BCC_KERNEL_SOURCE.
# Debian ships headers split into linux-headers-<abi>-amd64 (generated/config)
# and linux-headers-<abi>-common (the real headers); bcc only merges the two for
# /lib/modules/$(uname -r)/build, which this kernel does not have.
set -euo pipefail
OUT=${FELIXPY_BCC_HEADERS:-/var/cache/felixpy/bcc-headers}
amd=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1)
[ -n "$amd" ] || { echo "no linux-headers-*-amd64 installed" >&2; exit 1; }
common=${amd%-amd64}-common
[ -d "$common" ] || { echo "missing $common" >&2; exit 1; }
if [ -f "$OUT/.source" ] && [ "$(cat "$OUT/.source")" = "$amd" ]; then echo "$OUT"; exit 0; fi
rm -rf "$OUT"; mkdir -p "$OUT/include" "$OUT/arch/x86/include"
for d in "$common"/include/*; do ln -s "$d" "$OUT/include/$(basename "$d")"; done
for d in config generated; do rm -f "$OUT/include/$d"; ln -s "$amd/include/$d" "$OUT/include/$d"; done
for d in "$common"/arch/x86/include/*; do ln -s "$d" "$OUT/arch/x86/include/$(basename "$d")"; done
ln -sfn "$amd/arch/x86/include/generated" "$OUT/arch/x86/include/generated"
ln -s "$amd/.config" "$OUT/.config"; ln -s "$amd/Makefile" "$OUT/Makefile"
[ -e "$amd/Module.symvers" ] && ln -s "$amd/Module.symvers" "$OUT/Module.symvers"
for d in scripts tools; do [ -e "$common/$d" ] && ln -s "$common/$d" "$OUT/$d"; done
echo "$amd" > "$OUT/.source"
echo "$OUT"
