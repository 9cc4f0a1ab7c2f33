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
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import pydantic
from kubernetes.aio import client, config
from kubernetes.aio.config.config_exception import ConfigException

from gpuop.kube import errors

Obj = dict[str, Any]
ApiMethod = Callable[..., Awaitable[Any]]
"""A method of one of the official client's API classes, e.g. `kube.core.read_node`."""

# The config loaders carry no annotations; these are their shapes as gpuop calls them.
_load_kube_config: Callable[..., Awaitable[Any]] = config.load_kube_config
_load_incluster_config: Callable[..., None] = config.load_incluster_config

DEFAULT_REQUEST_TIMEOUT = 30.0
"""Seconds one request may take, body included, unless the call says otherwise."""


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


class Kube:
    """One API server: the official `ApiClient` and the API groups gpuop uses."""

    def __init__(
        self, api_client: Any, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    ) -> None:
        self.api_client = api_client
        self.request_timeout = request_timeout
        self.core: Any = client.CoreV1Api(api_client)
        self.coordination: Any = client.CoordinationV1Api(api_client)
        self.policy: Any = client.PolicyV1Api(api_client)
        self.custom_objects: Any = client.CustomObjectsApi(api_client)

    async def call(self, method: ApiMethod, *args: Any, **kwargs: Any) -> Obj:
        """Call an API method, e.g. `await kube.call(kube.core.read_node, "node-1")`, and
        return the decoded JSON body; a failed request raises a `KubeError`."""
        kwargs.setdefault("_request_timeout", self.request_timeout)
        try:
            response = await _raw(method)(*args, **kwargs)
            async with response:
                body = await response.read()
        except pydantic.ValidationError as error:
            raise errors.refused_by_client(error) from error
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise errors.unreachable(error) from error
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
            raise errors.unreachable(error) from error
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

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


async def connect(
    kubeconfig: Path | str | None = None,
    *,
    context: str | None = None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
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
    return Kube(client.ApiClient(configuration), request_timeout=request_timeout)
