"""A webhook receiver for Capstan's tests. Verifies every request with the Standard Webhooks
library (PyPI `standardwebhooks`) against the candidate secrets and logs one JSON line per request
to LOG. Answers on /hook follow SCRIPT (comma-separated: `500`, `429:<retry-after>`, `200`), then
200; /gone always answers 410. Prints its port on the first line of stdout.

With RECEIVER_TLS_DIR set, it serves HTTPS with a certificate for localhost/127.0.0.1 issued by a
throwaway test CA written to $RECEIVER_TLS_DIR/ca.pem (made with the openssl CLI).

usage: webhook_receiver.py LOG SCRIPT SECRET [SECRET...]
"""

import os
import ssl
import subprocess

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

LOG, SCRIPT, SECRETS = sys.argv[1], sys.argv[2], sys.argv[3:]
script = [s for s in SCRIPT.split(",") if s]
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
        headers = {k.lower(): v for k, v in self.headers.items()}
        verified_with = []
        secrets = list(SECRETS)
        # Secrets learnt after start (a booking webhook's secret is generated at registration).
        extra = os.environ.get("RECEIVER_SECRETS_FILE")
        if extra and os.path.exists(extra):
            secrets += [line.strip() for line in open(extra) if line.strip()]
        for i, secret in enumerate(secrets):
            try:
                Webhook(secret).verify(body, headers)
                verified_with.append(i)
            except WebhookVerificationError:
                pass
        with lock:
            if self.path == "/gone":
                status, retry = 410, None
            elif script:
                step = script.pop(0).split(":")
                status, retry = int(step[0]), (step[1] if len(step) > 1 else None)
            else:
                status, retry = 200, None
            event = json.loads(body)
            with open(LOG, "a") as log:
                log.write(json.dumps({
                    "path": self.path, "webhookId": headers.get("webhook-id"),
                    "signatures": headers.get("webhook-signature", "").count("v1,"),
                    "verifiedWith": verified_with, "eventId": event.get("eventId"),
                    "eventType": event.get("eventType"), "executionId": event.get("executionId"),
                    "answered": status, "body": event,
                }) + "\n")
        if self.path.startswith("/slow"):
            # A receiver that takes its time: longer than any test waits for others.
            time.sleep(60)
        self.send_response(status)
        if retry:
            self.send_header("Retry-After", retry)
        self.send_header("content-length", "0")
        self.end_headers()


def tls_context(directory):
    def run(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=Capstan test CA",
        "-keyout", "ca.key", "-out", "ca.pem", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key",
        "-out", "server.csr")
    with open(os.path.join(directory, "server.ext"), "w") as ext:
        ext.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
                  "basicConstraints=CA:FALSE\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-out", "server.pem", "-extfile", "server.ext")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(os.path.join(directory, "server.pem"), os.path.join(directory, "server.key"))
    return context


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
if os.environ.get("RECEIVER_TLS_DIR"):
    server.socket = tls_context(os.environ["RECEIVER_TLS_DIR"]).wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
