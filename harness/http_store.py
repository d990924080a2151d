"""An http(s) MLflow store: asked ``/health`` within seconds, and MLflow's own http client bounded. A leaf module
(``harness.uri`` and, lazily, ``requests``): the run side (``harness.store``, ``harness.tracking``) and the analysis
(``analysis.load``) ask a server the same way.

- :func:`health`: ``GET <uri>/health`` with a ``timeout_s`` limit and the basic auth MLflow's client would send
  (``harness.uri``: userinfo or ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``); the reason it failed in a few words,
  naming no password, or None.
- :data:`HTTP_LIMITS` / :func:`bound_http_retries`: MLflow's defaults are 7 retries, backoff factor 2 and 120 s per
  request, so a dead server kept a run in urllib3's retries for 12.5 minutes and an analysis for 4 (issue 45). These
  are MLflow's own settings (``mlflow.environment_variables``), set unless the environment sets them: worst case per
  call ~7 s when nothing answers, 4 x 20 s when a server accepts connections but never replies.
"""
from __future__ import annotations

import os
import re
import time

from harness.uri import http_auth, mlflow_uri, scrub

HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def is_http(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))


def bound_http_retries() -> None:
    """:data:`HTTP_LIMITS` into the environment (MLflow reads them at each request; jobs inherit them), unless set."""
    for key, value in HTTP_LIMITS.items():
        os.environ.setdefault(key, value)


def health(uri: str, timeout_s: float) -> str | None:
    """None when ``GET <uri>/health`` answers 200 within ``timeout_s``; else why not, in a few words."""
    import requests

    t0 = time.monotonic()
    bare = mlflow_uri(uri)
    try:
        resp = requests.get(bare.rstrip("/") + "/health", auth=http_auth(), timeout=timeout_s)
    except (requests.RequestException, OSError, ValueError) as exc:
        return f"{scrub(reason(exc), uri)} (after {time.monotonic() - t0:.1f} s)"
    if resp.status_code != 200:
        return (f"GET /health answered {resp.status_code} {resp.reason}"
                + (" (credentials: MLFLOW_TRACKING_USERNAME/PASSWORD)" if resp.status_code in (401, 403) else ""))
    return None


def reason(exc: BaseException) -> str:
    """A requests failure in a few words (``[Errno 111] Connection refused``), not urllib3's nested repr."""
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\][^'\")\]]*", text)
    return m.group(0).strip() if m else (text.splitlines()[0][:200] if text else type(exc).__name__)
