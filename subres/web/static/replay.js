// The replay page: one recording of a machine, a console's in asciinema-player, a display's on
// a canvas (displayplayer.js).
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
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const element = document.getElementById('player');

function say(state, text) {
  status.dataset.state = state;
  status.textContent = text;
}

if (recording.endsWith('.display')) {
  const { DisplayPlayer } = await import('./displayplayer.js');
  const response = await fetch(url, { headers, cache: 'no-store' });
  if (response.ok) {
    window.player = await DisplayPlayer.open(element, await response.arrayBuffer(), { onStatus: say });
  } else {
    const failure = await response.json().catch(() => ({}));
    say('disconnected', failure.message || response.statusText);
  }
} else {
  window.player = globalThis.AsciinemaPlayer.create({ url, fetchOpts: { headers } }, element, {
    autoPlay: true,
    idleTimeLimit: 2,
    fit: 'width',
  });
  window.player.addEventListener('play', () => say('connected', 'playing'));
  window.player.addEventListener('ended', () => say('idle', 'ended'));
}
