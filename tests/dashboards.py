"""The shipped Grafana dashboards' queries, and whether a `/metrics` scrape answers each panel.

A panel "gets data" when every `omnirl_*` vector selector in its queries (`name{label op "value", …}`)
matches at least one scraped series: the same name, and labels satisfying each matcher (`=`, `!=`,
`=~`, `!~`, the regexes anchored as in PromQL). Grafana variables (`$job`) are replaced by their
value. The `job` variable's own query (`label_values(omnirl_training_step, job)`) counts as a panel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from omnirl.transfer.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "charts" / "omnirl" / "files" / "dashboards"
SELECTOR_RE = re.compile(r"\b(omnirl_[a-z0-9_]+)\b\s*(\{[^}]*\})?")
MATCHER_RE = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
Series = tuple[str, frozenset[tuple[str, str]]]  # (sample name, labels)


@dataclass(frozen=True)
class Selector:
    """One PromQL vector selector: a metric name and its label matchers `(label, op, value)`."""

    name: str
    matchers: tuple[tuple[str, str, str], ...]

    def matches(self, series: Series, variables: dict[str, str]) -> bool:
        """True when `series` has this name and satisfies every matcher (variables substituted)."""
        name, labels = series
        if name != self.name:
            return False
        have = dict(labels)
        for label, op, value in self.matchers:
            for var, val in variables.items():
                value = value.replace(f"${var}", re.escape(val) if "~" in op else val)
            got = have.get(label, "")
            ok = {"=": got == value, "!=": got != value}.get(op)
            if ok is None:
                ok = re.fullmatch(value, got) is not None
                ok = ok if op == "=~" else not ok
            if not ok:
                return False
        return True


def selectors(expr: str) -> list[Selector]:
    """The `omnirl_*` vector selectors of a PromQL expression.

    Raises:
        ValueError: a `{…}` block that is not a list of `label op "value"` matchers.
    """
    found = []
    for m in SELECTOR_RE.finditer(expr):
        body = (m.group(2) or "{}")[1:-1]
        matchers = []
        for part in filter(str.strip, body.split(",")):
            parsed = MATCHER_RE.fullmatch(part)
            if parsed is None:
                raise ValueError(f"cannot parse the matcher {part!r} in {expr!r}")
            matchers.append(parsed.groups())
        found.append(Selector(m.group(1), tuple(matchers)))
    return found


def panels() -> dict[tuple[str, str], list[Selector]]:
    """(dashboard file, panel title) → the selectors of all its queries, for every shipped dashboard;
    each dashboard's template variables appear as panels titled `variable <name>`."""
    out: dict[tuple[str, str], list[Selector]] = {}
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            key = (path.name, panel["title"])
            if key in out:
                raise ValueError(f"{path.name}: two panels titled {panel['title']!r}")
            out[key] = [s for t in panel.get("targets", []) for s in selectors(t["expr"])]
        for var in board.get("templating", {}).get("list", []):
            query = var.get("query", "")
            query = query.get("query", "") if isinstance(query, dict) else query
            if "omnirl_" in query:
                out[(path.name, f"variable {var['name']}")] = selectors(query)
    return out


def parse_scrape(text: str) -> set[Series]:
    """Every series of a Prometheus text exposition (prometheus_client's own parser)."""
    return {(s.name, frozenset(s.labels.items()))
            for family in text_string_to_metric_families(text) for s in family.samples}


def run_scraped(job: Path, out: Path, *extra: str, timeout_s: float) -> tuple[int, str, set[Series], dict[str, float]]:
    """``omnirl run JOB --out OUT *extra`` with the controller's ``/metrics`` on a free port
    (``OMNIRL_METRICS_PORT``), scraped every 0.2 s until the job exits (killed after ``timeout_s``).

    Returns:
        (exit code, the job's combined stdout and stderr, every series ever served, each
        ``omnirl_*`` sample name's latest value).
    """
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "omnirl.cli", "run", str(job), "--out", str(out), *extra],
                            cwd=ROOT, env={**os.environ, "OMNIRL_METRICS_PORT": str(port)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[Series] = set()
    values: dict[str, float] = {}
    scraper = threading.Thread(target=_scrape_until_exit, args=(port, proc, seen, values), daemon=True)
    scraper.start()
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        scraper.join()
    return proc.returncode, log, seen, values


def _scrape_until_exit(port: int, proc: subprocess.Popen, seen: set[Series], values: dict[str, float]) -> None:
    """Scrape `http://127.0.0.1:{port}/metrics` every 0.2 s until `proc` exits; `seen` collects every
    series ever served, `values` each `omnirl_*` sample name's latest value (any labels)."""
    while proc.poll() is None:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        except OSError:  # not serving yet, or already gone
            threading.Event().wait(0.2)
            continue
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                seen.add((s.name, frozenset(s.labels.items())))
                if s.name.startswith("omnirl_"):
                    values[s.name] = s.value
        threading.Event().wait(0.2)


def empty_panels(seen: set[Series], variables: dict[str, str]) -> dict[tuple[str, str], list[str]]:
    """(dashboard file, panel title) → the selectors of that panel no series in `seen` answers,
    for every panel missing some data (a panel without any `omnirl_*` selector counts as empty)."""
    out = {}
    for key, sels in panels().items():
        missing = [f"{s.name}{{{', '.join(''.join(m) for m in s.matchers)}}}" for s in sels
                   if not any(s.matches(series, variables) for series in seen)]
        if missing or not sels:
            out[key] = missing or ["<no omnirl_* query>"]
    return out
