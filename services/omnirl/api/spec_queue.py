"""`spec.transferQueue.redisUrl`: the forms every client of the queue can reach, checked at validate time.

The roles (redis-py `Redis.from_url`), `omnirl run`'s pre-flight and the operator (its Redis
cleanup and autoscaler) all read this one URL. redis-py also takes `unix://` and connection
options in the query, but a socket path is only reachable on one machine (each pod of a job has its
own filesystem), and an option it does not know is passed on as a keyword argument that fails at
the first connection; a URL without a host silently means localhost. So only
`redis://` / `rediss://` URLs with a host, an optional port 1..65535 and an optional numeric
database pass.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from omnirl.api.errors import FieldProblem

REDIS_URL_FORM = "redis://[[user]:password@]host[:port][/db], or rediss:// for TLS, e.g. redis://redis:6379/0"


def check_redis_url(url: str) -> None:
    """Check `spec.transferQueue.redisUrl` (relative path `redisUrl`) against `REDIS_URL_FORM`.

    Raises:
        FieldProblem: naming `redisUrl`, what is wrong and the accepted form; a password in the URL is
            shown as `***` (the message reaches logs, events and the RLJob's status).
    """
    parts = urlsplit(url)
    if "@" in parts.netloc:
        userinfo, _, host = parts.netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        url = urlunsplit(parts._replace(netloc=f"{user}{colon and ':***'}@{host}"))
    try:
        port = parts.port  # raises ValueError when not a number in 0..65535
    except ValueError as err:
        raise FieldProblem("redisUrl", url, f"is not a valid URL ({err}); use {REDIS_URL_FORM}") from None
    if parts.scheme == "unix":
        raise FieldProblem("redisUrl", url, "a unix socket is reachable only on one machine (a job's pods each have "
                           f"their own filesystem); use {REDIS_URL_FORM}, or remove redisUrl for an embedded Redis")
    if parts.scheme not in ("redis", "rediss"):
        raise FieldProblem("redisUrl", url, f"must start with redis:// or rediss:// (redis-py's schemes); use "
                           f"{REDIS_URL_FORM}")
    if not parts.hostname:
        raise FieldProblem("redisUrl", url, f"has no host (redis-py would quietly use localhost); use {REDIS_URL_FORM}")
    if port == 0:
        raise FieldProblem("redisUrl", url, f"port must be 1..65535; use {REDIS_URL_FORM}")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise FieldProblem("redisUrl", url, f"the path must be a database number, not {parts.path!r}; use "
                           f"{REDIS_URL_FORM}")
    if parts.query or parts.fragment:
        raise FieldProblem("redisUrl", url, f"must have no query or fragment (connection options are not passed "
                           f"on); put the database in the path: {REDIS_URL_FORM}")
