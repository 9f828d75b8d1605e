"""A scorer server of the omnirl HTTP protocol (`POST /v1/score`, `protocol/scorer.proto`'s JSON
mapping) that fails one sample of a group's first `--fail-attempts` attempts, so every group is
refilled that many times: the controller's refill path on a real job.

`python tests/refill_scorer.py --port N --fail-attempts K` listens on 127.0.0.1:N and prints
`listening on N`. Sample ids are `{step}:{prompt}:{index}[r{attempt}]` (`omnirl.api.ids`); index 0
of attempts 0 … K-1 gets an error, every other sample a score in [0, 1) from its id. An empty
request is answered 400 (the protocol's probe).
"""

from __future__ import annotations

import argparse
import json
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from omnirl.api.ids import parse_sample_id


def _handler(fail_attempts: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            samples = json.loads(self.rfile.read(int(self.headers["Content-Length"]))).get("samples", [])
            if not samples:
                self._send(400, {"error": "no samples"})
                return
            results = []
            for sample in samples:
                sid = sample["sample_id"]
                ref = parse_sample_id(sid)
                if ref.index == 0 and ref.attempt < fail_attempts:
                    results.append({"sample_id": sid, "error": f"attempt {ref.attempt} rejected"})
                else:
                    results.append({"sample_id": sid, "score": zlib.crc32(sid.encode()) % 1000 / 1000})
            self._send(200, {"results": results, "scorer": "refill"})

        def _send(self, code: int, doc: dict) -> None:
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # quiet
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail-attempts", type=int, default=1)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(args.fail_attempts))
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
