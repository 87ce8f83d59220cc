// The replay page: one recording of a machine's console in asciinema-player.
const TOKEN_KEY = 'subres.token';

const settings = await (await fetch('config.json')).json();
const query = new URLSearchParams(location.search);
const machine = query.get('machine') || '';
const recording = query.get('recording') || '';
const status = document.getElementById('status');
const token = sessionStorage.getItem(TOKEN_KEY) || '';

document.getElementById('machine').textContent = `${machine} · ${recording}`;
document.getElementById('back').href = `./?${new URLSearchParams({ machine })}#recordings`;

const [namespace, name] = machine.split('/', 2).map(encodeURIComponent);
const path = `${settings.api_prefix}/namespaces/${namespace}/${settings.resource}/${name}`;
const url = `${path}/recordings/${encodeURIComponent(recording)}`;
const fetchOpts = token ? { headers: { Authorization: `Bearer ${token}` } } : {};
window.player = globalThis.AsciinemaPlayer.create({ url, fetchOpts }, document.getElementById('player'), {
  autoPlay: true,
  idleTimeLimit: 2,
  fit: 'width',
});
window.player.addEventListener('play', () => {
  status.dataset.state = 'connected';
  status.textContent = 'playing';
});
window.player.addEventListener('ended', () => {
  status.dataset.state = 'idle';
  status.textContent = 'ended';
});
