"""HTTP client of the tuning service, and the fall-back helpers the trainer and ``cswap tune`` use.

:class:`TuningClient` mirrors the endpoints with bounded retries and exponential backoff. A
service that is down or too slow raises :class:`ServiceUnavailable` after the retries; a request
the service refuses (4xx) raises :class:`RequestRejected` with the service's reason.

The helpers never let the service stop training: :func:`lookup_or_none` returns ``None`` and
:func:`publish_or_queue` keeps the run in the local store when the service cannot be reached,
warning once per client. ``cswap configs push --tuner-url URL`` publishes the local runs later.

Example:
    >>> client = TuningClient("http://127.0.0.1:1", timeout_s=0.2, retries=0)
    >>> try:
    ...     client.health()
    ... except ServiceUnavailable as exc:
    ...     print(str(exc).split(" after")[0])
    tuning service at http://127.0.0.1:1 did not answer GET /healthz
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from cswap.tuner.store import (
    MATCHES,
    ConfigStore,
    FingerprintLike,
    LookupResult,
    TuningRun,
    fingerprint_key,
    normalize_fingerprint,
)

__all__ = [
    "RequestRejected",
    "ServiceUnavailable",
    "ServiceUnavailableWarning",
    "TuningClient",
    "TuningServiceError",
    "best_lookup",
    "lookup_or_none",
    "publish_or_queue",
]

_RETRY_STATUS = frozenset({502, 503, 504})


class TuningServiceError(RuntimeError):
    """The tuning service could not answer a request."""


class ServiceUnavailable(TuningServiceError):
    """The service is down, unreachable, too slow, or failing (5xx), after every retry."""


class RequestRejected(TuningServiceError):
    """The service refused the request (4xx); retrying the same request will not help.

    Attributes:
        status_code: the HTTP status.
        detail: the service's explanation.
    """

    def __init__(self, message: str, status_code: int, detail: Any) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.detail = detail


class ServiceUnavailableWarning(UserWarning):
    """Issued (once per client) when training goes on without the tuning service."""


class TuningClient:
    """Client of a running ``cswap serve``.

    Args:
        url: the service, e.g. ``"http://127.0.0.1:8765"``.
        token: bearer token for publishing, when the service has one.
        timeout_s: per-request timeout (connect and read).
        retries: extra attempts after a connection error, timeout, or 502/503/504.
        backoff_s: sleep before the first retry; doubles on each further retry.
        transport: an ``httpx`` transport (for tests: ``httpx.ASGITransport``/``MockTransport``).

    Example:
        >>> with TuningClient("http://127.0.0.1:8765", token="s3cret") as client:  # doctest: +SKIP
        ...     client.lookup(fingerprint("cuda"), "zvc.cuda.compress", source_hash, "float32", 12)
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 2.0,
        retries: int = 2,
        backoff_s: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"tuner url {url!r} must look like http://HOST:PORT (the address of `cswap serve`)")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError(
                f"timeout_s must be > 0, retries and backoff_s >= 0; got {timeout_s}, {retries}, {backoff_s}"
            )
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, timeout=self.timeout_s, headers=headers, transport=transport)
        self._warned: set[type[BaseException]] = set()
        #: Whether every request so far was answered: ``None`` before the first, ``False`` once one
        #: went unanswered (down, too slow, or failing with a 5xx); a refusal (4xx) is an answer.
        self.answered: bool | None = None

    def _note_answer(self, answered: bool) -> None:
        self.answered = answered if self.answered is None else self.answered and answered

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> TuningClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TuningClient({self.url!r})"

    # ------------------------------------------------------------------ transport

    def _request(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None,
        allow_404: bool = False,
    ) -> Any:
        """One request with retries; the decoded JSON body, or ``None`` for an allowed 404."""
        attempts = self.retries + 1
        last: str = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self._http.request(method, path, params=params, json=json)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            if response.status_code in _RETRY_STATUS:
                last = f"HTTP {response.status_code}: {_detail(response)}"
                continue
            self._note_answer(response.status_code < 500)
            if response.status_code == 404 and allow_404:
                return None
            if 400 <= response.status_code < 500:
                detail = _detail(response)
                hint = " (pass the service's token: --token or CSWAP_SERVER_TOKEN)" if response.status_code == 401 else ""
                raise RequestRejected(
                    f"tuning service at {self.url} rejected {method} {path} with HTTP {response.status_code}: "
                    f"{detail}{hint}",
                    response.status_code,
                    detail,
                )
            if response.status_code >= 500:
                raise ServiceUnavailable(
                    f"tuning service at {self.url} failed on {method} {path} with HTTP {response.status_code}: "
                    f"{_detail(response)}"
                )
            try:
                return response.json()
            except ValueError:
                self.answered = False
                raise ServiceUnavailable(
                    f"tuning service at {self.url} answered {method} {path} with a body that is not JSON; "
                    f"is {self.url} a `cswap serve`?"
                ) from None
        self._note_answer(False)
        raise ServiceUnavailable(
            f"tuning service at {self.url} did not answer {method} {path} after {attempts} attempt(s) "
            f"within {self.timeout_s:g} s each ({last}); is `cswap serve` running there?"
        )

    def warn_once(self, exc: TuningServiceError, consequence: str) -> None:
        """Warn about ``exc`` once per kind of error on this client."""
        if type(exc) in self._warned:
            return
        self._warned.add(type(exc))
        warnings.warn(f"{exc}; {consequence}", ServiceUnavailableWarning, stacklevel=3)

    # ------------------------------------------------------------------ endpoints

    def health(self) -> dict[str, Any]:
        """``GET /healthz``."""
        return self._request("GET", "/healthz")

    def devices(self) -> list[dict[str, Any]]:
        """``GET /v1/devices``: ``[{"key", "fingerprint", "configs", "runs", "models"}, ...]``."""
        return self._request("GET", "/v1/devices")

    def lookup(
        self,
        fingerprint: FingerprintLike | str,
        kernel: str,
        source_hash: str,
        dtype: str,
        bucket: int,
        default: Mapping[str, int] | None = None,
    ) -> LookupResult:
        """``GET /v1/configs``: the same answer as :meth:`ConfigStore.lookup` on the service's store.

        Args:
            fingerprint: the device (``DeviceFingerprint``, its dict, or just its key). With the
                full fingerprint a device the service has never seen can still get a
                same-model or transferred config.
            kernel, source_hash, dtype, bucket: what the config is for.
            default: used (``match="default"``) when no device has a config.
        """
        params: dict[str, Any] = {"kernel": kernel, "source_hash": source_hash, "dtype": dtype, "bucket": bucket}
        if isinstance(fingerprint, str):
            params["fingerprint"] = fingerprint
        else:
            data = normalize_fingerprint(fingerprint)
            params["fingerprint"] = fingerprint_key(data)
            for name in ("kind", "name", "compute_capability", "sm_count", "memory_bytes"):
                params[name] = data[name]
        result = LookupResult.from_dict(self._request("GET", "/v1/configs", params=params))
        if result.match == "default" and result.params is None and default is not None:
            return LookupResult(dict(default), None, "default", None)
        return result

    def publish(self, run: TuningRun) -> bool:
        """``POST /v1/configs``; ``False`` when the service already had this ``run_id``.

        Safe to retry: the service ignores a run id it already stored.
        """
        if not isinstance(run, TuningRun):
            raise TypeError(f"publish takes a TuningRun, got {type(run).__name__}")
        return bool(self._request("POST", "/v1/configs", json=run.to_dict())["created"])

    def runs(
        self,
        fingerprint_key: str | None = None,
        kernel: str | None = None,
        *,
        evaluations: bool = True,
        limit: int = 100,
        offset: int = 0,
    ) -> list[TuningRun]:
        """``GET /v1/tuning-runs``: runs, oldest first, with every evaluation unless told otherwise."""
        params: dict[str, Any] = {"evaluations": evaluations, "limit": limit, "offset": offset}
        if fingerprint_key is not None:
            params["fingerprint"] = fingerprint_key
        if kernel is not None:
            params["kernel"] = kernel
        body = self._request("GET", "/v1/tuning-runs", params=params)
        return [_run_from_wire(r) for r in body["runs"]]

    def run(self, run_id: str) -> TuningRun | None:
        """``GET /v1/tuning-runs/{run_id}`` with every evaluation; ``None`` when unknown."""
        body = self._request("GET", f"/v1/tuning-runs/{quote(run_id, safe='')}", allow_404=True)
        return None if body is None else _run_from_wire(body)

    def predictors(self, fingerprint_key: str) -> dict[str, dict[str, Any]]:
        """``GET /v1/predictors``: calibrated models of a device by name (empty for an unknown device)."""
        body = self._request("GET", "/v1/predictors", params={"fingerprint": fingerprint_key}, allow_404=True)
        return {} if body is None else body["models"]


