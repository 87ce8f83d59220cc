// The page: which machine, how to authenticate, the tabs, the status badge, and who holds what.
import { ConsoleView } from './console.js';
import { explain } from './errors.js';
import { RecordingsView } from './recordings.js';
import { Presence, summary } from './sharing.js';
import { VncView } from './vnc.js';

const TOKEN_KEY = 'subres.token';
const BEARER_PREFIX = 'base64url.bearer.authorization.k8s.io.';

const settings = await (await fetch('config.json')).json();
const machine = chooseMachine();
const status = document.getElementById('status');
const views = {};
const states = {};
let visible = 'console';

document.getElementById('picker').elements.machine.value = machine || '';
if (machine) {
  document.getElementById('machine').textContent = machine;
  document.title = `${machine} · subres`;
  const token = takeToken();
  if (!token) {
    askForToken();
  } else {
    start(token);
  }
} else {
  document.querySelector('nav').hidden = true;
  document.querySelector('main').hidden = true;
  document.getElementById('picker').elements.machine.focus();
  showStatus('idle', 'pick a machine');
}

// The CLI's target grammar: NAME, TYPE/NAME when TYPE names this page's type, else NAMESPACE/NAME.
function chooseMachine() {
  const asked = new URLSearchParams(location.search).get('machine') || settings.machine;
  if (!asked) return '';
  const slash = asked.indexOf('/');
  const [first, name] = slash < 0 ? ['', asked] : [asked.slice(0, slash), asked.slice(slash + 1)];
  if (!first || settings.types.includes(first.toLowerCase())) return `${settings.namespace}/${name}`;
  return `${first}/${name}`;
}

// A token arrives in the fragment (which never reaches a server's logs); keep it
// for this tab only and take it out of the address bar.
function takeToken() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.has('token')) {
    sessionStorage.setItem(TOKEN_KEY, fragment.get('token'));
    history.replaceState(null, '', location.pathname + location.search);
  }
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

function askForToken() {
  const form = document.getElementById('login');
  form.hidden = false;
  document.querySelector('main').hidden = true;
  showStatus('idle', 'token needed');
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, form.elements.token.value.trim());
    form.hidden = true;
    document.querySelector('main').hidden = false;
    start(sessionStorage.getItem(TOKEN_KEY));
  });
}

function start(token) {
  const endpoint = (sub) => subresourceUrl(machine, sub);
  const read = (sub) => subresourceUrl(machine, sub, { websocket: false });
  const auth = token ? [BEARER_PREFIX + base64url(token)] : [];
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const report = (name) => (state, text) => {
    states[name] = [state, text];
    if (name === visible) showStatus(state, text);
  };
  // Why a connection was refused: the same subresource read as a plain GET.
  const why = (sub) => explain(read(sub), headers);
  const presence = new Presence({ url: read('sessions'), headers, onChange: showHolder });
  views.console = new ConsoleView(document.getElementById('console'), {
    url: endpoint('console'), observeUrl: endpoint('console-observe'), auth,
    onStatus: report('console'), why,
  });
  views.vnc = new VncView(document.getElementById('vnc'), {
    url: endpoint('vnc'), observeUrl: endpoint('vnc-observe'), auth, onStatus: report('vnc'),
    presence, why,
  });
  views.recordings = new RecordingsView(document.getElementById('recordings'), {
    url: read('recordings'), headers, machine, onStatus: report('recordings'),
  });
  for (const tab of document.querySelectorAll('nav button')) {
    tab.addEventListener('click', () => show(tab.dataset.pane));
  }
  window.subres = { ...views, presence }; // for tests and for poking at the page from devtools
  views.console.start(presence).then(() => {
    pickConsoles(presence);
    presence.follow();
  });
  show(location.hash.slice(1) in views ? location.hash.slice(1) : 'console');
}

// A machine with several consoles gets a picker: each is a console of its own (its writer,
// observers, recording); choosing one connects the tab to it.
function pickConsoles(presence) {
  const picker = document.getElementById('consoles');
  if (presence.consoles.length < 2) return;
  for (const name of presence.consoles) picker.append(new Option(name, name));
  picker.hidden = visible !== 'console';
  picker.addEventListener('change', () => {
    views.console.switchTo(presence, picker.value).then(() => showHolder(presence.items));
  });
}

// The banner under the header: who writes or views, who watches, whether it is recorded.
function showHolder(items) {
  const banner = document.getElementById('holder');
  const sub = visible === 'vnc' ? 'vnc' : 'console';
  banner.hidden = visible === 'recordings';
  const unit = sub === 'console' ? consoleUnit() : '';
  banner.textContent = summary(items, sub, unit);
  const recorded = (i) => i.subresource === sub && (i.unit || '') === unit && i.recorded;
  banner.dataset.recorded = String(items.some(recorded));
}

function show(name) {
  visible = name;
  for (const tab of document.querySelectorAll('nav button')) {
    const selected = tab.dataset.pane === name;
    tab.setAttribute('aria-selected', String(selected));
    document.getElementById(tab.dataset.pane).hidden = !selected;
  }
  views[name].show();
  const picker = document.getElementById('consoles');
  picker.hidden = name !== 'console' || picker.options.length < 2;
  showStatus(...(states[name] || ['connecting', 'connecting']));
  if (window.subres) showHolder(window.subres.presence.items);
}

// The console the tab shows, as the sessions API names it: '' when the machine has one.
function consoleUnit() {
  const consoles = window.subres ? window.subres.presence.consoles : [];
  return consoles.length < 2 ? '' : views.console.unit;
}

function showStatus(state, text) {
  status.dataset.state = state;
  status.textContent = text;
}

function subresourceUrl(namespaced, sub, { websocket = true } = {}) {
  const [namespace, name] = namespaced.split('/', 2).map(encodeURIComponent);
  const secure = location.protocol === 'https:';
  const scheme = websocket ? (secure ? 'wss:' : 'ws:') : location.protocol;
  const path = `${settings.api_prefix}/namespaces/${namespace}/${settings.resource}/${name}/${sub}`;
  return `${scheme}//${location.host}${path}`;
}

function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  const binary = Array.from(bytes, (b) => String.fromCharCode(b)).join('');
  return btoa(binary).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}
