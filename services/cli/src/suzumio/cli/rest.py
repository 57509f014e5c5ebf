"""Calling the REST API from a command: the key, one request, and its refusal on one line."""

from __future__ import annotations

import ipaddress
import time
import uuid
from typing import Annotated, Any
from urllib.parse import unquote

import httpx
import typer
from rich.console import Console

from suzumio.cli.failures import fail, first_line, redact
from suzumio.cli.keys import api_key, authorization

# Soft-wrapped: what is printed stays one line however narrow the terminal (or a pipe's
# 80 columns), as scripts reading it expect. Refusals go to stderr: `P=$(suzumio projects
# create x)` must not take one.
console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)
IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
IN_PROGRESS = "is still in progress"  # the gateway's 409 while a key's first request runs
TRANSIENT_STATUSES = frozenset({502, 503, 504})  # a proxy without a gateway, one restarting
RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0)  # seconds before each attempt after the first

# The options every command that calls the API takes.
ApiUrl = Annotated[str, typer.Option("--api", envvar="SUZUMIO_API_URL")]
API_URL = "http://127.0.0.1:8080"
ApiKey = Annotated[
    str | None,
    typer.Option(
        "--key", help="API key; default: $SUZUMIO_API_KEY, then the data directory's admin key"
    ),
]


def key_headers(api: str, key: str | None) -> dict[str, str]:
    """The `Authorization` header of the key given, else $SUZUMIO_API_KEY, else — for an API
    on this machine only — the data directory's admin key; exit 2 without one."""
    _has_scheme(api)  # said first: without one, the API would not be taken for this machine
    found = api_key(key, local=is_local(api))
    if found is None:
        errors.print(
            "[red]no API key: pass --key or set SUZUMIO_API_KEY (the data directory's admin "
            "key is sent only to an API on this machine)[/red]"
        )
        raise typer.Exit(2)
    return authorization(*found)


def _has_scheme(api: str) -> None:
    """Exit 1, saying so, unless `api` is an http(s) URL."""
    if not api.startswith(("http://", "https://")):
        shown = redact(api)
        fail(f"--api {shown!r} needs a scheme, like http://{shown}")


def is_local(api: str) -> bool:
    """Whether the API's URL names this machine (a loopback address, or localhost)."""
    try:
        host = httpx.URL(api).host
    except (httpx.InvalidURL, ValueError, TypeError):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def post(
    api: str, path: str, expect: int, **request: Any
) -> tuple[dict[str, object] | None, httpx.Response]:
    """POST `path` (quoted by the caller: one segment per id) to the API at `api`: its body as
    a JSON object (None if it is not one) and the response, when the status is `expect`.
    Anything else exits 1 with `<status>: <the problem's detail and field errors>`; an
    unusable URL or an unreachable API exits with one line too."""
    response = _send("POST", api, path, expect, **request)
    return json_object(response), response


def _send(
    method: str, api: str, path: str, expect: int, *, made: bool = False, **request: Any
) -> httpx.Response:
    """The response of a request whose status is `expect` — or, `made`, a 504 that names
    what the request made (`Location`): the change was made, the read models are behind.
    Anything else exits, one line."""
    shown = redact(api)  # as we print it: a proxy's password (https://user:pw@host) masked
    _has_scheme(api)
    try:
        response = _with_retries(method, f"{api.rstrip('/')}{path}", **request)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        fail(f"could not reach the API at {shown}: {first_line(exc).replace(api, shown)}")
    if made and response.status_code == 504 and response.headers.get("location"):
        return response
    if response.status_code != expect:
        body = json_object(response)
        detail = body.get("detail") if body is not None else None
        text = str(detail) if detail is not None else short(response)
        text += _field_errors(body)
        errors.print(f"{response.status_code}: {text}", style="red", markup=False)
        raise typer.Exit(1)
    return response


