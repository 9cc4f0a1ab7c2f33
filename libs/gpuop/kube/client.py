"""The connection to the API server, through the official client's asyncio flavour.

`connect()` loads a kubeconfig file (or, when none is given, the pod's service account)
into a fresh `Configuration`, never the client's process-wide default, and returns a `Kube`.
Every other module of `gpuop.kube` talks to the server through `Kube.call` (one request,
answered with the JSON object the server sent) or `Kube.open` (a streaming response, for
watches): both use the official API methods' `_without_preload_content` variants, so
objects stay the plain camelCase dicts of the wire, and both translate every failure into
`gpuop.kube.errors`. The client validates the bodies of creates and replaces against its
models, which forbid fields they do not know: gpuop builds those bodies itself and changes
objects it read with patches, so a newer server's extra fields never stand in the way.
Services open one `Kube` at start-up and close it on the way out.

`Kube.call` retries as client-go does, and a little more for reads (`RetryPolicy`):

- an answer that carries `Retry-After` (a 429, or a 5xx such as 503) is retried for any
  verb after that many seconds: the server refused the request before running it (429 is
  what priority and fairness and max-in-flight answer) and asks to try again. A Retry-After
  longer than `max_delay`, and a 429 without one (an eviction a PodDisruptionBudget
  refuses: a decision, not a throttle), go to the caller;
- a read (GET: `read_*`, `list_*`, `get_*`, `connect_get_*`) that got a 5xx or no answer is
  retried with capped exponential backoff and jitter: reading again is always safe;
- a write (POST, PUT, PATCH, DELETE) that got a 500 without Retry-After, or lost its
  connection after it was sent, may have run: it is not retried blindly. The caller
  decides, and gpuop's writers are built for that: patches carry the resourceVersion
  they were decided on (a repeat gets 409 and is decided again on a fresh read), creates
  get 409 AlreadyExists, deletes 404. A write whose connection could not even be opened
  never reached the server and is retried like a read.

`_request_timeout` (default `request_timeout`) bounds the whole call, retries and waits
included, as a client-go context deadline does, and `attempts` bounds the number of
requests; after either, the caller gets the last error, of its own type (`ServerError`,
`TooManyRequests`, `Unreachable`). The official client's own retry options
(`Configuration.retries`, `client_go_retries`) stay off: they retry by status code without
knowing what a verb did, and wait on a clock tests cannot drive. `Kube.open` does not retry:
`watching.ListWatch`, its one caller, reconnects with its own backoff.
"""

from __future__ import annotations

from gpuop.kube import _official  # noqa: F401  # first: the client without its validator

# isort: split
import json
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pydantic
from kubernetes.aio import client, config
from kubernetes.aio.config.config_exception import ConfigException

from gpuop import lifecycles
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube import errors

Obj = dict[str, Any]
ApiMethod = Callable[..., Awaitable[Any]]
"""A method of one of the official client's API classes, e.g. `kube.core.read_node`."""

# The config loaders carry no annotations; these are their shapes as gpuop calls them.
_load_kube_config: Callable[..., Awaitable[Any]] = config.load_kube_config
_load_incluster_config: Callable[..., None] = config.load_incluster_config

DEFAULT_REQUEST_TIMEOUT = 30.0
"""Seconds one call may take, retries and their bodies included, unless it says otherwise."""
READ_PREFIXES = ("read_", "list_", "get_", "connect_get_", "connect_head_")
"""How the official client names its GET (and HEAD) methods; the others write."""

RETRY_AFTER_ERRORS = (errors.TooManyRequests, errors.ServerError)
"""The answers whose Retry-After `Kube.call` honours, for any verb."""

log = logging.getLogger(__name__)


