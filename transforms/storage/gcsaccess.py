"""Before anything touches ``gs://``: can this machine reach Google Cloud Storage, and with which credentials.

Without this check a ``gs://`` path on a machine with no network (or a stopped emulator) hangs for over two minutes
before any message: Beam's search for Application Default Credentials retries for about 20 s
(``apache_beam/internal/gcp/auth.py``), then google-cloud-storage retries each request's connection errors until
its 120 s deadline (``google.api_core.retry``), and the error names neither cause. Here one name lookup and one TCP
connection to the first hop (the endpoint google-cloud-storage will use, or the HTTPS proxy in front of it), bounded
by :data:`CONNECT_TIMEOUT`, decide it before any request: unreachable is a one-line :class:`ConfigError` naming the
host, the reason, whether credentials were found, and the variable or flag to set.

Who asks: the commands, for every gs:// path of their flags and config file, before they plan
(``common.configure_filesystems``), and :mod:`fileio` before its first request to a gs:// path in any process (the
reader called from Python, a worker), so a library call fails as fast, and as plainly, as a command. A first hop
is checked once per process.

The endpoint, as google-cloud-storage chooses it (``google/cloud/storage/client.py``): ``API_ENDPOINT_OVERRIDE``,
else ``STORAGE_EMULATOR_HOST`` (an emulator; no credentials), else ``https://storage.googleapis.com``; the proxy as
requests chooses it (``HTTPS_PROXY`` / ``HTTP_PROXY`` unless ``NO_PROXY`` names the host). A variable whose value is
no address (``http://[::1``, a port above 65535) is a one-line :class:`ConfigError` naming it, where it was a
``ValueError`` traceback of whichever library parsed it first. Standard library only (the reader's install runs
verify and inspect through this too).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import urllib.parse
import urllib.request

from tfrecord_etl.transforms.errors import ConfigError, printable

CONNECT_TIMEOUT = 5.0  # seconds for the name lookup and the TCP connection together
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
EMULATOR_VAR = "STORAGE_EMULATOR_HOST"
OVERRIDE_VAR = "API_ENDPOINT_OVERRIDE"
CREDENTIALS_VAR = "GOOGLE_APPLICATION_CREDENTIALS"
CREDENTIALS_HINT = (
    f"set {CREDENTIALS_VAR}=KEY.json (a service account key) or run gcloud auth "
    "application-default login, or pass --no_auth to read a public bucket anonymously"
)
_REACHED: set[tuple[str, int]] = set()  # first hops this process reached: checked once
_SEARCHED: list[bool] = []  # search_credentials ran in this process


# Beam's own path options: the runner uses them (Dataflow stages and writes its temporary files there), the commands
# never read or write them, and verify and inspect ignore them; a runner that needs them reports its own errors
RUNNER_PATH_FLAGS = frozenset(
    {
        "--temp_location",
        "--staging_location",
        "--gcp_temp_location",
        "--template_location",
        "--sdk_location",
        "--dataflow_worker_jar",
        "--dataflow_job_file",
        "--extra_package",
        "--extra_packages",
        "--requirements_file",
        "--setup_file",
    }
)


def gcs_paths(tokens) -> list[str]:
    """The ``gs://`` paths among command-line tokens and config values (``gs://b/x``, ``--input=gs://b/x``) that the
    command reads or writes: the values of :data:`RUNNER_PATH_FLAGS` are left out."""
    out, skip = [], False
    for token in tokens:
        if not isinstance(token, str):
            skip = False
            continue
        is_flag = token.startswith("--")
        if skip and not is_flag:  # the value of "--temp_location gs://..."
            skip = False
            continue
        flag, _, value = token.partition("=") if is_flag else ("", "", token)
        skip = token in RUNNER_PATH_FLAGS
        if flag not in RUNNER_PATH_FLAGS and value.lower().startswith("gs://"):
            out.append(value)
    return out


def endpoint() -> tuple[str, str | None]:
    """``(url, variable)``: the endpoint google-cloud-storage sends gs:// requests to and the environment variable
    that chose it (None for the default)."""
    for var in (OVERRIDE_VAR, EMULATOR_VAR):
        value = os.environ.get(var, "").strip()
        if value:
            return (value if "://" in value else "http://" + value), var
    return DEFAULT_ENDPOINT, None


def address(url: str, variable: str | None = None) -> tuple[str, str, int | None]:
    """``(scheme, host, port or None)`` of ``url``; ``variable``: the environment variable it came from, named in
    the error.

    Raises:
      ConfigError: ``url`` is no address (``http://[::1``, a port above 65535, no host), naming the variable and
        its value.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
        if not parts.hostname:
            raise ValueError("no host name")
    except ValueError as e:
        where = f"{variable}={os.environ.get(variable, url)}" if variable else url
        raise ConfigError(
            f"{where} is not an address for gs:// requests: {e}",
            hint=f"set {variable or 'it'} to http://HOST:PORT (a port of 1-65535; an IPv6 host in brackets, "
            f"http://[::1]:PORT)" + (", or unset it" if variable else ""),
        ) from None
    return parts.scheme or "https", parts.hostname, port


def first_hop(url: str, variable: str | None = None) -> tuple[str, int, str | None]:
    """``(host, port, proxy variable)`` of the first TCP connection a request to ``url`` makes: the proxy's when
    the environment sets one for its scheme and does not exempt the host, else the endpoint's own. ``variable``:
    the environment variable that named ``url`` (for the error).

    Raises:
      ConfigError: ``url`` or the proxy's address is malformed (:func:`address`).
    """
    scheme, host, port = address(url, variable)
    port = port or (443 if scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        name = next(
            (v for v in (f"{scheme.upper()}_PROXY", f"{scheme}_proxy", "ALL_PROXY", "all_proxy") if os.environ.get(v)),
            f"{scheme.upper()}_PROXY",
        )
        _, proxy_host, proxy_port = address(proxy if "://" in proxy else "http://" + proxy, name)
        return proxy_host, proxy_port or 80, f"{scheme.upper()}_PROXY={proxy}"
    return host, port, None


def unreachable(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """Why ``host:port`` cannot be connected to within ``timeout`` seconds (name lookup included), or None when a
    TCP connection opens (it is closed at once). The lookup runs in a daemon thread: ``getaddrinfo`` takes no
    timeout of its own."""
    result: list[str | None] = []

    def attempt():
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(None)
        except socket.gaierror as e:
            result.append(f"its name does not resolve ({e.strerror or e})")
        except ConnectionRefusedError:
            result.append("the connection is refused (nothing listens there)")
        except TimeoutError:
            result.append(f"no answer within {timeout:g} s")
        except OSError as e:
            result.append(e.strerror or str(e))

    thread = threading.Thread(target=attempt, name="tfrecord-etl-gcs-check", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return result[0] if result else f"no answer within {timeout:g} s"


def credential_files() -> str | None:
    """Where Application Default Credentials would come from without a network request: the file
    ``GOOGLE_APPLICATION_CREDENTIALS`` names, gcloud's application-default file, or a Google Compute Engine VM
    (its metadata server); None when none of them is there."""
    named = os.environ.get(CREDENTIALS_VAR)
    if named:
        return f"{CREDENTIALS_VAR}={named}" if os.path.isfile(named) else None
    config = os.environ.get("CLOUDSDK_CONFIG") or (
        os.path.join(os.environ.get("APPDATA", ""), "gcloud")
        if os.name == "nt"
        else os.path.join(os.path.expanduser("~"), ".config", "gcloud")
    )
    adc = os.path.join(config, "application_default_credentials.json")
    if os.path.isfile(adc):
        return adc
    try:
        with open("/sys/class/dmi/id/product_name", encoding="utf-8") as f:
            if "Google" in f.read():
                return "the Compute Engine metadata server"
    except OSError:
        pass
    return None


def check(paths, argv=()) -> None:
    """Checks, once per process and first hop, that the gs:// ``paths`` can be reached (nothing to do without
    any); ``argv``: the command's flags (``--no_auth``).

    Raises:
      ConfigError: the endpoint (or its proxy) cannot be connected to within :data:`CONNECT_TIMEOUT` seconds
        (refused, no answer, no route, a name that does not resolve); the line names the first path, the host and
        the reason, whether credentials were found, and what to set (``STORAGE_EMULATOR_HOST``, ``HTTPS_PROXY``,
        ``GOOGLE_APPLICATION_CREDENTIALS``, ``--no_auth``). Or the variable naming the endpoint or the proxy holds
        no address (:func:`address`).
    """
    paths = list(paths)
    if not paths:
        return
    url, var = endpoint()
    host, port, proxy = first_hop(url, var)
    if (host, port) in _REACHED:
        return
    reason = unreachable(host, port)
    if reason is None:
        _REACHED.add((host, port))
        return
    where = f"{host}:{port}"
    if proxy:
        what = f"the proxy {proxy} in front of {url}"
        hint = "start the proxy or fix the variable (NO_PROXY lists hosts reached directly)"
    elif var == EMULATOR_VAR:
        what = f"the GCS emulator {EMULATOR_VAR}={os.environ[EMULATOR_VAR]}"
        hint = f"start the emulator there, or set {EMULATOR_VAR} to its address (unset it to use Google Cloud Storage)"
    elif var == OVERRIDE_VAR:
        what = f"the endpoint {OVERRIDE_VAR}={os.environ[OVERRIDE_VAR]}"
        hint = f"fix or unset {OVERRIDE_VAR}"
    else:
        what = "Google Cloud Storage"
        hint = (
            f"connect this machine to the network (behind a proxy: set HTTPS_PROXY=http://HOST:PORT), or set "
            f"{EMULATOR_VAR}=http://HOST:PORT to use a GCS emulator"
        )
    creds = ""
    if var is None and "--no_auth" not in argv:
        found = credential_files()
        creds = (
            f"; credentials: {found}"
            if found
            else f"; no Google credentials either ({CREDENTIALS_VAR} is unset and there is no gcloud "
            "application-default login)"
        )
        hint += "" if found else f"; then {CREDENTIALS_HINT}"
    raise ConfigError(f"Cannot reach {what} for {printable(paths[0])}: {where}: {reason}{creds}", hint=hint)


def search_credentials(paths, argv=()) -> None:
    """For gs:// ``paths`` on Google Cloud Storage (no emulator, no ``--no_auth``): looks for Application Default
    Credentials once (``google.auth.default``); when there are none, says so in one warning line and makes this
    process's gs:// clients anonymous at once, as Beam does after about 20 s of retries (public buckets only)."""
    if _SEARCHED or not gcs_paths(paths) or endpoint()[1] is not None or "--no_auth" in argv:
        return
    _SEARCHED.append(True)
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
    except ImportError:
        return
    try:
        google.auth.default()
    except DefaultCredentialsError:
        print(
            f"warning: no Google credentials found: gs:// is read anonymously (public buckets only). Hint: "
            f"for your own buckets {CREDENTIALS_HINT.split(', or pass')[0]}; --no_auth reads anonymously "
            "without this warning",
            file=sys.stderr,
        )
        connect_to_gcs_anonymously()
    except Exception:  # noqa: BLE001 - a search that fails otherwise is left to Beam's own
        pass


def connect_to_gcs_anonymously() -> None:
    """Makes this process's gs:// clients anonymous, skipping Beam's search for Google credentials.

    Used when ``STORAGE_EMULATOR_HOST`` points google-cloud-storage at an emulator (which takes no credentials)
    or ``--no_auth`` is given (public buckets). Beam's GCS filesystem looks for Application Default Credentials
    with 4 retries and exponential backoff (``apache_beam/internal/gcp/auth.py``, ``_get_credentials_with_retrys``):
    about 20 s per process on a machine that has none, before connecting anonymously anyway. Beam's ``--no_auth``
    option only covers its Dataflow API client, not GCS reads and writes. Does nothing when Beam's ``auth``
    module changes shape."""
    try:
        from apache_beam.internal.gcp import auth

        with auth._Credentials._credentials_lock:
            auth._Credentials._credentials_init, auth._Credentials._credentials = True, None
    except (ImportError, AttributeError):
        pass


_ANONYMOUS: list = []  # [True, _] once this process's clients are anonymous; else [options, emulator] last checked


def anonymous_where_no_credentials_apply(options=None) -> bool:
    """Makes this process's gs:// clients anonymous (:func:`connect_to_gcs_anonymously`) when ``STORAGE_EMULATOR_HOST``
    names an emulator or the pipeline ``options`` (Beam's ``PipelineOptions``, or None) say ``--no_auth``: in every
    process that opens gs:// objects, the launcher and each worker (an SDK harness on Flink, Spark or Prism), before
    Beam's GCS filesystem searches for credentials (about 20 s per process where there are none: measured 23 s for
    ``gcsio.create_storage_client`` against fake-gcs-server). Returns whether the clients are anonymous. Decided once
    per process (and options object: called on every use of Beam's filesystems, it reads the options only when
    they are new)."""
    emulator = os.environ.get(EMULATOR_VAR)
    if _ANONYMOUS and (_ANONYMOUS[0] is True or (_ANONYMOUS[0] is options and _ANONYMOUS[1] == emulator)):
        return _ANONYMOUS[0] is True
    no_auth = False
    if options is not None:
        try:
            from apache_beam.options.pipeline_options import GoogleCloudOptions

            no_auth = bool(options.view_as(GoogleCloudOptions).no_auth)
        except Exception:  # noqa: BLE001 - options of another shape: the search stays Beam's
            no_auth = False
    anonymous = bool(emulator) or no_auth
    if anonymous:
        connect_to_gcs_anonymously()
    _ANONYMOUS[:] = [True if anonymous else options, emulator]
    return anonymous
