"""A webhook receiver for Capstan's tests. Verifies every request with the Standard Webhooks
library (PyPI `standardwebhooks`) against the candidate secrets and logs one JSON line per request
to LOG. Answers on /hook follow SCRIPT (comma-separated: `500`, `429:<retry-after>`, `200`), then
200; /gone always answers 410. Prints its port on the first line of stdout.

usage: webhook_receiver.py LOG SCRIPT SECRET [SECRET...]
"""

import json
import sys
import threading
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
        for i, secret in enumerate(SECRETS):
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
                    "answered": status,
                }) + "\n")
        self.send_response(status)
        if retry:
            self.send_header("Retry-After", retry)
        self.send_header("content-length", "0")
        self.end_headers()


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
