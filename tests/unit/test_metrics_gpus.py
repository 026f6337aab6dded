# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The metrics_gpus module, run through Ansible on this host against a local HTTP server
that serves a page in dcgm-exporter's form (Prometheus text, a `gpu` label per sample)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from conftest import run_local_module

# Two GPUs; GPU 1 in MIG mode reports no utilisation, only per-instance fields. The
# exporter's own build info and a non-DCGM metric with a gpu label do not count.
PAGE = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aa",device="nvidia0",modelName="A100",Hostname="n1"} 0
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-bb",device="nvidia1",GPU_I_PROFILE="1g.5gb",GPU_I_ID="7"} 0
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aa",device="nvidia0",modelName="A100",Hostname="n1"} 13
dcgm_exporter_build_info{version="3.3.9-3.6.1"} 1
OTHER_EXPORTER_TEMP{gpu="9"} 40
"""


class _Page(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        body = PAGE.encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(status: int) -> Iterator[str]:
    handler = type("Page", (_Page,), {"status": status})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def page() -> Iterator[str]:
    yield from _serve(200)


@pytest.fixture
def unavailable() -> Iterator[str]:
    yield from _serve(503)


def test_each_gpu_with_a_dcgm_field_counts_once_and_nothing_changes(page):
    result = run_local_module("gpufleet.nvidia.metrics_gpus", {"url": page})
    assert (result["changed"], result["status"]) == (False, 200)
    assert result["gpus"] == ["0", "1"]
    assert result["samples"] == 3


def test_an_exporter_that_answers_an_error_fails_naming_the_status(unavailable):
    result = run_local_module("gpufleet.nvidia.metrics_gpus", {"url": unavailable})
    assert result.get("failed") is True
    assert result["status"] == 503
    assert result["msg"] == f"{unavailable} answered 503 Service Unavailable"


def test_an_exporter_that_does_not_listen_fails_saying_so():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/metrics"
    result = run_local_module("gpufleet.nvidia.metrics_gpus", {"url": url, "timeout": 2})
    assert result.get("failed") is True and result["status"] == -1
    assert result["msg"].startswith(f"{url} could not be read: ")
    assert "refused" in result["msg"]
