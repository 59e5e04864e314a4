/* The GPU status page (templates/live/status.html): one card per GPU, grouped by node.
 *
 * The page arrives with the fleet's cards (config.status); the websocket topic "status" then sends
 * a full snapshot on (re)connecting, each node's new readings as its agent reports them, and a
 * node's whole cards again when a booking, maintenance window, drain, slot boundary or a return
 * from offline changes them (reservations/fleet.py builds them, live/status.py sends them; this only draws).
 * Admins also follow "events": what the agents did and saw, newest first; and "alerts": the open
 * alerts (alerts/), a full list on (re)connecting, then each one as it opens or resolves. An alert
 * about the portal itself (periodic jobs late) has no node.
 *
 * Every value is written with textContent: names and reasons come from users and nodes.
 */
'use strict';

(() => {
  const config = JSON.parse(document.getElementById('status-config').textContent);
  const fleetEl = document.getElementById('fleet');
  const eventsEl = document.getElementById('events');
  const MAX_EVENTS = 100;
  const WINDOW_MS = 10 * 60000;  // the sparklines' span: the server keeps as much (nodes/history.py)

  const STATE_LABELS = {
    free: 'Free', in_use: 'In use', maintenance: 'Maintenance', drained: 'Drained',
    not_bookable: 'Not bookable', offline: 'Offline',
  };

  // --- formatting ------------------------------------------------------------------------------

  const timeZone = config.time_zone;
  const timeFormat = new Intl.DateTimeFormat(undefined, {hour: '2-digit', minute: '2-digit', hourCycle: 'h23', timeZone});
  const dayTimeFormat = new Intl.DateTimeFormat(undefined, {
    weekday: 'short', day: 'numeric', month: 'short', hour: '2-digit', minute: '2-digit', hourCycle: 'h23', timeZone,
  });
  const dayKey = new Intl.DateTimeFormat('en-CA', {year: 'numeric', month: '2-digit', day: '2-digit', timeZone});

  function when(iso) {
    const date = new Date(iso);
    return dayKey.format(date) === dayKey.format(new Date()) ? timeFormat.format(date) : dayTimeFormat.format(date);
  }

  function ago(iso) {
    const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (seconds < 90) return `${seconds} s ago`;
    if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
    return `since ${when(iso)}`;
  }

  const gb = (mib) => (mib / 1024).toFixed(1);
  const known = (value) => value !== null && value !== undefined;

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // --- state -----------------------------------------------------------------------------------

  let nodes = new Map();  // name -> node as the server sent it
  const history = new Map();  // GPU id -> [[ms, utilisation %], ...]

  function remember(node) {
    for (const gpu of node.gpus) {
      let list = gpu.history ? gpu.history.slice() : (history.get(gpu.id) ?? []);
      const reading = gpu.telemetry;
      if (reading && known(reading.utilization_pct)) {
        const at = Date.parse(reading.at);
        if (!list.length || list[list.length - 1][0] < at) {
          list.push([at, reading.utilization_pct]);
        }
      }
      const since = Date.now() - WINDOW_MS;
      list = list.filter(([at]) => at >= since);
      history.set(gpu.id, list);
    }
  }

  /** New readings of nodes' GPUs (batched by the server); the rest of their cards stays. A reading
   *  older than the one shown (a batch overtaken by a whole-card update) is ignored. */
  function applyTelemetry(message) {
    const changed = [];
    for (const [name, update] of Object.entries(message.nodes)) {
      const node = nodes.get(name);
      if (!node) continue;
      node.last_seen = update.last_seen;
      for (const gpu of node.gpus) {
        const reading = update.gpus[String(gpu.id)];
        if (reading && (!gpu.telemetry || Date.parse(reading.at) >= Date.parse(gpu.telemetry.at))) {
          gpu.telemetry = reading;
        }
      }
      remember(node);
      changed.push(name);
    }
    render(changed);
  }

  function apply(message) {
    if (message.full) {
      nodes = new Map();
    }
    for (const node of message.nodes) {
      if (!message.full) noteChanges(nodes.get(node.name), node);
      nodes.set(node.name, node);
      remember(node);
    }
    render(message.full ? null : message.nodes.map((node) => node.name));
  }

  // --- news for screen readers ------------------------------------------------------------------
  // What changed in words, said politely: a GPU's state and holder, a node going offline or coming
  // back, an alert opening or resolving. Readings (every few seconds) are never said; the cards are
  // aria-live="off". Changes arriving together are said together, once.

  const newsEl = document.getElementById('status-news');
  let news = [];
  let newsTimer = null;

  function say(text) {
    news.push(text);
    clearTimeout(newsTimer);
    newsTimer = setTimeout(() => {
      newsEl.textContent = news.join(' ');
      news = [];
    }, 1000);
  }

  const holderOf = (gpu) => (gpu.current ? `, held by ${gpu.current.user}` : '');

  function noteChanges(before, after) {
    if (!before) {
      say(`Node ${after.name} added.`);
      return;
    }
    if (before.online !== after.online) {
      say(after.online ? `Node ${after.name} is back online.` : `Node ${after.name} went offline.`);
      return;
    }
    const was = new Map(before.gpus.map((gpu) => [gpu.id, gpu]));
    for (const gpu of after.gpus) {
      const old = was.get(gpu.id);
      if (old && (old.state !== gpu.state || old.current?.user !== gpu.current?.user)) {
        say(`${after.name} GPU ${gpu.index}: ${STATE_LABELS[gpu.state] ?? gpu.state}${holderOf(gpu)}.`);
      }
    }
  }

  // --- drawing ---------------------------------------------------------------------------------

  function render(only) {
    const names = [...nodes.keys()].sort();
    if (!only) {
      fleetEl.replaceChildren(...names.map((name) => nodeSection(nodes.get(name))));
      if (!names.length) {
        fleetEl.replaceChildren(el('p', 'muted', 'No nodes yet: an admin adds them (see docs/agent.md).'));
      }
      return;
    }
    for (const name of only) {
      const fresh = nodeSection(nodes.get(name));
      const old = fleetEl.querySelector(`section.node[data-node="${CSS.escape(name)}"]`);
      if (old) {
        old.replaceWith(fresh);
      } else {
        render(null);
        return;
      }
    }
  }

  function nodeSection(node) {
    const section = el('section', `node${node.online ? '' : ' node-offline'}`);
    section.dataset.node = node.name;
    const titleId = `node-${node.name}`;
    section.setAttribute('aria-labelledby', titleId);

    const head = el('header', 'node-head');
    const title = el('h2', '', node.name);
    title.id = titleId;
    head.append(title, el('span', 'hostname', node.hostname));
    // A Slurm node without our agent: Slurm's word on it stands where an agent's last report would.
    const slurmOnly = node.manager === 'slurm' && !node.last_seen;
    const online = el('span', `badge ${node.online ? 'badge-online' : 'badge-offline'}`,
      slurmOnly ? 'Slurm' : (node.online ? 'Online' : 'Offline'));
    online.dataset.role = 'online';
    head.append(online);
    if (node.status !== 'active') {
      head.append(el('span', 'badge badge-maintenance', node.status === 'maintenance' ? 'In maintenance' : 'Disabled'));
    }
    if (slurmOnly) {
      head.append(el('span', 'muted manager-state',
        node.manager_state ? `Slurm: ${node.manager_state}` : 'not seen in Slurm yet'));
    } else {
      const seen = el('span', 'muted last-seen', node.last_seen ? `last report ${ago(node.last_seen)}` : 'its agent never reported');
      seen.dataset.lastSeen = node.last_seen ?? '';
      head.append(seen);
    }
    section.append(head);

    if (node.maintenance) {
      section.append(el('p', 'node-note',
        `Maintenance until ${when(node.maintenance.end)}${node.maintenance.reason ? `: ${node.maintenance.reason}` : ''}.`));
    }
    if (node.agent && config.is_admin) {
      const skew = node.agent.clock_skew_seconds;
      section.append(el('p', 'muted node-agent', `Agent ${node.agent.version || '?'} (${node.agent.backend || '?'}` +
        `${node.agent.driver_version ? `, driver ${node.agent.driver_version}` : ''})` +
        `${known(skew) ? `, clock ${skew >= 0 ? '+' : ''}${skew.toFixed(1)} s` : ''}`));
      if (node.agent.events_dropped) {
        // Past NODE_EVENTS_PER_MINUTE the portal counts the agent's events instead of storing them.
        const dropped = el('p', 'node-note events-dropped',
          `${node.agent.events_dropped} events over the per-minute budget were counted, not stored` +
          `${node.agent.events_dropped_at ? ` (last ${when(node.agent.events_dropped_at)})` : ''}.`);
        dropped.dataset.role = 'events-dropped';
        section.append(dropped);
      }
    }
    const cards = el('div', 'cards');
    cards.append(...node.gpus.map((gpu) => gpuCard(node, gpu)));
    if (!node.gpus.length) cards.append(el('p', 'muted', 'No GPUs registered.'));
    section.append(cards);
    return section;
  }

  function metric(name, label, value, share, warn) {
    const row = el('div', `metric${warn ? ' metric-warn' : ''}`);
    row.dataset.metric = name;
    row.append(el('span', 'metric-label', label), el('span', 'metric-value', value));
    if (known(share)) {
      const bar = el('span', 'bar');
      bar.setAttribute('aria-hidden', 'true');
      const fill = el('span', 'bar-fill');
      fill.style.width = `${Math.max(0, Math.min(100, share))}%`;
      bar.append(fill);
      row.append(bar);
    }
    return row;
  }

  function gpuCard(node, gpu) {
    const card = el('article', `gpu-card state-${gpu.state}`);
    card.dataset.gpu = gpu.id;
    card.setAttribute('aria-label', `${node.name} GPU ${gpu.index}: ${STATE_LABELS[gpu.state] ?? gpu.state}`);

    const head = el('header', 'gpu-head');
    // A Slurm node's GPUs are counted, not measured: no memory size to show (0).
    const size = gpu.memory_mib ? ` · ${gb(gpu.memory_mib)} GB` : '';
    head.append(el('h3', '', `GPU ${gpu.index}`), el('span', 'model', `${gpu.model}${size}`));
    const badge = el('span', `badge state-badge state-${gpu.state}`, STATE_LABELS[gpu.state] ?? gpu.state);
    badge.dataset.role = 'state';
    head.append(badge);
    card.append(head);

    const reading = gpu.telemetry;
    if (reading) {
      const metrics = el('div', 'metrics');
      const util = reading.utilization_pct;
      metrics.append(metric('utilization', 'Utilisation', known(util) ? `${util} %` : 'n/a', util));
      const used = reading.memory_used_mib;
      const total = reading.memory_total_mib ?? gpu.memory_mib;
      metrics.append(metric('memory', 'Memory', known(used) ? `${gb(used)} / ${gb(total)} GB` : 'n/a',
        known(used) && total ? (100 * used) / total : null));
      const temp = reading.temperature_c;
      const hot = known(temp) && known(reading.slowdown_temperature_c) ? temp >= reading.slowdown_temperature_c - 5 : temp >= 85;
      metrics.append(metric('temperature', 'Temperature', known(temp) ? `${temp} °C` : 'n/a', null, hot));
      // The limit too: lower than usual on an idle card the node's power cap holds (docs/agent.md, "Power limits").
      const limit = known(reading.power_limit_w) ? ` of ${Math.round(reading.power_limit_w)} W` : '';
      metrics.append(metric('power', 'Power', known(reading.power_w) ? `${Math.round(reading.power_w)} W${limit}` : 'n/a', null));
      card.append(metrics);
      card.append(sparkline(gpu.id));
    } else {
      card.append(el('p', 'muted', node.manager === 'slurm' && !node.last_seen
        ? 'No readings from Slurm.' : 'No readings yet.'));
    }

    const holder = el('p', 'holder');
    holder.dataset.role = 'holder';
    if (gpu.current) {
      holder.append('Held by ', el('strong', '', gpu.current.user), ` until ${when(gpu.current.end)}`);
    } else if (gpu.slices?.some((piece) => piece.current)) {
      holder.textContent = 'Held in MIG slices (below).';
    } else {
      holder.textContent = 'Nobody holds it now.';
    }
    card.append(holder);
    card.append(el('p', 'next muted', gpu.next
      ? `Next: ${gpu.next.user}, ${when(gpu.next.start)} – ${when(gpu.next.end)}`
      : 'Nothing booked next.'));

    if (gpu.slices?.length) {
      const list = el('ul', 'slices');
      list.setAttribute('aria-label', `MIG slices of GPU ${gpu.index}`);
      for (const piece of gpu.slices) {
        const item = el('li', '', `${piece.profile}: `);
        if (piece.current) {
          item.append('held by ', el('strong', '', piece.current.user), ` until ${when(piece.current.end)}`);
        } else {
          item.append(piece.bookable ? 'free' : 'waiting for an admin');
        }
        list.append(item);
      }
      card.append(list);
    }

    if (gpu.state === 'drained') {
      card.append(el('p', 'gpu-note', `Drained: processes could not be ended${gpu.drain_reason ? ` (${gpu.drain_reason})` : ''}. ` +
        'An admin returns it to service.'));
    } else if (gpu.maintenance) {
      card.append(el('p', 'gpu-note', `Maintenance until ${when(gpu.maintenance.end)}` +
        `${gpu.maintenance.reason ? `: ${gpu.maintenance.reason}` : ''}.`));
    }

    const processes = reading?.processes ?? [];
    if (processes.length) {
      const list = el('ul', 'processes');
      list.setAttribute('aria-label', 'Processes on this GPU');
      for (const process of processes) {
        const memory = known(process.used_memory_mib) ? ` · ${gb(process.used_memory_mib)} GB` : '';
        list.append(el('li', '', `${process.user || 'unknown'}${memory}${known(process.pid) ? ` · pid ${process.pid}` : ''}`));
      }
      card.append(list);
    }
    return card;
  }

  /** The last minutes of utilisation, as a small inline SVG line (decorative: the number is above). */
  function sparkline(gpuId) {
    const points = history.get(gpuId) ?? [];
    const svgNs = 'http://www.w3.org/2000/svg';
    const svg = document.createElementNS(svgNs, 'svg');
    svg.setAttribute('class', 'sparkline');
    svg.setAttribute('viewBox', '0 0 600 100');
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('aria-hidden', 'true');
    if (points.length > 1) {
      const since = Date.now() - WINDOW_MS;
      const line = document.createElementNS(svgNs, 'polyline');
      const x = (at) => Math.max(0, (600 * (at - since)) / WINDOW_MS).toFixed(1);
      line.setAttribute('points', points.map(([at, value]) => `${x(at)},${100 - value}`).join(' '));
      svg.append(line);
    }
    const title = document.createElementNS(svgNs, 'title');
    title.textContent = 'Utilisation over the last 10 minutes';
    svg.append(title);
    return svg;
  }

  // --- events (admins) -------------------------------------------------------------------------

  function eventItem(event, node) {
    const item = el('li', `event event-${event.kind}`);
    const gpu = known(event.gpu) ? ` GPU ${event.gpu}` : '';
    item.append(el('time', 'event-time', when(event.at)), el('strong', '', ` ${node ?? event.node}${gpu}: `),
      `${event.label}${event.user ? ` (${event.user})` : ''}${event.message ? ` — ${event.message}` : ''}`);
    item.querySelector('time').dateTime = event.at;
    return item;
  }

  function addEvents(list, node, atTop) {
    if (!eventsEl) return;
    const items = list.map((event) => eventItem(event, node));
    if (atTop) {
      eventsEl.prepend(...items.reverse());
    } else {
      eventsEl.append(...items);
    }
    while (eventsEl.children.length > MAX_EVENTS) eventsEl.lastElementChild.remove();
  }

  // --- alerts (admins) -------------------------------------------------------------------------

  const alertsEl = document.getElementById('alerts');
  const alertsCountEl = document.getElementById('alerts-count');
  const openAlerts = new Map();  // id -> alert as alerts.selectors.alert_data builds it

  function alertItem(alert) {
    const item = el('li', `alert alert-${alert.kind}`);
    item.dataset.alert = alert.id;
    const where = `${alert.node ?? 'The portal'}${known(alert.gpu) ? ` GPU ${alert.gpu}` : ''}` +
      `${alert.user ? ` · ${alert.user}` : ''}`;
    const head = el('div', 'alert-head');
    head.append(el('span', 'badge alert-kind', alert.label), el('strong', 'alert-where', where));
    const since = el('time', 'alert-since', `since ${when(alert.opened_at)}`);
    since.dateTime = alert.opened_at;
    head.append(since);
    item.append(head);
    if (alert.summary) item.append(el('p', 'alert-summary', alert.summary));
    const foot = el('p', 'alert-foot muted');
    if (!alert.mailed && alert.kind !== 'idle') {
      const held = el('span', 'alert-held', 'Staff not mailed yet · ');
      held.title = 'Mail goes at the next run, or together with others once the hourly limit allows.';
      foot.append(held);
    }
    const link = el('a', '', 'Details in admin');
    link.href = alert.admin_url;
    foot.append(link);
    item.append(foot);
    return item;
  }

  function renderAlerts() {
    if (!alertsEl) return;
    const shown = [...openAlerts.values()].sort((a, b) => Date.parse(b.opened_at) - Date.parse(a.opened_at));
    alertsEl.replaceChildren(...shown.map(alertItem));
    if (!shown.length) alertsEl.append(el('li', 'muted alert-none', 'No open alerts.'));
    alertsCountEl.textContent = String(shown.length);
    alertsCountEl.dataset.count = String(shown.length);
  }

  function applyAlerts(message) {
    if (message.full) openAlerts.clear();
    for (const alert of message.alerts) {
      const where = `${alert.node ?? 'the portal'}${known(alert.gpu) ? ` GPU ${alert.gpu}` : ''}`;
      if (alert.open) {
        if (!message.full && !openAlerts.has(alert.id)) say(`Alert: ${alert.label}, ${where}.`);
        openAlerts.set(alert.id, alert);
      } else {
        if (openAlerts.has(alert.id)) say(`Resolved: ${alert.label}, ${where}.`);
        openAlerts.delete(alert.id);
      }
    }
    renderAlerts();
  }

  // --- start -----------------------------------------------------------------------------------

  apply({full: true, nodes: config.status.nodes});
  addEvents(config.events, null, false);
  const alertsData = document.getElementById('alerts-data');
  if (alertsData) applyAlerts({full: true, alerts: JSON.parse(alertsData.textContent)});

  // Relative times ("12 s ago") age between messages.
  setInterval(() => {
    for (const seen of fleetEl.querySelectorAll('.last-seen[data-last-seen]')) {
      if (seen.dataset.lastSeen) seen.textContent = `last report ${ago(seen.dataset.lastSeen)}`;
    }
  }, 5000);

  window.gpuStatus = GpuLive.connect({
    topics: config.is_admin ? ['status', 'events', 'alerts'] : ['status'],
    stateEl: document.getElementById('live-state'),
    onMessage(message) {
      if (message.type === 'nodes') {
        apply(message);
      } else if (message.type === 'telemetry') {
        applyTelemetry(message);
      } else if (message.type === 'events') {
        addEvents(message.events, message.node, true);
      } else if (message.type === 'alerts') {
        applyAlerts(message);
      }
    },
  });
})();
