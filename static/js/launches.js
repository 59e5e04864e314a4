/* A booking's environments, live: while one is waiting, starting or running, the page fetches itself every few
 * seconds and swaps in the list of launches (state, connection, output, the node's events), so "Running" and the
 * output's tail appear without a reload. The launch form is left alone: the person may be choosing. The list is
 * an aria-live region: a screen reader hears a launch change state, not every line of output.
 */
'use strict';

(() => {
  const list = document.getElementById('launch-list');
  if (!list) {
    return;
  }
  let timer = null;

  function schedule(current) {
    const seconds = Number(current.dataset.refresh || 0);
    timer = seconds > 0 ? window.setTimeout(refresh, seconds * 1000) : null;
  }

  async function refresh() {
    let fresh = null;
    try {
      const response = await fetch(window.location.pathname, { headers: { Accept: 'text/html' }, credentials: 'same-origin' });
      if (response.ok) {
        const page = new DOMParser().parseFromString(await response.text(), 'text/html');
        fresh = page.getElementById('launch-list');
      }
    } catch (error) {
      fresh = null; // offline for a moment: try again at the next tick
    }
    const current = document.getElementById('launch-list');
    if (fresh && current) {
      const open = new Set([...current.querySelectorAll('details[open]')].map((d) => d.closest('article')?.id));
      fresh.querySelectorAll('article.launch').forEach((article) => {
        const details = article.querySelector('details');
        if (details && open.has(article.id)) {
          details.open = true; // what the person opened stays open
        }
      });
      current.replaceWith(fresh);
      schedule(fresh);
    } else {
      timer = window.setTimeout(refresh, 10000);
    }
  }

  schedule(list);
  window.addEventListener('pagehide', () => timer && window.clearTimeout(timer));
})();
