"""A header-read timeout for `specrt serve` (uvicorn has none: a client that sends half a request line and
then nothing holds its connection, and its file descriptor, forever; 500 of them exhaust the server).

`HeaderTimeoutH11` is uvicorn's h11 protocol with one timer: armed when a connection opens and after each
response, it closes the connection if the next request's headers have not fully arrived within
`HEADER_TIMEOUT_S`. A request whose headers arrived is never cut (its body has BodyLimit's own timeout).

    uvicorn.Config(app, http=HeaderTimeoutH11, ...)
"""

from __future__ import annotations

import asyncio
from typing import Optional

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0


class HeaderTimeoutH11(H11Protocol):
    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: Optional[asyncio.TimerHandle] = None
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timer()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _header_timeout(self) -> None:
        """Close the connection unless a request's headers have arrived since the timer was armed."""
        self._header_timer = None
        waiting = self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)
        if waiting and not self.transport.is_closing():
            self.transport.close()
