#!/usr/bin/env bash
# Generate felixpy/proto/*_pb2{,_grpc}.py{,i} from proto/*.proto.
#
# Idempotent: does nothing unless a .proto (or this script) is newer than the
# oldest generated file, or an output is missing.  FORCE=1 regenerates anyway.
# Python comes from $PYTHON, else .venv/bin/python.
#
# protoc emits top-level imports ("import felixbackend_pb2 as ...") that only
# work with felixpy/proto on sys.path; they are rewritten to package-relative
# form ("from felixpy.proto import felixbackend_pb2 as ...").
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
SRC=proto
OUT=felixpy/proto
PROTOS=(felixbackend felixpy)

outputs=()
for p in "${PROTOS[@]}"; do
  outputs+=("$OUT/${p}_pb2.py" "$OUT/${p}_pb2.pyi" "$OUT/${p}_pb2_grpc.py")
done

stale() {
  [ "${FORCE:-0}" = 1 ] && return 0
  local out in
  for out in "${outputs[@]}"; do
    [ -f "$out" ] || return 0
    for in in "${PROTOS[@]/#/$SRC/}"; do
      [ "$in.proto" -nt "$out" ] && return 0
    done
    [ "$0" -nt "$out" ] && return 0
  done
  return 1
}

if ! stale; then
  exit 0
fi

mkdir -p "$OUT"
"$PY" -m grpc_tools.protoc \
  -I "$SRC" \
  --python_out="$OUT" \
  --pyi_out="$OUT" \
  --grpc_python_out="$OUT" \
  "${PROTOS[@]/%/.proto}"

# Make cross-file imports package-relative (idempotent: only touches the
# bare "import X_pb2" form).
for p in "${PROTOS[@]}"; do
  for f in "${outputs[@]}"; do
    sed -i -E "s/^import ${p}_pb2( as |$)/from felixpy.proto import ${p}_pb2\1/" "$f"
  done
done

# Touch all outputs together so the staleness check sees one generation.
touch "${outputs[@]}"
echo "gen-proto: regenerated ${#outputs[@]} files in $OUT" >&2
