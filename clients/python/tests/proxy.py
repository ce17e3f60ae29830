"""A TCP proxy in front of PostgreSQL that can lose a COMMIT's answer: once armed, when the
client sends a simple-query message ('Q') whose text is COMMIT, the proxy forwards it to the
server, then closes both sides before any of the server's answer reaches the client. The
server commits (the message arrived before the end of the stream); the client cannot know."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class CommitCutter:
    def __init__(self, upstream_url: str) -> None:
        params = conninfo_to_dict(upstream_url)
        self.upstream = (
            str(params.get("host") or "127.0.0.1"),
            int(str(params.get("port") or 5432)),
        )
        self.upstream_url = upstream_url
        #: Set by the test right before the request whose commit is lost.
        self.armed = False
        #: How many COMMITs were cut.
        self.cut = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> CommitCutter:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    def url(self, **overrides: Any) -> str:
        """The upstream URL through the proxy, in plain text (no TLS or GSS to read through)."""
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return make_conninfo(
            self.upstream_url,
            host="127.0.0.1",
            port=port,
            sslmode="disable",
            gssencmode="disable",
            **overrides,
        )

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)
        answers = asyncio.create_task(self._relay(server_r, client_w))
        try:
            # The startup message has no type byte: its length, then the rest.
            (length,) = struct.unpack("!i", await client_r.readexactly(4))
            server_w.write(struct.pack("!i", length) + await client_r.readexactly(length - 4))
            while True:
                kind = await client_r.readexactly(1)
                (length,) = struct.unpack("!i", await client_r.readexactly(4))
                message = kind + struct.pack("!i", length) + await client_r.readexactly(length - 4)
                if (
                    self.armed
                    and kind == b"Q"
                    and message[5:].rstrip(b"\0").strip().upper() == b"COMMIT"
                ):
                    self.armed = False
                    self.cut += 1
                    answers.cancel()  # nothing more reaches the client
                    client_w.close()
                    server_w.write(message)
                    await server_w.drain()
                    server_w.close()  # after the COMMIT, in order: the server reads it first
                    await server_w.wait_closed()
                    return
                server_w.write(message)
                await server_w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            answers.cancel()
            for writer in (client_w, server_w):
                writer.close()

    @staticmethod
    async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
