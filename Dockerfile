# felixpy node image: runs as a privileged DaemonSet container in the host network namespace.
FROM debian:bookworm-slim
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-pip make \
      python3-bpfcc libbpfcc linux-headers-amd64 bpftool nftables libnftables1 python3-nftables \
      iptables ipset iproute2 iputils-ping conntrack ncat procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/felixpy
COPY . .
# setup.sh is idempotent and skips apt when the packages are already present.
RUN PYTHON=python3 bash scripts/setup.sh
ENV PATH=/opt/felixpy/.venv/bin:$PATH \
    BCC_KERNEL_SOURCE=/var/cache/felixpy/bcc-headers
# Default: serve a local calc-graph feed on a unix socket.  For Felix's external
# driver mode configure Felix with DataplaneDriver=/opt/felixpy/.venv/bin/felixpy-dataplane-driver.
ENTRYPOINT ["felixpy", "run"]
CMD ["--listen", "unix:/var/run/calico/felixpy.sock"]
