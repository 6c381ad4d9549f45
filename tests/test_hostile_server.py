"""The live page's server against hostile clients (issue #40): connections that stay silent must
not hold a thread for ever nor outlive stop(), and a request for another host name (a page that
points its own name at 127.0.0.1: DNS rebinding) must get nothing of the data."""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from colab_gpu.devices.replay import ReplaySource
from colab_gpu.live.sampler import THREAD_NAME, Sampler
from colab_gpu.live.server import IDLE_SECONDS, LiveServer

from conftest import DATA

V100 = DATA / "nvidia-smi-csv" / "v100s-pcie-32gb_miris.csv"


def wait_until(condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def open_descriptors():
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def served():
    """A page server over a replayed V100."""
    sampler = Sampler(ReplaySource(V100, follow=True), interval=0.05).start()
    server = LiveServer(sampler).start()
    yield server
    server.stop()
    sampler.stop()


def request(port, head: bytes) -> bytes:
    """The whole answer to the raw request ``head`` (the server closes after one answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(head)
        answer = b""
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                return answer
            answer += chunk


def get(port, host: "str | None", path="/data.json") -> bytes:
    header = b"" if host is None else f"Host: {host}\r\n".encode()
    return request(port, f"GET {path} HTTP/1.1\r\n".encode() + header + b"Connection: close\r\n\r\n")


def test_an_idle_connection_is_closed_after_a_few_seconds(served):
    server = served
    assert IDLE_SECONDS <= 10
    with socket.create_connection(("127.0.0.1", server.port), timeout=IDLE_SECONDS + 5) as silent:
        started = time.monotonic()
        assert silent.recv(1024) == b""  # the server closed it: nothing was ever asked
        waited = time.monotonic() - started
    assert IDLE_SECONDS - 0.5 <= waited <= IDLE_SECONDS + 3


def test_stop_closes_silent_connections_and_leaves_no_thread_nor_socket():
    before_threads = set(threading.enumerate())
    before_descriptors = open_descriptors()
    sampler = Sampler(ReplaySource(V100, follow=True), interval=0.05).start()
    server = LiveServer(sampler).start()
    port = server.port
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
    try:
        # each connection is being served, by a thread of its own waiting for a request
        wait_until(lambda: len(set(threading.enumerate()) - before_threads) >= 100, timeout=IDLE_SECONDS - 1)
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 4  # not one idle timeout per connection
        wait_until(lambda: all(thread.name == THREAD_NAME  # the sampler's, stopped below
                               for thread in set(threading.enumerate()) - before_threads), timeout=3)
        for client in clients:
            client.settimeout(2)
            try:
                assert client.recv(1024) == b""  # cut by stop, not left waiting
            except ConnectionResetError:
                pass  # cut by stop too: shut down while the server's side held unread data
    finally:
        for client in clients:
            client.close()
        sampler.stop()
    left = [thread.name for thread in set(threading.enumerate()) - before_threads]
    assert left == []
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    assert open_descriptors() <= before_descriptors


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LocalHost:{port}",
                                  "127.0.0.1",  # a proxy may give the bare name
                                  "localhost:8080",  # an SSH tunnel's own port (ssh -L 8080:127.0.0.1:PORT)
                                  # Colab's port proxy (serve_kernel_port_as_iframe), current and older names
                                  "8188-gpu-t4-s-abc123-a.us-east5-1.prod.colab.dev",
                                  "8188-gpu-t4-s-abc123-a.us-east5-1.prod.colab.dev:443",
                                  "abcdefgh-496ff2e9c6d22116-{port}-colab.googleusercontent.com",
                                  "abc-{port}.colab.googleusercontent.com"])
def test_the_loopback_and_colab_proxy_names_get_the_data(served, host):
    server = served
    answer = get(server.port, host.format(port=server.port))
    assert answer.startswith(b"HTTP/1.0 200") and b'"panel"' in answer


@pytest.mark.parametrize("host", [
    "evil.example:{port}", "evil.example",  # a page that rebound its own name to 127.0.0.1
    "127.0.0.1.nip.io:{port}", "localhost.evil.example:{port}", "127.0.0.2:{port}",
    "evil.example/127.0.0.1:{port}", "127.0.0.1:{port}@evil.example", "",
    "prod.colab.dev", "colab.googleusercontent.com",  # a proxy name has the port's label before it
    "8188-x.prod.colab.dev.evil.example", "x-colab.googleusercontent.com.evil.example",
    "8188-x.prod.colab.dev:{port}",  # the proxy answers on HTTPS only
    "googleusercontent.com", "evil-googleusercontent.com"])
def test_any_other_host_gets_a_403_and_nothing_of_the_data(served, host):
    server = served
    for path in ("/data.json", "/", "/favicon.ico"):
        answer = get(server.port, host.format(port=server.port), path)
        assert answer.startswith(b"HTTP/1.0 403"), answer[:80]
        assert b"panel" not in answer and b"V100" not in answer and b"<script" not in answer


def test_a_request_without_a_host_or_with_two_gets_a_403(served):
    server = served
    assert get(server.port, None).startswith(b"HTTP/1.0 403")  # HTTP/1.0 without Host: no name to check
    two = f"GET /data.json HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nHost: evil.example\r\n\r\n"
    assert request(server.port, two.encode()).startswith(b"HTTP/1.0 403")
