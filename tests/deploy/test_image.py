"""Image smoke test: the built OCI image's root filesystem runs the real daemon in a throwaway namespace.

The archive (``make image`` → build/image/felixpy-image.tar, or ``$FELIXPY_IMAGE``) is
unpacked layer by layer; the daemon runs from it under ``chroot`` inside
``ip netns exec <node namespace>`` (with the netns's own /sys, a fresh /proc, and the
machine's xtables lock bind-mounted, all inside the mount namespace ``ip netns exec``
creates) — never in this machine's network namespace.  The image's own driver shim
is the feed: it must answer ``felixpy health --ready`` after the feed and enforce
the lab's policy between two workloads.

Without a built image this module is skipped (``make image-test`` requires it:
``FELIXPY_IMAGE_REQUIRED=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import lab as labmod
from .lab import PROGRAMMED, Lab, PipeFeed

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = Path(os.environ.get("FELIXPY_IMAGE", REPO / "build" / "image" / "felixpy-image.tar"))
SOCK = "/run/calico/felixpy.sock"  # /var/run → /run inside the image
RUNTIME_ENV = {"FELIX_HEALTHENABLED": "true", "FELIX_IPTABLESBACKEND": "legacy"}


def _blob(layout: Path, digest: str) -> Path:
    algo, hexd = digest.split(":", 1)
    return layout / "blobs" / algo / hexd


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """(unpacked root filesystem, image config) of the OCI archive."""
    if not ARCHIVE.exists():
        if os.environ.get("FELIXPY_IMAGE_REQUIRED") == "1":
            pytest.fail(f"no image at {ARCHIVE}: run `make image` first")
        pytest.skip(f"no image built at {ARCHIVE} (`make image`, then `make image-test`)")
    tmp = tmp_path_factory.mktemp("image")
    layout, rootfs = tmp / "layout", tmp / "rootfs"
    layout.mkdir()
    rootfs.mkdir()
    with tarfile.open(ARCHIVE) as t:
        t.extractall(layout, filter="data")
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(_blob(layout, index["manifests"][0]["digest"]).read_text())
    config = json.loads(_blob(layout, manifest["config"]["digest"]).read_text())
    for layer in manifest["layers"]:  # in order; tar(1) keeps owners, devices and absolute symlinks
        subprocess.run(["tar", "-xf", str(_blob(layout, layer["digest"])), "-C", str(rootfs)], check=True)
    (rootfs / "run" / "calico").mkdir(parents=True, exist_ok=True)
    return rootfs, config


def _image_env(config: dict[str, object]) -> dict[str, str]:
    cfg = config["config"]
    assert isinstance(cfg, dict)
    env = dict(e.split("=", 1) for e in cfg.get("Env", []))
    return {**env, **RUNTIME_ENV}


class ImageDaemon:
    """``felixpy run`` from the image's rootfs, chrooted, inside the node's network namespace."""

    def __init__(self, rootfs: Path, netns: str, env: dict[str, str], log: Path) -> None:
        self.rootfs, self.netns, self.env = rootfs, netns, env
        r = str(rootfs)
        Path(r, "run", "xtables.lock").touch()
        # Inside `ip netns exec`'s own mount namespace (/ is made a slave there): nothing mounted
        # here shows up on the machine, and it all goes away with the process.
        script = (f"set -e; mount -t proc proc {r}/proc; mount --rbind /sys {r}/sys; "
                  f"mount --rbind /dev {r}/dev; mount --bind /run/xtables.lock {r}/run/xtables.lock; "
                  f"mount --bind -o ro /lib/modules {r}/lib/modules; "
                  f"exec chroot {r} felixpy run --listen unix:{SOCK}")
        self.log = log
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(["ip", "netns", "exec", netns, "sh", "-c", script], env=env,
                                         stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket_path):
            assert self.proc.poll() is None, f"daemon exited {self.proc.returncode}:\n{self.logs()}"
            assert time.monotonic() < deadline, f"daemon did not listen:\n{self.logs()}"
            time.sleep(0.05)

    @property
    def socket_path(self) -> str:
        return str(self.rootfs) + SOCK

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def health(self, flag: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.netns, "chroot", str(self.rootfs),
                               "felixpy", "health", flag], env=self.env, capture_output=True, text=True,
                              timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def the_lab() -> Iterator[Lab]:
    with labmod.lab("fpyim") as lab:
        yield lab


def test_image_is_runtime_only(image: tuple[Path, dict[str, object]]) -> None:
    rootfs, config = image
    site = next((rootfs / "opt" / "felixpy" / "lib").glob("python3*/site-packages"))
    present = {p.name.split("-")[0].lower() for p in site.iterdir()}
    assert {"felixpy", "pyroute2", "grpc", "google", "structlog", "prometheus_client", "yaml"} <= present
    assert not present & {"pytest", "_pytest", "mypy", "hypothesis", "grpc_tools", "kubernetes_validate"}
    for compiler in ("gcc", "cc", "clang", "g++"):
        assert not (rootfs / "usr" / "bin" / compiler).exists(), compiler
    assert os.access(rootfs / "usr" / "local" / "bin" / "felixpy-driver-shim", os.X_OK)
    cfg = config["config"]
    assert isinstance(cfg, dict) and cfg["Entrypoint"] == ["felixpy", "run"]


def _dockerfile_final_stage() -> dict[str, object]:
    """ENV, ENTRYPOINT and CMD of the Dockerfile's last stage (continuation lines joined)."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    stage = text.split("\nFROM ")[-1]
    out: dict[str, object] = {"Env": {}}
    for line in stage.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "ENV":
            out["Env"] = {**out["Env"], **dict(kv.split("=", 1) for kv in rest.split())}  # type: ignore[dict-item]
        elif word in ("ENTRYPOINT", "CMD"):
            out[word.title()] = json.loads(rest)
    return out


