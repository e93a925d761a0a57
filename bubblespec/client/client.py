"""Python clients of the gateway: `BubbleSpecClient` (blocking) and `AsyncBubbleSpecClient`.

Both speak the gateway's HTTP API (see `bubblespec.gateway.server`) and return its response
models (`bubblespec.protocol.gateway`). Every failure is a `BubbleSpecError` carrying the HTTP
status, the gateway's message and the request field at fault; `BubbleSpecUnavailable` when
the gateway cannot be reached or has no rank to run on (503/504).

Prompts may be given as token id lists, as text (tokenized by the gateway), as
`{"input_ids": ...}` / `{"text": ...}` dicts, or as objects with an `input_ids` attribute
(e.g. the embedded task's `Prompt`). Sampling parameters: a dict, or a
`bubblespec.protocol.sampling.SamplingParams`.

Over TLS: `ca=` (the CA that signed the gateway's certificate; a `host:port` then means
`https://host:port`), and `cert=`/`key=` when the gateway requires a client certificate.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from typing_extensions import Self

from bubblespec.client.record import Recorder, derived_seeds, step_record
from bubblespec.protocol.gateway import RankEntry, RolloutResponse, StepReport, WeightsResult
from bubblespec.protocol.sampling import PregenWindow, SamplingParams
from bubblespec.protocol.shapes import is_batch_list
from bubblespec.tls import client_context


class BubbleSpecError(Exception):
    """A gateway call failed: `status` (HTTP code, 0 when the gateway was not reached),
    `detail` (the gateway's message) and `field` (the request field at fault, or "")."""

    def __init__(self, status: int, detail: str, field: str = "", route: str = "") -> None:
        where = f"{route}: " if route else ""
        at = f" (field {field})" if field else ""
        super().__init__(f"{where}HTTP {status}: {detail}{at}" if status else f"{where}{detail}")
        self.status = status
        self.detail = detail
        self.field = field
        self.route = route


class BubbleSpecUnavailable(BubbleSpecError):
    """The gateway could not be reached, or had no rank to run on (503/504)."""


DEFAULT_TIMEOUT_S = 3700.0
"""A rollout may take as long as the gateway's rollout deadline (1 h by default)."""


def prompt_json(p: Any) -> dict[str, Any]:
    """One prompt as the gateway wants it."""
    if isinstance(p, str):
        return {"text": p}
    if isinstance(p, Mapping):
        return dict(p)
    ids = getattr(p, "input_ids", None)
    if ids is None:
        ids = p
    return {"input_ids": [int(t) for t in ids]}


def next_prompts_json(next_prompts: Sequence[Any]) -> list[Any]:
    """`next_prompts` as the gateway wants it: one batch of prompts (the next step's), or a
    list of the next steps' batches (each batch a sequence of prompts)."""
    items = list(next_prompts)
    if is_batch_list(items):
        return [[prompt_json(p) for p in batch] for batch in items]
    return [prompt_json(p) for p in items]


def _seed_rows(rows: Any) -> list[Any]:
    """Seeds per prompt, or (a list of batches) per batch and prompt."""
    rows = list(rows)
    if is_batch_list(rows):
        return [[[int(s) for s in row] for row in batch] for batch in rows]
    return [[int(s) for s in row] for row in rows]


def sampling_json(sp: SamplingParams | Mapping[str, Any] | None) -> dict[str, Any]:
    """Sampling parameters as the gateway wants them (a dict is sent as given; a model
    without its unset fields, so that an unset `seed_mode` stays the gateway's choice)."""
    if sp is None:
        return {}
    if isinstance(sp, Mapping):
        return dict(sp)
    if isinstance(sp, SamplingParams):
        return sp.model_dump(mode="json", exclude_unset=True)
    raise TypeError(f"sampling_params: expected a dict or SamplingParams, got "
                    f"{type(sp).__name__}")


def rollout_body(prompts: Sequence[Any], n: int, sampling_params: Any, seeds: Any,
                 next_prompts: Sequence[Any] | None, step: int | None, next_seeds: Any,
                 return_logprobs: bool, pregen: bool,
                 pregen_window: PregenWindow | str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompts": [prompt_json(p) for p in prompts], "n": n,
                            "sampling_params": sampling_json(sampling_params),
                            "return_logprobs": return_logprobs, "pregen": pregen}
    if pregen_window is not None:
        body["pregen_window"] = PregenWindow(pregen_window).value
    if step is not None:
        body["step"] = step
    if seeds is not None:
        body["seeds"] = [[int(s) for s in row] for row in seeds]
    if next_prompts is not None:
        body["next_prompts"] = next_prompts_json(next_prompts)
    if next_seeds is not None:
        body["next_seeds"] = _seed_rows(next_seeds)
    return body


def check(response: httpx.Response, route: str) -> Any:
    """The JSON body of a 200 reply; BubbleSpecError (with status and field) otherwise."""
    if response.status_code == 200:
        return response.json()
    detail, field = response.text[:1000], ""
    try:
        body = response.json()
        if isinstance(body, dict):
            d = body.get("detail", detail)
            detail = d if isinstance(d, str) else str(d)
            field = str(body.get("field") or "")
    except ValueError:
        pass
    cls = BubbleSpecUnavailable if response.status_code in (502, 503, 504) else BubbleSpecError
    raise cls(response.status_code, detail, field, route)


def _unreachable(base_url: str, route: str, e: Exception) -> BubbleSpecUnavailable:
    return BubbleSpecUnavailable(0, f"cannot reach the gateway at {base_url}: "
                                    f"{type(e).__name__}: {e}", "", route)


PathLike = str | os.PathLike[str]


class _Common:
    def __init__(self, base_url: str, token: str | None, timeout_s: float,
                 connect_timeout_s: float, record: PathLike | None = None,
                 ca: PathLike | None = None, cert: PathLike | None = None,
                 key: PathLike | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        if "://" not in self.base_url:
            self.base_url = ("https://" if ca else "http://") + self.base_url
        self.verify: ssl.SSLContext | bool = True
        """httpx's `verify=`: the gateway's certificate must chain to `ca` (and name its
        host) when `ca` is given, presenting `cert`/`key` as the client certificate; else
        the system's CAs for an https:// URL."""
        if ca:
            self.verify = client_context(ca, cert, key)
        elif cert:
            raise ValueError("cert= needs ca=, the CA that verifies the gateway")
        self.timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self.headers = {"authorization": f"Bearer {token}"} if token else {}
        self.recorder = Recorder(record) if record is not None else None
        """Appends a record of every rollout (`bubblespec.client.record`) when `record` is set."""

    def _record(self, body: dict[str, Any], res: RolloutResponse,
                config: dict[str, Any] | None) -> None:
        """Write the step's record: the caller's seeds, else those the gateway derived
        (from its run seed in `config`, GET /config; None: could not be read)."""
        assert self.recorder is not None
        if body.get("seeds") is not None:
            seeds, origin = body["seeds"], "caller"
        elif config is not None and "run_seed" in config:
            seeds, origin = derived_seeds(int(config["run_seed"]), res, body["n"]), "gateway"
        else:
            seeds, origin = None, "unknown: the gateway's run seed could not be read"
        self.recorder.write(step_record(res, body, seeds, origin, self.base_url))


class BubbleSpecClient(_Common):
    """Blocking client of one gateway (`base_url` like `http://127.0.0.1:8000`)."""

    def __init__(self, base_url: str, token: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, connect_timeout_s: float = 5.0,
                 record: str | os.PathLike[str] | None = None, *,
                 ca: PathLike | None = None, cert: PathLike | None = None,
                 key: PathLike | None = None) -> None:
        super().__init__(base_url, token, timeout_s, connect_timeout_s, record, ca, cert, key)
        self._http = httpx.Client(base_url=self.base_url, timeout=self.timeout,
                                  headers=self.headers, verify=self.verify)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, route: str, body: Any = None) -> Any:
        try:
            r = self._http.request(method, route, json=body)
        except httpx.HTTPError as e:
            raise _unreachable(self.base_url, route, e) from None
        return check(r, route)

    def rollout(self, prompts: Sequence[Any], n: int = 1, sampling_params: Any = None,
                seeds: Sequence[Sequence[int]] | None = None,
                next_prompts: Sequence[Any] | None = None, step: int | None = None, *,
                next_seeds: Sequence[Any] | None = None, return_logprobs: bool = True,
                pregen: bool = True, pregen_window: PregenWindow | str | None = None
                ) -> RolloutResponse:
        """Roll out `n` samples per prompt as one step (the next one unless `step` is given);
        `next_prompts` are pre-generated in this step's bubble (`pregen_window="training"`:
        and on until the next step or weight push; None: the gateway's default): the next
        step's prompts, or a list of the next steps' batches (nearest first), so that a
        bubble that covered the next step goes on to the ones after it; `next_seeds`, when
        given, is shaped the same way. With
        `record` set, the step is appended to the record file (`bubblespec replay`)."""
        body = rollout_body(prompts, n, sampling_params, seeds, next_prompts, step, next_seeds,
                            return_logprobs, pregen, pregen_window)
        res = RolloutResponse.model_validate(self._request("POST", "/v1/rollout", body))
        if self.recorder is not None:
            self._record(body, res, None if seeds is not None else self._config())
        return res

    def _config(self) -> dict[str, Any] | None:
        """The gateway's effective configuration (GET /config), None if unreadable."""
        try:
            return self._request("GET", "/config")
        except BubbleSpecError:
            return None

    def config(self) -> dict[str, Any]:
        """The gateway's effective configuration (GET /config; secrets masked)."""
        return self._request("GET", "/config")

    def update_weights(self, path: str, version: int | None = None,
                       force: bool = False) -> WeightsResult:
        """Reload weights from `path` (visible to the ranks) on every rank; the ranks
        validate the checkpoint first. `version` must be newer than the ranks' (409
        otherwise) unless `force`."""
        body: dict[str, Any] = {"path": str(path)}
        if version is not None:
            body["version"] = version
        if force:
            body["force"] = True
        return WeightsResult.model_validate(self._request("POST", "/v1/weights", body))

    def step_timeline(self, step: int) -> StepReport:
        """Bubble figures of `step` per rank, and the gateway's summary of its rollout."""
        return StepReport.model_validate(self._request("GET", f"/v1/steps/{int(step)}"))

    def ranks(self) -> list[RankEntry]:
        """The ranks the gateway sees, with state and weight version."""
        data = self._request("GET", "/v1/ranks")
        return [RankEntry.model_validate(r) for r in data["ranks"]]

    def health(self) -> dict[str, Any]:
        """GET /health_generate: the readiness report; BubbleSpecUnavailable when not ready."""
        return self._request("GET", "/health_generate")

    def wait_ready(self, timeout_s: float = 120.0, period_s: float = 0.5) -> dict[str, Any]:
        """Poll `health()` until ready; the last error after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.health()
            except BubbleSpecUnavailable:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(period_s)


class AsyncBubbleSpecClient(_Common):
    """Async client of one gateway; same methods as `BubbleSpecClient`, awaited."""

    def __init__(self, base_url: str, token: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, connect_timeout_s: float = 5.0,
                 record: str | os.PathLike[str] | None = None, *,
                 ca: PathLike | None = None, cert: PathLike | None = None,
                 key: PathLike | None = None) -> None:
        super().__init__(base_url, token, timeout_s, connect_timeout_s, record, ca, cert, key)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout,
                                       headers=self.headers, verify=self.verify)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _request(self, method: str, route: str, body: Any = None) -> Any:
        try:
            r = await self._http.request(method, route, json=body)
        except httpx.HTTPError as e:
            raise _unreachable(self.base_url, route, e) from None
        return check(r, route)

    async def rollout(self, prompts: Sequence[Any], n: int = 1, sampling_params: Any = None,
                      seeds: Sequence[Sequence[int]] | None = None,
                      next_prompts: Sequence[Any] | None = None, step: int | None = None, *,
                      next_seeds: Sequence[Any] | None = None,
                      return_logprobs: bool = True, pregen: bool = True,
                      pregen_window: PregenWindow | str | None = None
                      ) -> RolloutResponse:
        body = rollout_body(prompts, n, sampling_params, seeds, next_prompts, step, next_seeds,
                            return_logprobs, pregen, pregen_window)
        res = RolloutResponse.model_validate(await self._request("POST", "/v1/rollout", body))
        if self.recorder is not None:
            config = None
            if seeds is None:
                try:
                    config = await self._request("GET", "/config")
                except BubbleSpecError:
                    config = None
            await asyncio.to_thread(self._record, body, res, config)
        return res

    async def config(self) -> dict[str, Any]:
        return await self._request("GET", "/config")

    async def update_weights(self, path: str, version: int | None = None,
                             force: bool = False) -> WeightsResult:
        body: dict[str, Any] = {"path": str(path)}
        if version is not None:
            body["version"] = version
        if force:
            body["force"] = True
        return WeightsResult.model_validate(await self._request("POST", "/v1/weights", body))

    async def step_timeline(self, step: int) -> StepReport:
        return StepReport.model_validate(
            await self._request("GET", f"/v1/steps/{int(step)}"))

    async def ranks(self) -> list[RankEntry]:
        data = await self._request("GET", "/v1/ranks")
        return [RankEntry.model_validate(r) for r in data["ranks"]]

    async def health(self) -> dict[str, Any]:
        return await self._request("GET", "/health_generate")

    async def wait_ready(self, timeout_s: float = 120.0, period_s: float = 0.5
                         ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return await self.health()
            except BubbleSpecUnavailable:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(period_s)
