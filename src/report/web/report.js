// src/report/web/report.js — the page's own script (the page: report.html; compiled in by cmake/page_assets.cmake).
// It reads the runs from the JSON block #deloco-data (a live page: from api/data every 2 s) and fills the tables and
// the uPlot charts. Every value it puts into markup goes through esc or fmt, or is set as textContent.
let runs = JSON.parse(document.getElementById('deloco-data').textContent);
const colours = ['#1f77b4','#d62728','#2ca02c','#ff7f0e','#9467bd','#8c564b','#e377c2','#17becf','#7f7f7f','#bcbd22'];
// Every value put into markup goes through esc or fmt: a number is formatted, anything else (a string where a number
// was expected, an object) is shown as escaped text.
const esc = v => String(v).replace(/[<>&"']/g, c => ({'<': '&lt;', '>': '&gt;', '&': '&amp;', '"': '&quot;', "'": '&#39;'}[c]));
const fmt = (v, d) => (v === undefined || v === null) ? '–' : (typeof v === 'number' ? (Number.isInteger(v) ? v.toLocaleString('en') : v.toFixed(d === undefined ? 4 : d)) : esc(v));
function tables() {
  const cols = [['run','name'],['kind','kind'],['wall s','wall_seconds',0],['final val loss','final_val_loss'],['bits/byte','val_bpb',3],
    ['tokens','tokens'],['merges','outer_steps'],['merged','contributions_merged'],['rejected','contributions_rejected'],
    ['uptime','uptime',3],['goodput','goodput',3],['bytes sent','bytes_sent'],['learner kills','learner_kills'],['syncer kills','syncer_kills']];
  let h = '<table><tr>' + cols.map(c => '<th>' + c[0] + '</th>').join('') + '</tr>';
  runs.forEach((r, i) => {
    h += '<tr>' + cols.map((c, k) => {
      const v = k < 2 ? r[c[1]] : r.summary[c[1]];
      const cell = k === 0 ? '<span class="sw" style="background:' + colours[i % colours.length] + '"></span>' : '';
      return '<td>' + cell + (k < 2 ? esc(v) : fmt(v, c[2])) + '</td>';
    }).join('') + '</tr>';
  });
  const thinned = runs.filter(r => r.thinned_to).map(r => esc(r.name) + ' (' + fmt(r.thinned_to) + ' per series)');
  document.getElementById('summary').innerHTML = h + '</table>' + (thinned.length ?
    '<p class="empty" id="thinned">Charts thinned to evenly spaced records, first and last kept: ' + thinned.join(', ') + '.</p>' : '');
  let t = '<table><tr><th>run</th><th>merged</th><th>rejected, by reason</th></tr>';
  runs.forEach(r => {
    const parts = Object.entries(r.rejects).map(([k, v]) => esc(k) + ' ' + fmt(v));
    t += '<tr><td>' + esc(r.name) + '</td><td>' + fmt(r.summary.contributions_merged) + '</td><td>' + (parts.join(', ') || 'none') + '</td></tr>';
  });
  document.getElementById('rejects').innerHTML = t + '</table>';
  // What the reader skipped, as text nodes: the counts and the first notes (file, line, problem) of each run.
  const skipped = document.getElementById('skipped');
  skipped.textContent = '';
  runs.filter(r => r.bad_lines || r.long_lines || r.bad_times || (r.notes && r.notes.length)).forEach(r => {
    const p = document.createElement('p');
    p.className = 'empty';
    p.textContent = r.name + ': skipped ' + (r.bad_lines || 0) + ' line(s) that were not records, ' + (r.long_lines || 0) +
      ' line(s) over 1 MiB, ' + (r.bad_times || 0) + ' record(s) with an impossible time';
    const ul = document.createElement('ul');
    (r.notes || []).forEach(n => { const li = document.createElement('li'); li.textContent = n; ul.appendChild(li); });
    skipped.appendChild(p);
    if (ul.childNodes.length) skipped.appendChild(ul);
  });
  let l = '<table id="learners"><tr><th>run</th><th>learner</th><th>state</th><th>step</th><th>training loss</th><th>tokens/s</th><th>last record (s)</th></tr>';
  runs.forEach(r => Object.entries(r.learner_now).forEach(([id, n]) => {
    l += '<tr class="learner"><td>' + esc(r.name) + '</td><td>' + esc(id) + '</td><td class="state-' + esc(n.state || 'unknown') + '">' +
      esc(n.state || '–') + '</td><td>' + fmt(n.step, 0) + '</td><td>' + fmt(n.loss) + '</td><td>' + fmt(Math.round(n.tokens_per_s)) +
      '</td><td>' + fmt(n.t, 1) + '</td></tr>';
  }));
  document.getElementById('learner-table').innerHTML = l + '</table>';
  const rows = runs.flatMap(r => r.events.map(e => '<tr><td>' + esc(r.name) + '</td><td>' + fmt(e[0], 1) + '</td><td>' + esc(e[1]) + '</td></tr>'));
  document.getElementById('events').innerHTML = rows.length ? '<table><tr><th>run</th><th>t (s)</th><th>event</th></tr>' + rows.join('') + '</table>' : '<p class="empty">no chaos or failure events</p>';
}
// The charts drawn, by element id: {u: the uPlot, shape: its series, counts: points per series, events}.
const plots = {};
// One chart: x/y pairs per run, aligned on a shared x axis (uPlot wants one x array; gaps are null). A chart that
// exists with the same series is updated in place (setData, as each poll of a live page does): when the user
// zoomed in, so that the x scale no longer spans the data drawn, the zoom is kept; otherwise the scales follow the
// new data. A chart whose series changed (a learner appeared) is drawn anew.
function chart(id, title, xlabel, ylabel, seriesOf, opts) {
  const per = [];
  runs.forEach((r, i) => seriesOf(r).forEach(s => per.push({label: s.label, pts: s.pts, colour: colours[i % colours.length], dash: s.dash})));
  const xs = Array.from(new Set(per.flatMap(s => s.pts.map(p => p[0])))).sort((a, b) => a - b);
  const index = new Map(xs.map((x, k) => [x, k]));
  const data = [xs];
  per.forEach(s => { const y = new Array(xs.length).fill(null); s.pts.forEach(p => { y[index.get(p[0])] = p[1]; }); data.push(y); });
  const el = document.getElementById(id);
  el.dataset.points = String(per.reduce((n, s) => n + s.pts.length, 0));
  let plot = plots[id];
  if (!xs.length) {
    if (plot) { plot.u.destroy(); delete plots[id]; }
    el.innerHTML = '<p class="empty">' + esc(title) + ': no data yet</p>';
    return;
  }
  // Markers for what struck (a kill, a stop, a failure); the restarts that follow are in the events table only.
  const events = (opts && opts.events) ? runs.flatMap((r, i) => r.events.filter(e => !/^restarted/.test(e[1])).map(e => ({t: e[0], colour: colours[i % colours.length]}))) : [];
  const shape = JSON.stringify(per.map(s => [s.label, s.colour, s.dash || null]));
  if (plot && plot.shape === shape) {
    plot.counts = per.map(s => s.pts.length);
    plot.events = events;
    const x0 = plot.u.data[0], sx = plot.u.scales.x;
    const zoomed = x0.length > 0 && (sx.min > x0[0] || sx.max < x0[x0.length - 1]);
    plot.u.setData(data, !zoomed);
    return;
  }
  if (plot) plot.u.destroy();
  el.innerHTML = '';
  plot = plots[id] = {shape: shape, counts: per.map(s => s.pts.length), events: events};
  const series = [{label: xlabel}].concat(per.map((s, k) => ({label: s.label, stroke: s.colour, width: 1.5, dash: s.dash, spanGaps: true,
    points: {show: () => (opts && opts.points) || plot.counts[k] < 60}, paths: (opts && opts.bars) ? uPlot.paths.stepped({align: 1}) : undefined})));
  plot.u = new uPlot({title: title, width: Math.min(1100, window.innerWidth - 40), height: 300, series: series,
    scales: {x: {time: false}}, axes: [{label: xlabel}, {label: ylabel}],
    hooks: {draw: [u => {
      const ctx = u.ctx; ctx.save();
      plot.events.forEach(e => { const x = u.valToPos(e.t, 'x', true); if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
        ctx.strokeStyle = e.colour; ctx.setLineDash([4, 4]); ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke(); });
      ctx.restore(); }]}}, data, el);
  el.dataset.rendered = '1';
}
function render() {
  const multi = runs.length > 1;
  const named = (r, what) => multi ? r.name + ' ' + what : what;
  tables();
  chart('loss-time', 'Validation loss of the global model', 'seconds', 'val loss', r => [{label: named(r, 'val loss'), pts: r.evals.map(e => [e[0], e[2]])}], {events: true});
  chart('loss-tokens', 'Validation loss against tokens', 'tokens', 'val loss', r => [{label: named(r, 'val loss'), pts: r.evals.map(e => [e[1], e[2]])}]);
  chart('bpb-time', 'Bits per byte', 'seconds', 'bits/byte', r => [{label: named(r, 'bits/byte'), pts: r.evals.filter(e => e[3] !== null).map(e => [e[0], e[3]])}], {events: true});
  chart('merge-rate', 'Merges per minute', 'seconds', 'merges/min', r => [{label: named(r, 'merges/min'), pts: r.merge_rate}], {events: true, bars: true});
  chart('quorum', 'Contributions in each merge (quorum size)', 'seconds', 'contributions', r => [{label: named(r, 'merged'), pts: r.merges.map(m => [m[0], m[1]])}], {points: true});
  chart('grace', 'Grace wait of each merge', 'seconds', 'seconds', r => [{label: named(r, 'grace wait'), pts: r.merges.map(m => [m[0], m[2]])}], {points: true});
  chart('learner-loss', 'Learners: training loss', 'seconds', 'loss', r => Object.entries(r.learners).map(([id, v], k) => ({label: named(r, 'learner ' + id), pts: v.filter(p => p[2] !== null).map(p => [p[0], p[2]]), dash: k % 2 ? [6, 3] : undefined})), {events: true});
  chart('learner-step', 'Learners: step', 'seconds', 'step', r => Object.entries(r.learners).map(([id, v], k) => ({label: named(r, 'learner ' + id), pts: v.map(p => [p[0], p[1]]), dash: k % 2 ? [6, 3] : undefined})), {events: true});
}
if (typeof LIVE !== 'undefined' && LIVE) {
  // The dashboard of a running syncer: the same page, refreshed from its api every 2 s (charts updated in place).
  let reads = 0;
  const poll = () => fetch('api/data', {cache: 'no-store'}).then(r => r.ok ? r.json() : Promise.reject(r.status)).then(d => {
    runs = d; reads += 1; document.body.dataset.reads = String(reads);
    document.getElementById('live').textContent = 'live: updated ' + new Date().toLocaleTimeString() + ' (every 2 s)';
    render();
  }).catch(e => { document.getElementById('live').textContent = 'live: the syncer did not answer (' + e + '); retrying'; })
    .finally(() => setTimeout(poll, 2000));
  poll();
} else {
  render();
}