def test_dockerfile_matches_the_image(image: tuple[Path, dict[str, object]]) -> None:
    _, config = image
    cfg = config["config"]
    assert isinstance(cfg, dict)
    docker = _dockerfile_final_stage()
    assert docker["Entrypoint"] == cfg["Entrypoint"] and docker["Cmd"] == cfg["Cmd"]
    assert docker["Env"] == dict(e.split("=", 1) for e in cfg["Env"])
    assert "deploy/image/runtime-packages.txt" in (REPO / "Dockerfile").read_text()


@pytest.mark.kernel
def test_image_daemon_probes_and_enforces_policy(image: tuple[Path, dict[str, object]], the_lab: Lab,
                                                 tmp_path: Path) -> None:
    rootfs, config = image
    env = _image_env(config)
    d = ImageDaemon(rootfs, the_lab.netns, env, tmp_path / "daemon.log")
    feed = None
    try:
        # Probe-able before any feed: live, not ready.
        deadline = time.monotonic() + 20
        while (live := d.health("--live")).returncode != 0:
            assert time.monotonic() < deadline, f"{live.stderr}\n{d.logs()}"
            time.sleep(0.2)
        assert d.health("--ready").returncode == 1

        # The image's own shim is the feed, exec'd as Felix execs it.
        feed = PipeFeed([str(rootfs / "usr" / "local" / "bin" / "felixpy-driver-shim")],
                        {"PATH": "/usr/bin:/bin", "FELIXPY_SOCKET": d.socket_path})
        feed.send(the_lab.scenario().initial)
        feed.wait_in_sync(60)
        deadline = time.monotonic() + 20
        while (ready := d.health("--ready")).returncode != 0:
            assert time.monotonic() < deadline, f"{ready.stderr}\n{d.logs()}"
            time.sleep(0.2)
        the_lab.wait_matrix(PROGRAMMED)
        assert d.proc.poll() is None, d.logs()
    finally:
        if feed is not None:
            feed.kill()
        d.stop()
