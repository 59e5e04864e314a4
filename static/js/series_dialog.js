/* Repeating bookings in the calendar's booking dialog (templates/reservations/calendar.html).
 *
 * The "Repeat" fieldset turns a booking into a series (POST /api/v1/series/, docs/api.md): none, every
 * day, every weekday, every week (until a last day), or a custom RFC 5545 rule. calendar.js asks rule()
 * when the form is submitted: null books one slot as before; otherwise it posts the series, with
 * preview: true from the Preview button, and shows the per-occurrence report with showReport() (before
 * booking, and after it, or with a refused all-or-nothing series).
 */
'use strict';

window.GpuSeries = (() => {
  const $ = (id) => document.getElementById(id);
  const kind = $('booking-repeat');
  const until = $('booking-until');
  const custom = $('booking-rule');
  const report = $('booking-report');
  const preview = $('booking-preview');
  const ZONE = JSON.parse($('calendar-config').textContent).time_zone.name;
  // The report's times in the user's own zone, DST included (the calendar grid uses today's offset).
  const dayTime = new Intl.DateTimeFormat(undefined, {
    timeZone: ZONE, weekday: 'short', day: 'numeric', month: 'short', year: 'numeric', hour: '2-digit', minute: '2-digit',
    hourCycle: 'h23',
  });
  const timeOnly = new Intl.DateTimeFormat(undefined, {timeZone: ZONE, hour: '2-digit', minute: '2-digit', hourCycle: 'h23'});
  const wallPeriod = (start, end) => `${dayTime.format(new Date(start))}–${timeOnly.format(new Date(end))}`;
  const RULES = {daily: 'FREQ=DAILY', weekdays: 'FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR', weekly: 'FREQ=WEEKLY'};
  const OUTCOMES = {
    booked: 'booked',
    bookable: 'can be booked',
    refused: 'refused',
    later: 'not booked yet (beyond how far ahead you may book; booked when within reach)',
    held_back: 'not booked (all or nothing)',
  };

  function showChoices() {
    const repeating = kind.value !== 'none';
    document.querySelectorAll('[data-repeat-only]').forEach((el) => { el.hidden = !repeating; });
    document.querySelectorAll('[data-repeat-custom]').forEach((el) => { el.hidden = kind.value !== 'custom'; });
    until.closest('[data-repeat-only]').hidden = !repeating || kind.value === 'custom';
    preview.hidden = !repeating;
    showReport(null);
  }

  /** The rule asked for, {rule, mode} or {problem}, or null when the booking does not repeat. */
  function rule() {
    if (kind.value === 'none') {
      return null;
    }
    const mode = document.querySelector('input[name="series-mode"]:checked')?.value ?? 'all';
    if (kind.value === 'custom') {
      const text = custom.value.trim();
      return text ? {rule: text, mode} : {problem: 'Give the repeat rule, e.g. FREQ=WEEKLY;BYDAY=MO;UNTIL=20270331.'};
    }
    if (!until.value) {
      return {problem: 'Choose the last day the booking repeats on (Until).'};
    }
    return {rule: `${RULES[kind.value]};UNTIL=${until.value.replaceAll('-', '')}`, mode};
  }

  function item(occurrence) {
    const li = document.createElement('li');
    li.className = `outcome-${occurrence.outcome}`;
    const number = occurrence.reservation ? ` #${occurrence.reservation}` : '';
    const status = occurrence.status === 'pending' ? ', waits for approval' : '';
    li.textContent = `${wallPeriod(occurrence.start, occurrence.end)}: ${OUTCOMES[occurrence.outcome] ?? occurrence.outcome}${number}${status}`;
    if (occurrence.message) {
      li.textContent += ` — ${occurrence.message}`;
    }
    if (occurrence.note) {
      li.textContent += ` (${occurrence.note})`;
    }
    return li;
  }

  /** Shows a series report (the API's `report`), with a link to the series' page once booked; null hides it. */
  function showReport(result, seriesUrl) {
    if (!result) {
      report.hidden = true;
      report.replaceChildren();
      return;
    }
    const head = document.createElement('p');
    head.className = 'series-summary';
    head.textContent = (result.preview ? 'Preview: ' : '') + result.summary;
    const list = document.createElement('ol');
    list.append(...result.occurrences.map(item));
    report.replaceChildren(head, list);
    if (seriesUrl) {
      const link = document.createElement('a');
      link.href = seriesUrl;
      link.textContent = `Open series #${result.series}`;
      report.append(link);
    }
    report.hidden = false;
  }

  function reset() {
    kind.value = 'none';
    until.value = '';
    custom.value = '';
    showChoices();
  }

  kind.addEventListener('change', showChoices);
  showChoices();
  return {rule, showReport, reset};
})();
