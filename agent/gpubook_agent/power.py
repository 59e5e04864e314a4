"""The idle power cap: a card nobody has booked runs at a lower power limit, and gets its limit back before a
booking opens it.

An admin turns it on per node in the portal (``Node.idle_power_limit_pct``, off by default). It reaches the agent
inside the signed snapshot (``idle_power_limit_pct``), so nobody without the node's lease secret can set it, and
the agent applies it by its own clock while the portal is down, as it does leases. The node's root has the last
word: ``ALLOW_POWER_CAP=false`` in the agent's config refuses it (reported once), and the agent then changes no
limit but to give back the caps it set itself.

The enforcer's every pass gives limits back (``give_back``) before it grants anything, and caps idle cards
(``cap_idle``) after its grants and revocations, so a slow NVML call holds up neither:

- A card is *idle* while no lease in force holds it or any of its MIG slices. An idle card is capped at the
  policy's share of its default limit, in whole watts, within the range the card accepts. A cap only ever
  lowers: a card whose limit is at or below the target already (its root set it so) is left alone.
- A card the agent capped gets back the limit the cap replaced when a lease starts on it (before its ACLs are
  granted, so the booking starts at full power), when the cap is turned off or refused by the node, and when
  the agent stops cleanly. Only the agent's own caps are given back: a card whose limit changed since the agent
  set it (``nvidia-smi -pl``, a driver reload, which restores the default) is no longer the agent's, and is capped
  again only if it is idle and above the target.
- After a crash (``kill -9``: no clean stop gave the limits back) the agent knows its caps again at start from
  the stored snapshot's policy: an idle card's limit that is that policy's target, below its default, is taken
  as its cap of the default.
- Nothing here is done twice: limits are read once per reconcile (``reread``) and after that only what the agent
  set is remembered, so a pass calls NVML only for a card whose state must change. A failure (the card does not
  support power limits, the agent is not root) is reported once per card and message (``power_failed``), never
  stops enforcement and never holds up a grant; a cap that failed is not tried again at the same target, a
  give-back that failed is tried again at every reconcile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from gpubook_agent.gpus import GpuBackend, PowerLimitError, PowerLimits

log = logging.getLogger(__name__)

Report = Callable[..., None]  # report(kind, **fields): one event for the portal
# Limits within this many watts of each other are the same limit (NVML keeps milliwatts; a driver may round).
TOLERANCE_W = 0.5


@dataclass(frozen=True)
class Cap:
    """A cap the agent set on a card: the limit it set, and the one it replaced (given back at the end)."""

    watts: float
    before: float


def cap_watts(limits: PowerLimits, pct: int) -> float:
    """``pct`` % of the card's default limit in whole watts, within the range the card accepts."""
    return float(min(max(round(limits.default_w * pct / 100), limits.min_w), limits.max_w))


