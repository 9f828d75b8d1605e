"""A serving controller keeps `/metrics` up until its final numbers have been scraped once."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

from omnirl.telemetry.meters import Meters


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_last_step_waits_for_a_scrape_and_is_in_it():
    port = free_port()
    meters = Meters("final-scrape", port)
    scraped: list[str] = []

    def scrape_later() -> None:
        time.sleep(0.5)
        for _ in range(2):  # a scraper's next reads
            scraped.append(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
            time.sleep(0.1)

    try:
        meters.record_step({"step": 3, "policy_version": 4})
        t0 = time.monotonic()
        scraper = threading.Thread(target=scrape_later, daemon=True)
        scraper.start()
        assert meters.wait_for_final_scrape(timeout_s=20)
        assert time.monotonic() - t0 >= 0.5  # it waited for the scraper, not a moment less
        scraper.join(timeout=10)
        assert any(line.startswith('omnirl_training_step{job="final-scrape"') and line.endswith(" 3.0")
                   for text in scraped for line in text.splitlines())
        meters.record_step({"step": 4})  # nobody scrapes now: the wait gives up after its timeout
        assert not meters.wait_for_final_scrape(timeout_s=0.3)
    finally:
        meters.shutdown()


def test_without_a_port_nothing_waits():
    meters = Meters("no-port")
    try:
        meters.record_step({"step": 1})
        assert meters.wait_for_final_scrape(timeout_s=60)
    finally:
        meters.shutdown()
