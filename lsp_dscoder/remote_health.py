"""Whether the remote endpoint is serving: failures, the backoff before the next try, the probe that
finds it again, and the one message per outage that the editor shows.

While the endpoint is down, requests are refused at once (the editor gets no suggestion, and no keystroke
waits on a connect timeout); a probe thread retries on a doubling schedule and the next request after
a successful probe goes through.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from lsp_dscoder.remote_http import EndpointDownError, RemoteError

log = logging.getLogger(__name__)

# (logging level, message): shown to the user; called from the backend's threads
Notify = Callable[[int, str], None]
# `dscoder/status`'s params when the endpoint goes down or works again: editors show it in their status
Status = Callable[[dict[str, Any]], None]

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


class Health:
    def __init__(
        self, name: str, probe: Callable[[], None], notify: Notify | None, status: Status | None = None
    ) -> None:
        self.name = name
        self._probe = probe  # raises RemoteError when the endpoint is not serving
        self._notify = notify or (lambda level, message: None)
        self._status = status or (lambda params: None)
        self._cond = threading.Condition()
        self.reachable = True
        self.last_error: str | None = None
        self.failures = 0  # consecutive
        self.retry_at: float | None = None  # time.monotonic() of the next probe while down
        self._announced = False  # this outage has been shown to the user
        self._refusals: set[str] = set()  # request errors already shown (shown once each)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="lsp-dscoder-remote-probe", daemon=True)

    def start(self) -> None:
        """Probe once now (off the caller's thread), then whenever the endpoint is down."""
        with self._cond:
            self.retry_at = time.monotonic()
        self._thread.start()

    def check(self) -> None:
        """Raises EndpointDownError while the endpoint is down and its retry time has not come."""
        with self._cond:
            if not self.reachable and self.retry_at is not None and time.monotonic() < self.retry_at:
                wait = self.retry_at - time.monotonic()
                raise EndpointDownError(f"{self.last_error} (retrying in {wait:.1f} s)")

    def succeeded(self, completion: bool) -> None:
        """The endpoint answered: a probe (it is serving) or a whole completion (it works). Only a
        completion ends an outage: an endpoint that lists its models but fails every completion must
        not be announced again and again, nor retried faster."""
        with self._cond:
            self.reachable, self.retry_at = True, None
            if not completion:
                return
            announced = self._announced
            self.failures, self._announced = 0, False
            self._refusals.clear()
        if announced:
            log.info("%s is working again", self.name)
            self._notify(logging.INFO, f"dscoder: the completion endpoint {self.name} is working again")
            self._status(self.status_params(True, None))

    def failed(self, message: str) -> None:
        with self._cond:
            self.reachable, self.last_error = False, message
            self.failures += 1
            delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (self.failures - 1))
            self.retry_at = time.monotonic() + delay
            announce, self._announced = not self._announced, True
            self._cond.notify_all()
        log.warning(
            "remote endpoint failed (%d in a row, retry in %.1f s): %s", self.failures, delay, message
        )
        if announce:
            self._notify(logging.WARNING, f"dscoder: the completion endpoint failed: {message}")
            self._status(self.status_params(False, message))

    def status_params(self, reachable: bool, error: str | None) -> dict[str, Any]:
        """`dscoder/status` for an outage that begins (`error`: why) or ends."""
        return {"backend": "remote", "endpoint": self.name, "reachable": reachable, "error": error}

    def refused(self, message: str) -> None:
        """The endpoint answered, but refused the request: shown once per distinct message."""
        with self._cond:
            self.last_error = message
            new = message not in self._refusals
            self._refusals.add(message)
        log.warning("remote endpoint refused a request: %s", message)
        if new:
            self._notify(logging.WARNING, f"dscoder: the completion endpoint refused a request: {message}")

    def as_dict(self) -> dict[str, Any]:
        with self._cond:
            retry = None if self.retry_at is None else max(0.0, self.retry_at - time.monotonic())
            return {
                "endpoint": self.name,
                "reachable": self.reachable,
                "lastError": self.last_error,
                "failures": self.failures,
                "retryInS": None if self.reachable else round(retry or 0.0, 3),
            }

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self.retry_at is None or time.monotonic() < self.retry_at):
                    timeout = None if self.retry_at is None else self.retry_at - time.monotonic()
                    self._cond.wait(timeout)
                if self._closed:
                    return
                self.retry_at = None if self.reachable else self.retry_at
            try:
                self._probe()
            except RemoteError as exc:
                self.failed(str(exc))
                continue
            self.succeeded(completion=False)
