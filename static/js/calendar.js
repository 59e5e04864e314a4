/* The booking calendar (templates/reservations/calendar.html).
 *
 * EventCalendar (static/vendor/event-calendar/) draws a resource timeline: one row per node with its
 * GPUs as child rows, time across. The rows and events of each visible range come from
 * GET /api/v1/calendar/; every change goes through the reservations API (book, cancel, release,
 * extend), and every refusal is shown in the API's own words. The range is loaded again when the
 * websocket says someone changed bookings in it (see "live updates" at the end).
 *
 * Times. EventCalendar knows fixed offsets only, so the page uses the offset the user's zone has
 * now (config.time_zone.offset) for everything: a week that crosses a DST change is shown with one
 * offset. EventCalendar hands callbacks browser Dates whose *local* fields hold the wall-clock time
 * in that offset: wallOf() reads them, instantOf() turns a wall-clock time back into an ISO 8601
 * time with the offset, which is what the API takes.
 *
 * Selections. A selection in a resource timeline stays on the row where it began, so one drag picks
 * one GPU (or a node's row); the booking dialog lists the node's GPUs as checkboxes to book several.
 *
 * Crowded ranges. EventCalendar costs about a millisecond per event it draws, whatever the event
 * (a Svelte component, a forced layout to stack it, grid layout), with no virtual scrolling: a full
 * week of a 64-GPU lab is over 5,000 bookings, 5 s (bench/calendar_render.py measures it). So only
 * the bookings one may drag are EventCalendar events: your own that have not ended (drag the end to
 * extend). Every other booking is drawn by blocksOf() as a plain, absolutely placed element inside
 * one background event per GPU row (a "run"), which costs microseconds: it shows the holder's name,
 * looks pending when it is, is a button (click, Enter or Space opens the same dialog as an event)
 * and carries the full description as its accessible name. A run's element is kept for the load,
 * so expanding or collapsing a node (which makes EventCalendar redraw every row below it) moves it
 * instead of building it again. Laying out and painting blocks is then what costs (a dense week's
 * 5,000 blocks, ~0.1 ms each, on every redraw), so above EAGER_BLOCKS a row's blocks are built when
 * it comes within half a screen of what the calendar shows (an IntersectionObserver): like a virtual
 * list, rows far out of view have no blocks yet; scrolling, or tabbing, towards them builds them
 * before they show. Each node's row also carries a summary of its load (how many of its GPUs are
 * booked, as shading), which is what a collapsed node shows.
 *
 * Opening on now. The day view spans two days (it moves by one), so that in the evening the night and
 * the next morning are on screen rather than a click away, and the week view starts on its date, not
 * on a Monday: both open on today. After every change of dates the grid is scrolled so that, when the
 * view starts today, now sits at a third of the visible hours, else the view's first morning shows
 * (placeView); the position is rounded to a label's edge, so the first label shows whole (labels cut
 * by an edge while scrolling are hidden, see showEdges), and "Today" comes back to it. EventCalendar's scrollTime is relative to today's midnight and capped
 * at that day's end, and its own "today" button is disabled while today is in view, hence the small
 * scroll of our own and a button of our own.
 *
 * Narrow screens. A GPU's row is labelled "GPU 0" there (the node's row above names the node), with
 * the rest of its name kept for screen readers, on hover (title) and, for the keyboard (or a tap),
 * shown under the label while it has the focus. Shadows at the grid's edges show there are hours to either side,
 * and on a phone a line says so until the grid has been scrolled once.
 *
 * Accessibility. EventCalendar marks its grid role="table" but puts row headers, buttons and events
 * straight into it and one role="row" around every cell of every row: no table a screen reader can
 * walk, and axe-core's critical aria-required-children/-parent. plainGrid() takes those roles off
 * after every redraw (a MutationObserver), so the grid reads as what it is: the days, the rows'
 * names in order (nodes, their GPUs), and each booking a button whose name starts with what it shows
 * and goes on with the whole booking in words (describeBooking: "GPU 2 · A100 on gpu-a100, alice,
 * Thu, Dec 3, 10:00 to 12:00, approved"). The equivalent of cells is the slot cursor
 * (static/js/slot_cursor.js): the grid's keyboard path, which says what lies under it and books or
 * opens it with Enter. The dialogs are modal, keep Tab inside (keepFocusIn) and give the focus back
 * to what opened them. Others' changes are said politely once drawn (loaded), never telemetry.
 */
'use strict';