def _detail(response: httpx.Response) -> Any:
    try:
        return response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        return response.text[:200]


def _run_from_wire(data: Mapping[str, Any]) -> TuningRun:
    data = dict(data)
    data.pop("fingerprint_key", None)
    return TuningRun.from_dict(data)


# ---------------------------------------------------------------------- fall-back helpers


def lookup_or_none(
    client: TuningClient | None,
    fingerprint: FingerprintLike | str,
    kernel: str,
    source_hash: str,
    dtype: str,
    bucket: int,
    default: Mapping[str, int] | None = None,
) -> LookupResult | None:
    """The service's answer, or ``None`` when there is no client or the service cannot answer.

    A failure is warned about once per client (:class:`ServiceUnavailableWarning`); the caller
    then uses its local store.
    """
    if client is None:
        return None
    try:
        return client.lookup(fingerprint, kernel, source_hash, dtype, bucket, default=default)
    except TuningServiceError as exc:
        client.warn_once(exc, "using the local config store")
        return None


def publish_or_queue(client: TuningClient | None, run: TuningRun, store: ConfigStore | None = None) -> bool:
    """Record ``run`` in the local store, then publish it; nothing is lost if the service is down.

    Args:
        client: the service, or ``None`` to record locally only.
        run: the finished tuning run.
        store: the local store (default: ``$CSWAP_HOME/store.db``).

    Returns:
        ``True`` when the service has the run (now or already). On ``False`` it waits in the
        local store for ``cswap configs push --tuner-url URL``.
    """
    (store if store is not None else ConfigStore()).record_run(run)
    if client is None:
        return False
    try:
        client.publish(run)
        return True
    except TuningServiceError as exc:
        client.warn_once(exc, "the run is kept in the local store; publish it later with `cswap configs push`")
        return False


def best_lookup(
    client: TuningClient | None,
    store: ConfigStore,
    fingerprint: FingerprintLike,
    kernel: str,
    source_hash: str,
    dtype: str,
    bucket: int,
    default: Mapping[str, int] | None = None,
) -> LookupResult:
    """The closer of the local store's and the service's answers (local wins a tie).

    The local store may hold an exact config tuned offline that the service has not seen yet,
    and the service may know devices this machine has never met.
    """
    local = store.lookup(fingerprint, kernel, source_hash, dtype, bucket, default=default)
    if local.match == "exact":
        return local
    remote = lookup_or_none(client, fingerprint, kernel, source_hash, dtype, bucket, default=default)
    if remote is not None and MATCHES.index(remote.match) < MATCHES.index(local.match):
        return remote
    return local
