// The console tab: xterm.js over a Kubernetes channel WebSocket (v5, or v4), as the
// writer or as a read-only observer (console-observe) when someone else writes, to
// whichever of the machine's consoles the picker names (`?console=NAME`).
import { Terminal } from './vendor/xterm/xterm.mjs';
import { FitAddon } from './vendor/addon-fit/addon-fit.mjs';
import { choose, holder } from './sharing.js';

const SUBPROTOCOLS = ['v5.channel.k8s.io', 'v4.channel.k8s.io'];
const STDIN = 0, STDOUT = 1, STDERR = 2, ERROR = 3, RESIZE = 4;

export class ConsoleView {
  constructor(element, { url, observeUrl, auth, onStatus, why }) {
    this.element = element;
    this.urls = { writer: url, observer: observeUrl };
    this.why = why;
    this.mode = 'writer';
    this.unit = '';
    this.protocols = [...SUBPROTOCOLS, ...auth];
    this.onStatus = onStatus;
    this.encoder = new TextEncoder();
    this.ws = null;
    this.final = false; // refused for good (401): Enter does not connect again
    this.terminal = new Terminal({
      cursorBlink: true,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", monospace',
      fontSize: 14,
      scrollback: 5000,
    });
    this.fit = new FitAddon();
    this.terminal.loadAddon(this.fit);
    this.terminal.open(element);
    this.terminal.onData((data) => this.send(STDIN, this.encoder.encode(data)));
    this.terminal.onBinary((data) => this.send(STDIN, Uint8Array.from(data, (c) => c.charCodeAt(0))));
    this.terminal.onResize(() => this.sendSize());
    new ResizeObserver(() => this.refit()).observe(element);
  }

  // Connect as the writer, unless someone else writes: then ask whether to take over or watch.
  // `unit`: which console, by name, when the machine has several ('' otherwise).
  async start(presence, unit = this.unit) {
    const items = await presence.read();
    this.unit = unit || (presence.consoles.length > 1 ? presence.consoles[0] : '');
    const held = holder(items, 'console', this.unit);
    const mode = held ? await choose(this.element, held, { watch: 'Observe' }) : 'writer';
    this.connect(mode);
  }

  // Leave the console shown for another of the machine's (the picker changed).
  async switchTo(presence, unit) {
    if (this.ws !== null) {
      this.ws.onclose = null;
      this.ws.close();
      this.ws = null;
    }
    this.terminal.reset();
    await this.start(presence, unit);
  }

  connect(mode = this.mode) {
    this.mode = mode;
    this.onStatus('connecting', 'connecting');
    this.failure = '';
    const ws = new WebSocket(this.urls[mode] + this.query(), this.protocols);
    let opened = false;
    ws.binaryType = 'arraybuffer';
    ws.onopen = () => {
      opened = true;
      const observing = mode === 'observer';
      this.terminal.options.disableStdin = observing;
      this.onStatus('connected', observing ? 'console observed (read-only)' : 'console connected');
      this.sendSize();
    };
    ws.onmessage = (event) => this.receive(new Uint8Array(event.data));
    ws.onclose = async (event) => {
      // A refused upgrade reaches a page only as a lost connection: ask the server why.
      const sub = (mode === 'observer' ? 'console-observe' : 'console') + this.query();
      const refused = opened ? { text: '', final: false } : await this.why(sub);
      const reason = this.failure || event.reason || refused.text
        || (event.code === 1000 ? 'closed' : 'connection lost');
      this.final = refused.final;
      this.terminal.options.disableStdin = false;
      this.onStatus('disconnected', `console: ${reason}`);
      const offer = this.final ? '' : '; press Enter to reconnect';
      this.terminal.write(`\r\n\x1b[2m[${reason}${offer}]\x1b[0m\r\n`);
    };
    this.ws = ws;
  }

  // Which console, as a query: none for a machine's only one.
  query() {
    return this.unit ? `?console=${encodeURIComponent(this.unit)}` : '';
  }

  show() {
    this.refit();
    this.terminal.focus();
  }

  refit() {
    // A hidden pane has no size: fitting it would shrink the terminal to nothing.
    if (this.element.offsetWidth > 0) this.fit.fit();
  }

  receive(message) {
    const channel = message[0];
    const data = message.subarray(1);
    if (channel === STDOUT || channel === STDERR) {
      this.terminal.write(data);
    } else if (channel === ERROR && data.length) {
      const status = JSON.parse(new TextDecoder().decode(data));
      if (status.status !== 'Success') this.failure = status.message || 'the session failed';
    }
  }

  send(channel, bytes) {
    if (this.ws === null) return;
    if (this.ws.readyState === WebSocket.CLOSED && channel === STDIN) {
      if (bytes.includes(13) && !this.final) this.connect();
      return;
    }
    if (this.ws.readyState !== WebSocket.OPEN) return;
    const message = new Uint8Array(bytes.length + 1);
    message[0] = channel;
    message.set(bytes, 1);
    this.ws.send(message);
  }

  sendSize() {
    const size = { Width: this.terminal.cols, Height: this.terminal.rows };
    this.send(RESIZE, this.encoder.encode(JSON.stringify(size)));
  }
}
