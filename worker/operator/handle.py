"""One execution's view of its binding: read it, and change it only by fenced compare-and-set.

A change is a pure function of the current binding and the Redis clock. On a revision
conflict the latest binding is re-read from the script's reply and the function applied
again, so concurrent writers (a duplicate delivery, the cancel handler's flag) never lose
each other's updates. A terminal binding is returned as it is: the function is not even
called, which is how "terminal states are write-once" reaches every caller.

Because every transition passes through `update`, it is also the one terminal hook: the
first time an update leaves the binding terminal (written by this holder, or found so by a
concurrent one), `on_terminal` runs, once per handle. The session hangs the release of the
endpoint's run slot on it (docs/architecture.md §8 "Endpoint capacity"), so no terminal path
can forget the slot or free it twice. (`StartFence.create` also gives back a slot it took
for a binding it then found terminal: no update of this handle ran.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from schemas.errors import ErrorCode
from worker.errors import ConnectorError, LeaseLost, StoreUnavailable
from worker.operator.binding import OperatorBinding, decode_binding, encode_binding
from worker.store.keys import ActionKeys
from worker.store.operator_store import OperatorStore, StoredBinding, WriteStatus

#: A change: given the binding and Redis time, the new binding, or None for "no change".
Change = Callable[[OperatorBinding, int], OperatorBinding | None]

#: Conflicts in a row before contention itself is reported (`operator_state`).
MAX_CAS_ATTEMPTS = 64


@dataclass(slots=True)
class View:
    """The binding as last read or written, with the Redis clock of that step."""

    binding: OperatorBinding
    revision: int
    now_ms: int
    #: The cancel handler's durable flag (folded into the doc on the next write).
    cancel_flag: bool


def state_error(exc: StoreUnavailable) -> ConnectorError:
    return ConnectorError(ErrorCode.OPERATOR_STATE, f"operator state unavailable: {exc}")


class BindingHandle:
    """Fenced access to one binding for one lease holder (`keys`, `owner`, `fence`)."""

    def __init__(
        self,
        store: OperatorStore,
        keys: ActionKeys,
        owner: str,
        fence: int,
        *,
        created_at_hint_ms: int = 0,
        on_terminal: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self.owner = owner
        self.fence = fence
        self.view: View | None = None
        #: Redis time of this holder's first lease of the Action (0: unknown, read first).
        self._created_at_hint_ms = created_at_hint_ms
        #: Run once, the first time `update` leaves the binding terminal (set to None then).
        self._on_terminal = on_terminal

    @property
    def binding(self) -> OperatorBinding:
        if self.view is None:
            raise RuntimeError("binding not loaded")
        return self.view.binding

    @property
    def now_ms(self) -> int:
        return 0 if self.view is None else self.view.now_ms

    @property
    def cancel_flag(self) -> bool:
        return self.view is not None and (self.view.cancel_flag or self.binding.cancel_requested)

    def _adopt(
        self, stored: StoredBinding, sent: tuple[bytes, OperatorBinding] | None = None
    ) -> View:
        """The stored binding as this handle's view. `sent` is the doc this handle just
        wrote and the binding it encodes: when the store answers with those very bytes (a
        write that took), that binding is adopted without decoding them again."""
        doc = stored.doc
        if doc is None:
            raise ConnectorError(ErrorCode.OPERATOR_STATE, "operator binding vanished")
        binding = sent[1] if sent is not None and doc == sent[0] else decode_binding(doc)
        self.view = View(binding, stored.revision, stored.now_ms, stored.cancel_requested)
        return self.view

    async def read(self) -> OperatorBinding | None:
        """The stored binding (None when there is none); never fenced: reading is harmless."""
        try:
            stored = await self.store.read(self.keys.binding)
        except StoreUnavailable as exc:
            raise state_error(exc) from None
        if stored.doc is None:
            self.view = None
            return None
        return self._adopt(stored).binding

    async def read_clock(self) -> int:
        """Redis time now (the same clock every claim expiry was computed with)."""
        try:
            stored = await self.store.read(self.keys.binding)
        except StoreUnavailable as exc:
            raise state_error(exc) from None
        if stored.doc is not None:
            self._adopt(stored)
        return stored.now_ms

    @property
    def creates_without_reading(self) -> bool:
        """Whether `create` is sent blind (a first lease: no binding can exist yet)."""
        return self._created_at_hint_ms > 0

    async def create(self, make: Callable[[int], OperatorBinding]) -> OperatorBinding:
        """The Action's binding: the stored one, or `make(now)` created under the fence.

        With a creation-time hint (the Redis time of a first lease, when no earlier owner
        can have created a binding) the create is sent without reading first: the script
        answers `exists` with the stored binding if there is one after all, and that one is
        adopted exactly as a read would have found it. Otherwise the read comes first and
        its Redis time is the creation time.
        """
        if self.creates_without_reading:
            created_at = self._created_at_hint_ms
        else:
            try:
                stored = await self.store.read(self.keys.binding)
            except StoreUnavailable as exc:
                raise state_error(exc) from None
            if stored.doc is not None:
                return self._adopt(stored).binding
            created_at = stored.now_ms
        self.view = None
        fresh = make(created_at)
        doc = encode_binding(fresh)
        try:
            reply = await self.store.create(
                self.keys, self.owner, self.fence, doc, fresh.status.value
            )
        except StoreUnavailable as exc:
            raise state_error(exc) from None
        if reply.status is WriteStatus.FENCED_OUT:
            raise LeaseLost("lease lost before the operator binding was created")
        return self._adopt(reply.stored, (doc, fresh)).binding

    async def update(self, change: Change) -> OperatorBinding:
        """Apply `change` by compare-and-set; returns the binding stored afterwards, after
        running the terminal hook if that binding is terminal (see the module docstring).

        Raises LeaseLost when this holder's fence is no longer current: nothing is written
        and the hook does not run (the run may be live under the next holder).
        """
        binding = await self._compare_and_set(change)
        if binding.terminal and self._on_terminal is not None:
            hook, self._on_terminal = self._on_terminal, None
            await hook()
        return binding

    async def _compare_and_set(self, change: Change) -> OperatorBinding:
        if self.view is None:
            await self.read()
            if self.view is None:
                raise ConnectorError(ErrorCode.OPERATOR_STATE, "operator binding is missing")
        for _ in range(MAX_CAS_ATTEMPTS):
            view = self.view
            assert view is not None
            if view.binding.terminal:
                return view.binding
            proposed = change(view.binding, view.now_ms)
            if proposed is None:
                return view.binding
            # Bookkeeping, not a transition: the revision of the write, and the cancel flag
            # folded in so the doc never forgets an intent recorded beside it.
            proposed = msgspec.structs.replace(
                proposed,
                revision=view.revision + 1,
                cancel_requested=proposed.cancel_requested or view.cancel_flag,
            )
            doc = encode_binding(proposed)
            try:
                reply = await self.store.write(
                    self.keys,
                    self.owner,
                    self.fence,
                    view.revision,
                    doc,
                    proposed.status.value,
                )
            except StoreUnavailable as exc:
                raise state_error(exc) from None
            if reply.status is WriteStatus.FENCED_OUT:
                raise LeaseLost("lease lost: the operator binding was not changed")
            if reply.status is WriteStatus.MISSING:
                raise ConnectorError(ErrorCode.OPERATOR_STATE, "operator binding vanished")
            self._adopt(reply.stored, (doc, proposed))
            if reply.status is WriteStatus.WRITTEN:
                return self.binding
        raise ConnectorError(
            ErrorCode.OPERATOR_STATE,
            f"operator binding still contended after {MAX_CAS_ATTEMPTS} compare-and-set attempts",
        )
