/* The reports page's charts (templates/accounting/report.html): Chart.js, vendored.
 *
 * The table on the page carries every figure; the charts draw the same data (report-data):
 * booked and used GPU-hours per row as bars, and the demand by hour of the week as a heatmap
 * (chartjs-chart-matrix), the peak hours outlined. The heatmap's table twin is filled here too.
 */
'use strict';

(() => {
  const data = JSON.parse(document.getElementById('report-data').textContent);
  const DAYS = ['Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun'];
  const ink = '#1b1f24';
  Chart.defaults.color = ink;
  Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
  Chart.defaults.animation = false;

  const usage = document.getElementById('usage-chart');
  if (usage && data.rows.length) {
    new Chart(usage, {
      type: 'bar',
      data: {
        labels: data.rows.map((row) => row.label),
        datasets: [
          {label: 'Booked GPU-hours', data: data.rows.map((row) => row.booked_gpu_hours), backgroundColor: '#9fb3c8'},
          {label: 'Used GPU-hours', data: data.rows.map((row) => row.used_gpu_hours), backgroundColor: '#0b5cad'},
        ],
      },
      options: {
        maintainAspectRatio: false,
        indexAxis: data.rows.length > 12 ? 'y' : 'x',
        plugins: {
          tooltip: {
            callbacks: {
              afterBody: (items) => {
                const row = data.rows[items[0].dataIndex];
                return row.efficiency === null ? '' : `Efficiency: ${Math.round(row.efficiency * 100)} %`;
              },
            },
          },
        },
      },
    });
  }

  const peak = new Set(data.peak.map(([day, hour]) => `${day}:${hour}`));
  const max = Math.max(0, ...data.demand.flat());
  const HOURS = Array.from({length: 24}, (_, hour) => `${String(hour).padStart(2, '0')}:00`);
  const cells = [];
  data.demand.forEach((hours, day) => hours.forEach((value, hour) => cells.push({x: HOURS[hour], y: DAYS[day], v: value, day, hour})));
  const isPeak = (cell) => cell && peak.has(`${cell.day}:${cell.hour}`);
  new Chart(document.getElementById('demand-chart'), {
    type: 'matrix',
    data: {
      datasets: [{
        label: 'Booked GPU-hours',
        data: cells,
        backgroundColor: (context) => {
          const value = context.dataset.data[context.dataIndex]?.v ?? 0;
          return `rgba(11, 92, 173, ${0.05 + 0.95 * (max ? value / max : 0)})`;
        },
        borderColor: (context) => (isPeak(context.dataset.data[context.dataIndex]) ? '#c25e00' : 'rgba(0, 0, 0, 0.08)'),
        borderWidth: (context) => (isPeak(context.dataset.data[context.dataIndex]) ? 2 : 1),
        width: ({chart}) => (chart.chartArea || {}).width / 24 - 2,
        height: ({chart}) => (chart.chartArea || {}).height / 7 - 2,
      }],
    },
    options: {
      maintainAspectRatio: false,
      plugins: {
        legend: {display: false},
        tooltip: {
          callbacks: {
            title: ([item]) => `${item.raw.y} ${item.raw.x}`,
            label: (item) => `${item.raw.v} GPU-hours booked${isPeak(item.raw) ? ' (peak)' : ''}`,
          },
        },
      },
      scales: {
        x: {type: 'category', labels: HOURS, offset: true, grid: {display: false}, ticks: {autoSkip: true, maxRotation: 0}},
        y: {type: 'category', labels: DAYS, offset: true, reverse: true, grid: {display: false}},
      },
    },
  });

  const body = document.getElementById('demand-rows');
  for (let hour = 0; hour < 24; hour++) {
    const tr = document.createElement('tr');
    const th = document.createElement('th');
    th.scope = 'row';
    th.textContent = `${String(hour).padStart(2, '0')}:00`;
    tr.append(th);
    for (let day = 0; day < 7; day++) {
      const td = document.createElement('td');
      td.className = `num${peak.has(`${day}:${hour}`) ? ' peak' : ''}`;
      td.textContent = data.demand[day][hour].toFixed(1);
      tr.append(td);
    }
    body.append(tr);
  }
})();