def _with_retries(method: str, url: str, **request: Any) -> httpx.Response:
    """The request, sent again a few times while the connection fails or a proxy says the
    gateway is away (a rolling restart). A POST carries an `Idempotency-Key` of its own, the
    same in every attempt: one whose answer was lost on the way back (the gateway acted) is
    answered as the first was, not done twice — and while the first is still at work, the
    gateway's 409 for that is waited out too."""
    if method == "POST":
        headers = {k.lower(): v for k, v in (request.pop("headers", None) or {}).items()}
        headers.setdefault(IDEMPOTENCY_HEADER.lower(), f"cli-{uuid.uuid4().hex}")
        request["headers"] = headers
    cut_off = False  # an attempt may have reached the gateway, its answer lost
    for delay in (*RETRY_DELAYS, None):
        try:
            response = httpx.request(method, url, timeout=60, **request)
        except httpx.TransportError:
            if delay is None:
                raise
            cut_off = True
        else:
            # A kept answer (replayed) is all a retry would ever get again.
            replayed = response.headers.get(REPLAYED_HEADER) == "true"
            transient = response.status_code in TRANSIENT_STATUSES and not replayed
            again = transient or (cut_off and method == "POST" and still_in_progress(response))
            if not again or delay is None:
                return response
            # A proxy's 502/504 may come while the gateway still works on the request.
            cut_off = cut_off or transient
        time.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


def still_in_progress(response: httpx.Response) -> bool:
    """The gateway's 409 for a request whose `Idempotency-Key` an earlier attempt still holds."""
    body = json_object(response) if response.status_code == 409 else None
    return body is not None and IN_PROGRESS in str(body.get("detail"))


def json_object(response: httpx.Response) -> dict[str, object] | None:
    """The body as a JSON object, or None (a proxy's HTML error page, a list, nothing)."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _field_errors(body: dict[str, object] | None) -> str:
    """A 422's per-field reasons (`errors` of the problem), which its `detail` only sums up."""
    errors = body.get("errors") if body is not None else None
    if not isinstance(errors, list):
        return ""
    said = [
        f"{e.get('loc')}: {e.get('msg')}" if e.get("loc") else str(e.get("msg"))
        for e in errors
        if isinstance(e, dict)
    ]
    return f" ({'; '.join(said)})" if said else ""


def short(response: httpx.Response, limit: int = 200) -> str:
    """The body on one line, cut short, so an HTML error page stays one line of output."""
    text = " ".join(response.text.split())
    if not text:
        return response.reason_phrase or "(empty body)"
    return text if len(text) <= limit else text[:limit] + " ..."


def create(api: str, path: str, body: dict[str, object], key: str | None, what: str) -> str:
    """POST `body` to `path` for a new `what`; its id (exits 1 on a refusal, with one line).
    Made while the read models lag (the gateway's 504 with the new `what`'s `Location`), it
    is made: its id is the answer — run again, the command would make a second one."""
    response = _send("POST", api, path, 201, made=True, headers=key_headers(api, key), json=body)
    if response.status_code == 504:
        errors.print(f"the {what} was made; the API may take a moment to show it", markup=False)
        return unquote(response.headers["location"].rstrip("/").rsplit("/", 1)[-1])
    answer = json_object(response)
    made = answer.get("id") if answer is not None else None
    if not isinstance(made, str):
        fail(f"the API at {redact(api)} answered 201 without a {what}: {short(response)}")
    return made


def get(api: str, path: str, headers: dict[str, str], **params: str | int) -> object:
    """GET `path` (quoted by the caller) from the API at `api`: its JSON body when the status is
    200. Anything else exits 1 with one line, as `post` does."""
    response = _send("GET", api, path, 200, headers=headers, params=params)
    try:
        return response.json()
    except ValueError:
        errors.print(f"200: {short(response)}", style="red", markup=False)
        raise typer.Exit(1) from None


def get_list(api: str, path: str, key: str | None) -> list[dict[str, Any]]:
    """A list endpoint's items, every page of it (`{items, next_cursor}`), or its plain list."""
    headers = key_headers(api, key)
    found: list[dict[str, Any]] = []
    params: dict[str, str | int] = {"limit": 200}
    while True:
        body = get(api, path, headers, **params)
        if isinstance(body, list):
            return [item for item in body if isinstance(item, dict)]
        page = body if isinstance(body, dict) else {}
        items = page.get("items")
        found += [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []
        following = page.get("next_cursor")
        if not isinstance(following, str) or not following:
            return found
        params["cursor"] = following
