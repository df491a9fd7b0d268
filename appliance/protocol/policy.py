"""Pure policies of the node protocol: reconnect backoff, auth lockout, the offline event queue.

No clock and no dice of their own (style H2): ``now`` is passed in, and :class:`Backoff` takes the
random source (``random.Random(...)`` or any ``() -> float`` in [0, 1)) from its caller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

from pydantic import SecretStr

__all__ = [
    "BACKOFF_INITIAL_S",
    "BACKOFF_JITTER",
    "BACKOFF_MAX_S",
    "EVENT_QUEUE_CAPACITY",
    "LOCKOUT_MAX_FAILURES",
    "LOCKOUT_WINDOW_S",
    "Backoff",
    "EventQueue",
    "Lockout",
    "RandomSource",
    "SupportsRandom",
    "lockout_identifier",
]

# interop.md 6 "Node client": exponential backoff 1, 2, 4 … 60 s (±10 % jitter).
BACKOFF_INITIAL_S: Final = 1.0
BACKOFF_MAX_S: Final = 60.0
BACKOFF_JITTER: Final = 0.10
# interop.md 6 "Lockout": 5 failures within 60 s lock the identifier for the rest of that window.
LOCKOUT_MAX_FAILURES: Final = 5
LOCKOUT_WINDOW_S: Final = 60.0
# interop.md 6 "Node client": events wait in a queue of at most 1000, oldest dropped when full.
EVENT_QUEUE_CAPACITY: Final = 1000


class SupportsRandom(Protocol):
    """Anything with ``random() -> float`` in [0, 1), e.g. a ``random.Random`` instance."""

    def random(self) -> float: ...


RandomSource = Callable[[], float] | SupportsRandom
"""A ``random.Random`` (or anything with ``.random()``), or a callable returning a float in [0, 1)."""


class Backoff:
    """Reconnect delays 1, 2, 4 … 60 s, each ±10 % jitter (interop.md 6 "Node client").

    Call :meth:`next_delay` after each failed or lost connection, :meth:`reset` after a successful
    auth (the next delay is 1 s again). Never sleeps: the driver does.
    """

    def __init__(
        self,
        rng: RandomSource,
        *,
        initial_s: float = BACKOFF_INITIAL_S,
        max_s: float = BACKOFF_MAX_S,
        factor: float = 2.0,
        jitter: float = BACKOFF_JITTER,
    ) -> None:
        self._random: Callable[[], float] = rng if callable(rng) else rng.random
        self._initial_s = initial_s
        self._max_s = max_s
        self._factor = factor
        self._jitter = jitter
        self._base_s = initial_s

    def next_delay(self) -> float:
        """The delay before the next attempt, in seconds: within ±``jitter`` of 1, 2, 4 … ``max_s``."""
        base = self._base_s
        self._base_s = min(self._max_s, base * self._factor)
        # Uniform in [base·(1-j), base·(1+j)): spreads a fleet that lost the manager at once.
        return base * (1.0 + self._jitter * (2.0 * self._random() - 1.0))

    def reset(self) -> None:
        """After a successful auth: the next delay starts again from ``initial_s``."""
        self._base_s = self._initial_s


def lockout_identifier(*, node_id: str | None, registration_token: SecretStr | str | None) -> str:
    """The lockout key (interop.md 6 "Lockout"): the ``node_id``, else ``token:<first 8 chars>``."""
    if node_id is not None:
        return node_id
    if registration_token is None:
        raise ValueError("a node id or a registration token is needed")
    token = registration_token.get_secret_value() if isinstance(registration_token, SecretStr) else registration_token
    return f"token:{token[:8]}"


@dataclass(slots=True)
class _Window:
    start: float
    failures: int


class Lockout:
    """Auth failures per identifier in fixed 60 s windows (interop.md 6 "Lockout").

    A window opens at an identifier's first failure and lasts ``window_s``. Its ``max_failures``-th
    failure locks the identifier until the window ends; while locked, every attempt is refused
    (the driver answers ``auth_error`` without checking the credentials) and does not extend the
    lock. The next failure after the window's end opens a fresh window. A success does not clear
    the count: the rule counts failures, and clearing would let a guesser reset it by
    interleaving with the real node.

    Memory is bounded: past ``max_identifiers``, finished windows are pruned, then the oldest.
    """

    def __init__(
        self,
        *,
        max_failures: int = LOCKOUT_MAX_FAILURES,
        window_s: float = LOCKOUT_WINDOW_S,
        max_identifiers: int = 100_000,
    ) -> None:
        self._max_failures = max_failures
        self._window_s = window_s
        self._max_identifiers = max_identifiers
        self._windows: dict[str, _Window] = {}  # insertion order = window start order

    def is_locked(self, identifier: str, now: float) -> bool:
        """Whether an attempt for ``identifier`` at ``now`` must be refused."""
        return self.locked_until(identifier, now) is not None

    def locked_until(self, identifier: str, now: float) -> float | None:
        """When the lock on ``identifier`` ends (the caller's clock), or None when not locked."""
        window = self._windows.get(identifier)
        if window is None or window.failures < self._max_failures:
            return None
        end = window.start + self._window_s
        return end if now < end else None

    def record_failure(self, identifier: str, now: float) -> bool:
        """Count one failed attempt at ``now``. Returns whether ``identifier`` is now locked."""
        window = self._windows.get(identifier)
        if window is None or now >= window.start + self._window_s:
            self._windows.pop(identifier, None)  # re-insert: keeps the dict ordered by start
            if len(self._windows) >= self._max_identifiers:
                self._evict(now)
            window = self._windows[identifier] = _Window(start=now, failures=0)
        if window.failures < self._max_failures:
            window.failures += 1
        return window.failures >= self._max_failures

    def prune(self, now: float) -> None:
        """Forget every window that has ended."""
        for identifier in [i for i, w in self._windows.items() if now >= w.start + self._window_s]:
            del self._windows[identifier]

    def __len__(self) -> int:
        return len(self._windows)

    def _evict(self, now: float) -> None:
        self.prune(now)
        while len(self._windows) >= self._max_identifiers:
            del self._windows[next(iter(self._windows))]


T = TypeVar("T")


class EventQueue(Generic[T]):
    """Events waiting for the manager link (interop.md 6 "Node client").

    At most ``capacity`` (1000); when full, :meth:`put` drops the oldest and counts it in
    ``dropped``. Flush in order on reconnect: ``peek`` a frame, send it, then ``pop`` it, so a send
    that fails leaves it queued; or :meth:`drain` everything at once.
    """

    def __init__(self, capacity: int = EVENT_QUEUE_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._items: deque[T] = deque(maxlen=capacity)
        self.capacity = capacity
        self.dropped = 0
        """Events dropped because the queue was full (oldest first)."""

    def put(self, item: T) -> bool:
        """Queue ``item``. Returns False when the oldest event was dropped to make room."""
        full = len(self._items) == self.capacity
        if full:
            self.dropped += 1
        self._items.append(item)  # deque(maxlen) drops the oldest itself
        return not full

    def peek(self) -> T | None:
        """The oldest event, left in the queue; None when empty."""
        return self._items[0] if self._items else None

    def pop(self) -> T | None:
        """Remove and return the oldest event; None when empty."""
        return self._items.popleft() if self._items else None

    def drain(self) -> list[T]:
        """Every queued event, oldest first; the queue is then empty."""
        items = list(self._items)
        self._items.clear()
        return items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)
