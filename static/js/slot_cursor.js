/* The calendar's keyboard path (templates/reservations/calendar.html): a slot cursor over the grid.
 *
 * EventCalendar selects time with the mouse only, and its grid has no element per GPU and hour to
 * focus. So the grid has one tab stop of our own, a cursor: a box over one GPU's row and a span of
 * hours, moved with the keys below. Its accessible name says where it is and what lies there ("GPU 1 ·
 * A100 80 GB on gpu-a100, Thu, Dec 3, 10:00 to 11:00, free"), and changes as it moves; Enter books
 * that slot (the booking dialog opens with that GPU and time) or opens the booking that lies there.
 * The dialogs give the focus back to it when they close.
 *
 *   ↑ ↓            the GPU above or below (rows of collapsed nodes are skipped: they are not drawn)
 *   ← →            an hour earlier or later (past the shown days, the calendar moves with it)
 *   Shift+← →      an hour shorter or longer
 *   Page Up/Down   a day earlier or later
 *   Home / End     the first or last hour of its day
 *   Enter, Space   book the slot, or open the booking on it
 *
 * The cursor lives beside EventCalendar's markup, not in it (the library redraws its rows), and is
 * placed from the row's label (top and height) and the view's time scale (left and width); it scrolls
 * the grid to stay in view and follows the grid when it is scrolled. calendar.js attaches it with what
 * it needs (GpuSlotCursor.attach(host)); this file knows nothing of the API or of bookings' details.
 */
'use strict';

