#!/usr/bin/env bash
# The test command: every test, with pytest's "no tests collected" (exit 5) as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
export BCC_KERNEL_SOURCE=${BCC_KERNEL_SOURCE:-$(scripts/bcc-headers.sh)}
.venv/bin/pytest -q -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run-tests: pytest collected no tests: failing" >&2
  exit 1
fi
# Nothing may be left behind in the root namespace or as stray namespaces.
left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^fpy' || true)
if [ -n "$left" ]; then
  echo "run-tests: namespaces left behind: $left" >&2
  for ns in $left; do
    # What still holds it (processes, mounts), then the reason its deletion fails, if it does.
    echo "run-tests: $ns: pids: $(ip netns pids "$ns" 2>&1 | tr '\n' ' ')" >&2
    findmnt -n "/run/netns/$ns" >&2 || true
    ip netns del "$ns" >&2
  done
  [ "$rc" -eq 0 ] && rc=1
fi
exit "$rc"
