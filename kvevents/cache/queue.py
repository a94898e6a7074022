"""The cache's event queue: coalesces each new event with the last queued one (schemas/README.md,
"What the reference cache emits", coalescing).

Coalescing looks only at the last queued event and never across two `take()` calls, so the
batches an engine publishes per step are exactly what SGLang 0.5.20 would publish.
"""

from __future__ import annotations

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, Event

__all__ = ["EventQueue"]


class EventQueue:
    """Pending events of one cache; `push` joins an event into the last one when the rules allow."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: list[Event] = []

    def __len__(self) -> int:
        return len(self._events)

    def push(self, ev: Event) -> None:
        """Queue `ev`, joining it into the last queued event when the coalescing rules say so."""
        q = self._events
        if q:
            last = q[-1]
            if type(ev) is BlockRemoved:
                if type(last) is BlockRemoved and last.medium == ev.medium and last.lora_name == ev.lora_name:
                    last.block_hashes.extend(ev.block_hashes)
                    return
            elif type(ev) is BlockStored:
                if (
                    type(last) is BlockStored
                    and ev.parent_block_hash is not None
                    and last.block_hashes
                    and ev.parent_block_hash == last.block_hashes[-1]
                    and last.medium == ev.medium
                    and last.lora_id == ev.lora_id
                    and last.lora_name == ev.lora_name
                    and last.block_size == ev.block_size
                    and last.cache_salt == ev.cache_salt
                    and last.session_id == ev.session_id
                ):
                    last.block_hashes.extend(ev.block_hashes)
                    last.token_ids.extend(ev.token_ids)
                    return
        q.append(ev)

    def clear_all(self) -> None:
        """Queue `AllBlocksCleared` after whatever is pending (it never joins anything)."""
        self._events.append(AllBlocksCleared())

    def take(self) -> list[Event]:
        """Drain the queue: the caller owns the returned list and its events."""
        out = self._events
        self._events = []
        return out

    def peek(self) -> list[Event]:
        """The pending events (a copy of the list; for dumps and tests)."""
        return list(self._events)
