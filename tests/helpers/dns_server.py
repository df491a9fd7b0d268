"""A small authoritative DNS server for tests (UDP, trio, dnspython's wire format): enough for
unicast DNS-SD (PTR, SRV, TXT, A, AAAA). Records are ``(name, type) -> [rdata text]``; a name
with no records of the type asked is NOERROR with an empty answer, an unknown name NXDOMAIN.

Usage::

    server = DnsServer({("_nmos-register._tcp.example.test.", "PTR"): ["reg1._nmos-register._tcp.example.test."]})
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, "127.0.0.1")
"""

from __future__ import annotations

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.rrset
import trio

__all__ = ["DnsServer"]


class DnsServer:
    """Answers from ``records``; ``queries`` logs every ``(name, type)`` asked."""

    def __init__(self, records: dict[tuple[str, str], list[str]], ttl: int = 30) -> None:
        self.records = records
        self.ttl = ttl
        self.queries: list[tuple[str, str]] = []

    def answer(self, wire: bytes) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
        except Exception:  # not DNS: no answer
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        for question in query.question:
            name = question.name.to_text().lower()
            rdtype = dns.rdatatype.to_text(question.rdtype)
            self.queries.append((name, rdtype))
            texts = self.records.get((name, rdtype))
            if texts:
                response.answer.append(dns.rrset.from_text(question.name, self.ttl, "IN", rdtype, *texts))
            elif not any(known == name for known, _ in self.records):
                response.set_rcode(dns.rcode.NXDOMAIN)
        return response.to_wire()

    async def serve(
        self, host: str = "127.0.0.1", *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve on ``host`` (an ephemeral port, handed to ``task_status``) until cancelled."""
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        with sock:
            await sock.bind((host, 0))
            task_status.started(sock.getsockname()[1])
            while True:
                wire, peer = await sock.recvfrom(65535)
                reply = self.answer(wire)
                if reply is not None:
                    await sock.sendto(reply, peer)
