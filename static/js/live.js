/* Live updates over the portal's websocket (/ws/live/, live/consumers.py), shared by the pages.
 *
 *   const live = GpuLive.connect({
 *     topics: ['status'],
 *     onMessage(message) { ... },      // every message but errors about the connection itself
 *     onOpen() { ... },                // after each (re)connection, once subscribed: resynchronise
 *     stateEl: document.getElementById('live-state'),
 *   });
 *
 * After the server goes away (a restart, a network change) it reconnects with exponential backoff
 * (1 s doubling up to 30 s, with jitter so a restarted server is not hit by every page at once),
 * and says so in stateEl: "Live", "Reconnecting in 4 s…", or why it gave up. It gives up only when
 * the server says the user is no longer logged in (close code 4401): then reloading the page leads
 * to the login form. Coming back online or to the tab retries at once. While the portal waits for
 * Redis or the database, the server says so and closes with 4503 (live/outages.py): the notice
 * gives its words ("Live updates are paused while the portal waits for Redis.") and it retries
 * as after any other loss.
 */
'use strict';

window.GpuLive = (() => {
  const CLOSE_NOT_AUTHENTICATED = 4401;
  const CLOSE_UNAVAILABLE = 4503;
  const MAX_DELAY_MS = 30000;

  function connect({topics, onMessage, onOpen = () => {}, stateEl = null, path = '/ws/live/'}) {
    let socket = null;
    let attempt = 0;
    let retryTimer = null;
    let countdownTimer = null;
    let stopped = false;
    let pausedBecause = null;  // the server's last error: its words before a 4503 close

    function show(state, text) {
      if (stateEl) {
        stateEl.dataset.state = state;
        stateEl.textContent = text;
      }
    }

    function open() {
      clearTimeout(retryTimer);
      clearInterval(countdownTimer);
      if (stopped || (socket && socket.readyState <= WebSocket.OPEN)) {
        return;
      }
      const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
      show(attempt ? 'reconnecting' : 'connecting', attempt ? 'Reconnecting…' : 'Connecting…');
      socket = new WebSocket(`${scheme}//${location.host}${path}`);
      socket.addEventListener('open', () => {
        socket.send(JSON.stringify({subscribe: topics}));
      });
      socket.addEventListener('message', (event) => {
        let message;
        try {
          message = JSON.parse(event.data);
        } catch {
          return;
        }
        if (message.type === 'subscribed') {
          attempt = 0;
          show('live', 'Live');
          onOpen();
          return;
        }
        if (message.type === 'error' && message.code === 'not_authenticated') {
          stopped = true;
          show('stopped', `Live updates stopped: ${message.message} Reload the page to log in.`);
          return;
        }
        if (message.type === 'error') {
          pausedBecause = message.message;  // shown if a 4503 close follows
        }
        onMessage(message);
      });
      socket.addEventListener('close', (event) => {
        socket = null;
        if (event.code === CLOSE_NOT_AUTHENTICATED) {
          stopped = true;
        }
        const why = event.code === CLOSE_UNAVAILABLE ? pausedBecause || event.reason || null : null;
        pausedBecause = null;
        if (!stopped) {
          retry(why);
        }
      });
    }

    function retry(why = null) {
      const base = Math.min(MAX_DELAY_MS, 1000 * 2 ** attempt);
      const delay = Math.round(base / 2 + (Math.random() * base) / 2);
      attempt += 1;
      const due = Date.now() + delay;
      // The sentence is announced once (stateEl is a status region); the countdown beside it is
      // for the eyes only, or a screen reader would read it out every second.
      show('reconnecting', why ? `${why} Reconnecting` : 'Connection lost. Reconnecting');
      const countdown = document.createElement('span');
      countdown.setAttribute('aria-hidden', 'true');
      stateEl?.append(countdown);
      const tick = () => {
        countdown.textContent = ` in ${Math.max(1, Math.ceil((due - Date.now()) / 1000))} s…`;
      };
      tick();
      countdownTimer = setInterval(tick, 1000);
      retryTimer = setTimeout(open, delay);
    }

    const soon = () => {
      if (!stopped && !socket) {
        open();
      }
    };
    window.addEventListener('online', soon);
    document.addEventListener('visibilitychange', () => document.visibilityState === 'visible' && soon());

    open();
    return {
      close() {
        stopped = true;
        socket?.close();
      },
    };
  }

  return {connect};
})();