class PowerCap:
    """The idle power cap of one node's cards; used from the enforcer's thread only."""

    def __init__(self, *, backend: GpuBackend, cards: Iterable[str], report: Report, allowed: bool) -> None:
        self.backend = backend
        self.cards = list(cards)
        self.report = report
        self.allowed = allowed
        self._caps: dict[str, Cap] = {}  # card -> the cap the agent set there
        self._limits: dict[str, PowerLimits] = {}  # card -> its limits as last read (or set), until ``reread``
        self._unreadable: set[str] = set()  # cards whose limits could not be read, until ``reread``
        self._failed: dict[str, float] = {}  # card -> the limit a set failed to set (not tried again at once)
        self._reported: set[tuple[str, str]] = set()  # (card, message) of failures reported already
        self._refusal_reported: int | None = None  # the policy this node's ALLOW_POWER_CAP=false was reported for

    def caps(self) -> dict[str, float]:
        """The cards the agent has capped now, and their cap (W)."""
        return {card: cap.watts for card, cap in self._caps.items()}

    def reread(self) -> None:
        """Read every limit again at the next pass (the reconcile: a limit may have changed under the agent), and
        try again to give back the caps that could not be."""
        self._limits.clear()
        self._unreadable.clear()
        self._failed = {card: watts for card, watts in self._failed.items() if card not in self._caps}

    def adopt(self, pct: int | None) -> None:
        """At start, before any pass: take as the agent's own the caps of ``pct`` (the stored snapshot's policy)
        that a crashed agent left on the cards, so that they are given back when they must be."""
        if pct is None:
            return
        for card in self.cards:
            limits = self._read(card)
            if limits is None:
                continue
            target = cap_watts(limits, pct)
            if abs(limits.current_w - target) <= TOLERANCE_W and target < limits.default_w - TOLERANCE_W:
                self._caps[card] = Cap(watts=target, before=limits.default_w)
                log.info("card %s: at %.0f W, the idle power cap of %d %%: taken as the agent's own", card, target, pct)

    def converge(self, pct: int | None, busy: set[str]) -> None:
        """Cap the cards not in ``busy`` at ``pct`` % (None: off), and give the others back their limit."""
        self.give_back(pct, busy)
        self.cap_idle(pct, busy)

    def give_back(self, pct: int | None, busy: set[str]) -> None:
        """The limit back to the capped cards in ``busy``, or to all of them with the cap off (or refused): the
        enforcer's pass does this before it grants anything."""
        pct = self._policy(pct)
        for card in list(self._caps):
            if pct is None or card in busy:
                self._restore(card, "a lease holds the card now" if pct is not None else self._off_reason())

    def cap_idle(self, pct: int | None, busy: set[str]) -> None:
        """Cap the cards not in ``busy`` at ``pct`` %: the enforcer's pass does this after its grants and
        revocations, so a slow NVML call never holds those up."""
        pct = self._policy(pct)
        if pct is None:
            return  # off: no NVML call at all
        for card in self.cards:
            if card not in busy:
                self._cap(card, pct)

    def _policy(self, pct: int | None) -> int | None:
        """The cap in force: ``pct``, or None when it is off or this node refuses it (reported once)."""
        if pct is None:
            self._refusal_reported = None  # turned on again later: refused (and reported) again
        elif not self.allowed:
            self._refuse(pct)
            return None
        return pct

    def restore_all(self, why: str) -> None:
        """Give every card the agent capped its limit back (the agent stops cleanly), read afresh."""
        self.reread()
        for card in list(self._caps):
            self._restore(card, why)

    # -- one card ---------------------------------------------------------------------------------------------

    def _cap(self, card: str, pct: int) -> None:
        limits = self._read(card)
        if limits is None:
            return
        cap = self._own(card, limits)
        target = cap_watts(limits, pct)
        before = cap.before if cap is not None else limits.current_w
        if cap is not None and abs(cap.watts - target) <= TOLERANCE_W:
            return  # capped already, at this target
        if target >= before - TOLERANCE_W:  # never raised: at or below the target already
            if cap is not None:  # the policy went up to (or above) the limit the cap replaced
                self._restore(card, f"the idle power cap is now {pct} % of the card's default limit")
            return
        if self._failed.get(card) == target or not self._set(card, target, limits):
            return
        self._caps[card] = Cap(watts=target, before=before)
        log.info("card %s idle: power limit %.0f W -> %.0f W (%d %%)", card, limits.current_w, target, pct)
        self.report(
            "power_capped",
            gpu=card,
            power_limit_w=target,
            message=f"no lease holds the card: power limit {limits.current_w:.0f} W -> {target:.0f} W "
            f"({pct} % of its default {limits.default_w:.0f} W, within its range "
            f"{limits.min_w:.0f}-{limits.max_w:.0f} W)",
        )

    def _restore(self, card: str, why: str) -> None:
        limits = self._read(card)
        if limits is None or self._own(card, limits) is None:
            return  # unreadable (tried again at the next reconcile), or no longer the agent's cap
        cap = self._caps[card]
        target = min(max(cap.before, limits.min_w), limits.max_w)
        if self._failed.get(card) == target or not self._set(card, target, limits):
            return
        del self._caps[card]
        log.info("card %s: power limit %.0f W -> %.0f W (%s)", card, cap.watts, target, why)
        self.report(
            "power_restored",
            gpu=card,
            power_limit_w=target,
            message=f"power limit {cap.watts:.0f} W -> {target:.0f} W: {why}",
        )

    def _own(self, card: str, limits: PowerLimits) -> Cap | None:
        """The agent's cap on ``card`` while its limit is still that cap; forgotten once someone changed it."""
        cap = self._caps.get(card)
        if cap is not None and abs(limits.current_w - cap.watts) > TOLERANCE_W:
            log.warning(
                "card %s: power limit %.0f W, not the %.0f W the agent set: changed on the node (nvidia-smi -pl, a "
                "driver reload); no longer the agent's cap",
                card,
                limits.current_w,
                cap.watts,
            )
            del self._caps[card]
            return None
        return cap

    def _read(self, card: str) -> PowerLimits | None:
        limits = self._limits.get(card)
        if limits is not None or card in self._unreadable:
            return limits
        try:
            limits = self.backend.power_limits(card)
        except Exception as error:  # PowerLimitError, or a binding this agent does not know: this card only
            self._unreadable.add(card)
            self._fail(card, _words(error))
            return None
        self._limits[card] = limits
        return limits

    def _set(self, card: str, watts: float, limits: PowerLimits) -> bool:
        try:
            self.backend.set_power_limit(card, watts)
        except Exception as error:  # PowerLimitError, or a binding this agent does not know: the card is left as is
            self._failed[card] = watts
            self._fail(card, _words(error), watts=watts)
            return False
        self._limits[card] = replace(limits, current_w=watts)
        self._failed.pop(card, None)
        self._reported = {item for item in self._reported if item[0] != card}  # a later failure is news again
        return True

    def _fail(self, card: str, message: str, *, watts: float | None = None) -> None:
        if (card, message) in self._reported:
            return
        self._reported.add((card, message))
        log.warning("card %s: power limit not changed: %s", card, message)
        if watts is None:
            self.report("power_failed", gpu=card, message=message)
        else:
            self.report("power_failed", gpu=card, power_limit_w=watts, message=message)

    # -- the node's refusal -----------------------------------------------------------------------------------

    def _refuse(self, pct: int) -> None:
        if self._refusal_reported == pct:
            return
        self._refusal_reported = pct
        message = (
            f"the portal asks for an idle power cap of {pct} % of each card's default limit; this node's "
            "ALLOW_POWER_CAP=false refuses it: no power limit is changed"
        )
        log.warning("%s", message)
        self.report("power_failed", message=message)

    def _off_reason(self) -> str:
        return "the idle power cap is off" if self.allowed else "this node's ALLOW_POWER_CAP=false refuses it"


def _words(error: Exception) -> str:
    """A failure as the event says it: a PowerLimitError's own words; anything else with its type's name."""
    return str(error) if isinstance(error, PowerLimitError) else f"{type(error).__name__}: {error}"
