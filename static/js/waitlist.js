/* The waitlist page, live: when bookings change anywhere (the "calendar" topic of /ws/live/), the page
 * fetches itself again and swaps in its entries (the offers and the queue, then what has ended), so a
 * slot offered to this person appears without a reload. The join form is left alone: they may be
 * typing. What changed for them is said once, politely, to screen readers ("A slot is on offer to
 * you ..."), not at every change of anyone's booking.
 */
'use strict';

(() => {
  const parts = ['waitlist-current', 'waitlist-closed'];
  const news = document.getElementById('waitlist-news');
  let timer = null;
  let fetching = false;
  let again = false;

  function ids(root, selector) {
    return new Set([...root.querySelectorAll(selector)].map((element) => element.id));
  }

  // What a part shows, without its CSRF tokens: they are masked anew on every render, and a part that only
  // changed those is left as it is (the focus and whatever a screen reader is reading stay put).
  function shown(element) {
    const copy = element.cloneNode(true);
    copy.querySelectorAll('input[name="csrfmiddlewaretoken"]').forEach((input) => input.remove());
    return copy.innerHTML;
  }

  // A selector that finds the focused control again after its part is replaced.
  function selectorFor(element) {
    const form = element.closest('form');
    if (form && form.getAttribute('action')) {
      return `form[action="${CSS.escape(form.getAttribute('action'))}"] button`;
    }
    if (element.id) {
      return `#${CSS.escape(element.id)}`;
    }
    if (element.getAttribute('href')) {
      return `a[href="${CSS.escape(element.getAttribute('href'))}"]`;
    }
    return null;
  }

  function described(element) {
    return (element.querySelector('p') || element).textContent.replace(/\s+/g, ' ').trim();
  }

  async function refresh() {
    if (fetching) {
      again = true;  // one more once this one is in: nothing that happened meanwhile is missed
      return;
    }
    fetching = true;
    try {
      const response = await fetch(window.location.pathname, {credentials: 'same-origin'});
      if (!response.ok) {
        return;  // logged out or the server is away: the live state says so; the next change retries
      }
      const fresh = new DOMParser().parseFromString(await response.text(), 'text/html');
      const offered = ids(document, '.offers li');
      const ended = ids(document, '#waitlist-closed li');
      const said = [];
      for (const id of parts) {
        const now = document.getElementById(id);
        const next = fresh.getElementById(id);
        if (now && next && shown(now) !== shown(next)) {
          const focused = now.contains(document.activeElement) ? selectorFor(document.activeElement) : null;
          now.replaceChildren(...next.childNodes);
          const again = focused && now.querySelector(focused);
          if (again) {
            again.focus();
          }
        }
      }
      for (const offer of document.querySelectorAll('.offers li')) {
        if (!offered.has(offer.id)) {
          said.push(`A slot is on offer to you: ${described(offer)}`);
        }
      }
      for (const entry of document.querySelectorAll('#waitlist-closed li')) {
        if (!ended.has(entry.id)) {
          said.push(described(entry));
        }
      }
      if (said.length) {
        news.textContent = said.join(' ');
      }
      document.body.dataset.waitlistRefreshes = String(Number(document.body.dataset.waitlistRefreshes || 0) + 1);
    } catch (error) {
      // The network went away: the live state shows it, and the next change tries again.
    } finally {
      fetching = false;
      if (again) {
        again = false;
        refreshSoon();
      }
    }
  }

  function refreshSoon() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 300);  // a burst of changes (a cancelled series) is one fetch
  }

  let connections = 0;
  GpuLive.connect({
    topics: ['calendar'],
    stateEl: document.getElementById('live-state'),
    onOpen() {
      connections += 1;
      if (connections > 1) {
        refreshSoon();  // back after a lost connection: whatever happened meanwhile
      }
    },
    onMessage(message) {
      if (message.type === 'calendar') {
        refreshSoon();
      }
    },
  });
})();
