"""The live page: a tiny HTTP server on 127.0.0.1, for front ends where widgets do not update.

Colab does not re-render ipywidgets changed from a background thread (colabtools#3373); a
page served from the kernel's machine and shown with ``serve_kernel_port_as_iframe`` keeps
updating while a cell runs (TensorBoard does the same). The page is self-contained (no CDN,
no network): it polls ``data.json`` and swaps in the panel the notebook widget shows.
Only the page and its data are served; any other path is a 404.

They are served only to requests addressed to the loopback or to Colab's proxy: a web page the
user visits could otherwise point a name of its own at 127.0.0.1 (DNS rebinding) and read
data.json, the GPUs and what runs on them. Its requests carry that name in their Host header,
which is checked:
``127.0.0.1``, ``localhost`` and ``[::1]`` (any port: an SSH tunnel maps the port, and only the
name tells an attacker's page apart), and the names of Colab's port proxy, which
``serve_kernel_port_as_iframe`` loads the page through (``https://PORT-...-colab.googleusercontent.com``,
``https://PORT-....prod.colab.dev``): whether that proxy passes its own name on or rewrites it to
the loopback is not documented, so both are accepted; Google holds those domains, so no page can
point them here. Anything else gets a 403 and no data. A connection that sends no request is
closed after IDLE_SECONDS, and stop() closes those still open: each held a thread, forever.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Optional

from .panel import render_panel, source_title
from .sampler import Sampler

PAGE_PATH = os.path.join(os.path.dirname(__file__), "page.html")
HOST = "127.0.0.1"  # never reachable from another machine
IDLE_SECONDS = 5.0  # a connection silent this long is closed (the page asks every second or so)
CLOSE_SECONDS = 2.0  # stop() waits this long at most for the requests it cut off to end
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
COLAB_PROXY_SUFFIXES = ("-colab.googleusercontent.com", ".colab.googleusercontent.com", ".prod.colab.dev")
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::([0-9]{1,5}))?")


def allowed_host(host: Optional[str]) -> bool:
    """Whether a request whose Host header is ``host`` may be answered (see the module's notes):
    a loopback name, or a name of Colab's proxy on the HTTPS port."""
    match = _HOST.fullmatch((host or "").strip().lower())
    if match is None:
        return False
    name, port = match.groups()
    if name in LOOPBACK_NAMES:
        return True
    return port in (None, "443") and any(name.endswith(suffix) and len(name) > len(suffix)
                                         for suffix in COLAB_PROXY_SUFFIXES)


def page_state(sampler: Sampler) -> dict:
    """What one poll returns: the panel to show and the latest numbers, for scripts."""
    latest = sampler.latest()
    return {
        "label": sampler.label,
        "title": source_title(sampler),
        "running": sampler.running,
        "error": sampler.error,
        "count": sampler.count,
        "interval": sampler.interval,
        "latest": None if latest is None else {
            "time": latest.time, "gpus": [reading._asdict() for reading in latest.gpus]},
        "panel": render_panel(sampler),
    }


class _QuietServer(ThreadingHTTPServer):
    """Serves each connection on a thread of its own, and can end them all (:meth:`close_connections`):
    the standard one joins them at close without a bound, or leaves them running (by version)."""

    daemon_threads = True
    block_on_close = False  # close_connections() ends them instead, within a bound
    # socketserver's 5 made the sixth of a burst of connections (tabs reloading the page) wait for
    # the kernel's SYN retries, 1, 3, 7 ... seconds
    request_queue_size = 128

    def __init__(self, *args) -> None:
        self._connections: Dict[threading.Thread, socket.socket] = {}  # thread -> its socket, while it serves
        self._connections_lock = threading.Lock()
        super().__init__(*args)

    def process_request(self, request, client_address) -> None:
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                                  name="colab_gpu-live-page-request", daemon=True)
        with self._connections_lock:
            self._connections[thread] = request
        thread.start()

    def shutdown_request(self, request) -> None:
        """The end of a connection, on its own thread (or one refused before it had one)."""
        with self._connections_lock:
            self._connections.pop(threading.current_thread(), None)
        super().shutdown_request(request)

    def close_connections(self, seconds: float) -> None:
        """Cut every open connection (an idle one waits in recv) and wait ``seconds`` at most
        for their threads to end."""
        with self._connections_lock:
            open_now = list(self._connections.items())
        for _, request in open_now:
            try:
                request.shutdown(socket.SHUT_RDWR)  # its recv returns at once: the thread ends
            except OSError:
                pass  # closed meanwhile
        deadline = time.monotonic() + seconds
        for thread, _ in open_now:
            thread.join(max(0.0, deadline - time.monotonic()))

    def handle_error(self, request, client_address) -> None:
        """A browser that went away mid-reply: nothing to tell (and never into a cell)."""


class LiveServer:
    """Serves the live page of ``sampler`` on a free port of 127.0.0.1 from a daemon thread."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self._httpd: Optional[_QuietServer] = None
        self._thread: Optional[threading.Thread] = None
        self._stopping = threading.Lock()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "start() first"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    @property
    def address(self):
        """(host, port) the socket is bound to."""
        assert self._httpd is not None, "start() first"
        return self._httpd.socket.getsockname()

    def start(self) -> "LiveServer":
        with open(PAGE_PATH, "rb") as file:
            page = file.read()
        sampler = self.sampler

        class Handler(BaseHTTPRequestHandler):
            timeout = IDLE_SECONDS  # the socket's: a silent connection ends instead of waiting

            def do_GET(self):
                path = self.path.split("?", 1)[0]
                hosts = self.headers.get_all("Host") or []
                if len(hosts) != 1 or not allowed_host(hosts[0]):
                    # what was refused, for a proxy this does not know yet; nothing of the data
                    said = ", ".join(repr(host[:100]) for host in hosts) or "none"
                    self._send(403, "text/plain; charset=utf-8",
                               f"forbidden: the live page answers only requests for 127.0.0.1, localhost "
                               f"or Colab's proxy, not Host {said}\n".encode("ascii", "replace"))
                elif path in ("/", "/index.html"):
                    self._send(200, "text/html; charset=utf-8", page)
                elif path == "/data.json":
                    body = json.dumps(page_state(sampler)).encode()
                    self._send(200, "application/json", body)
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found\n")

            def _send(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args):  # never print into the user's cells
                pass

        self._httpd = _QuietServer((HOST, 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="colab_gpu-live-page", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # after the sampler's: runs first at exit
        return self

    def stop_after(self, seconds: float) -> None:
        """Keep serving (the sampler's final state) for ``seconds``, then :meth:`stop`."""
        timer = threading.Timer(seconds, self.stop)
        timer.name, timer.daemon = "colab_gpu-live-page-close", True
        timer.start()

    def stop(self) -> None:
        """Stop serving, end the connections still open and close the socket: the port refuses
        connections afterwards, and no thread of the server is left."""
        atexit.unregister(self.stop)
        with self._stopping:  # the timer of stop_after and atexit may both get here
            if self._httpd is None:
                return
            self._httpd.shutdown()
            if self._thread is not None:  # started with _httpd
                self._thread.join()
            self._httpd.close_connections(CLOSE_SECONDS)
            self._httpd.server_close()
            self._httpd = None
