"""Reads one execution's SSE feed with httpx-sse until the server ends it (a feed that stays
open fails on the 10 s read timeout: keepalives come every 15 s), then resumes it with
`Last-Event-ID` at the last event read. Prints the event names in order, how many events the
resumed feed sent and its status, as JSON.

usage: sse_feed.py BASE_URL API_KEY EXECUTION_ID
"""

import json
import sys

import httpx
from httpx_sse import connect_sse


def main():
    base, key, execution = sys.argv[1], sys.argv[2], sys.argv[3]
    url = f"{base}/v1/executions/{execution}/events"
    headers = {"Authorization": f"Bearer {key}"}
    names, last = [], None
    with httpx.Client(timeout=10) as client:
        with connect_sse(client, "GET", url, headers=headers) as source:
            assert source.response.status_code == 200, source.response.status_code
            for sse in source.iter_sse():
                names.append(sse.event)
                last = sse.id
        with connect_sse(client, "GET", url, headers={**headers, "Last-Event-ID": last}) as source:
            status = source.response.status_code
            resumed = 0 if status == 204 else sum(1 for _ in source.iter_sse())
    print(json.dumps({"names": names, "resumeStatus": status, "resumedEvents": resumed}))


if __name__ == "__main__":
    main()
