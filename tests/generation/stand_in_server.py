"""A stand-in for a vLLM server in the process-lifecycle tests: answers GET /health with 200 after `--delay` seconds,
starts a child process (as vLLM starts its engine core), and ignores SIGTERM when `--stubborn` (SIGKILL is needed)."""

import argparse
import http.server
import signal
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--delay", type=float, default=0.0)
parser.add_argument("--exit-at-once", action="store_true")
parser.add_argument("--stubborn", action="store_true")
cli = parser.parse_args()
if cli.exit_at_once:
    print("stand-in: failing on purpose", flush=True)
    sys.exit(3)
if cli.stubborn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # like vLLM's engine core
time.sleep(cli.delay)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer((cli.host, cli.port), Health).serve_forever()