window.GpuSlotCursor = {
  /**
   * host: {
   *   calendarEl, frameEl, cursorEl,
   *   range() -> [fromMs, toMs] shown,
   *   row(id) -> {label, node, bookable} of a GPU row ("gpu-12"),
   *   at(id, fromMs, toMs) -> {text, open()} of what lies there, or null,
   *   period(fromMs, toMs) -> the span in words, dayStart(ms) -> its day's midnight,
   *   now() -> ms, book(id, fromMs, toMs) -> null, or why it cannot be booked,
   *   showDay(ms) -> show the days from ms's day on,
   * }
   */
  attach(host) {
    const HOUR_MS = 3600000;
    const DAY_MS = 24 * HOUR_MS;
    const {calendarEl, frameEl, cursorEl} = host;
    const slot = {row: null, start: null, length: HOUR_MS};
    let refusal = '';  // why Enter did nothing, said once

    const labels = () => [...calendarEl.querySelectorAll('.row-label[data-row^="gpu-"]')];
    const headOf = (id) => calendarEl.querySelector(`.row-label[data-row="${CSS.escape(id)}"]`)?.closest('.ec-row-head');
    const mainOf = () => calendarEl.querySelector('.ec-main');

    /** Where it starts when first focused: the first GPU, now's hour when now is shown, else 07:00. */
    function start() {
      const [from, to] = host.range();
      const now = host.now();
      slot.start = now >= from && now < to ? Math.floor(now / HOUR_MS) * HOUR_MS : from + 7 * HOUR_MS;
      slot.row = labels()[0]?.dataset.row ?? null;
    }

    function describe() {
      if (!slot.row) {
        return 'No GPUs to book.';
      }
      const row = host.row(slot.row);
      const end = slot.start + slot.length;
      const where = `${row.label} on ${row.node}, ${host.period(slot.start, end)}`;
      const there = host.at(slot.row, slot.start, end);
      let what;
      if (there) {
        what = `${there.text}. Enter opens it`;
      } else if (!row.bookable) {
        what = 'not bookable';
      } else if (end <= host.now()) {
        what = 'past';
      } else if (slot.start < host.now()) {
        what = 'free. Enter books it from now';
      } else {
        what = 'free. Enter books it';
      }
      return `${where}: ${what}.${refusal ? ` ${refusal}` : ''}`;
    }

    /** Lays the cursor over its slot; with ``reveal``, scrolls the grid first so the slot shows. */
    function place(reveal) {
      const main = mainOf();
      const head = slot.row && headOf(slot.row);
      if (!main || !head) {
        cursorEl.classList.remove('placed');
        return;
      }
      const [from, to] = host.range();
      const sidebar = main.querySelector('.ec-header .ec-sidebar')?.offsetWidth ?? 0;
      const perMs = (main.scrollWidth - sidebar) / (to - from);
      const left = (slot.start - from) * perMs;
      const width = slot.length * perMs;
      const visible = main.clientWidth - sidebar;
      if (reveal) {
        bringIntoView(main, head, left, width, visible);
      }
      const box = main.getBoundingClientRect();
      const row = head.getBoundingClientRect();
      // The last row stretches to the grid's bottom: it is as tall as the first (a node's) instead.
      const last = !head.nextElementSibling;
      const height = last ? Math.min(row.height, head.parentElement.firstElementChild.offsetHeight) : row.height;
      const frame = frameEl.getBoundingClientRect();
      // Cut to the visible hours, so that it never covers the row labels.
      const x0 = Math.max(left - main.scrollLeft, 0);
      const x1 = Math.min(left + width - main.scrollLeft, visible);
      Object.assign(cursorEl.style, {
        left: `${box.left - frame.left + sidebar + x0}px`, width: `${Math.max(x1 - x0, 4)}px`,
        top: `${row.top - frame.top}px`, height: `${height}px`,
      });
      cursorEl.classList.add('placed');
    }

    function bringIntoView(main, head, left, width, visible) {
      if (left < main.scrollLeft || width > visible) {
        main.scrollLeft = left;
      } else if (left + width > main.scrollLeft + visible) {
        main.scrollLeft = left + width - visible;
      }
      const header = main.querySelector('.ec-header')?.offsetHeight ?? 0;
      const box = main.getBoundingClientRect();
      const row = head.getBoundingClientRect();
      if (row.top < box.top + header) {
        main.scrollTop -= box.top + header - row.top;
      } else if (row.bottom > box.top + main.clientHeight) {
        main.scrollTop += row.bottom - (box.top + main.clientHeight);
      }
    }

    function show() {
      cursorEl.setAttribute('aria-label', describe());
      place(true);
      cursorEl.scrollIntoView({block: 'nearest', inline: 'nearest'});
    }

    /** Moves the slot; past the shown days the calendar moves too (and the cursor is placed once drawn). */
    function moveTo(startMs) {
      slot.start = startMs;
      const [from, to] = host.range();
      if (slot.start < from || slot.start + slot.length > to) {
        host.showDay(slot.start);
      }
    }

    function moveRow(step) {
      const rows = labels().map((label) => label.dataset.row);
      const at = rows.indexOf(slot.row);
      slot.row = rows[Math.min(rows.length - 1, Math.max(0, (at < 0 ? 0 : at) + step))] ?? null;
    }

    const KEYS = {
      ArrowUp: () => moveRow(-1),
      ArrowDown: () => moveRow(1),
      ArrowLeft: (shift) => (shift ? (slot.length = Math.max(HOUR_MS, slot.length - HOUR_MS)) : moveTo(slot.start - HOUR_MS)),
      ArrowRight: (shift) => (shift ? (slot.length = Math.min(7 * DAY_MS, slot.length + HOUR_MS)) : moveTo(slot.start + HOUR_MS)),
      PageUp: () => moveTo(slot.start - DAY_MS),
      PageDown: () => moveTo(slot.start + DAY_MS),
      Home: () => moveTo(host.dayStart(slot.start)),
      End: () => moveTo(host.dayStart(slot.start) + DAY_MS - slot.length),
    };

    function act() {
      const end = slot.start + slot.length;
      const there = host.at(slot.row, slot.start, end);
      if (there) {
        there.open();
        return;
      }
      refusal = host.book(slot.row, slot.start, end) ?? '';
      if (refusal) {
        cursorEl.setAttribute('aria-label', describe());
      }
    }

    cursorEl.addEventListener('focus', () => {
      if (slot.start === null || !headOf(slot.row)) {
        start();
      }
      show();
    });
    cursorEl.addEventListener('blur', () => cursorEl.classList.remove('placed'));
    cursorEl.addEventListener('keydown', (jsEvent) => {
      if (!slot.row || jsEvent.altKey || jsEvent.ctrlKey || jsEvent.metaKey) {
        return;
      }
      if (jsEvent.key === 'Enter' || jsEvent.key === ' ') {
        jsEvent.preventDefault();  // else Space scrolls the page, and Enter's keypress acts on the dialog
        act();
        return;
      }
      const move = KEYS[jsEvent.key];
      if (move) {
        jsEvent.preventDefault();
        refusal = '';
        move(jsEvent.shiftKey);
        show();
      }
    });

    const focused = () => document.activeElement === cursorEl;
    return {
      /** The grid was drawn again: bring the slot into view and lay the cursor over it. */
      reveal: () => focused() && place(true),
      /** The grid was scrolled: the cursor follows its slot. */
      follow: () => focused() && place(false),
      /** The bookings were loaded again: say what lies under the cursor now. */
      refresh: () => focused() && show(),
    };
  },
};