(() => {
  const config = JSON.parse(document.getElementById('calendar-config').textContent);
  const OFFSET = config.time_zone.offset;
  const OFFSET_MS = parseOffset(OFFSET) * 60000;
  const GRID_MS = config.grid_minutes * 60000;
  const HOUR_MS = 3600000;
  const DAY_MS = 24 * HOUR_MS;
  const REFRESH_MS = 2 * 60000;
  const LIVE_RELOAD_DELAY_MS = 300;
  const VIEW_KEY = 'gpu-calendar-view';
  const VIEWS = ['resourceTimelineDay', 'resourceTimelineWeek'];
  const EAGER_BLOCKS = 1500;  // more bookings drawn as blocks than this: rows get theirs when near (see "Crowded ranges")
  const DAY_VIEW_DAYS = 2;  // the day view's span (see "Opening on now")
  const FIRST_MORNING_HOUR = 7;  // where the day view opens on a day other than today
  const NARROW = window.matchMedia('(max-width: 640px)');  // as calendar.css's narrow layout

  const $ = (id) => document.getElementById(id);
  const calendarEl = $('calendar');
  const statusEl = $('calendar-status');
  const pageErrorEl = $('calendar-error');

  // --- time ------------------------------------------------------------------------------------

  function parseOffset(text) {
    const match = /^([+-])(\d{2}):(\d{2})$/.exec(text);
    return match ? (match[1] === '-' ? -1 : 1) * (Number(match[2]) * 60 + Number(match[3])) : 0;
  }

  const pad = (n) => String(n).padStart(2, '0');

  /** "2030-01-07T10:00:00" from a Date EventCalendar handed out (its local fields are the wall clock). */
  function wallOf(date) {
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}` +
      `T${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  }

  /** The wall-clock time, in the calendar's offset, of an instant (milliseconds or ISO 8601). */
  function wallAt(instant) {
    const ms = typeof instant === 'number' ? instant : Date.parse(instant);
    return new Date(ms + OFFSET_MS).toISOString().slice(0, 19);
  }

  /** "2030-01-07T10:00:00+01:00" from a wall-clock time ("2030-01-07T10:00" or with seconds). */
  function instantOf(wall) {
    return (wall.length === 16 ? `${wall}:00` : wall.slice(0, 19)) + OFFSET;
  }

  const msOf = (wall) => Date.parse(instantOf(wall));
  const floorToGrid = (ms) => Math.floor(ms / GRID_MS) * GRID_MS;
  const toInputValue = (wall) => wall.slice(0, 16);

  // Wall-clock strings are formatted by reading their fields as UTC: no zone arithmetic in between.
  // 24-hour times throughout, like the calendar's labels.
  // Thousands of bookings are described per load, so each day's name is formatted once ("Thu, Dec 3").
  const dayOnly = new Intl.DateTimeFormat(undefined, {weekday: 'short', day: 'numeric', month: 'short', timeZone: 'UTC'});
  const dayNames = new Map();

  function formatDay(wall) {
    const day = wall.slice(0, 10);
    if (!dayNames.has(day)) {
      dayNames.set(day, dayOnly.format(new Date(`${day}T00:00:00Z`)));
    }
    return dayNames.get(day);
  }

  const formatWall = (wall) => `${formatDay(wall)}, ${wall.slice(11, 16)}`;

  function formatPeriod(startWall, endWall, between = ' – ') {
    const sameDay = startWall.slice(0, 10) === endWall.slice(0, 10);
    return `${formatWall(startWall)}${between}${sameDay ? endWall.slice(11, 16) : formatWall(endWall)}`;
  }

  /** A period as it is read out: "Thu, Dec 3, 10:00 to 12:00" (a dash is read as "dash", or not at all). */
  const spokenPeriod = (startWall, endWall) => formatPeriod(startWall, endWall, ' to ');

  function formatDuration(ms) {
    const minutes = Math.round(ms / 60000);
    const hours = Math.floor(minutes / 60);
    const rest = minutes % 60;
    return [hours ? `${hours} h` : '', rest ? `${rest} min` : ''].filter(Boolean).join(' ') || '0 min';
  }

  const zoneText = `${config.time_zone.name} (UTC${OFFSET})`;

  // --- the API ---------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(message, code, details) {
      super(message);
      this.code = code;  // the API's error code, such as slot_conflict
      this.details = details;  // the API's details, such as a refused series' report
    }
  }

  function csrfToken() {
    const cookie = document.cookie.split('; ').find((part) => part.startsWith('csrftoken='));
    return cookie ? decodeURIComponent(cookie.slice('csrftoken='.length)) : config.csrf_token;
  }

  /** Calls the API; resolves with the JSON body, or rejects with ApiError carrying error.message. */
  async function api(method, url, body) {
    const options = {method, credentials: 'same-origin', headers: {Accept: 'application/json'}};
    if (method !== 'GET') {
      options.headers['Content-Type'] = 'application/json';
      options.headers['X-CSRFToken'] = csrfToken();
      options.body = JSON.stringify(body ?? {});
    }
    let response;
    try {
      response = await fetch(url, options);
    } catch {
      throw new ApiError('The portal could not be reached. Check the connection and try again.');
    }
    let data = null;
    try {
      data = await response.json();
    } catch {
      // Not JSON (a proxy's error page): described by the status below.
    }
    if (!response.ok) {
      const message = data?.error?.message || `The portal answered ${response.status} ${response.statusText}.`;
      throw new ApiError(message, data?.error?.code, data?.error?.details);
    }
    return data;
  }

  const actionUrl = (id, action) => `${config.urls.reservations}${id}/${action}/`;

  // --- messages --------------------------------------------------------------------------------

  let statusTimer;
  let announcedAt = 0;  // when the page last said what the person's own action did

  function announce(text) {
    announcedAt = Date.now();
    statusEl.textContent = text;
    clearTimeout(statusTimer);
    statusTimer = setTimeout(() => { statusEl.textContent = ''; }, 15000);
  }

  function showPageError(text) {
    pageErrorEl.textContent = text;
  }

  function showError(el, text) {
    el.textContent = text;
  }

  // --- rows ------------------------------------------------------------------------------------

  let resources = config.resources;
  let resourcesJson = JSON.stringify(resources);
  const collapsedNodes = new Set();  // node row ids the person collapsed, kept when the rows are replaced
  let gpus = new Map();  // GPU id -> {label, node, bookable}
  let nodeRowOf = new Map();  // "gpu-12" -> "node-3"
  let shareOf = new Map();  // a MIG slice row -> its share of its card (cards: absent, counted as 1)
  let rowIds = [];

  /** A node's GPU rows in order, each MIG card followed by its slices (rows under it). */
  function bookableRows(node) {
    return (node?.children ?? []).flatMap((gpu) => [gpu, ...(gpu.children ?? [])]);
  }

  /** A count of GPUs as people read it: 2, or 1.43 when MIG slices count by their share. */
  const gpuCount = (count) => `${Number(count.toFixed(2))}`;

  function indexResources() {
    gpus = new Map();
    nodeRowOf = new Map();
    shareOf = new Map();
    rowIds = [];
    for (const node of resources) {
      rowIds.push(node.id);
      for (const gpu of bookableRows(node)) {
        rowIds.push(gpu.id);
        nodeRowOf.set(gpu.id, node.id);
        if (gpu.extendedProps.share !== undefined) shareOf.set(gpu.id, gpu.extendedProps.share);
        gpus.set(gpu.extendedProps.gpu, {...gpu.extendedProps, title: gpu.title});
      }
    }
  }
  indexResources();

  const rows = () => resources.map((node) => ({...node, expanded: !collapsedNodes.has(node.id)}));

  /** New rows from the server; the same rows are left be (replacing them redraws everything). */
  function setResources(next) {
    const json = JSON.stringify(next);
    if (json === resourcesJson) {
      return;
    }
    resources = next;
    resourcesJson = json;
    indexResources();
    calendar.setOption('resources', rows());
  }

  const gpuLabel = (id) => gpus.get(id)?.label ?? `GPU #${id}`;
  // A booking's GPU ids, from its rows ("gpu-12" -> 12).
  const gpuIdsOf = (booking) => booking.resourceIds.filter((id) => id.startsWith('gpu-')).map((id) => Number(id.slice(4)));
  const nodeOf = (booking) => gpus.get(gpuIdsOf(booking)[0])?.node ?? '';

  // --- events ----------------------------------------------------------------------------------

  async function loadEvents(info) {
    const params = new URLSearchParams({start: instantOf(info.startStr), end: instantOf(info.endStr)});
    try {
      const data = await api('GET', `${config.urls.calendar}?${params}`);
      performance.mark('calendar-data');  // bench/calendar_render.py times the drawing from here
      showPageError('');
      setResources(data.resources);
      const bookings = data.events.filter((event) => event.extendedProps.kind === 'reservation');
      const others = data.events.filter((event) => event.extendedProps.kind !== 'reservation');
      const draggable = bookings.filter(isDraggable);
      return others.concat(
        draggable, runs(bookings.filter((event) => !isDraggable(event)), info), nodeLoad(bookings),
        pastShade(info.startStr, data.now),
      );
    } catch (error) {
      showPageError(`The calendar could not be loaded: ${error.message}`);
      throw error;
    }
  }

  const isoUtc = (ms) => `${new Date(ms).toISOString().slice(0, 19)}+00:00`;  // EventCalendar reads no "Z"

  /** Each node's load over time, as background events on its row ("3/8 booked"), shaded by share. */
  function nodeLoad(bookings) {
    const changes = new Map();  // node row id -> [[ms, +share | -share], ...]: a card 1, a MIG slice its share
    for (const event of bookings) {
      const start = Date.parse(event.start);
      const end = Date.parse(event.end);
      for (const id of event.resourceIds) {
        const node = nodeRowOf.get(id);
        if (node) {
          const share = shareOf.get(id) ?? 1;
          changes.has(node) || changes.set(node, []);
          changes.get(node).push([start, share], [end, -share]);
        }
      }
    }
    const sizes = new Map(resources.map((node) => [node.id, node.children.length]));
    const load = [];
    for (const [node, list] of changes) {
      list.sort((a, b) => a[0] - b[0] || a[1] - b[1]);  // an end before a start at the same time
      const total = sizes.get(node) || 1;
      let count = 0;
      let since = null;
      let shown = 0;
      const close = (at) => {
        if (shown > 0 && since < at) {
          load.push({
            id: `load-${node}-${load.length}`, resourceIds: [node], start: isoUtc(since), end: isoUtc(at),
            display: 'background', title: `${gpuCount(shown)} of ${total} GPUs booked`,
            classNames: ['load', `load-${Math.min(4, Math.ceil((4 * shown) / total))}`],
            extendedProps: {kind: 'load', label: `${gpuCount(shown)}/${total} booked`},
          });
        }
      };
      for (let i = 0; i < list.length; i++) {
        count = Math.round((count + list[i][1]) * 1e6) / 1e6;  // shares are fractions: no float residue
        const at = list[i][0];
        if (i + 1 < list.length && list[i + 1][0] === at) {
          continue;  // settle every change at this moment first
        }
        if (count !== shown) {
          close(at);
          since = at;
          shown = count;
        }
      }
    }
    return load;
  }

  /** The part of the range before now, shaded on every row (a background event). */
  function pastShade(startWall, now) {
    if (Date.parse(now) <= msOf(startWall)) {
      return [];
    }
    return [{
      id: 'past', start: instantOf(startWall), end: now, resourceIds: rowIds, display: 'background',
      classNames: ['past'], extendedProps: {kind: 'past'},
    }];
  }

  // --- bookings drawn as blocks (see "Crowded ranges") ---------------------------------------------

  /** Whether a booking is an EventCalendar event: yours and not ended, so its end can be dragged. */
  const isDraggable = (event) => event.extendedProps.mine && event.extendedProps.can_extend;

  /** What the dialog and the descriptions need of a booking, from the API's event... */
  const bookingFromApi = (event) => ({
    title: event.title, ext: event.extendedProps, resourceIds: event.resourceIds,
    startMs: Date.parse(event.start), endMs: Date.parse(event.end), startWall: wallAt(event.start), endWall: wallAt(event.end),
  });
  /** ... or from an event EventCalendar hands a callback. */
  const bookingOf = (event) => ({
    title: event.title, ext: event.extendedProps, resourceIds: event.resourceIds,
    startWall: wallOf(event.start), endWall: wallOf(event.end),
  });

  let blockBookings = new Map();  // reservation id -> booking drawn as a block, for their clicks
  let runBlocks = new Map();  // run id -> its blocks' element, built once per load
  let nearby = null;  // an IntersectionObserver on the calendar's scroller, for crowded ranges
  const unbuilt = new WeakMap();  // run element -> what to fill it with, once near

  /** One background event per GPU row over the whole range, whose content is the row's blocks. */
  function runs(list, info) {
    const from = msOf(info.startStr);
    const to = msOf(info.endStr);
    blockBookings = new Map();
    runBlocks = new Map();
    nearby?.disconnect();  // the previous load's rows are about to go
    nearby = null;
    const perRow = new Map();
    for (const event of list) {
      const booking = bookingFromApi(event);
      blockBookings.set(booking.ext.reservation, booking);
      for (const id of event.resourceIds) {
        if (nodeRowOf.has(id)) {
          perRow.has(id) || perRow.set(id, []);
          perRow.get(id).push(booking);
        }
      }
    }
    return [...perRow].map(([row, bookings]) => ({
      id: `run-${row}`, resourceIds: [row], start: isoUtc(from), end: isoUtc(to), display: 'background',
      classNames: ['run'], extendedProps: {kind: 'run', bookings, from, span: to - from},
    }));
  }

  /** A run's element; its blocks are built at once, or in a crowded range when its row comes near. */
  function blocksOf(event) {
    if (runBlocks.has(event.id)) {
      return runBlocks.get(event.id);
    }
    const box = element('div', 'run-blocks', '');
    runBlocks.set(event.id, box);
    if (blockBookings.size <= EAGER_BLOCKS) {
      fill(box, event.extendedProps);
    } else {
      // Watched once EventCalendar has put it in the page (its scroller is the observer's root).
      requestAnimationFrame(() => box.isConnected && watchNear(box, event.extendedProps));
    }
    return box;
  }


  function watchNear(box, run) {
    const root = box.closest('.ec-main');
    if (nearby?.root !== root) {  // a new view has a new scroller
      nearby?.disconnect();
      nearby = new IntersectionObserver((entries) => {
        for (const entry of entries) {
          if (entry.isIntersecting && unbuilt.has(entry.target)) {
            nearby.unobserve(entry.target);
            fill(entry.target, unbuilt.get(entry.target));
            unbuilt.delete(entry.target);
          }
        }
      }, {root, rootMargin: '50% 0px'});  // half a screen above and below what shows
    }
    unbuilt.set(box, run);
    nearby.observe(box);
  }

  /** One button per booking, placed by its share of the range. */
  function fill(box, {bookings, from, span}) {
    for (const booking of bookings) {
      const ext = booking.ext;
      const left = Math.max(0, (booking.startMs - from) / span);
      const right = Math.min(1, (booking.endMs - from) / span);
      const block = element('span', `block ${ext.status}${ext.mine ? ' mine' : ''}`, booking.title);
      let shown = booking.title;
      if (span <= DAY_VIEW_DAYS * DAY_MS) {  // the day view has room for the start, like its events
        shown = `${booking.startWall.slice(11, 16)} ${shown}`;
        block.prepend(element('span', 'block-time', booking.startWall.slice(11, 16)), ' ');
      }
      // Its name is what it shows and then the rest (WCAG 2.5.3: a name that holds the visible text). A label,
      // not a hidden element: a dense week has thousands of blocks, and each element costs on every redraw.
      block.setAttribute('aria-label', `${shown}: ${describeBooking(booking)}`);
      block.style.cssText = `left:${left * 100}%;width:${(right - left) * 100}%`;
      block.setAttribute('role', 'button');
      block.tabIndex = 0;
      block.dataset.reservationId = ext.reservation;
      box.append(block);
    }
  }

  const blockAt = (target) => (target instanceof Element ? target.closest('.run-blocks .block') : null);

  calendarEl.addEventListener('click', (jsEvent) => {
    const block = blockAt(jsEvent.target);
    if (block) {
      openReservation(blockBookings.get(Number(block.dataset.reservationId)), block);
    }
  });
  calendarEl.addEventListener('keydown', (jsEvent) => {
    const block = blockAt(jsEvent.target);
    if (block && (jsEvent.key === 'Enter' || jsEvent.key === ' ')) {
      jsEvent.preventDefault();  // else the key would also act on what has the focus next
      openReservation(blockBookings.get(Number(block.dataset.reservationId)), block);
    }
  });
  calendarEl.addEventListener('mouseover', (jsEvent) => {
    const block = blockAt(jsEvent.target);
    if (block && !block.title) {
      block.title = describeBooking(blockBookings.get(Number(block.dataset.reservationId)));
    }
  });

  function element(tag, className, text) {
    const el = document.createElement(tag);
    el.className = className;
    el.textContent = text;
    return el;
  }

  const STATUS_WORDS = {pending: 'pending approval', offered: 'offered from the waitlist'};

  /** Who holds a booking, when and how: "alice, Thu, Dec 3, 10:00 to 12:00, approved". */
  function describeHolding(booking) {
    const ext = booking.ext;
    return [
      ext.mine ? `${booking.title} (you)` : booking.title,
      spokenPeriod(booking.startWall, booking.endWall),
      STATUS_WORDS[ext.status] ?? 'approved',
    ].join(', ');
  }

  /** A booking in words: "GPU 2 · A100 80 GB on gpu-a100, alice, Thu, Dec 3, 10:00 to 12:00, approved". */
  const describeBooking = (booking) => `${gpuIdsOf(booking).map(gpuLabel).join(', ')} on ${nodeOf(booking)}, ${describeHolding(booking)}`;

  function renderEvent({event, timeText, view}) {
    const ext = event.extendedProps;
    if (ext.kind === 'maintenance') {
      return {domNodes: [element('span', 'maintenance-label', event.title)]};
    }
    if (ext.kind === 'reserved') {  // capacity kept for a group: members and admins may still book inside
      return {domNodes: [element('span', 'reserved-label', event.title)]};
    }
    if (ext.kind === 'load') {
      return {domNodes: [element('span', 'load-label', ext.label)]};
    }
    if (ext.kind === 'run') {
      // Until the data of a new range arrives, EventCalendar draws the old range's runs cut to the new
      // one: their blocks would be squeezed into it.
      const current = msOf(wallOf(view.activeStart)) === ext.from && msOf(wallOf(view.activeEnd)) === ext.from + ext.span;
      return {domNodes: current ? [blocksOf(event)] : []};
    }
    if (ext.kind !== 'reservation') {
      return undefined;
    }
    const nodes = [];
    if (view.type === 'resourceTimelineDay' && timeText) {
      nodes.push(element('span', 'ec-event-time', timeText));
    }
    const note = {pending: ' (pending)', offered: ' (offered)'}[ext.status] || '';
    nodes.push(element('span', 'ec-event-title', event.title + note));
    nodes.push(element('span', 'visually-hidden', `: ${describeBooking(bookingOf(event))}`));
    return {domNodes: nodes};
  }

  function onEventMounted({el, event}) {
    const ext = event.extendedProps;
    if (ext.kind === 'reservation') {
      el.dataset.reservationId = ext.reservation;
    } else if (ext.kind === 'maintenance') {
      el.dataset.maintenanceId = ext.maintenance;
    } else if (ext.kind === 'reserved') {
      el.dataset.reservedId = ext.reserved;
      el.title = ext.member ? `${event.title}: you may book it` : `${event.title}: only its members book here`;
    }
  }

  function onEventHover({el, event}) {
    const ext = event.extendedProps;
    if (ext.kind === 'reservation') {
      el.title = describeBooking(bookingOf(event));
    }
  }

  // --- booking a slot --------------------------------------------------------------------------

  const booking = {
    dialog: $('booking-dialog'),
    form: $('booking-form'),
    node: $('booking-node'),
    gpuList: $('booking-gpu-list'),
    start: $('booking-start'),
    end: $('booking-end'),
    when: $('booking-when'),
    purpose: $('booking-purpose'),
    error: $('booking-error'),
    submit: $('booking-submit'),
  };
  booking.start.step = booking.end.step = String(config.grid_minutes * 60);

  /** The dialog's slot as the advice asks about it (static/js/slot_advice.js): how many cards, or slices of
   * one profile; null while it is incomplete, or for cards and slices (or two profiles) together. */
  function slotAsked() {
    const chosen = [...booking.gpuList.querySelectorAll('input:checked')].map((box) => gpus.get(Number(box.value)));
    const profiles = new Set(chosen.map((gpu) => gpu?.slice ?? ''));
    const start = booking.start.value;
    const end = booking.end.value;
    if (!chosen.length || profiles.size !== 1 || !start || !end || msOf(end) <= msOf(start)) {
      return null;
    }
    const [profile] = profiles;
    return {gpus: chosen.length, profile, start: instantOf(start), end: instantOf(end)};
  }

  function askAdvice() {
    const slot = slotAsked();
    if (slot) {
      window.GpuAdvice?.update(slot);
    } else {
      window.GpuAdvice?.reset();
    }
  }

  function takeSlot({node, gpus, start, end}) {
    if (node !== undefined) {
      fillNodes(node);
      fillGpus(node, gpus);
    }
    booking.start.value = toInputValue(wallAt(start));
    booking.end.value = toInputValue(wallAt(end));
    describeSlot();
    showError(booking.error, '');
    askAdvice();
    booking.submit.focus();
  }

  window.GpuAdvice?.init({
    api,
    period: (start, end) => formatPeriod(wallAt(start), wallAt(end)),
    useSlot: takeSlot,
    useLength: (start, hours) => takeSlot({start, end: Date.parse(start) + hours * 3600000}),
  });

  function fillNodes(selected) {
    booking.node.replaceChildren(...resources.map((node) => {
      const option = new Option(node.title, node.extendedProps.node);
      option.selected = node.extendedProps.node === selected;
      return option;
    }));
  }

  function fillGpus(nodeName, checked) {
    const node = resources.find((row) => row.extendedProps.node === nodeName);
    const items = bookableRows(node).map((gpu) => {
      const label = element('label', gpu.extendedProps.slice ? 'gpu-choice slice' : 'gpu-choice', '');
      const box = document.createElement('input');
      box.type = 'checkbox';
      box.name = 'gpus';
      box.value = gpu.extendedProps.gpu;
      box.checked = checked.includes(gpu.extendedProps.gpu);
      label.append(box, ` ${gpu.title}`);
      return label;
    });
    booking.gpuList.replaceChildren(...(items.length ? items : [element('p', 'help', 'This node has no GPUs.')]));
  }

  function describeSlot() {
    const start = booking.start.value;
    const end = booking.end.value;
    if (!start || !end || msOf(end) <= msOf(start)) {
      booking.when.textContent = `Times in ${zoneText}.`;
      return;
    }
    booking.when.textContent = `${formatPeriod(start, end)} (${formatDuration(msOf(end) - msOf(start))}), ${zoneText}.`;
  }

  let bookingOpener = null;

  function openBooking({node, gpu, startWall, endWall}) {
    bookingOpener = document.activeElement;
    const nodeName = node ?? resources.find((row) => row.extendedProps.bookable)?.extendedProps.node;
    fillNodes(nodeName);
    fillGpus(booking.node.value, gpu ? [gpu] : []);
    booking.start.value = toInputValue(startWall);
    booking.end.value = toInputValue(endWall);
    booking.purpose.value = '';
    window.GpuSeries?.reset();
    describeSlot();
    showError(booking.error, '');
    window.GpuAdvice?.reset();
    askAdvice();
    booking.dialog.showModal();
    const firstBox = booking.gpuList.querySelector('input');
    (gpu ? booking.purpose : (node && firstBox) || booking.node).focus();
  }

  function onSelect(info) {
    if (msOf(info.startStr) < floorToGrid(Date.now())) {
      calendar.unselect();
      showPageError('Past time cannot be booked: start a booking now or later.');
      return;
    }
    showPageError('');
    const ext = info.resource?.extendedProps ?? {};
    openBooking({
      node: ext.node, gpu: ext.kind === 'gpu' ? ext.gpu : null, startWall: info.startStr, endWall: info.endStr,
    });
  }

  booking.node.addEventListener('change', () => {
    fillGpus(booking.node.value, []);
    askAdvice();
  });
  booking.gpuList.addEventListener('change', askAdvice);
  for (const input of [booking.start, booking.end]) {
    input.addEventListener('input', () => {
      describeSlot();
      askAdvice();
    });
  }

  booking.form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const chosen = [...booking.gpuList.querySelectorAll('input:checked')].map((box) => Number(box.value));
    const start = booking.start.value;
    const end = booking.end.value;
    if (!chosen.length) {
      showError(booking.error, 'Choose at least one GPU.');
      return;
    }
    if (!start || !end) {
      showError(booking.error, 'Give a start and an end.');
      return;
    }
    if (msOf(end) <= msOf(start)) {
      showError(booking.error, 'The end must be after the start.');
      return;
    }
    const series = window.GpuSeries?.rule();
    if (series) {
      await bookSeries(series, chosen, start, end, event.submitter?.id === 'booking-preview');
      return;
    }
    showError(booking.error, '');
    booking.submit.disabled = true;
    try {
      const made = await api('POST', config.urls.reservations, {
        gpus: chosen, start: instantOf(start), end: instantOf(end), purpose: booking.purpose.value,
      });
      booking.dialog.close();
      calendar.refetchEvents();
      const which = made.gpus.map((gpu) => `GPU ${gpu.index}`).join(', ');
      const when = formatPeriod(wallAt(made.start), wallAt(made.end));
      announce(`Booked ${made.node} ${which}, ${when} (#${made.id})` +
        (made.status === 'pending' ? ': it waits for an admin\'s approval.' : '.'));
    } catch (error) {
      showError(booking.error, error.message);
      if (error.code === 'slot_conflict' || error.code === 'reserved') {  // taken, or kept for a group: wait
        offerWaitlist(booking.error, chosen, instantOf(start), instantOf(end));
        window.GpuAdvice?.refused(slotAsked());
      }
    } finally {
      booking.submit.disabled = false;
    }
  });

  /** A repeating booking (static/js/series_dialog.js): preview or book the series and show its report, which
   * stays in the dialog; a refused all-or-nothing series shows the report that says which occurrences. */
  async function bookSeries(series, gpus, start, end, previewOnly) {
    if (series.problem) {
      showError(booking.error, series.problem);
      return;
    }
    showError(booking.error, '');
    booking.submit.disabled = true;
    try {
      const made = await api('POST', config.urls.series, {
        gpus, start: instantOf(start), end: instantOf(end), purpose: booking.purpose.value, repeat: series.rule,
        mode: series.mode, timezone: config.time_zone.name, preview: previewOnly,
      });
      window.GpuSeries.showReport(made.report, made.series?.url);
      if (!previewOnly) {
        calendar.refetchEvents();
        announce(`Series #${made.series.id}: ${made.report.summary}`);
      }
    } catch (error) {
      window.GpuSeries.showReport(error.details?.occurrences ? error.details : null);
      showError(booking.error, error.message);
    } finally {
      booking.submit.disabled = false;
    }
  }

  /** After a "slot taken" refusal: a link to wait for those GPUs and that time (the waitlist page, prefilled). */
  function offerWaitlist(el, gpus, start, end) {
    const query = new URLSearchParams({gpus: gpus.join(','), start, end});
    const link = element('a', 'join-waitlist', 'Join the waitlist for it');
    link.href = `${config.urls.waitlist}?${query}`;
    el.append(' ', link);
  }

  /** Tab and Shift+Tab go round inside an open dialog, never out of it to the browser's own controls. */
  function keepFocusIn(dialog) {
    dialog.addEventListener('keydown', (jsEvent) => {
      if (jsEvent.key !== 'Tab') {
        return;
      }
      const stops = [...dialog.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')]
        .filter((el) => !el.disabled && el.tabIndex >= 0 && el.getClientRects().length);
      const at = stops.indexOf(document.activeElement);
      const edge = jsEvent.shiftKey ? 0 : stops.length - 1;
      if (stops.length && (at === edge || at < 0)) {
        jsEvent.preventDefault();
        stops[stops.length - 1 - edge].focus();
      }
    });
  }

  booking.dialog.addEventListener('close', () => {
    calendar.unselect();
    bookingOpener?.focus?.();
  });

  $('booking-close').addEventListener('click', () => booking.dialog.close());
  keepFocusIn(booking.dialog);

  $('new-booking').addEventListener('click', () => {
    const start = floorToGrid(Date.now());
    openBooking({node: null, gpu: null, startWall: wallAt(start), endWall: wallAt(start + HOUR_MS)});
  });

  // --- one booking: details and actions --------------------------------------------------------

  const held = {
    dialog: $('reservation-dialog'),
    title: $('reservation-title'),
    details: $('reservation-details'),
    actions: $('reservation-actions'),
    adminNote: $('reservation-admin-note'),
    cancel: $('reservation-cancel'),
    release: $('reservation-release'),
    extend: $('reservation-extend'),
    extendHour: $('reservation-extend-hour'),
    extendTo: $('reservation-extend-to'),
    end: $('reservation-end'),
    error: $('reservation-error'),
    page: $('reservation-page'),
  };
  held.end.step = String(config.grid_minutes * 60);
  let current = null;  // {id, ext, startWall, endWall}
  let heldOpener = null;

  function detail(term, value) {
    return [element('dt', '', term), element('dd', '', value)];
  }

  function openReservation(booking, opener) {
    const ext = booking.ext;
    current = {id: ext.reservation, ext, startWall: booking.startWall, endWall: booking.endWall};
    heldOpener = opener;
    held.title.textContent = ext.mine ? `Your booking #${ext.reservation}` : `Booked by ${booking.title}`;
    const rows = [
      ...detail('Holder', booking.title),
      ...detail('GPUs', `${nodeOf(booking)}: ${gpuIdsOf(booking).map(gpuLabel).join(', ')}`),
      ...detail('When', `${formatPeriod(current.startWall, current.endWall)}, ${zoneText}`),
    ];
    if (ext.status === 'pending') {
      rows.push(...detail('Status', 'Pending approval'));
    } else if (ext.status === 'offered') {
      // Held for someone on the waitlist; its holder claims (or declines) it on their waitlist page.
      const status = element('dd', '', 'Offered from the waitlist');
      if (ext.mine) {
        const claim = element('a', 'claim-offer', 'Claim or decline it on your waitlist');
        claim.href = config.urls.waitlist;
        status.append(': ', claim);
      }
      rows.push(element('dt', '', 'Status'), status);
    } else if (ext.mine || config.is_admin) {
      const running = msOf(current.startWall) <= Date.now() && Date.now() < msOf(current.endWall);
      rows.push(...detail('Status', running ? 'Approved, running now' : 'Approved'));
    }
    if (ext.purpose !== null && ext.purpose !== undefined) {
      rows.push(...detail('Purpose', ext.purpose || '—'));
    }
    held.details.replaceChildren(...rows);
    // The booking's own page: the server gives its address only to the holder and the admins.
    if (ext.url) {
      held.page.href = ext.url;
    } else {
      held.page.removeAttribute('href');
    }
    held.page.hidden = !ext.url;

    const acts = ext.can_cancel || ext.can_release || ext.can_extend;
    held.actions.hidden = !acts;
    held.adminNote.hidden = ext.mine || !config.is_admin;
    held.cancel.hidden = !ext.can_cancel;
    held.release.hidden = !ext.can_release;
    held.extend.hidden = !ext.can_extend;
    held.end.min = toInputValue(current.endWall);
    held.end.value = toInputValue(wallAt(msOf(current.endWall) + HOUR_MS));
    showError(held.error, '');
    held.dialog.showModal();
    // The heading, not a button: the key that opened the dialog must not land on "Release now".
    held.title.focus();
  }

  function onEventClick({event, el, jsEvent}) {
    if (event.extendedProps.kind === 'reservation') {
      // Opened with Enter: without this, the same key's keypress would activate whatever has the
      // focus next.
      if (jsEvent?.type === 'keydown') {
        jsEvent.preventDefault();
      }
      openReservation(bookingOf(event), el);
    }
  }

  async function act(action, body, done) {
    const buttons = held.dialog.querySelectorAll('button');
    showError(held.error, '');
    buttons.forEach((button) => { button.disabled = true; });
    try {
      const result = await api('POST', actionUrl(current.id, action), body);
      held.dialog.close();
      calendar.refetchEvents();
      announce(done(result));
    } catch (error) {
      showError(held.error, error.message);
    } finally {
      buttons.forEach((button) => { button.disabled = false; });
    }
  }

  const endsAt = (result) => formatWall(wallAt(result.end));
  // Where booking needs approval, so does an extension: the booking keeps its end meanwhile.
  const extended = (result) => (result.pending_extension
    ? `Extension of booking #${result.id} until ${endsAt(result.pending_extension)} requested ` +
      `(#${result.pending_extension.id}): it waits for an admin's approval; until then the booking ends ${endsAt(result)}.`
    : `Booking #${result.id} now ends ${endsAt(result)} (extended).`);

  held.cancel.addEventListener('click', () => act('cancel', {}, (r) => (r.extends
    ? `Extension request #${r.id} withdrawn.` : `Booking #${r.id} cancelled.`)));
  held.release.addEventListener('click', () => act('release', {}, (r) => `Booking #${r.id} released at ${endsAt(r)}.`));
  held.extendHour.addEventListener('click', () => {
    const end = new Date(msOf(current.endWall) + HOUR_MS).toISOString();
    act('extend', {end}, extended);
  });
  held.extendTo.addEventListener('click', () => {
    if (!held.end.value) {
      showError(held.error, 'Give the new end.');
      return;
    }
    act('extend', {end: instantOf(held.end.value)}, extended);
  });
  $('reservation-close').addEventListener('click', () => held.dialog.close());
  keepFocusIn(held.dialog);
  held.dialog.addEventListener('close', () => {
    if (heldOpener?.isConnected) {
      heldOpener.focus();
    }
  });

  /** Dragging the end of a booking extends it; a refusal puts the end back and says why. */
  async function onResize(info) {
    const ext = info.event.extendedProps;
    const end = instantOf(wallOf(info.event.end));
    if (!ext.can_extend || Date.parse(end) <= msOf(wallOf(info.oldEvent.end))) {
      info.revert();
      return;
    }
    try {
      const result = await api('POST', actionUrl(ext.reservation, 'extend'), {end});
      showPageError('');
      announce(extended(result));
      calendar.refetchEvents();
    } catch (error) {
      info.revert();
      showPageError(`Booking #${ext.reservation} was not extended: ${error.message}`);
    }
  }

  // --- row labels (see "Narrow screens") -------------------------------------------------------

  const rowTip = $('row-tip');

  /** A row's label: a GPU's is "GPU 0" and the rest of its name, which narrow screens show only on focus. */
  function rowLabel(resource) {
    const title = resource.title;
    const ext = resource.extendedProps ?? {};
    const short = `GPU ${ext.index}`;
    const label = element('span', 'row-label', '');
    label.title = title;
    label.dataset.row = resource.id;  // the slot cursor finds a row by it (slot_cursor.js)
    if (ext.kind !== 'gpu' || !title.startsWith(short)) {
      label.textContent = title;
      return label;
    }
    label.append(element('span', 'row-short', short), element('span', 'row-rest', title.slice(short.length)));
    label.classList.toggle('unbookable', !ext.bookable);
    label.dataset.full = title;
    if (NARROW.matches) {
      label.tabIndex = 0;  // on a phone the keyboard (or a tap) is how the full name is reached
    }
    return label;
  }

  NARROW.addEventListener('change', () => {
    for (const label of calendarEl.querySelectorAll('.row-label[data-full]')) {
      NARROW.matches ? (label.tabIndex = 0) : label.removeAttribute('tabindex');
    }
  });

  function showRowTip(label) {
    const box = label.getBoundingClientRect();
    rowTip.textContent = label.dataset.full;
    rowTip.style.left = `${Math.max(4, box.left)}px`;
    rowTip.style.top = `${box.bottom + 2}px`;
    rowTip.hidden = false;
  }

  calendarEl.addEventListener('focusin', (jsEvent) => {
    const label = jsEvent.target.closest?.('.row-label[data-full]');
    if (label && NARROW.matches) {
      showRowTip(label);
    }
  });
  calendarEl.addEventListener('focusout', () => { rowTip.hidden = true; });

  /** The tip is placed on the page (it would be clipped inside the grid): it follows its label's moves. */
  function followRowTip() {
    const label = document.activeElement;
    if (!rowTip.hidden && label?.matches?.('.row-label[data-full]')) {
      showRowTip(label);
    }
  }
  window.addEventListener('scroll', followRowTip, {passive: true});

  // --- where the grid opens, and its scroll shadows (see "Opening on now") -----------------------

  const frameEl = $('calendar-frame');
  const hintEl = $('scroll-hint');
  const HINT_KEY = 'gpu-calendar-scrolled';
  let placedLeft = null;  // where placeView put the grid: a scroll away from it is the person's

  const mainOf = () => calendarEl.querySelector('.ec-main');
  const sidebarOf = (main) => main.querySelector('.ec-header .ec-sidebar')?.offsetWidth ?? 0;

  /** Scrolls the grid to where this range opens: now at a third when it starts today, else its first morning. */
  function placeView() {
    const main = mainOf();
    if (!main) {
      return;
    }
    const view = calendar.getView();
    const from = msOf(wallOf(view.activeStart));
    const to = msOf(wallOf(view.activeEnd));
    const sidebar = sidebarOf(main);
    const perMs = (main.scrollWidth - sidebar) / (to - from);
    const visible = main.clientWidth - sidebar;
    const now = Date.now();
    let left;
    if (now >= from && now < from + DAY_MS) {
      left = (now - from) * perMs - visible / 3;
    } else {
      left = view.type === VIEWS[0] ? FIRST_MORNING_HOUR * HOUR_MS * perMs : 0;
    }
    // To the nearest label's edge, so that the first label shows whole.
    const step = main.querySelector('.ec-header .ec-slot')?.getBoundingClientRect().width || HOUR_MS * perMs;
    left = Math.max(0, Math.min(Math.round(left / step) * step, main.scrollWidth - main.clientWidth));
    main.scrollLeft = left;
    placedLeft = main.scrollLeft;
    showEdges();
  }

  /** Shadows on the grid's edges where more hours lie beyond them; labels cut by an edge hidden. */
  function showEdges() {
    const main = mainOf();
    if (!main) {
      return;
    }
    const frame = frameEl.getBoundingClientRect();
    const box = main.getBoundingClientRect();
    const sidebar = sidebarOf(main);
    const room = main.scrollWidth - main.clientWidth;
    const left = Math.abs(main.scrollLeft);
    // Day names and hour labels keep to their column's visible part (calendar.css), so only the last
    // sliver of a column, narrower than its label, cuts one: that label goes rather than show "0:00".
    const from = box.left + sidebar - 0.5;
    const to = box.left + main.clientWidth + 0.5;
    for (const label of main.querySelectorAll('.ec-header time')) {
      const at = label.getBoundingClientRect();
      label.style.visibility = at.left < from || at.right > to ? 'hidden' : '';
    }
    frameEl.style.setProperty('--edge-top', `${box.top - frame.top}px`);
    frameEl.style.setProperty('--edge-height', `${main.clientHeight}px`);
    frameEl.style.setProperty('--edge-start', `${box.left - frame.left + sidebar}px`);
    frameEl.style.setProperty('--edge-end', `${frame.right - box.left - main.clientWidth}px`);
    frameEl.classList.toggle('more-before', left > 1);
    frameEl.classList.toggle('more-after', left < room - 1);
  }

  function hideHint() {
    hintEl.hidden = true;
    try {
      localStorage.setItem(HINT_KEY, '1');
    } catch {
      // Storage may be off: the hint comes back on the next visit then.
    }
  }

  try {
    hintEl.hidden = localStorage.getItem(HINT_KEY) === '1';
  } catch {
    hintEl.hidden = false;
  }

  let edgesQueued = false;
  // Scroll events do not bubble, but a capturing listener sees those of the grid, whichever view drew it.
  calendarEl.addEventListener('scroll', (jsEvent) => {
    if (!jsEvent.target.classList?.contains('ec-main')) {
      return;
    }
    followRowTip();
    slotCursor.follow();
    if (!hintEl.hidden && placedLeft !== null && Math.abs(jsEvent.target.scrollLeft - placedLeft) > 24) {
      hideHint();
    }
    if (!edgesQueued) {
      edgesQueued = true;
      requestAnimationFrame(() => {
        edgesQueued = false;
        showEdges();
      });
    }
  }, true);
  new ResizeObserver(() => showEdges()).observe(calendarEl);

  /** "Today": today's range, scrolled as on opening (EventCalendar's own button is off while today shows). */
  function goToday() {
    calendar.setOption('date', wallAt(Date.now()).slice(0, 10));
    requestAnimationFrame(placeView);
  }

  // --- the keyboard path (static/js/slot_cursor.js) --------------------------------------------

  /** What lies on a GPU's row between two instants: a booking (which opens), maintenance or a reserved window. */
  function whatLiesAt(rowId, from, to) {
    const on = (event) => event.resourceIds.includes(rowId) || event.resourceIds.includes(nodeRowOf.get(rowId));
    const overlaps = (start, end) => start < to && end > from;
    const opener = $('slot-cursor');
    for (const event of calendar.getEvents()) {
      const ext = event.extendedProps;
      // A reserved window on a node's row keeps some of its GPUs, not this one: only one on this row counts.
      const here = ext.kind === 'reserved' ? event.resourceIds.includes(rowId) : on(event);
      if (!['reservation', 'maintenance', 'reserved'].includes(ext.kind) || !here
          || !overlaps(msOf(wallOf(event.start)), msOf(wallOf(event.end)))) {
        continue;
      }
      if (ext.kind === 'reservation') {
        const held = bookingOf(event);
        return {text: `booked by ${describeHolding(held)}`, open: () => openReservation(held, opener)};
      }
      if (ext.kind === 'maintenance') {
        return {text: `maintenance: ${event.title}`, open: () => announce(`Maintenance: ${event.title}.`)};
      }
      if (!ext.member) {
        return {text: `${event.title}, only its members book here`, open: () => announce(`${event.title}: only its members book here.`)};
      }
    }
    for (const held of blockBookings.values()) {
      if (held.resourceIds.includes(rowId) && overlaps(held.startMs, held.endMs)) {
        return {text: `booked by ${describeHolding(held)}`, open: () => openReservation(held, opener)};
      }
    }
    return null;
  }

  /** The booking dialog for the cursor's slot (from now on, when its hour has begun), or why not. */
  function bookFromCursor(rowId, from, to) {
    const gpu = gpus.get(Number(rowId.slice(4)));
    const start = Math.max(from, floorToGrid(Date.now()));
    if (!gpu?.bookable) {
      return 'This GPU cannot be booked now.';
    }
    if (start >= to) {
      return 'Past time cannot be booked: start a booking now or later.';
    }
    openBooking({node: gpu.node, gpu: gpu.gpu, startWall: wallAt(start), endWall: wallAt(to)});
    return null;
  }

  const slotCursor = window.GpuSlotCursor.attach({
    calendarEl, frameEl, cursorEl: $('slot-cursor'),
    range: () => visibleRange(),
    row: (id) => {
      const gpu = gpus.get(Number(id.slice(4)));
      return {label: gpu?.title ?? id, node: gpu?.node ?? '', bookable: Boolean(gpu?.bookable)};
    },
    at: whatLiesAt,
    period: (from, to) => spokenPeriod(wallAt(from), wallAt(to)),
    dayStart: (ms) => msOf(`${wallAt(ms).slice(0, 10)}T00:00`),
    now: () => Date.now(),
    book: bookFromCursor,
    showDay: (ms) => calendar.setOption('date', wallAt(ms).slice(0, 10)),
  });

  // --- the calendar ----------------------------------------------------------------------------

  function savedView() {
    try {
      const view = localStorage.getItem(VIEW_KEY);
      return VIEWS.includes(view) ? view : VIEWS[0];
    } catch {
      return VIEWS[0];
    }
  }

  // --- the grid for assistive technology (see "Accessibility") ----------------------------------

  const TABLE_PARTS = '[role="table"], [role="rowgroup"], [role="row"], [role="cell"], [role="columnheader"], [role="rowheader"]';

  /** EventCalendar's table roles taken off (they describe no table: see "Accessibility"). */
  function plainGrid(records) {
    if (records && records.every((record) => record.target.closest?.('.run-blocks'))) {
      return;  // only blocks were added (a crowded range's rows coming near): no table parts among them
    }
    for (const el of calendarEl.querySelectorAll(TABLE_PARTS)) {
      el.removeAttribute('role');
      el.removeAttribute('aria-colindex');
    }
    for (const aside of calendarEl.querySelectorAll('aside.ec-sidebar:not([role])')) {
      aside.setAttribute('role', 'none');  // not a landmark: the row labels' column
    }
    calendarEl.querySelector('nav.ec-toolbar:not([aria-label])')?.setAttribute('aria-label', 'Calendar days');
  }
  new MutationObserver(plainGrid).observe(calendarEl, {childList: true, subtree: true, attributes: true, attributeFilter: ['role']});

  const nowWall = wallAt(Date.now());
  const grid = {minutes: config.grid_minutes};

  const calendar = EventCalendar.create(calendarEl, {
    view: savedView(),
    // Today in the reader's zone, not the browser's: at 23:30 UTC a Berlin laptop is already on
    // tomorrow, and the calendar opened there.
    date: nowWall.slice(0, 10),
    headerToolbar: {start: 'prev,next now', center: 'title', end: VIEWS.join(',')},
    customButtons: {now: {text: 'Today', click: goToday}},
    buttonText: (text) => ({...text, resourceTimelineDay: 'Day', resourceTimelineWeek: 'Week'}),
    timeZone: OFFSET,
    firstDay: 1,
    height: 'max(28rem, calc(100vh - 15rem))',
    resources: rows(),
    eventSources: [{events: loadEvents}],
    // Each view loads exactly its range (the day view does not reuse the week's data): runs span it.
    lazyFetching: false,
    nowIndicator: true,
    // Roughly where placeView() puts the grid once it is drawn (EventCalendar scrolls first).
    scrollTime: `${pad(Math.max(0, Number(nowWall.slice(11, 13)) - 6))}:00:00`,
    slotDuration: grid,
    snapDuration: grid,
    slotLabelFormat: {hour: '2-digit', minute: '2-digit', hourCycle: 'h23'},
    eventTimeFormat: {hour: '2-digit', minute: '2-digit', hourCycle: 'h23'},
    views: {
      resourceTimelineDay: {
        duration: {days: DAY_VIEW_DAYS}, dateIncrement: {days: 1},
        slotDuration: grid, slotWidth: 14, slotLabelInterval: '01:00',
        dayHeaderFormat: {weekday: 'long', day: 'numeric', month: 'long'},
      },
      // Seven days from its date (a duration in days, not weeks, is not moved back to firstDay).
      resourceTimelineWeek: {
        duration: {days: 7},
        slotDuration: '01:00', slotWidth: 12, slotLabelInterval: '06:00',
        dayHeaderFormat: {weekday: 'short', day: 'numeric', month: 'short'},
      },
    },
    resourceLabelContent: ({resource}) => ({domNodes: [rowLabel(resource)]}),
    selectable: true,
    selectConstraint: (info) => msOf(info.startStr) >= floorToGrid(Date.now()),
    select: onSelect,
    unselectCancel: '.calendar-dialog',
    // Nothing can be moved; whether an end can be dragged is each event's own `editable` (the API sets
    // it on the bookings one may extend): null here defers to it.
    editable: false,
    eventStartEditable: false,
    eventDurationEditable: null,
    resizeConstraint: (info) => info.event.end >= info.oldEvent.end,
    eventResize: onResize,
    eventClick: onEventClick,
    eventClassNames: ({event}) => (event.extendedProps.kind === 'reservation' ? ['booking'] : []),
    eventContent: renderEvent,
    eventDidMount: onEventMounted,
    eventMouseEnter: onEventHover,
    resourceExpand: ({resource}) => {
      resource.expanded ? collapsedNodes.delete(resource.id) : collapsedNodes.add(resource.id);
    },
    loading: (busy) => {
      calendarEl.setAttribute('aria-busy', String(busy));
      if (!busy) {
        loaded();
      }
    },
    datesSet: (info) => {
      placedLeft = null;  // EventCalendar's own scroll to the new range is not the person's
      requestAnimationFrame(() => {  // once EventCalendar has drawn the new range and scrolled it
        placeView();
        slotCursor.reveal();
      });
      try {
        localStorage.setItem(VIEW_KEY, info.view.type);
      } catch {
        // Storage may be off; the day view is the default then.
      }
    },
  });

  // Keep the shaded past current while the page stays open (and catch up if the live updates below
  // ever missed something).
  setInterval(() => {
    if (!document.hidden && !booking.dialog.open && !held.dialog.open) {
      calendar.refetchEvents();
    }
  }, REFRESH_MS);

  // --- live updates ----------------------------------------------------------------------------
  // The websocket topic "calendar" (static/js/live.js, docs/live.md) says where and when bookings or
  // maintenance changed, never what: when it touches the visible range, the range is loaded again
  // from the API, which shows this user what it always does. A burst of changes is one load, and
  // none happens under an open dialog (the person's choices stay put) but once it closes.

  const visibleRange = () => {
    const view = calendar.getView();
    return [msOf(wallOf(view.activeStart)), msOf(wallOf(view.activeEnd))];
  };
  let liveTimer = null;
  let missed = false;
  let changedOn = null;  // the nodes whose bookings changed since the last load (a Set), or null

  /** A load finished: the cursor says what lies under it now, and others' changes are said politely
   * (not the person's own, which announce() has just said), once per load. */
  function loaded() {
    slotCursor.refresh();
    if (changedOn && Date.now() - announcedAt > 5000) {
      const nodes = [...changedOn].filter(Boolean).sort();
      $('calendar-news').textContent = nodes.length
        ? `Bookings changed on ${nodes.join(', ')}; the calendar shows them.` : 'Bookings changed; the calendar shows them.';
    }
    changedOn = null;
  }

  function reloadSoon() {
    clearTimeout(liveTimer);
    liveTimer = setTimeout(() => {
      if (booking.dialog.open || held.dialog.open) {
        missed = true;
      } else {
        missed = false;
        calendar.refetchEvents();
      }
    }, LIVE_RELOAD_DELAY_MS);
  }

  for (const dialog of [booking.dialog, held.dialog]) {
    dialog.addEventListener('close', () => missed && reloadSoon());
  }

  let connections = 0;
  GpuLive.connect({
    topics: ['calendar'],
    stateEl: $('live-state'),
    onOpen() {
      connections += 1;
      if (connections > 1) {
        reloadSoon();  // back after a lost connection: whatever happened meanwhile
      }
    },
    onMessage(message) {
      if (message.type !== 'calendar') {
        return;
      }
      const [from, to] = visibleRange();
      if (!message.start || !message.end || (Date.parse(message.start) < to && Date.parse(message.end) > from)) {
        (changedOn ??= new Set()).add(message.node ?? '');
        reloadSoon();
      }
    },
  });
})();
