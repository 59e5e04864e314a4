/* Advice in the calendar's booking dialog (templates/reservations/calendar.html): how long to book, from the
 * person's own past bookings of as many GPUs (GET /api/v1/me/length-advice/), and free slots nearby when the
 * slot asked is refused or falls in the week's busiest hours (GET /api/v1/availability/suggest/), ranked by
 * past demand and energy price with the figures they were ranked on. Advice only: the booking is decided by
 * the API when the form is sent.
 *
 * calendar.js calls init() with its API caller, a way to show a period and a way to take a suggested slot
 * into the form; update() whenever the GPUs or the times change (debounced), refused() after the API refused
 * the slot as taken, and reset() when the dialog opens.
 */
'use strict';

window.GpuAdvice = (() => {
  const $ = (id) => document.getElementById(id);
  const config = JSON.parse($('calendar-config').textContent);
  const lengthEl = $('booking-length');
  const box = $('booking-suggestions');
  const intro = $('booking-suggest-intro');
  const list = $('booking-suggestion-list');
  const ranking = $('booking-suggest-ranking');
  const WAIT_MS = 400;
  let hooks = null;
  let timer = null;
  let asked = 0;  // answers to an older question are dropped

  const init = (given) => { hooks = given; };

  function reset() {
    clearTimeout(timer);
    asked += 1;
    lengthEl.replaceChildren();
    lengthEl.hidden = true;
    box.hidden = true;
  }

  /** ``slot``: {gpus: how many, profile: of MIG slices ('' for cards), start, end: instants with their offset}. */
  function update(slot) {
    clearTimeout(timer);
    timer = setTimeout(() => load(slot, false), WAIT_MS);
  }

  function refused(slot) {
    clearTimeout(timer);
    if (slot) {
      load(slot, true);
    } else {
      reset();
    }
  }

  async function load({gpus, profile, start, end}, wasRefused) {
    const ticket = ++asked;
    const hours = (Date.parse(end) - Date.parse(start)) / 3600000;
    if (!hooks) {
      return;
    }
    const rounded = hours.toFixed(2);
    const nearbyQuery = new URLSearchParams({gpus, hours: rounded, start, ...(profile ? {profile} : {})});
    const [length, nearby] = await Promise.allSettled([
      // The history of whole cards only: a slice's busy time says little about a card's.
      profile ? Promise.resolve(null) : hooks.api('GET', `${config.urls.length_advice}?${new URLSearchParams({gpus, hours: rounded})}`),
      hooks.api('GET', `${config.urls.suggest}?${nearbyQuery}`),
    ]);
    if (ticket !== asked) {
      return;
    }
    showLength(length.value, hours, start);
    showSuggestions(nearby.value, wasRefused);
  }

  function showLength(advice, hours, start) {
    const lines = [];
    if (advice?.advice) {
      lines.push(advice.advice);
    } else if (advice?.suggested_hours) {
      lines.push(`Your last ${advice.bookings} bookings of ${advice.gpus} GPU${advice.gpus === 1 ? '' : 's'} were busy ` +
        `${advice.mean_busy_hours.toFixed(1)} h on average.`);
    }
    lengthEl.replaceChildren(...lines.map((line) => document.createTextNode(line)));
    const proposed = advice?.suggested_hours;
    if (proposed && proposed <= hours - 0.25) {  // advice to book less, never more
      const take = document.createElement('button');
      take.type = 'button';
      take.className = 'link-button';
      take.textContent = `Book ${proposed} h instead`;
      take.addEventListener('click', () => hooks.useLength(start, proposed));
      lengthEl.append(' ', take);
    }
    lengthEl.hidden = !lines.length;
  }

  function showSuggestions(answer, wasRefused) {
    if (!answer || !(answer.offer || wasRefused) || !answer.suggestions.length) {
      box.hidden = true;
      return;
    }
    const asked = answer.asked;
    intro.textContent = wasRefused ? 'Free slots nearby:'
      : !asked.free ? 'No node has room for this slot. Free slots nearby:'
        : `This slot is in the week's busiest hours (${asked.why}). Quieter free slots:`;
    list.replaceChildren(...answer.suggestions.map((item) => {
      const row = document.createElement('li');
      const take = document.createElement('button');
      take.type = 'button';
      take.className = 'suggestion';
      const which = item.gpu_indexes.map((index) => `GPU ${index}`).join(', ');
      take.textContent = `${item.node} ${which}, ${hooks.period(item.start, item.end)}`;
      take.addEventListener('click', () => hooks.useSlot(item));
      const why = document.createElement('span');
      why.className = 'help';
      why.textContent = item.why;
      row.append(take, ' ', why);
      return row;
    }));
    ranking.textContent = `Ranked: ${answer.ranking}; from the last ${answer.history_weeks} weeks.`;
    box.hidden = false;
  }

  return {init, reset, update, refused};
})();