def is_read(method: ApiMethod) -> bool:
    """Whether an API method only reads. The official client names every method by its HTTP
    verb (`read_node`: GET, `patch_node`: PATCH); an unknown name counts as a write."""
    name = getattr(method, "__name__", "").removesuffix("_without_preload_content")
    return name.startswith(READ_PREFIXES)


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long `Kube.call` waits to try a failed request again (see the module
    docstring for which failures)."""

    attempts: int = 5
    """Requests at most, the first included."""
    backoff: float = 0.1
    """Seconds before the first retry of a read; doubled for each further one, and
    jittered down by up to half so that many clients do not retry in step."""
    max_delay: float = 5.0
    """The longest one wait may be; a Retry-After beyond it is left to the caller."""

    def delay(self, error: errors.KubeError, *, read: bool, retry: int) -> float | None:
        """Seconds to wait before retry number `retry` (from 1) after `error`, or None when
        the error goes to the caller."""
        if retry >= self.attempts:
            return None
        asked = error.retry_after if isinstance(error, RETRY_AFTER_ERRORS) else None
        if asked is not None:
            return asked if asked <= self.max_delay else None
        unsent = isinstance(error, errors.Unreachable) and not error.sent
        if not isinstance(error, errors.ServerError | errors.Unreachable) or not (read or unsent):
            return None
        backoff = min(self.backoff * 2.0 ** (retry - 1), self.max_delay)
        return backoff * (1.0 - random.random() / 2)


NO_RETRY = RetryPolicy(attempts=1)
"""Every failure straight to the caller."""


def _raw(method: ApiMethod) -> ApiMethod:
    """The variant of an API method that returns the HTTP response undecoded."""
    name = getattr(method, "__name__", "")
    if name.endswith("_without_preload_content"):
        return method
    raw: ApiMethod | None = getattr(
        getattr(method, "__self__", None), f"{name}_without_preload_content", None
    )
    if raw is None:
        raise TypeError(f"{method!r} is not a method of a kubernetes.aio API class")
    return raw


def _sent(error: BaseException) -> bool:
    """Whether a request that failed this way may have reached the server: not when the
    connection could not be opened."""
    return not isinstance(error, aiohttp.ClientConnectorError | ConnectionRefusedError)


class Kube(lifecycles.Closable):
    """One API server: the official `ApiClient` and the API groups gpuop uses."""

    def __init__(
        self,
        api_client: Any,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        retry: RetryPolicy = RetryPolicy(),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.api_client = api_client
        self.request_timeout = request_timeout
        self.retry = retry
        self.clock = clock
        self.core: Any = client.CoreV1Api(api_client)
        self.coordination: Any = client.CoordinationV1Api(api_client)
        self.policy: Any = client.PolicyV1Api(api_client)
        self.custom_objects: Any = client.CustomObjectsApi(api_client)
        self.resource: Any = client.ResourceV1Api(api_client)

    async def call(self, method: ApiMethod, *args: Any, **kwargs: Any) -> Obj:
        """Call an API method, e.g. `await kube.call(kube.core.read_node, "node-1")`, and
        return the decoded JSON body; a failed request raises a `KubeError`, once the
        retries the failure allows are spent (see the module docstring)."""
        timeout = kwargs.pop("_request_timeout", self.request_timeout)
        deadline = self.clock.monotonic() + timeout
        read = is_read(method)
        retries = 0
        while True:
            try:
                return await self._call_once(method, args, kwargs, timeout)
            except errors.KubeError as error:
                retries += 1
                delay = self.retry.delay(error, read=read, retry=retries)
                timeout = deadline - self.clock.monotonic() - (delay or 0.0)
                if delay is None or timeout <= 0:
                    raise
                name = getattr(method, "__name__", "request")
                log.info("%s failed (%s); retry %d in %.2fs", name, error, retries, delay)
                await self.clock.sleep(delay)

    async def _call_once(
        self, method: ApiMethod, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float
    ) -> Obj:
        try:
            response = await _raw(method)(*args, _request_timeout=timeout, **kwargs)
            async with response:
                body = await response.read()
        except pydantic.ValidationError as error:
            raise errors.refused_by_client(error) from error
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise errors.unreachable(error, sent=_sent(error)) from error
        if response.status >= 400:
            raise errors.from_response(response.status, body, response.headers)
        if not body:
            return {}
        decoded = json.loads(body)
        if not isinstance(decoded, dict):
            raise errors.KubeError(f"expected a JSON object, got {type(decoded).__name__}")
        return decoded

    async def open(self, method: ApiMethod, *args: Any, **kwargs: Any) -> aiohttp.ClientResponse:
        """Start a streaming request (a watch) and return its response once the status is
        known to be a success; the caller reads it and must `close()` it."""
        try:
            response: aiohttp.ClientResponse = await _raw(method)(*args, **kwargs)
        except pydantic.ValidationError as error:
            raise errors.refused_by_client(error) from error
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise errors.unreachable(error, sent=_sent(error)) from error
        if response.status >= 400:
            try:
                body = await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError):
                body = b""
            finally:
                response.close()
            raise errors.from_response(response.status, body, response.headers)
        return response

    async def close(self) -> None:
        await self.api_client.close()


async def connect(
    kubeconfig: Path | str | None = None,
    *,
    context: str | None = None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    retry: RetryPolicy = RetryPolicy(),
) -> Kube:
    """A `Kube` for the cluster a kubeconfig file names (its current context, or
    `context`), or for the cluster this pod runs in when `kubeconfig` is None."""
    configuration = client.Configuration()
    try:
        if kubeconfig is None:
            _load_incluster_config(client_configuration=configuration)
        else:
            await _load_kube_config(
                config_file=str(kubeconfig),
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
    except (ConfigException, OSError, ValueError, KeyError) as error:
        source = kubeconfig if kubeconfig is not None else "the in-cluster service account"
        raise errors.ConfigError(f"cannot load Kubernetes config from {source}: {error}") from error
    return Kube(client.ApiClient(configuration), request_timeout=request_timeout, retry=retry)
