"""The live page: a tiny HTTP server on 127.0.0.1, for front ends where widgets do not update.

Colab does not re-render ipywidgets changed from a background thread (colabtools#3373); a
page served from the kernel's machine and shown with ``serve_kernel_port_as_iframe`` keeps
updating while a cell runs (TensorBoard does the same). The page is self-contained (no CDN,
no network): it polls ``data.json`` and swaps in the panel the notebook widget shows.
Only the page and its data are served; any other path is a 404.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

from .panel import render_panel, source_title
from .sampler import Sampler

PAGE_PATH = os.path.join(os.path.dirname(__file__), "page.html")
HOST = "127.0.0.1"  # never reachable from another machine


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
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A browser that went away mid-reply: nothing to tell (and never into a cell)."""


class LiveServer:
    """Serves the live page of ``sampler`` on a free port of 127.0.0.1 from a daemon thread."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._stopping = threading.Lock()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    @property
    def address(self):
        """(host, port) the socket is bound to."""
        return self._httpd.socket.getsockname()

    def start(self) -> "LiveServer":
        with open(PAGE_PATH, "rb") as file:
            page = file.read()
        sampler = self.sampler

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?", 1)[0]
                if path in ("/", "/index.html"):
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
        """Stop serving and close the socket: the port refuses connections afterwards."""
        atexit.unregister(self.stop)
        with self._stopping:  # the timer of stop_after and atexit may both get here
            if self._httpd is None:
                return
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join()
            self._httpd = None
