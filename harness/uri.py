"""Which MLflow tracking store a run (or the analysis) talks to: one rule, one place; and its credentials.

Precedence: ``tracking.uri`` (the spec) > ``MLFLOW_TRACKING_URI`` (the environment, as every MLflow
tool reads it; on a cluster it names the central server) > the embedded sqlite file ``sqlite:///<home>/mlruns.db``.
A leaf module (standard library only): ``analysis`` imports it too.

The home (:func:`home`, the one rule for where the harness writes): ``$MOE_RL_HOME`` if set, else the project root
in a source checkout (a ``pyproject.toml`` of moe-rl-harness beside the package: the store, ``runs/`` and
``.cache/warmstart`` stay at the root, as always), else the current working directory (an installed wheel).
Inside the container image (the copy that ``containers/install_in_image.sh`` marked with ``BUILD_COMMIT``) there is
no default: the image's folder is read-only in a SIF and lost with a Docker container, so ``$MOE_RL_HOME`` must
name a writable shared folder (:class:`~harness.errors.ConfigError` naming it otherwise: exit 2, nothing written).

Credentials are accepted as MLflow accepts them: ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``
(recommended: nothing secret in the URI) or userinfo in the URI (``http://user:pw@host:port``, which MLflow's
client turns into basic auth; it wins over the variables, as in MLflow). A URI with a secret never leaves the
process as given: :func:`redact` is what is printed, logged, tagged, written and compared as the store's
identity, and :func:`mlflow_uri` is what MLflow is handed (an http store's userinfo moved into those variables,
so that MLflow's own messages, "View run ... at: <uri>", carry none).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
ENV = "MLFLOW_TRACKING_URI"
HOME_ENV = "MOE_RL_HOME"
#: written by the image build (containers/install_in_image.sh) into a copy without .git: the commit it was built from
BUILD_COMMIT_FILE = "BUILD_COMMIT"
USERNAME_ENV, PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"

#: scheme://userinfo@ : the userinfo runs up to the last '@' before the path, query or fragment (as urlsplit)
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)([^/?#]*)@")
#: secrets a database URL may carry in its query (``?password=...``; SQLAlchemy hands the query to the driver)
_SECRET_QUERY = re.compile(r"(?i)([?&](?:password|passwd|pwd|token|access_token|secret|api_key)=)[^&#]*")


def is_checkout(root: Path = ROOT) -> bool:
    """Whether ``root`` (the folder above the ``harness`` package) is a source checkout of this project."""
    try:
        text = (root / "pyproject.toml").read_text()
    except OSError:
        return False
    return re.search(r'^name\s*=\s*"moe-rl-harness"', text, re.M) is not None


def home() -> Path:
    """Where the store, ``runs/`` and caches go: ``$MOE_RL_HOME``, else the project root in a source checkout,
    else the current working directory (an installed package). Read at each call (never cached at import)."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser().resolve()
    if in_image():
        from harness.errors import ConfigError

        raise ConfigError(HOME_ENV, f"not set, and the harness runs from the container image ({ROOT}, built from "
                          f"{BUILD_COMMIT_FILE}): runs, the store and caches would land inside the image (read-only "
                          "in a SIF, lost with a Docker container); set MOE_RL_HOME to a writable shared folder "
                          "(docs/verl.md, \"Container route\")")
    return ROOT if is_checkout() else Path.cwd()


def in_image(root: Path = ROOT) -> bool:
    """Whether ``root`` is the image's copy of the project (``BUILD_COMMIT`` there, no ``.git``)."""
    return (root / BUILD_COMMIT_FILE).is_file() and not (root / ".git").exists()


def default_tracking_uri() -> str:
    """The harness's own store: ``sqlite:///<home>/mlruns.db`` (the project root in a source checkout)."""
    return f"sqlite:///{home() / 'mlruns.db'}"


def resolve_tracking_uri(configured: str | None = None) -> str:
    """``configured`` if set, else ``$MLFLOW_TRACKING_URI`` if set and non-empty, else the project's store."""
    return configured or os.environ.get(ENV) or default_tracking_uri()


def split_userinfo(uri: str) -> tuple[str, str | None, str | None]:
    """``(uri without its userinfo, user, password)``, user and password percent-decoded (None when absent)."""
    m = _USERINFO.match(uri)
    if m is None:
        return uri, None, None
    user, sep, password = m.group(2).partition(":")
    return m.group(1) + uri[m.end():], unquote(user), unquote(password) if sep else None


def redact(uri: str | None) -> str | None:
    """``uri`` with no secret: its userinfo dropped, password-like query values as ``***``. What the harness
    prints, logs, tags and writes, and the store's identity (the same store whatever the credentials)."""
    if not uri:
        return uri
    return _SECRET_QUERY.sub(r"\1***", split_userinfo(uri)[0])


def scrub(text: str, uri: str) -> str:
    """``text`` (a command line, a message) with ``uri`` in it replaced by its redacted form."""
    return text.replace(uri, redact(uri)) if uri else text


def mlflow_uri(uri: str) -> str:
    """The URI to hand MLflow: an ``http(s)`` URI's userinfo goes into ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``
    (this process and its children: jobs, the rollout process) and the bare URI comes back; MLflow then sends the
    same basic auth it would have derived from the URI, without ever printing it. Other URIs (a database URL:
    its driver needs its userinfo; an http URI with a user name only) come back as given."""
    bare, user, password = split_userinfo(uri)
    if password is None or not uri.lower().startswith(("http://", "https://")):
        return uri  # no secret to move (a bare user name is none), or not MLflow's to authenticate
    os.environ[USERNAME_ENV], os.environ[PASSWORD_ENV] = user or "", password
    return bare


def http_auth() -> tuple[str, str] | None:
    """Basic-auth ``(user, password)`` from the environment, as MLflow's client reads it; None when unset."""
    user, password = os.environ.get(USERNAME_ENV), os.environ.get(PASSWORD_ENV)
    return (user, password) if user and password else None
