# felixpy node image for users with a registry: the same contents `make image` builds offline
# (scripts/build-image.sh: mmdebstrap + buildah, no Docker Hub).  Keep the two in step:
# packages from deploy/image/runtime-packages.txt, felixpy + pinned deps as wheels in a
# venv at /opt/felixpy, the static shim at /usr/local/bin/felixpy-driver-shim, same
# ENV/ENTRYPOINT/CMD.  (Not built in felixpy's CI: it has no Docker engine.)
#   docker build --build-arg BASE_IMAGE=registry.example/debian:bookworm-slim -t felixpy:0.1.0 .
ARG BASE_IMAGE=debian:bookworm-slim

# ---- build: wheels (with the generated protobuf code and the C rule hasher) and the static shim
FROM ${BASE_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev libssl-dev gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py requirements.txt ./
COPY proto/ proto/
COPY scripts/gen-proto.sh scripts/
COPY felixpy/ felixpy/
COPY shim/ shim/
RUN python3 -m venv /build-venv \
 && /build-venv/bin/pip install -q -c requirements.txt grpcio-tools pip \
 && PYTHON=/build-venv/bin/python FORCE=1 bash scripts/gen-proto.sh \
 && /build-venv/bin/pip wheel -q --wheel-dir /wheels -c requirements.txt . \
 && /build-venv/bin/pip download -q --no-deps --dest /wheels "pip==$(/build-venv/bin/pip --version | cut -d' ' -f2)" \
 && make -s -C shim OUT=/out/felixpy-driver-shim

# ---- runtime: Debian packages + felixpy, nothing else
FROM ${BASE_IMAGE}
ARG WITH_BPF=1
# ARG, not ENV: build-time only, not part of the image's environment.
ARG DEBIAN_FRONTEND=noninteractive
COPY deploy/image/runtime-packages.txt /tmp/runtime-packages.txt
RUN pkgs=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' /tmp/runtime-packages.txt) \
 && if [ "$WITH_BPF" != 1 ]; then pkgs=$(echo "$pkgs" | grep -vx 'python3-bpfcc *'); fi \
 && apt-get update \
 && apt-get install -y --no-install-recommends $pkgs \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /usr/share/doc /usr/share/man /tmp/runtime-packages.txt
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python3 -m venv --without-pip --system-site-packages /opt/felixpy \
 && /opt/felixpy/bin/python /wheels/$(cd /wheels && ls pip-*.whl)/pip install -q --no-index --no-cache-dir \
      --find-links /wheels felixpy \
 && ln -sf /opt/felixpy/bin/felixpy /usr/local/bin/felixpy \
 && mkdir -p /var/run/calico /sys/fs/bpf
COPY --from=build /out/felixpy-driver-shim /usr/local/bin/felixpy-driver-shim
ENV PATH=/opt/felixpy/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    FELIX_HEALTHENABLED=true \
    FELIXPY_SOCKET=/var/run/calico/felixpy.sock
LABEL org.opencontainers.image.title=felixpy \
      org.opencontainers.image.description="felixpy node daemon + Felix driver shim"
ENTRYPOINT ["felixpy", "run"]
CMD ["--listen", "unix:/var/run/calico/felixpy.sock"]
