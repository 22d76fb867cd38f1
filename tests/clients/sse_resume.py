"""Reads Capstan's event stream with httpx-sse: a first connection from cursor 0 that stops after
`first` events, then a resumed one authenticated by a single-use stream token with
`lastEventId`, until `total` events. Prints what it saw as JSON.

usage: sse_resume.py BASE_URL API_KEY FIRST TOTAL
"""

import json
import sys

import httpx
from httpx_sse import connect_sse


def read(client, url, headers, limit):
    seen = []
    with connect_sse(client, "GET", url, headers=headers) as source:
        assert source.response.status_code == 200, source.response.status_code
        assert source.response.headers["content-type"].startswith("text/event-stream")
        for sse in source.iter_sse():
            if sse.event == "resync":
                seen.append({"resync": json.loads(sse.data)})
                continue
            event = json.loads(sse.data)
            seen.append({"id": sse.id, "event": sse.event, "eventId": event["eventId"],
                         "name": f'{event["eventType"]}.v{event["eventVersion"]}'})
            if len(seen) >= limit:
                break
    return seen


def main():
    base, key, first, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    bearer = {"Authorization": f"Bearer {key}"}
    with httpx.Client(timeout=60) as client:
        one = read(client, f"{base}/v1/streams/events?workflow=fixture-steps",
                   {**bearer, "Last-Event-ID": "0"}, first)
        token = client.post(f"{base}/v1/streams/token", headers=bearer).json()["token"]
        two = read(client,
                   f"{base}/v1/streams/events?workflow=fixture-steps&token={token}&lastEventId={one[-1]['id']}",
                   {}, total - len(one))
        reuse = client.get(f"{base}/v1/streams/events?token={token}")
    print(json.dumps({"first": one, "second": two, "reuseStatus": reuse.status_code}))


if __name__ == "__main__":
    main()
